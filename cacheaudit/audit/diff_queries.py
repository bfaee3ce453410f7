"""What `diff` reads from ledgers: the runs a ledger holds, the records of one run (or of the
whole ledger) in the order they were used, and, for `diff --by-host`, one compact row per
compile with each of its parts reduced to a content class, in a few set-wise queries.

Read-only; built on the ledger's public reads (`Ledger.records`, `Ledger.runs`) and plain SQL
over its documented schema (docs/ledger.md), so that the ledger package itself needs nothing new.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

from cacheaudit.exceptions import UsageError
from cacheaudit.ledger import Ledger
from cacheaudit.ledger.values import RunInfo
from cacheaudit.model import CompileRecord, json_digest

ORDER_OF_USE = "r.started_ns, r.id"


def find_run(ledger: Ledger, wanted: str) -> RunInfo:
    """The run whose id is `wanted`, or the one run whose id starts with it (as git takes a
    commit's prefix); a usage error naming the ledger when none or several match."""
    runs = ledger.runs()
    if wanted in runs:
        return runs[wanted]
    matches = sorted(uuid for uuid in runs if uuid.startswith(wanted))
    if len(matches) == 1:
        return runs[matches[0]]
    if matches:
        shown = ", ".join(matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise UsageError(f"run id {wanted!r} is ambiguous in {ledger.path}: {shown}")
    raise UsageError(f"no run {wanted!r} in {ledger.path} ({len(runs)} run(s) there; "
                     "`cacheaudit report --json` names each record's run_uuid)")


def side_records(ledger: Ledger, run_uuid: str | None = None) -> list[CompileRecord]:
    """The records of one run, or of the whole ledger, in the order they were used."""
    if run_uuid is None:
        return ledger.records(order=ORDER_OF_USE)
    return ledger.records(where="runs.run_uuid = ?", params=(run_uuid,), order=ORDER_OF_USE)


# ------------------------------------------------------------------------------ by host


class HostCompile(NamedTuple):
    """One compile of a combined ledger as `diff --by-host` compares it: the kernel's identity,
    the host, and its inputs and binary as class ids (`signature`: equal ids, equal content, in
    the order of `SIGNATURE_PARTS`). A tuple: a fleet has ten million of them."""

    identity: tuple[str | None, str | None, str | None]  # runtime, kernel, key
    host: str
    signature: tuple[int, int, int, int, int, int]
    record_uuid: str


SIGNATURE_PARTS = ("compiler", "options", "environment", "sources", "graph", "binary")


@dataclass
class ContentClasses:
    """Class ids of content: compilers by identity (binary, version, host compiler; not their
    mtime), graphs by their members' paths and digests (not their stat fields), JSON values by
    their stored body (already content-addressed). Shared graphs are classed once."""

    compilers: dict[int | None, int]
    graphs: dict[int | None, int]
    binaries: dict[int | None, int]


def _classes(rows: Iterator[tuple[int, str]]) -> dict[int | None, int]:
    ids: dict[str, int] = {}
    found: dict[int | None, int] = {None: 0}
    for row_id, content in rows:
        found[row_id] = ids.setdefault(content, len(ids) + 1)
    return found


def _compiler_classes(conn: sqlite3.Connection) -> dict[int | None, int]:
    rows = conn.execute("SELECT id, resolved, binary_digest, version_text, host_id"
                        " FROM compilers ORDER BY id").fetchall()
    by_id = {row[0]: row for row in rows}
    memo: dict[int, str] = {}

    def identity(compiler_id: int, depth: int = 0) -> str:
        if compiler_id not in memo:
            _id, resolved, digest, version, host_id = by_id[compiler_id]
            host = identity(host_id, depth + 1) if host_id in by_id and depth < 4 else None
            memo[compiler_id] = json_digest([resolved, digest, version, host])
        return memo[compiler_id]

    return _classes((compiler_id, identity(compiler_id)) for compiler_id in by_id)


def _graph_classes(conn: sqlite3.Connection, used: str, member: str) -> dict[int | None, int]:
    """Class ids of the graphs of `used` (a query of graph ids), by `member` (an SQL expression
    over `f` files and `s` file_states) of each file, in the compiler's order."""
    rows = conn.execute(
        f"SELECT g.graph_id, group_concat({member}, char(10)) FROM ({used}) used"
        " JOIN graph_files g ON g.graph_id = used.id"
        " JOIN file_states s ON s.id = g.state_id JOIN files f ON f.id = s.file_id"
        " GROUP BY g.graph_id ORDER BY g.graph_id")
    return _classes((graph_id, content or "") for graph_id, content in rows)


def content_classes(ledger: Ledger) -> ContentClasses:
    conn = ledger.conn
    inputs = _graph_classes(
        conn, "SELECT graph_id AS id FROM records WHERE graph_id IS NOT NULL"
        " UNION SELECT sources_id FROM records WHERE sources_id IS NOT NULL",
        "f.path || ' ' || s.present || ' ' || s.digest")
    # A binary is its content: the same bytes under another cache path are the same binary.
    binaries = _graph_classes(
        conn, "SELECT DISTINCT outputs_id AS id FROM records WHERE outputs_id IS NOT NULL",
        "s.digest")
    return ContentClasses(_compiler_classes(conn), inputs, binaries)


def host_compiles(ledger: Ledger, classes: ContentClasses,
                  identity: tuple[str | None, str | None, str | None] | None = None
                  ) -> Iterator[HostCompile]:
    """Every successful compile of the ledger as a `HostCompile`, in the table's order (no
    sort: a fleet's ten million rows are read as they lie); only those of one kernel
    `identity` (runtime, kernel, key) when given, through the records' kernel index."""
    sql = ("SELECT runtime, kernel, key, host, compiler_id, effective_argv_id, env_id,"
           " sources_id, graph_id, outputs_id, record_uuid FROM records"
           " WHERE event = 'compile' AND coalesce(exit_code, 0) = 0 AND signal IS NULL")
    params: list[str] = []
    if identity is not None:
        for column, value in zip(("runtime", "kernel", "key"), identity, strict=True):
            sql += f" AND {column} IS NULL" if value is None else f" AND {column} = ?"
            params += [] if value is None else [value]
        sql += " ORDER BY host, started_ns"
    compilers, graphs, binaries = classes.compilers, classes.graphs, classes.binaries
    for (runtime, kernel, key, host, compiler_id, options, env, sources, graph, outputs,
         uuid) in ledger.conn.execute(sql, params):
        yield HostCompile((runtime, kernel, key), host, (
            compilers.get(compiler_id, -1), options or 0, env or 0, graphs.get(sources, -1),
            graphs.get(graph, -1), binaries.get(outputs, -1)), uuid)
