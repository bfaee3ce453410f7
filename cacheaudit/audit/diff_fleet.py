"""How `diff --by-host` reads a fleet: one combined ledger, or each host's own ledger read in
place (no `combine` first), every successful compile reduced to its kernel identity, its host
and a signature of content classes, compared while it is read.

Each source is attached read-only to a scratch database in turn. Content is classed once for
the whole fleet: a graph by its digest (the digest covers its members' paths and states, so one
digest is one content), the first time a digest is met by its members' paths and digests (not
their stat fields: a header installed at another time on another host is the same header); a
compiler by what it is (binary digest, version, host compiler; not its mtime); a JSON value
(options, environment) by its digest.

Pass one reads each source run by run. The first compile of a kernel is its reference (host and
signature); later compiles are compared with it inside SQLite, and only those that tell
something new come back to Python: a kernel not seen before, a signature other than the
reference's, or a second host. A fleet that agrees costs one indexed lookup a compile and
returns almost nothing; one that does not returns its odd compiles. Pass two reads back, from
each source, only the compiles of the kernels whose signatures differ between hosts.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import xxhash

from cacheaudit.exceptions import LedgerError
from cacheaudit.ledger.opening import attach_read_only
from cacheaudit.ledger.schema import SCHEMA_VERSION
from cacheaudit.ledger.spool import open_ledger, pending_spooled
from cacheaudit.model import json_digest

SIGNATURE_PARTS = ("compiler", "options", "environment", "sources", "graph", "binary")

Identity = tuple[str | None, str | None, str | None]
"""A kernel as the hosts are compared on it: runtime, kernel, key."""

SOURCE = "fleet_source"

_SUCCESSFUL = ("r.event = 'compile' AND coalesce(r.exit_code, 0) = 0 AND r.signal IS NULL")
"""The compiles compared: successful ones (a failed compile produced no binary to serve)."""

_SIGNATURE = ("ifnull(hc.cls, 0)", "ifnull(bo.id, 0)", "ifnull(be.id, 0)", "ifnull(gs.inputs, 0)",
              "ifnull(gg.inputs, 0)", "ifnull(go.binary, 0)")
"""A compile's signature, part by part (`SIGNATURE_PARTS`), over `_CLASS_JOINS`."""
_SIGNATURE_COLUMNS = ", ".join(_SIGNATURE)
_SAME = " AND ".join(f"k.{part} = {value}" for part, value in zip("coesgb", _SIGNATURE,
                                                                  strict=True))
"""A compile's signature equal to its kernel's reference (`temp.kernels` k)."""

_VALUE_JOINS = (
    " LEFT JOIN temp.host_compilers hc ON hc.id = r.compiler_id"
    " LEFT JOIN fleet_source.blobs xo ON xo.id = r.effective_argv_id"
    " LEFT JOIN temp.blob_classes bo ON bo.digest = xo.digest"
    " LEFT JOIN fleet_source.blobs xe ON xe.id = r.env_id"
    " LEFT JOIN temp.blob_classes be ON be.digest = xe.digest")

_CLASS_JOINS = _VALUE_JOINS + (
    " LEFT JOIN temp.host_graphs gs ON gs.id = r.sources_id"
    " LEFT JOIN temp.host_graphs gg ON gg.id = r.graph_id"
    " LEFT JOIN temp.host_graphs go ON go.id = r.outputs_id")
"""The joins `_SIGNATURE` reads, through the source's graphs mapped once (`host_graphs`)."""

_CLASS_JOINS_BY_DIGEST = _VALUE_JOINS + "".join(
    f" LEFT JOIN fleet_source.graphs x{alias} ON x{alias}.id = r.{column}"
    f" LEFT JOIN temp.graph_classes {alias} ON {alias}.digest = x{alias}.digest"
    for alias, column in (("gs", "sources_id"), ("gg", "graph_id"), ("go", "outputs_id")))
"""The same joins for a few compiles, through each graph's digest (classed in pass one)."""

