"""`combine`'s set-wise copy: another ledger of the same schema `ATTACH`ed to the target and
copied table by table with `INSERT ... SELECT`, in one write transaction.

The content-addressed tables (paths, file states, JSON values, compilers, graphs) are merged by
their natural keys, the source's ids remapped through temporary tables; records go in by their
`record_uuid` (one already present is skipped: combining twice adds nothing). What it stores is
what the per-record path (`combine._combine_records`) stores for the same source: the runs
that records or tests belong to (stamped with this cacheaudit's version, as `_run_id` stamps
them), the records in the order `started_ns, id`, the test windows, the settled seen states,
the findings not yet present (the first of duplicates within the source) and the cache roots
(the latest scan time kept).

Values are copied as the source stored them, where the per-record path redacts them again
with the combining process's setting: the same text for a ledger recorded with redaction on
(every ledger of this schema version, unless `CACHEAUDIT_REDACT_ARGV=0`). A source in which
redaction would change a command line, a note or a message (`needs_redaction`) is left to the
per-record path, so that combine never stores a credential the per-record path would not.

Paths and file states are copied as the per-record path interns them: those that the new
graphs, the records and the seen states name (a graph the target already has brings nothing).
What differs stays out of the read API's sight: a value too deep to read (`bounded`) is copied
as it is, where the per-record path stores what its reader made of it (left out, with a note);
both read back the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any

from cacheaudit import __version__
from cacheaudit.ledger.redact import _redacted_argv, _redacted_text, argv_redaction
from cacheaudit.ledger.schema import _RECORD_INDEXES as _SCHEMA_RECORD_INDEXES

SOURCE = "combine_source"
"""The schema name the source ledger is attached under."""

_STATE_KEY = ("present", "size", "mtime_ns", "ctime_ns", "inode", "digest", "settled", "error")

_COMPILER_COLUMNS = ("invoked", "path", "resolved", "wrappers", "kind", "version_text",
                     "binary_digest", "size", "mtime_ns", "error")

_RECORD_PLAIN = ("record_uuid", "event", "runtime", "kernel", "key", "exit_code", "signal",
                 "started_ns", "duration_ns", "pid", "host", "test_id", "observer")

_RECORD_REFERENCES = {
    "entry_id": "file", "cwd_id": "file", "compiler_id": "compiler", "argv_id": "blob",
    "effective_argv_id": "blob", "env_id": "blob", "tracked_id": "blob", "notes_id": "blob",
    "extra_id": "blob", "sources_id": "graph", "graph_id": "graph", "outputs_id": "graph",
}
"""The records' columns that hold ids of another table, and which map remaps them."""

_FINDING_COLUMNS = ("audit_uuid", "found_ns", "code", "severity", "subject", "message",
                    "recorded", "current", "how", "inferred", "record_uuid", "entry",
                    "runtime", "kernel", "hint")

_FINDING_KEY = ("audit_uuid", "code", "subject", "record_uuid", "entry", "message")
"""What makes a finding already present (`combine._copy_findings_and_roots`'s test)."""

_MAPS = ("file", "state", "blob", "compiler", "graph", "run", "needed_state", "needed_file")