_SCRATCH = """
CREATE TABLE temp.kernels (id INTEGER PRIMARY KEY, runtime TEXT, kernel TEXT, key TEXT,
    host TEXT NOT NULL, many INTEGER NOT NULL, c INTEGER NOT NULL, o INTEGER NOT NULL,
    e INTEGER NOT NULL, s INTEGER NOT NULL, g INTEGER NOT NULL, b INTEGER NOT NULL);
CREATE INDEX temp.kernels_by_identity ON kernels (kernel, runtime, key);
CREATE TABLE temp.graph_classes (digest TEXT PRIMARY KEY, inputs INTEGER NOT NULL,
    binary INTEGER NOT NULL) WITHOUT ROWID;
CREATE TABLE temp.blob_classes (id INTEGER PRIMARY KEY, digest TEXT NOT NULL UNIQUE);
CREATE TABLE temp.host_graphs (id INTEGER PRIMARY KEY, inputs INTEGER, binary INTEGER);
CREATE TABLE temp.host_compilers (id INTEGER PRIMARY KEY, cls INTEGER NOT NULL);
CREATE TABLE temp.new_graphs (id INTEGER PRIMARY KEY, digest TEXT NOT NULL);
CREATE TABLE temp.wanted (runtime TEXT, kernel TEXT, key TEXT);
"""


class UnreadableSource(Exception):
    """A source that is not a ledger this cacheaudit reads (another schema, another database)."""


class HostCompile(NamedTuple):
    """One compile as `diff --by-host` compares it: the kernel's identity, the host, and its
    inputs and binary as class ids (`signature`: equal ids, equal content, in the order of
    `SIGNATURE_PARTS`), the record's id and the source ledger that holds it."""

    identity: Identity
    host: str
    signature: tuple[int, ...]
    record_uuid: str
    source: str


@dataclass
class KernelSummary:
    """What pass one keeps of a kernel: its first compile's host and signature (the reference),
    every signature seen, and whether another host built it too."""

    row: int  # its id in the scratch `kernels` table
    host: str
    signatures: set[tuple[int, ...]] = field(default_factory=set)
    many_hosts: bool = False


@dataclass
class FleetRead:
    """Pass one over every source: the hosts, the compiles and each kernel's summary."""

    sources: list[str]
    skipped: list[str]
    hosts: set[str]
    compiles: int
    kernels: dict[Identity, KernelSummary]