def copy_ledger(conn: sqlite3.Connection, source_path: str) -> int:
    """Copy the ledger at `source_path` into the one `conn` is open on; returns how many
    records were new. One write transaction: a failure leaves the target as it was."""
    conn.execute(f"ATTACH DATABASE ? AS {SOURCE}", (source_path,))
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            added = _copy(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
    finally:
        for name in _MAPS:
            conn.execute(f"DROP TABLE IF EXISTS temp.combine_{name}_map")
        conn.execute("DROP TABLE IF EXISTS temp.combine_new_graphs")
        conn.execute(f"DETACH DATABASE {SOURCE}")
    return added


REBUILD_FROM_SOURCES = 8
"""From this many sources on, `combine` builds the records' indexes once at the end instead
of keeping them up to date source by source. Each host's records land all over the indexes by
kernel, key, entry, sources and outputs (every host builds the same kernels), so each source's
commit rewrites pages across the whole of them: a cost per source that grows with the target
(0.4 s a host at 10 hosts, 1 s at 100), where one sorted build at the end is n log n."""

# The schema's own list: a statement there may open with its comment.
_RECORD_INDEXES = list(_SCHEMA_RECORD_INDEXES.values())


@contextlib.contextmanager
def record_indexes_built_once(conn: sqlite3.Connection, retry: Callable[[Any], Any],
                              sources: list[str], target_path: str) -> Iterator[None]:
    """Around a combine of `sources` into the ledger at `target_path`: the records' secondary
    indexes dropped first and made again at the end, even when the combine fails, where there
    are `REBUILD_FROM_SOURCES` sources or more and together they are larger than the target
    (a long-lived ledger that gains a pytest session's workers keeps its indexes: building
    them again would cost more than the few records added). Every
    combine first makes any of them that is missing, so that one killed in between (the
    indexes gone, the records all there) is mended by the next; readers meanwhile read the
    same rows, only slower."""

    def transaction(statements: list[str]) -> Callable[[], None]:
        def run() -> None:
            conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in statements:
                    conn.execute(statement)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        return run

    retry(transaction(_RECORD_INDEXES))
    if len(sources) < REBUILD_FROM_SOURCES or _size(sources) <= _size([target_path]):
        yield
        return
    names = [s.split(" EXISTS ", 1)[1].split()[0] for s in _RECORD_INDEXES]
    retry(transaction([f"DROP INDEX IF EXISTS {name}" for name in names]))
    try:
        yield
    finally:
        retry(transaction(_RECORD_INDEXES))


def _size(paths: list[str]) -> int:
    total = 0
    for path in paths:
        with contextlib.suppress(OSError):
            total += os.path.getsize(path)
    return total


def needs_redaction(source: sqlite3.Connection) -> bool:
    """Whether redaction, as this process is set to do it, would change a value of `source`'s
    records or runs (recorded with `CACHEAUDIT_REDACT_ARGV=0`, say)."""
    if not argv_redaction():
        return False
    # Every value judged as each kind it could be, rather than found by the records that use
    # it (a pass over every record): the values are few, the records many. A value that
    # only looks like a command line with a credential sends the source the slower way.
    judges = (_argv_changes, _effective_changes, _notes_change, _messages_change)
    for (body,) in source.execute("SELECT body FROM blobs"):
        value = _loads(body)
        if any(changes(value) for changes in judges):
            return True
    return any(_argv_changes(_loads(command)) for (command,) in source.execute(
        "SELECT DISTINCT command FROM runs WHERE command IS NOT NULL"))


def _loads(body: Any) -> Any:
    try:
        return json.loads(body)
    except (TypeError, ValueError, RecursionError):
        return None


def _argv_changes(value: Any) -> bool:
    if not isinstance(value, list) or not all(isinstance(w, str) for w in value):
        return False
    return bool(_redacted_argv(tuple(value))[1])


def _effective_changes(value: Any) -> bool:
    if not isinstance(value, list):
        return False
    return _argv_changes([t[0] for t in value if isinstance(t, list) and t])


def _notes_change(value: Any) -> bool:
    return isinstance(value, list) and any(
        isinstance(n, str) and _redacted_text(n) != n for n in value)


def _messages_change(value: Any) -> bool:
    return isinstance(value, dict) and any(
        isinstance(value.get(name), str) and _redacted_text(value[name]) != value[name]
        for name in ("runtime_error", "graph_problem"))


def _map_table(conn: sqlite3.Connection, name: str) -> str:
    table = f"temp.combine_{name}_map"
    conn.execute(f"DROP TABLE IF EXISTS {table}")
    conn.execute(f"CREATE TABLE {table} (old INTEGER PRIMARY KEY, new INTEGER NOT NULL)")
    return table


def _copy(conn: sqlite3.Connection) -> int:
    s = SOURCE
    blobs = _map_table(conn, "blob")
    conn.execute(f"INSERT INTO main.blobs (digest, body) SELECT digest, body FROM {s}.blobs"
                 " WHERE true ON CONFLICT DO NOTHING")
    conn.execute(f"INSERT INTO {blobs} (old, new) SELECT o.id, m.id FROM {s}.blobs o"
                 " JOIN main.blobs m ON m.digest = o.digest")

    compilers = _map_table(conn, "compiler")
    _copy_compilers(conn, compilers)

    graphs = _map_table(conn, "graph")
    # Graphs first: one the target has (same digest) is the same, members and all, so only
    # the new graphs' members, and the files and states records and seen states name
    # directly, are looked up and copied. A fleet's hosts share nearly every graph: most of
    # a host's paths and states are never touched.
    conn.execute(f"INSERT INTO {graphs} (old, new) SELECT o.id, m.id FROM {s}.graphs o"
                 " JOIN main.graphs m ON m.digest = o.digest")
    conn.execute("DROP TABLE IF EXISTS temp.combine_new_graphs")
    conn.execute("CREATE TABLE temp.combine_new_graphs (old INTEGER PRIMARY KEY)")
    conn.execute(f"INSERT INTO temp.combine_new_graphs (old) SELECT o.id FROM {s}.graphs o"
                 f" WHERE o.id NOT IN (SELECT old FROM {graphs})")
    conn.execute(f"INSERT INTO main.graphs (digest, method, file_count) SELECT o.digest,"
                 f" o.method, o.file_count FROM {s}.graphs o JOIN temp.combine_new_graphs n"
                 " ON n.old = o.id WHERE true ON CONFLICT DO NOTHING")
    conn.execute(f"INSERT INTO {graphs} (old, new) SELECT o.id, m.id FROM {s}.graphs o"
                 " JOIN temp.combine_new_graphs n ON n.old = o.id"
                 " JOIN main.graphs m ON m.digest = o.digest")

    needed_states = _map_table(conn, "needed_state")
    # CROSS JOIN: from the new graphs (none, from a fleet's second host on) to their members,
    # never the other way round through every member of the source.
    conn.execute(f"INSERT OR IGNORE INTO {needed_states} (old, new) SELECT o.state_id, 0"
                 f" FROM temp.combine_new_graphs n CROSS JOIN {s}.graph_files o"
                 f" ON o.graph_id = n.old UNION SELECT state_id, 0 FROM {s}.seen_states")
    needed_files = _map_table(conn, "needed_file")
    conn.execute(
        f"INSERT OR IGNORE INTO {needed_files} (old, new) SELECT x.file_id, 0"
        f" FROM {s}.file_states x JOIN {needed_states} n ON n.old = x.id"
        " UNION SELECT o.written_id, 0 FROM temp.combine_new_graphs n"
        f" CROSS JOIN {s}.graph_files o ON o.graph_id = n.old"
        f" UNION SELECT entry_id, 0 FROM {s}.records WHERE entry_id IS NOT NULL"
        f" UNION SELECT cwd_id, 0 FROM {s}.records WHERE cwd_id IS NOT NULL"
        f" UNION SELECT file_id, 0 FROM {s}.seen_states")

    files = _map_table(conn, "file")
    conn.execute(f"INSERT INTO main.files (path) SELECT o.path FROM {s}.files o"
                 f" JOIN {needed_files} n ON n.old = o.id WHERE true ON CONFLICT DO NOTHING")
    conn.execute(f"INSERT INTO {files} (old, new) SELECT o.id, m.id FROM {s}.files o"
                 f" JOIN {needed_files} n ON n.old = o.id JOIN main.files m ON m.path = o.path")

    states = _map_table(conn, "state")
    key = ", ".join(_STATE_KEY)
    conn.execute(f"INSERT INTO main.file_states (file_id, {key}) SELECT f.new,"
                 f" {', '.join('o.' + c for c in _STATE_KEY)} FROM {s}.file_states o"
                 f" JOIN {needed_states} n ON n.old = o.id"
                 f" JOIN {files} f ON f.old = o.file_id WHERE true ON CONFLICT DO NOTHING")
    conn.execute(f"INSERT INTO {states} (old, new) SELECT o.id, m.id FROM {s}.file_states o"
                 f" JOIN {needed_states} n ON n.old = o.id"
                 f" JOIN {files} f ON f.old = o.file_id JOIN main.file_states m"
                 " ON m.file_id = f.new AND "
                 + " AND ".join(f"m.{c} = o.{c}" for c in _STATE_KEY))

    conn.execute(f"INSERT INTO main.graph_files (graph_id, position, state_id, written_id)"
                 " SELECT g.new, o.position, st.new, w.new FROM temp.combine_new_graphs n"
                 f" CROSS JOIN {s}.graph_files o ON o.graph_id = n.old"
                 f" JOIN {graphs} g ON g.old = o.graph_id JOIN {states} st ON st.old = o.state_id"
                 f" JOIN {files} w ON w.old = o.written_id WHERE true ON CONFLICT DO NOTHING")

    runs = _map_table(conn, "run")
    # The runs the per-record path writes: those a record or a test window belongs to.
    conn.execute("INSERT INTO main.runs (run_uuid, started_ns, host, pid, label, command,"
                 " cacheaudit_version) SELECT run_uuid, started_ns, host, pid, label, command,"
                 f" ? FROM {s}.runs WHERE id IN (SELECT run_id FROM {s}.records UNION"
                 f" SELECT run_id FROM {s}.tests) ON CONFLICT DO NOTHING", (__version__,))
    conn.execute(f"INSERT INTO {runs} (old, new) SELECT o.id, m.id FROM {s}.runs o"
                 " JOIN main.runs m ON m.run_uuid = o.run_uuid")

    before = conn.total_changes
    joins, values = [], []
    for n, (column, kind) in enumerate(_RECORD_REFERENCES.items()):
        alias = f"m{n}"
        joins.append(f" LEFT JOIN temp.combine_{kind}_map {alias} ON {alias}.old = o.{column}")
        values.append(f"{alias}.new")
    conn.execute(
        f"INSERT INTO main.records (run_id, {', '.join(_RECORD_PLAIN)},"
        f" {', '.join(_RECORD_REFERENCES)}) SELECT r.new,"
        f" {', '.join('o.' + c for c in _RECORD_PLAIN)}, {', '.join(values)}"
        f" FROM {s}.records o JOIN {runs} r ON r.old = o.run_id{''.join(joins)}"
        " WHERE true ORDER BY o.started_ns, o.id ON CONFLICT(record_uuid) DO NOTHING")
    added = conn.total_changes - before

    conn.execute("INSERT INTO main.tests (run_id, nodeid, started_ns, finished_ns, outcome,"
                 " worker) SELECT r.new, o.nodeid, o.started_ns, o.finished_ns, o.outcome,"
                 f" o.worker FROM {s}.tests o JOIN {runs} r ON r.old = o.run_id"
                 " WHERE true ORDER BY o.started_ns, o.id ON CONFLICT DO NOTHING")
    # `remember_states` keeps only settled states with a digest.
    conn.execute("INSERT OR REPLACE INTO main.seen_states (file_id, state_id)"
                 f" SELECT f.new, st.new FROM {s}.seen_states o JOIN {s}.file_states x"
                 f" ON x.id = o.state_id JOIN {files} f ON f.old = o.file_id"
                 f" JOIN {states} st ON st.old = o.state_id"
                 " WHERE x.settled != 0 AND x.digest != ''")
    _copy_findings_and_roots(conn)
    return added


def _copy_compilers(conn: sqlite3.Connection, compilers: str) -> None:
    """Compilers by digest, each after its host compiler (whose id it holds): in rounds, as
    many as the deepest chain of host compilers."""
    s = SOURCE
    columns = ", ".join(_COMPILER_COLUMNS)
    while True:
        conn.execute(
            f"INSERT INTO main.compilers (digest, {columns}, host_id) SELECT o.digest,"
            f" {', '.join('o.' + c for c in _COMPILER_COLUMNS)}, h.new FROM {s}.compilers o"
            f" LEFT JOIN {compilers} h ON h.old = o.host_id"
            f" WHERE (o.host_id IS NULL OR h.new IS NOT NULL)"
            f" AND o.id NOT IN (SELECT old FROM {compilers}) ON CONFLICT(digest) DO NOTHING")
        before = conn.total_changes
        conn.execute(
            f"INSERT INTO {compilers} (old, new) SELECT o.id, m.id FROM {s}.compilers o"
            f" JOIN main.compilers m ON m.digest = o.digest"
            f" WHERE o.id NOT IN (SELECT old FROM {compilers})"
            f" AND (o.host_id IS NULL OR o.host_id IN (SELECT old FROM {compilers}))")
        if conn.total_changes == before:
            return


def _copy_findings_and_roots(conn: sqlite3.Connection) -> None:
    s = SOURCE
    columns = ", ".join(_FINDING_COLUMNS)
    partition = ", ".join(_FINDING_KEY)
    present = " AND ".join(f"m.{c} IS o.{c}" for c in _FINDING_KEY)
    # PARTITION BY groups NULLs together, as the `IS` of the per-record test does.
    conn.execute(
        f"INSERT INTO main.findings ({columns}) SELECT {columns} FROM (SELECT o.*,"
        f" row_number() OVER (PARTITION BY {partition} ORDER BY o.id) AS nth"
        f" FROM {s}.findings o WHERE NOT EXISTS (SELECT 1 FROM main.findings m"
        f" WHERE {present})) WHERE nth = 1 ORDER BY id")
    conn.execute("INSERT INTO main.cache_roots (path, layout, last_scan_ns)"
                 f" SELECT path, layout, last_scan_ns FROM {s}.cache_roots WHERE true"
                 " ON CONFLICT(path) DO UPDATE SET layout = excluded.layout,"
                 " last_scan_ns = excluded.last_scan_ns"
                 " WHERE excluded.last_scan_ns > cache_roots.last_scan_ns")