class FleetReader:
    """The scratch database and the fleet-wide content classes, for one `diff --by-host`."""

    def __init__(self, sources: Sequence[str]) -> None:
        self.sources = [os.path.abspath(s) for s in sources]
        # An unnamed database: SQLite's own temporary file, removed when it is closed.
        self.conn = sqlite3.connect("", uri=True, isolation_level=None)
        self.conn.executescript(_SCRATCH)
        self._contents: dict[str, dict[bytes, int]] = {"inputs": {}, "binary": {}}
        self._compilers: dict[str, int] = {}

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> FleetReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- pass one

    def read(self) -> FleetRead:
        readable, skipped = [], []
        self._kernels: dict[Identity, KernelSummary] = {}
        self._hosts: set[str] = set()
        self._compiles = 0
        for path in self.sources:
            self._undo: list[Callable[[], object]] = []
            try:
                with self._attached(path):
                    self._class_source()
                    runs = [run for (run,) in self.conn.execute(f"SELECT id FROM {SOURCE}.runs")]
                    for run in runs:
                        self._fold(run)
            except (sqlite3.Error, OSError, LedgerError, UnreadableSource) as exc:
                for step in reversed(self._undo):  # what its earlier runs added, taken back
                    step()
                skipped.append(f"{path}: {_why(exc)}")
                continue
            readable.append(path)
        self.sources = readable
        return FleetRead(readable, skipped, self._hosts, self._compiles, self._kernels)

    def _fold(self, run: int) -> None:
        """One run's compiles of the attached source compared with their kernels' references;
        what is new is kept (`KernelSummary`) and written back for the next run's comparison."""
        conn, undo = self.conn, self._undo
        for host, count in conn.execute(
                f"SELECT ifnull(r.host, ''), count(*) FROM {SOURCE}.records r"
                f" WHERE r.run_id = ? AND {_SUCCESSFUL} GROUP BY r.host", (run,)):
            if host not in self._hosts:
                self._hosts.add(host)
                undo.append(functools.partial(self._hosts.discard, host))
            self._compiles += count
            undo.append(functools.partial(self._uncount, count))
        rows = conn.execute(
            f"SELECT r.runtime, r.kernel, r.key, ifnull(r.host, ''), {_SIGNATURE_COLUMNS}"
            f" FROM {SOURCE}.records r{_CLASS_JOINS} LEFT JOIN temp.kernels k"
            " ON k.kernel IS r.kernel AND k.runtime IS r.runtime AND k.key IS r.key"
            f" WHERE r.run_id = ? AND {_SUCCESSFUL} AND (k.id IS NULL OR NOT ({_SAME})"
            " OR (k.many = 0 AND k.host != ifnull(r.host, '')))", (run,)).fetchall()
        new, flagged = [], []
        for runtime, kernel, key, host, *parts in rows:
            signature = tuple(parts)
            summary = self._kernels.get((runtime, kernel, key))
            if summary is None:
                summary = KernelSummary(len(self._kernels) + 1, host, {signature})
                self._kernels[(runtime, kernel, key)] = summary
                undo.append(functools.partial(self._kernels.pop, (runtime, kernel, key)))
                new.append((summary.row, runtime, kernel, key, host, *signature))
                continue
            if signature not in summary.signatures:
                summary.signatures.add(signature)
                undo.append(functools.partial(summary.signatures.discard, signature))
            if not summary.many_hosts and host != summary.host:
                summary.many_hosts = True
                undo.append(functools.partial(setattr, summary, "many_hosts", False))
                flagged.append((summary.row,))
        conn.executemany("INSERT INTO temp.kernels (id, runtime, kernel, key, host, many, c, o,"
                         " e, s, g, b) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?, ?, ?)", new)
        conn.executemany("UPDATE temp.kernels SET many = 1 WHERE id = ?", flagged)

    def _uncount(self, count: int) -> None:
        self._compiles -= count

    # ---------------------------------------------------------------- pass two

    def compiles_of(self, identities: Sequence[Identity]) -> Iterator[HostCompile]:
        """Every successful compile of `identities` in every source, as `HostCompile`s, in each
        source's order of host and start."""
        if not identities:
            return
        for path in self.sources:
            self._undo: list[Callable[[], object]] = []
            try:
                with self._attached(path):
                    self._class_compilers()
                    self.conn.execute("DELETE FROM temp.wanted")
                    self.conn.executemany(
                        "INSERT INTO temp.wanted (runtime, kernel, key) VALUES (?, ?, ?)",
                        identities)
                    rows = self.conn.execute(
                        f"SELECT r.runtime, r.kernel, r.key, ifnull(r.host, ''),"
                        f" {_SIGNATURE_COLUMNS}, r.record_uuid"
                        f" FROM temp.wanted w JOIN fleet_source.records r"
                        " ON r.kernel IS w.kernel AND r.runtime IS w.runtime AND r.key IS w.key"
                        f"{_CLASS_JOINS_BY_DIGEST} WHERE {_SUCCESSFUL}"
                        " ORDER BY r.host, r.started_ns, r.id").fetchall()
            except (sqlite3.Error, OSError, LedgerError, UnreadableSource):
                continue  # read in pass one; one that turned unreadable since is left out
            for runtime, kernel, key, host, *signature, uuid in rows:
                yield HostCompile((runtime, kernel, key), host, tuple(signature), uuid, path)

    # ---------------------------------------------------------------- classes

    @contextlib.contextmanager
    def _attached(self, path: str) -> Iterator[None]:
        """`path` attached read-only, inside one read transaction (one snapshot of it)."""
        if not os.path.isfile(path):
            raise OSError(f"no such ledger file: {path}")
        if pending_spooled(path):
            _open_as_readers_do(path)
            if left := pending_spooled(path):  # busy, or read-only: never a partial read
                raise UnreadableSource(f"{left} spooled record(s) could not be folded in (the "
                                       "ledger is busy or read-only)")
        self._attach(path)
        try:
            version = self._source_version(path)
            if version != SCHEMA_VERSION:
                self.conn.execute(f"DETACH DATABASE {SOURCE}")
                _open_as_readers_do(path)  # upgrades it, as any reader of it would
                self._attach(path)
                if self._source_version(path) != SCHEMA_VERSION:
                    raise UnreadableSource(f"schema version {version}, not {SCHEMA_VERSION}")
            self.conn.execute("BEGIN")
            try:
                yield
            except BaseException:
                self.conn.execute("ROLLBACK")  # the scratch tables; `read` undoes the rest
                raise
            self.conn.execute("COMMIT")
        finally:
            with contextlib.suppress(sqlite3.Error):
                self.conn.execute(f"DETACH DATABASE {SOURCE}")

    def _attach(self, path: str) -> None:
        attach_read_only(self.conn, path, SOURCE)

    def _source_version(self, path: str) -> int | None:
        try:
            row = self.conn.execute(
                f"SELECT value FROM {SOURCE}.meta WHERE key = 'schema_version'").fetchone()
        except sqlite3.DatabaseError as exc:
            raise UnreadableSource(f"not a cacheaudit ledger ({exc})") from exc
        return int(row[0]) if row else None

    def _class_source(self) -> None:
        """The attached source's compilers, graphs and values mapped to the fleet's classes."""
        conn = self.conn
        self._class_compilers()
        conn.execute(f"INSERT OR IGNORE INTO temp.blob_classes (digest) SELECT digest FROM"
                     f" {SOURCE}.blobs")
        conn.execute("DELETE FROM temp.host_graphs")
        conn.execute(f"INSERT INTO temp.host_graphs (id, inputs, binary) SELECT g.id, c.inputs,"
                     f" c.binary FROM {SOURCE}.graphs g LEFT JOIN temp.graph_classes c"
                     " ON c.digest = g.digest")
        conn.execute("DELETE FROM temp.new_graphs")
        conn.execute(f"INSERT INTO temp.new_graphs (id, digest) SELECT h.id, g.digest FROM"
                     f" temp.host_graphs h JOIN {SOURCE}.graphs g ON g.id = h.id"
                     " WHERE h.inputs IS NULL")
        classed = list(self._new_graph_classes())
        conn.executemany("INSERT OR IGNORE INTO temp.graph_classes (digest, inputs, binary)"
                         " VALUES (?, ?, ?)", ((d, i, b) for _id, d, i, b in classed))
        conn.executemany("UPDATE temp.host_graphs SET inputs = ?, binary = ? WHERE id = ?",
                         ((i, b, graph_id) for graph_id, _d, i, b in classed))

    def _class_compilers(self) -> None:
        self.conn.execute("DELETE FROM temp.host_compilers")
        self.conn.executemany("INSERT INTO temp.host_compilers (id, cls) VALUES (?, ?)",
                              self._compiler_classes())

    def _new_graph_classes(self) -> Iterator[tuple[int, str, int, int]]:
        """For each graph digest met for the first time: its class as inputs (members' paths,
        presence and digests, in the compiler's order) and as a binary (digests alone: the same
        bytes under another cache path are the same binary)."""
        rows = self.conn.execute(
            f"SELECT n.id, n.digest, f.path, s.present, s.digest FROM temp.new_graphs n"
            f" LEFT JOIN {SOURCE}.graph_files m ON m.graph_id = n.id"
            f" LEFT JOIN {SOURCE}.file_states s ON s.id = m.state_id"
            f" LEFT JOIN {SOURCE}.files f ON f.id = s.file_id ORDER BY n.id, m.position")
        current: int | None = None
        digest = ""
        inputs, binary = xxhash.xxh3_128(), xxhash.xxh3_128()
        for graph_id, graph_digest, path, present, member_digest in rows:
            if graph_id != current:
                if current is not None:
                    yield (current, digest, self._class("inputs", inputs),
                           self._class("binary", binary))
                current, digest = graph_id, graph_digest
                inputs, binary = xxhash.xxh3_128(), xxhash.xxh3_128()
            if path is not None:
                inputs.update(f"{path} {present} {member_digest}\n".encode(
                    "utf-8", "surrogateescape"))
                binary.update(f"{member_digest}\n".encode("utf-8", "surrogateescape"))
        if current is not None:
            yield current, digest, self._class("inputs", inputs), self._class("binary", binary)

    def _class(self, kind: str, content: xxhash.xxh3_128) -> int:
        classes = self._contents[kind]
        return classes.setdefault(content.digest(), len(classes) + 1)

    def _compiler_classes(self) -> list[tuple[int, int]]:
        rows = self.conn.execute(f"SELECT id, resolved, binary_digest, version_text, host_id"
                                 f" FROM {SOURCE}.compilers").fetchall()
        by_id = {row[0]: row for row in rows}
        memo: dict[int, str] = {}

        def identity(compiler_id: int, depth: int = 0) -> str:
            if compiler_id not in memo:
                _id, resolved, digest, version, host_id = by_id[compiler_id]
                host = identity(host_id, depth + 1) if host_id in by_id and depth < 4 else None
                memo[compiler_id] = json_digest([resolved, digest, version, host])
            return memo[compiler_id]

        return [(compiler_id, self._compilers.setdefault(identity(compiler_id),
                                                         len(self._compilers) + 1))
                for compiler_id in by_id]


def _open_as_readers_do(path: str) -> None:
    """`open_ledger` once: it folds spooled records in and upgrades an older schema, so that
    nothing recorded is left out; a source that needs neither is read as it lies, unwritten."""
    with open_ledger(path, create=False):
        pass


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
