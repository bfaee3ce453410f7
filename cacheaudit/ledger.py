"""The ledger: one SQLite file of runs, compilers, file states, include graphs, records, findings.

Content-addressed where it pays: a file path, a file state, an include graph, a compiler identity
and a JSON value (argv, environment) are each stored once and referenced, since thousands of kernels
share one CUTLASS graph and one set of flags. Short write transactions in WAL mode let many shim
processes share one file on local disk; long-lived parallel writers (pytest-xdist workers, ranks)
keep one file each and `combine` them afterwards.

Writes run on the stdlib `sqlite3` connection: the shim writes one record per compile and importing
sqlite-utils costs ~200 ms there (it probes for numpy). Schema creation, migrations and the query
helpers go through sqlite-utils on the same connection.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from cacheaudit import __version__
from cacheaudit.exceptions import LedgerError
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    Finding,
    GraphFile,
    IncludeGraph,
    content_digest,
    split_stored_extra,
)

if TYPE_CHECKING:
    import sqlite_utils

APPLICATION_ID = 0x43414144  # "CAAD": lets `file` and our own open() tell a ledger apart.

# The schema, one statement per table, each column commented. Statements are separated by ";\n"
# and no comment may contain a semicolon: `_statements` splits on it.
#
# Schema history:
#   1 (0.1.0): first version.
#   2: indexes on records by run and by test (audit_run and the pytest fixture read by them).
SCHEMA_VERSION = 2

SCHEMA = """
-- Properties of this ledger file: schema_version, ledger_id, created_at, created_by.
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- One process tree that produced records: a pytest session, a `cacheaudit run`, or the parent
-- process of a compiler shim when nothing set CACHEAUDIT_RUN.
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY,
    run_uuid TEXT NOT NULL UNIQUE,          -- CACHEAUDIT_RUN, or host:ppid:parent-start-time
    started_ns INTEGER NOT NULL,            -- wall clock, ns since the epoch
    host TEXT NOT NULL,                     -- socket.gethostname()
    pid INTEGER NOT NULL,                   -- pid of the process that opened the run
    label TEXT NOT NULL,                    -- 'shim', 'pytest', 'run', 'scan', ...
    command TEXT,                           -- JSON argv of that process, when known
    cacheaudit_version TEXT NOT NULL
);

-- Every path mentioned anywhere, stored once: realpaths, paths as a compiler wrote them, entries.
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY,
    path TEXT NOT NULL UNIQUE
);

-- What a file was at one moment. Identical observations share a row.
CREATE TABLE IF NOT EXISTS file_states (
    id INTEGER PRIMARY KEY,
    file_id INTEGER NOT NULL REFERENCES files(id),
    present INTEGER NOT NULL,               -- 0 when the file did not exist
    size INTEGER NOT NULL,                  -- bytes, -1 when absent
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    inode INTEGER NOT NULL,
    digest TEXT NOT NULL,                   -- xxh3-128 hex of the content, '' when unreadable
    settled INTEGER NOT NULL,               -- 0 when captured inside the timestamp window
    error TEXT NOT NULL,                    -- why it could not be read, '' when it could
    UNIQUE (file_id, present, size, mtime_ns, ctime_ns, inode, digest, settled, error)
);

-- An include graph (or a set of sources or outputs), content-addressed by its digest.
CREATE TABLE IF NOT EXISTS graphs (
    id INTEGER PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,            -- model.IncludeGraph.digest
    method TEXT NOT NULL,                   -- how it was obtained: 'nvcc -M', 'g++ -M', ...
    file_count INTEGER NOT NULL
);

-- The members of a graph in the compiler's order.
CREATE TABLE IF NOT EXISTS graph_files (
    graph_id INTEGER NOT NULL REFERENCES graphs(id),
    position INTEGER NOT NULL,
    state_id INTEGER NOT NULL REFERENCES file_states(id),
    written_id INTEGER NOT NULL REFERENCES files(id),  -- the path as the compiler printed it
    PRIMARY KEY (graph_id, position)
) WITHOUT ROWID;

-- Compiler identities: a host compiler is a row of its own referenced by host_id.
CREATE TABLE IF NOT EXISTS compilers (
    id INTEGER PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,            -- over every column below
    invoked TEXT NOT NULL,                  -- argv[0] as the runtime gave it
    path TEXT NOT NULL,                     -- found along PATH
    resolved TEXT NOT NULL,                 -- the real binary behind symlinks and wrapper scripts
    wrappers TEXT NOT NULL,                 -- JSON list of wrapper scripts, outermost first
    kind TEXT NOT NULL,                     -- nvcc, gcc, clang, hipcc, unknown
    version_text TEXT NOT NULL,             -- full `--version` output
    binary_digest TEXT,                     -- xxh3-128 of the resolved binary
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    host_id INTEGER REFERENCES compilers(id),
    error TEXT
);

-- JSON values shared between records: argv, effective argv, environment, tracked sets, notes.
CREATE TABLE IF NOT EXISTS blobs (
    id INTEGER PRIMARY KEY,
    digest TEXT NOT NULL UNIQUE,
    body TEXT NOT NULL
);

-- One observed compile or cache lookup: the four answers of the design card.
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY,
    record_uuid TEXT NOT NULL UNIQUE,       -- survives `combine`
    run_id INTEGER NOT NULL REFERENCES runs(id),
    event TEXT NOT NULL CHECK (event IN ('compile', 'disk-hit', 'memory-hit')),
    runtime TEXT,                           -- deepjit, torch-ext, triton, ... or NULL if unknown
    kernel TEXT,                            -- the runtime's name for the kernel
    key TEXT,                               -- the runtime's cache key, when it has one
    entry_id INTEGER REFERENCES files(id),  -- the cache entry the record belongs to
    compiler_id INTEGER REFERENCES compilers(id),
    argv_id INTEGER REFERENCES blobs(id),            -- JSON list, argv[0] excluded
    effective_argv_id INTEGER REFERENCES blobs(id),  -- JSON list of [token, origin]
    env_id INTEGER REFERENCES blobs(id),             -- JSON object, registry variables only
    cwd_id INTEGER REFERENCES files(id),
    sources_id INTEGER REFERENCES graphs(id),        -- the primary source files
    graph_id INTEGER REFERENCES graphs(id),          -- everything else the compiler read
    outputs_id INTEGER REFERENCES graphs(id),        -- what the compile wrote
    tracked_id INTEGER REFERENCES blobs(id),         -- JSON list of paths the key covers
    exit_code INTEGER,
    signal INTEGER,                         -- the signal that ended the compiler, if any
    started_ns INTEGER NOT NULL,
    duration_ns INTEGER NOT NULL,
    pid INTEGER NOT NULL,
    host TEXT NOT NULL,
    test_id TEXT,                           -- pytest node id, when recorded under the plugin
    observer TEXT NOT NULL,                 -- shim, adapter:<runtime>, reader:<layout>
    notes_id INTEGER REFERENCES blobs(id),           -- JSON list of recording problems
    extra_id INTEGER REFERENCES blobs(id)            -- JSON object, observer-specific facts
);

CREATE INDEX IF NOT EXISTS records_by_kernel ON records (runtime, kernel, started_ns);

CREATE INDEX IF NOT EXISTS records_by_key ON records (key);

CREATE INDEX IF NOT EXISTS records_by_entry ON records (entry_id);

CREATE INDEX IF NOT EXISTS records_by_run ON records (run_id, started_ns);

CREATE INDEX IF NOT EXISTS records_by_test ON records (test_id) WHERE test_id IS NOT NULL;

-- Verdicts of an audit, each with its evidence.
CREATE TABLE IF NOT EXISTS findings (
    id INTEGER PRIMARY KEY,
    audit_uuid TEXT NOT NULL,               -- one audit pass
    found_ns INTEGER NOT NULL,
    code TEXT NOT NULL,                     -- CA101 ...
    severity TEXT NOT NULL,
    subject TEXT NOT NULL,                  -- the file or variable
    message TEXT NOT NULL,
    recorded TEXT,                          -- the value at build time
    current TEXT,                           -- the value now
    how TEXT NOT NULL,                      -- how it was established
    inferred INTEGER NOT NULL,              -- 1 when inferred from timestamps, not content
    record_uuid TEXT,
    entry TEXT,
    runtime TEXT,
    kernel TEXT,
    hint TEXT NOT NULL
);

CREATE INDEX IF NOT EXISTS findings_by_audit ON findings (audit_uuid);

-- Tests of a pytest session: when each ran, so that a cache hit (DeepJIT touches .committed) can
-- be attributed to the test that caused it.
CREATE TABLE IF NOT EXISTS tests (
    id INTEGER PRIMARY KEY,
    run_id INTEGER NOT NULL REFERENCES runs(id),
    nodeid TEXT NOT NULL,
    started_ns INTEGER NOT NULL,
    finished_ns INTEGER NOT NULL,
    outcome TEXT NOT NULL,                  -- passed, failed, skipped
    worker TEXT NOT NULL,                   -- pytest-xdist worker id, '' without xdist
    UNIQUE (run_id, nodeid, started_ns)
);

-- Cache roots scans have found: a later audit of a run looks there for entries the run hit
-- without leaving a record (DeepJIT's disk hits only touch .committed).
CREATE TABLE IF NOT EXISTS cache_roots (
    path TEXT PRIMARY KEY,
    layout TEXT NOT NULL,
    last_scan_ns INTEGER NOT NULL
);

-- The last state a scan saw of each cache file (entry binaries and sources): the next scan
-- verifies them by one stat instead of reading them again.
CREATE TABLE IF NOT EXISTS seen_states (
    file_id INTEGER PRIMARY KEY REFERENCES files(id),
    state_id INTEGER NOT NULL REFERENCES file_states(id)
)
"""

BUSY_TIMEOUT_S = 30.0
_RETRY_DEADLINE_S = 60.0

T = TypeVar("T")


def _statements(schema: str) -> list[str]:
    return [s.strip() for s in schema.split(";\n") if s.strip()]


def default_ledger_path(env: Mapping[str, str] | None = None) -> str:
    """CACHEAUDIT_LEDGER, else `$XDG_CACHE_HOME/cacheaudit/ledger.db`, else ~/.cache/..."""
    env = os.environ if env is None else env
    explicit = env.get("CACHEAUDIT_LEDGER")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    cache_home = env.get("XDG_CACHE_HOME")
    if not cache_home or not os.path.isabs(cache_home):
        # The XDG spec: a relative value is invalid and must be ignored.
        cache_home = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "cacheaudit", "ledger.db")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _retrying(action: Callable[[], T], deadline_s: float = _RETRY_DEADLINE_S) -> T:
    """Run `action`, retrying with jittered backoff while another writer holds the lock.

    The busy timeout already waits inside SQLite; this outer loop covers the cases where SQLite
    gives up at once (a deadlock between two readers upgrading to writers, say).
    """
    deadline = time.monotonic() + deadline_s
    delay = 0.005
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 0.5)


class Attribution(NamedTuple):
    """What an audit learnt about a compile record: the entry it built, and so its runtime,
    kernel and key."""

    record_uuid: str
    runtime: str
    kernel: str
    key: str | None
    entry: str


@dataclass(frozen=True)
class RunInfo:
    """The process tree a record belongs to."""

    run_uuid: str
    label: str
    started_ns: int = field(default_factory=time.time_ns)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    command: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TestWindow:
    """When one test ran: the interval that a disk hit's timestamp is matched against."""

    nodeid: str
    started_ns: int
    finished_ns: int
    outcome: str = ""
    worker: str = ""
    run_uuid: str = ""


def _blob_json(value: Any) -> str:
    # ASCII escapes carry surrogate-escaped bytes (undecodable paths) through SQLite's UTF-8 TEXT.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _storable(value: Any) -> Any:
    """A str SQLite can hold: paths and compiler output may carry undecodable bytes as surrogate
    escapes, which UTF-8 TEXT refuses; those are stored as their original bytes instead."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return os.fsencode(value)
    return value


def _params(values: Sequence[Any]) -> tuple[Any, ...]:
    return tuple(_storable(v) for v in values)


def _text(value: Any) -> Any:
    return os.fsdecode(value) if isinstance(value, bytes) else value


def _texts(row: Sequence[Any]) -> Sequence[Any]:
    # Nearly every row is plain text: convert only when an undecodable path is present.
    if any(type(v) is bytes for v in row):
        return [_text(v) for v in row]
    return row


Row = sqlite3.Row | dict[str, Any]
"""A row read by column name (the `AS` name where the query gives one), never by position: an
`sqlite3.Row`, or a dict where an undecodable path had to be turned back into the str it was
stored from."""


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    rows = cursor.execute(sql, params).fetchall()
    if not rows or not any(type(v) is bytes for row in rows for v in row):
        return rows
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, _texts(row), strict=True)) for row in rows]


def _row(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Row | None:
    found = _rows(conn, sql, params)
    return found[0] if found else None


def _named_params(row: Row) -> Row:
    """A row read back as the named parameters of a statement that stores it again."""
    # An sqlite3.Row iterates over its values: its names come from keys().
    return {name: _storable(row[name]) for name in row.keys()}  # noqa: SIM118


def _select_list(*columns: str) -> str:
    """`t.name AS name, ...`: each column named for `Row` access (an explicit `AS` kept), since
    SQLite leaves a result column's name unspecified without one."""
    return ", ".join(c if " AS " in c else f"{c} AS {c.rsplit('.', 1)[-1]}" for c in columns)


_STATE_COLUMNS = _select_list("f.path", "s.present", "s.size", "s.mtime_ns", "s.ctime_ns",
                              "s.inode", "s.digest", "s.settled", "s.error")
"""A file state's columns, from `file_states s JOIN files f`."""


def _state_from_row(row: Row) -> FileState:
    return FileState(row["path"], bool(row["present"]), row["size"], row["mtime_ns"],
                     row["ctime_ns"], row["inode"], row["digest"] or None, bool(row["settled"]),
                     row["error"] or None)


def _value(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    """The one column of the first row of `sql`, None when there is no row."""
    row = _row(conn, sql, params)
    if row is None:
        return None
    (name,) = row.keys()
    return row[name]



def _chunks(values: Iterable[Any], size: int = 500) -> Iterator[list[Any]]:
    """`values` without repeats, sorted, in lists short enough for one `IN (...)` each (SQLite
    caps the parameters of a statement)."""
    wanted = sorted(set(values))
    for start in range(0, len(wanted), size):
        yield wanted[start:start + size]


class Ledger:
    """An open ledger file. Use `Ledger.open()`; close it, or use it as a context manager."""

    def __init__(self, path: str, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn
        self._ids: dict[tuple[str, str], int] = {}
        self._graph_cache: dict[int, IncludeGraph] = {}
        self._compiler_cache: dict[int, CompilerIdentity] = {}
        self._blob_cache: dict[int, Any] = {}
        # (runtime, kernel, key, entry, record_uuid) waiting for a write transaction

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, path: str | None = None, *, create: bool = True) -> Ledger:
        """Open (and with `create`, make or upgrade) the ledger at `path` or the default place."""
        path = os.path.abspath(path or default_ledger_path())
        exists = os.path.exists(path)
        if not exists and not create:
            raise LedgerError(f"no ledger at {path}")
        if exists and os.path.isdir(path):
            raise LedgerError(f"{path} is a directory, not a cacheaudit ledger")
        if not exists:
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
            except OSError as exc:
                raise LedgerError(f"cannot create a ledger at {path}: {exc.strerror}") from exc
        try:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open {path}: {exc}") from exc
        ledger = cls(path, conn)
        try:
            ledger._prepare(create)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise LedgerError(
                    f"{path} is not a cacheaudit ledger (not an SQLite file)") from exc
            raise LedgerError(f"cannot use ledger {path}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return ledger

    def _prepare(self, create: bool) -> None:
        conn = self.conn
        conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        # In WAL mode NORMAL never corrupts; a power cut may lose the last records, which an
        # auditor can afford, while an fsync per compile record it cannot.
        conn.execute("PRAGMA synchronous = NORMAL")
        version = self._schema_version()
        if version == SCHEMA_VERSION:
            return
        if version is not None and version > SCHEMA_VERSION:
            raise LedgerError(
                f"{self.path} has ledger schema version {version}, newer than this cacheaudit "
                f"({__version__}) understands ({SCHEMA_VERSION}); upgrade cacheaudit")
        if version is None and not create:
            raise LedgerError(
                f"{self.path} is empty or not a cacheaudit ledger yet; run `cacheaudit scan` "
                "or record into it first")
        # An older ledger is upgraded by whoever opens it first, reader or writer: the records
        # in it stay readable only through the current schema.
        _retrying(lambda: _enable_wal(conn))
        _retrying(self._migrate)

    def _schema_version(self) -> int | None:
        """The schema version, None for an empty file; LedgerError for a foreign database."""
        tables = {row["name"] for row in _rows(
            self.conn, "SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return None
        application_id = _value(self.conn, "PRAGMA application_id")
        if "meta" not in tables or application_id != APPLICATION_ID:
            raise LedgerError(
                f"{self.path} is an SQLite database but not a cacheaudit ledger "
                f"(tables: {', '.join(sorted(tables)[:5])})")
        version = _value(self.conn, "SELECT value FROM meta WHERE key = 'schema_version'")
        if version is None:
            raise LedgerError(f"{self.path} is a damaged cacheaudit ledger: no schema version")
        return int(version)

    def _migrate(self) -> None:
        """Create or upgrade the schema under one write lock, so racing shims do it once."""
        import sqlite_utils

        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self._schema_version() != SCHEMA_VERSION:
                _MIGRATIONS.apply(sqlite_utils.Database(conn, execute_plugins=False))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            self._ids.clear()  # ids handed out inside the rolled-back transaction are void
            raise

    # ---------------------------------------------------------------- interning

    def _intern(self, kind: str, insert: str, select: str, params: tuple[Any, ...],
                memo_key: str, key_params: int | None = None) -> int:
        """The id of a row, inserting it first if new; `select` takes the first `key_params`
        of `params` (all of them by default)."""
        cached = self._ids.get((kind, memo_key))
        if cached is not None:
            return cached
        stored = _params(params)
        cursor = self.conn.execute(insert, stored)
        if cursor.rowcount == 1 and cursor.lastrowid:
            row_id = int(cursor.lastrowid)
        else:
            row_id = int(_value(self.conn, select, stored[:key_params]))
        self._ids[(kind, memo_key)] = row_id
        return row_id

    def _file_id(self, path: str) -> int:
        return self._intern("file", "INSERT INTO files (path) VALUES (?) ON CONFLICT DO NOTHING",
                            "SELECT id FROM files WHERE path = ?", (path,), path)

    def _state_id(self, state: FileState) -> int:
        params = (self._file_id(state.path), int(state.exists), state.size, state.mtime_ns,
                  state.ctime_ns, state.inode, state.digest or "", int(state.settled),
                  state.error or "")
        return self._intern(
            "state",
            "INSERT INTO file_states (file_id, present, size, mtime_ns, ctime_ns, inode,"
            " digest, settled, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            "SELECT id FROM file_states WHERE file_id = ? AND present = ? AND size = ? AND"
            " mtime_ns = ? AND ctime_ns = ? AND inode = ? AND digest = ? AND settled = ? AND"
            " error = ?",
            params, repr(params))

    def _graph_id(self, graph: IncludeGraph | None) -> int | None:
        if graph is None:
            return None
        digest = graph.digest
        cached = self._ids.get(("graph", digest))
        if cached is not None:
            return cached
        stored_id = _value(self.conn, "SELECT id FROM graphs WHERE digest = ?", (digest,))
        if stored_id is not None:
            self._ids[("graph", digest)] = int(stored_id)
            return int(stored_id)
        cursor = self.conn.execute(
            "INSERT INTO graphs (digest, method, file_count) VALUES (?, ?, ?)",
            (digest, graph.method, len(graph.files)))
        graph_id = int(cursor.lastrowid or 0)
        self.conn.executemany(
            "INSERT INTO graph_files (graph_id, position, state_id, written_id)"
            " VALUES (?, ?, ?, ?)",
            [(graph_id, position, self._state_id(f.state), self._file_id(f.written))
             for position, f in enumerate(graph.files)])
        self._ids[("graph", digest)] = graph_id
        return graph_id

    def _states_graph_id(self, states: Sequence[FileState], method: str) -> int | None:
        if not states:
            return None
        return self._graph_id(IncludeGraph(tuple(GraphFile(s, s.path) for s in states), method))

    def _blob_id(self, value: Any) -> int | None:
        if value is None:
            return None
        body = _blob_json(value)
        digest = content_digest(body.encode("utf-8", "surrogateescape"))
        return self._intern(
            "blob", "INSERT INTO blobs (digest, body) VALUES (?, ?) ON CONFLICT DO NOTHING",
            "SELECT id FROM blobs WHERE digest = ?", (digest, body), digest, key_params=1)

    def _compiler_id(self, compiler: CompilerIdentity | None) -> int | None:
        if compiler is None:
            return None
        digest = compiler.identity_digest
        cached = self._ids.get(("compiler", digest))
        if cached is not None:
            return cached
        host_id = self._compiler_id(compiler.host)
        self.conn.execute(
            "INSERT INTO compilers (digest, invoked, path, resolved, wrappers, kind,"
            " version_text, binary_digest, size, mtime_ns, host_id, error)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(digest) DO NOTHING",
            _params((digest, compiler.invoked, compiler.path, compiler.resolved,
             _blob_json(list(compiler.wrappers)), compiler.kind, compiler.version_text,
             compiler.digest, compiler.size, compiler.mtime_ns, host_id, compiler.error)))
        row_id = int(_value(self.conn, "SELECT id FROM compilers WHERE digest = ?", (digest,)))
        self._ids[("compiler", digest)] = row_id
        return row_id

    def _run_id(self, run: RunInfo) -> int:
        cached = self._ids.get(("run", run.run_uuid))
        if cached is not None:
            return cached
        self.conn.execute(
            "INSERT INTO runs (run_uuid, started_ns, host, pid, label, command,"
            " cacheaudit_version) VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT(run_uuid) DO NOTHING",
            _params((run.run_uuid, run.started_ns, run.host, run.pid, run.label,
                     None if run.command is None else _blob_json(list(run.command)),
                     __version__)))
        row_id = int(_value(self.conn, "SELECT id FROM runs WHERE run_uuid = ?",
                            (run.run_uuid,)))
        self._ids[("run", run.run_uuid)] = row_id
        return row_id

    # ---------------------------------------------------------------- writing

    def add_records(self, records: Iterable[CompileRecord], run: RunInfo) -> int:
        """Store records in one short transaction; a record already present is skipped.

        Returns how many were new. Retries while other writers hold the lock.
        """
        batch = list(records)

        def write() -> int:
            with self._write():
                run_id = self._run_id(run)
                return sum(self._insert_record(r, run_id) for r in batch)

        return _retrying(write)

    def _insert_record(self, record: CompileRecord, run_id: int) -> int:
        stored_extra = record.stored_extra()
        cursor = self.conn.execute(
            "INSERT INTO records (record_uuid, run_id, event, runtime, kernel, key,"
            " entry_id, compiler_id, argv_id, effective_argv_id, env_id, cwd_id, sources_id,"
            " graph_id, outputs_id, tracked_id, exit_code, signal, started_ns, duration_ns, pid,"
            " host, test_id, observer, notes_id, extra_id)"
            # Only a record already present is skipped: OR IGNORE would also drop, without a
            # word, a record that breaks NOT NULL or CHECK (an unknown event, say).
            f" VALUES ({', '.join('?' * 26)}) ON CONFLICT(record_uuid) DO NOTHING",
            _params((
                record.record_id, run_id, record.event, record.runtime, record.kernel, record.key,
                self._file_id(record.entry) if record.entry else None,
                self._compiler_id(record.compiler),
                self._blob_id(list(record.argv)) if record.argv else None,
                self._blob_id([t.to_list() for t in record.effective_argv])
                if record.effective_argv else None,
                self._blob_id(dict(record.env)) if record.env else None,
                self._file_id(record.cwd) if record.cwd else None,
                self._states_graph_id(record.sources, "sources"),
                self._graph_id(record.graph),
                self._states_graph_id(record.outputs, "outputs"),
                self._blob_id(list(record.tracked)) if record.tracked is not None else None,
                record.exit_code, record.signal, record.started_ns, record.duration_ns,
                record.pid, record.host, record.test_id, record.observer,
                self._blob_id(list(record.notes)) if record.notes else None,
                self._blob_id(stored_extra) if stored_extra else None,
            )))
        return cursor.rowcount

    def add_findings(self, findings: Iterable[Finding], audit_uuid: str | None = None) -> str:
        """Store the findings of one audit pass; returns its audit id."""
        audit_uuid = audit_uuid or uuid.uuid4().hex
        now = time.time_ns()
        rows = [_params((audit_uuid, now, f.code, f.severity.value, f.subject, f.message,
                         f.recorded, f.current, f.how, int(f.inferred), f.record_id, f.entry,
                         f.runtime, f.kernel, f.hint)) for f in findings]

        def write() -> None:
            with self._write() as conn:
                conn.executemany(
                    "INSERT INTO findings (audit_uuid, found_ns, code, severity, subject, message,"
                    " recorded, current, how, inferred, record_uuid, entry, runtime, kernel, hint)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

        _retrying(write)
        return audit_uuid

    # ---------------------------------------------------------------- reading

    def count(self, table: str = "records") -> int:
        if table not in _TABLES:
            raise ValueError(f"unknown ledger table {table!r}")
        return int(_value(self.conn, f"SELECT count(*) AS count FROM {table}"))

    def integrity_check(self) -> str:
        return "; ".join(row["integrity_check"]
                         for row in _rows(self.conn, "PRAGMA integrity_check"))

    def load_graph(self, graph_id: int | None) -> IncludeGraph | None:
        """A stored graph, loaded once per ledger object (shared graphs are read once)."""
        if graph_id is None:
            return None
        if graph_id not in self._graph_cache:
            self._load_graphs([graph_id])
        return self._graph_cache.get(graph_id)

    def _load_graphs(self, graph_ids: Iterable[int]) -> None:
        """Load many graphs in a few queries: a scan ties thousands of records at once."""
        for part in _chunks({g for g in graph_ids if g is not None and g not in self._graph_cache}):
            marks = ", ".join("?" * len(part))
            methods = {row["id"]: row["method"] for row in _rows(
                self.conn, f"SELECT id, method FROM graphs WHERE id IN ({marks})", part)}
            files: dict[int, list[GraphFile]] = {graph_id: [] for graph_id in methods}
            rows = _rows(
                self.conn,
                f"SELECT g.graph_id AS graph_id, {_STATE_COLUMNS}, w.path AS written"
                " FROM graph_files g"
                " JOIN file_states s ON s.id = g.state_id JOIN files f ON f.id = s.file_id"
                f" JOIN files w ON w.id = g.written_id WHERE g.graph_id IN ({marks})"
                " ORDER BY g.graph_id, g.position", part)
            for r in rows:
                files[r["graph_id"]].append(GraphFile(_state_from_row(r), r["written"]))
            for graph_id, method in methods.items():
                self._graph_cache[graph_id] = IncludeGraph(tuple(files[graph_id]), method)

    def _load_blob(self, blob_id: int | None) -> Any:
        if blob_id is None:
            return None
        if blob_id not in self._blob_cache:
            body = _value(self.conn, "SELECT body FROM blobs WHERE id = ?", (blob_id,))
            self._blob_cache[blob_id] = json.loads(body) if body is not None else None
        return self._blob_cache[blob_id]

    def load_compiler(self, compiler_id: int | None) -> CompilerIdentity | None:
        if compiler_id is None:
            return None
        if compiler_id not in self._compiler_cache:
            row = _row(
                self.conn,
                "SELECT invoked, path, resolved, wrappers, kind, version_text, binary_digest,"
                " size, mtime_ns, host_id, error FROM compilers WHERE id = ?", (compiler_id,))
            if row is None:
                return None
            self._compiler_cache[compiler_id] = CompilerIdentity(
                invoked=row["invoked"], path=row["path"], resolved=row["resolved"],
                wrappers=tuple(json.loads(row["wrappers"])), kind=row["kind"],
                version_text=row["version_text"], digest=row["binary_digest"], size=row["size"],
                mtime_ns=row["mtime_ns"], host=self.load_compiler(row["host_id"]),
                error=row["error"])
        return self._compiler_cache[compiler_id]

    _RECORD_COLUMNS = _select_list(
        "r.record_uuid", "r.event", "r.started_ns", "r.runtime", "r.kernel", "r.key",
        "e.path AS entry", "r.compiler_id", "r.argv_id", "r.effective_argv_id", "r.env_id",
        "c.path AS cwd", "r.sources_id", "r.graph_id", "r.outputs_id", "r.tracked_id",
        "r.exit_code", "r.signal", "r.duration_ns", "r.pid", "r.host", "r.test_id", "r.observer",
        "r.notes_id", "r.extra_id", "runs.run_uuid")
    _RECORD_FROM = (
        " FROM records r JOIN runs ON runs.id = r.run_id"
        " LEFT JOIN files e ON e.id = r.entry_id LEFT JOIN files c ON c.id = r.cwd_id")

    def records(self, *, where: str = "", params: Sequence[Any] = (), order: str = "r.id",
                limit: int | None = None, with_graphs: bool = True,
                with_files: bool = True) -> list[CompileRecord]:
        """Records matching an SQL condition on `records r` (and `runs`), oldest first.

        `with_graphs=False` leaves every file list out; `with_files=False` keeps the include
        graph (shared, loaded once) and leaves out each record's own sources and outputs, which
        an audit of thousands of entries does not need.
        """
        sql = f"SELECT {self._RECORD_COLUMNS}{self._RECORD_FROM}"
        if where:
            sql += f" WHERE {where}"
        sql += f" ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = _rows(self.conn, sql, _params(params))
        if with_graphs:
            columns = ("sources_id", "graph_id", "outputs_id") if with_files else ("graph_id",)
            self._load_graphs(row[c] for row in rows for c in columns)
        return [self._record_from_row(row, with_graphs, with_files) for row in rows]

    def recent_records(self, *, kernel: str | None = None, runtime: str | None = None,
                       limit: int = 50, with_files: bool = True) -> list[CompileRecord]:
        """The newest `limit` records, of one kernel or runtime when given, newest last."""
        conditions, params = [], []
        if kernel:
            conditions.append("r.kernel = ?")
            params.append(kernel)
        if runtime:
            conditions.append("r.runtime = ?")
            params.append(runtime)
        found = self.records(where=" AND ".join(conditions), params=params,
                             order="r.started_ns DESC, r.id DESC", limit=max(limit, 0),
                             with_files=with_files)
        found.reverse()
        return found

    def record(self, record_uuid: str) -> CompileRecord | None:
        found = self.records(where="r.record_uuid = ?", params=(record_uuid,))
        return found[0] if found else None

    def _record_from_row(self, row: Row, with_graphs: bool,
                         with_files: bool = True) -> CompileRecord:
        sources = self.load_graph(row["sources_id"]) if with_graphs and with_files else None
        outputs = self.load_graph(row["outputs_id"]) if with_graphs and with_files else None
        tracked = self._load_blob(row["tracked_id"])
        effective = self._load_blob(row["effective_argv_id"]) or []
        facts, extra = split_stored_extra(self._load_blob(row["extra_id"]))
        return CompileRecord(
            record_id=row["record_uuid"], event=row["event"], started_ns=row["started_ns"],
            runtime=row["runtime"], kernel=row["kernel"], key=row["key"], entry=row["entry"],
            compiler=self.load_compiler(row["compiler_id"]),
            argv=tuple(self._load_blob(row["argv_id"]) or ()),
            effective_argv=tuple(ArgToken(t, o) for t, o in effective),
            env=dict(self._load_blob(row["env_id"]) or {}), cwd=row["cwd"] or "",
            sources=tuple(f.state for f in sources.files) if sources else (),
            graph=self.load_graph(row["graph_id"]) if with_graphs else None,
            outputs=tuple(f.state for f in outputs.files) if outputs else (),
            tracked=tuple(tracked) if tracked is not None else None,
            exit_code=row["exit_code"], signal=row["signal"], duration_ns=row["duration_ns"],
            pid=row["pid"], host=row["host"], test_id=row["test_id"], observer=row["observer"],
            notes=tuple(self._load_blob(row["notes_id"]) or ()), extra=extra,
            run_uuid=row["run_uuid"], graph_id=None if with_graphs else row["graph_id"],
            **facts)

    def add_tests(self, run: RunInfo, tests: Iterable[TestWindow]) -> None:
        rows = list(tests)

        def write() -> None:
            with self._write() as conn:
                run_id = self._run_id(run)
                conn.executemany(
                    "INSERT INTO tests (run_id, nodeid, started_ns, finished_ns,"
                    " outcome, worker) VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    [_params((run_id, t.nodeid, t.started_ns, t.finished_ns, t.outcome, t.worker))
                     for t in rows])

        _retrying(write)

    def tests(self, run_uuid: str | None = None) -> list[TestWindow]:
        columns = _select_list("t.nodeid", "t.started_ns", "t.finished_ns", "t.outcome",
                               "t.worker", "runs.run_uuid")
        sql = f"SELECT {columns} FROM tests t JOIN runs ON runs.id = t.run_id"
        params: tuple[Any, ...] = ()
        if run_uuid is not None:
            sql += " WHERE runs.run_uuid = ?"
            params = (run_uuid,)
        return [TestWindow(r["nodeid"], r["started_ns"], r["finished_ns"], r["outcome"],
                           r["worker"], r["run_uuid"])
                for r in _rows(self.conn, sql + " ORDER BY t.started_ns", params)]

    def runs(self) -> dict[str, RunInfo]:
        rows = _rows(self.conn, "SELECT run_uuid, label, started_ns, host, pid, command FROM runs")
        return {r["run_uuid"]: RunInfo(run_uuid=r["run_uuid"], label=r["label"],
                                       started_ns=r["started_ns"], host=r["host"], pid=r["pid"],
                                       command=tuple(json.loads(r["command"]))
                                       if r["command"] else None)
                for r in rows}

    def remember_roots(self, roots: Iterable[tuple[str, str]]) -> None:
        rows = [_params((root, layout, time.time_ns())) for layout, root in roots]
        if not rows:
            return

        def write() -> None:
            with self._write() as conn:
                conn.executemany("INSERT OR REPLACE INTO cache_roots (path, layout, last_scan_ns)"
                                 " VALUES (?, ?, ?)", rows)

        _retrying(write)

    def known_roots(self) -> list[str]:
        return [r["path"] for r in _rows(self.conn, "SELECT path FROM cache_roots")]

    def remember_states(self, states: Iterable[FileState]) -> None:
        """Keep the settled states a scan captured, for the next scan's stat-only check."""
        settled = [s for s in states if s.settled and s.digest is not None]
        if not settled:
            return

        def write() -> None:
            with self._write() as conn:
                conn.executemany(
                    "INSERT OR REPLACE INTO seen_states (file_id, state_id) VALUES (?, ?)",
                    [(self._file_id(s.path), self._state_id(s)) for s in settled])

        _retrying(write)

    def seen_states(self) -> list[FileState]:
        rows = _rows(self.conn,
                     f"SELECT {_STATE_COLUMNS} FROM seen_states v"
                     " JOIN file_states s ON s.id = v.state_id JOIN files f ON f.id = v.file_id")
        return [_state_from_row(r) for r in rows]

    def compiles_by_output(self) -> dict[str, str]:
        """Output digest -> the newest successful compile record that wrote it, preferring
        records with an include graph.

        This is how an entry found on disk is tied to the compile that built it: JIT runtimes
        build in a temporary directory and rename it into place, so paths differ but the
        binary's bytes do not. A link step recorded by the shim writes the same library as the
        adapter's compile record but read no headers; the compile is the one worth judging.
        """
        rows = _rows(
            self.conn,
            "SELECT s.digest AS digest, r.record_uuid AS record_uuid FROM records r"
            " JOIN graph_files g ON g.graph_id = r.outputs_id"
            " JOIN file_states s ON s.id = g.state_id"
            " WHERE r.event = 'compile' AND r.exit_code = 0 AND s.digest != ''"
            " ORDER BY (r.graph_id IS NOT NULL), r.started_ns, r.id")
        return {r["digest"]: r["record_uuid"] for r in rows}

    def records_by_uuid(self, uuids: Iterable[str], with_files: bool = True
                        ) -> dict[str, CompileRecord]:
        found: dict[str, CompileRecord] = {}
        for part in _chunks(uuids):
            marks = ", ".join("?" * len(part))
            for record in self.records(where=f"r.record_uuid IN ({marks})", params=part,
                                       with_files=with_files):
                found[record.record_id] = record
        return found

    def first_compile_environments(self, run_uuids: Iterable[str]
                                   ) -> dict[str, tuple[int, dict[str, str]]]:
        """(start, environment) of the first compile of each run: what a runtime that reads its
        configuration once, at its first use, went by for the rest of the run."""
        found: dict[str, tuple[int, dict[str, str]]] = {}
        for part in _chunks(run_uuids):
            marks = ", ".join("?" * len(part))
            # One row per run, found by walking records_by_run from the run's earliest record.
            rows = _rows(
                self.conn,
                f"SELECT {_select_list('runs.run_uuid', 'r.started_ns', 'r.env_id')} FROM runs"
                " JOIN records r ON r.id = (SELECT f.id FROM records f WHERE f.run_id = runs.id"
                " AND f.event = 'compile' ORDER BY f.started_ns, f.id LIMIT 1)"
                f" WHERE runs.run_uuid IN ({marks})", _params(part))
            for r in rows:
                found[r["run_uuid"]] = (r["started_ns"], dict(self._load_blob(r["env_id"]) or {}))
        return found

    def lookups_by_entry(self, paths: Iterable[str] | None = None, *,
                         with_graphs: bool = False) -> dict[str, list[CompileRecord]]:
        """Hit records (disk-hit, memory-hit) per entry path, oldest first; only those of
        `paths` when given. A hit is judged by its time and process, so its files are left out
        unless `with_graphs`."""
        condition = "r.event != 'compile' AND r.entry_id IS NOT NULL"
        chunks: Iterable[list[str]] = [[]] if paths is None else _chunks(paths)
        by_entry: dict[str, list[CompileRecord]] = {}
        for part in chunks:
            where = condition if paths is None else (
                f"{condition} AND e.path IN ({', '.join('?' * len(part))})")
            for record in self.records(where=where, params=part, order="r.started_ns, r.id",
                                       with_graphs=with_graphs):
                if record.entry:
                    by_entry.setdefault(record.entry, []).append(record)
        return by_entry

    def attribute(self, attributions: Iterable[Attribution]) -> None:
        """Fill in what compiles' observers could not know (the shim sees `kernel.cu` in a
        temporary directory) once an audit has tied each compile to its cache entry, in one
        transaction: a scan attributes thousands of records.

        The runtime, key and entry an observer already set are left alone. The kernel name is
        replaced while the record has no entry: the shim can only name the kernel after its
        source file.
        """
        rows = list(attributions)
        if not rows:
            return

        def write() -> None:
            with self._write() as conn:
                conn.executemany(
                    "UPDATE records SET runtime = coalesce(runtime, ?),"
                    " kernel = CASE WHEN entry_id IS NULL THEN ? ELSE kernel END,"
                    " key = coalesce(key, ?), entry_id = coalesce(entry_id, ?)"
                    " WHERE record_uuid = ?",
                    [_params((a.runtime, a.kernel, a.key, self._file_id(a.entry), a.record_uuid))
                     for a in rows])

        _retrying(write)

    _FINDING_COLUMNS = ("audit_uuid", "found_ns", "code", "severity", "subject", "message",
                        "recorded", "current", "how", "inferred", "record_uuid", "entry",
                        "runtime", "kernel", "hint")

    def _copy_findings_and_roots(self, source: Ledger) -> None:
        """`combine`'s share of another ledger's findings and cache roots. A finding already
        here (same audit, code, subject, record and entry) is not copied again; a root keeps
        its latest scan time."""
        columns = self._FINDING_COLUMNS
        findings = [_named_params(r) for r in _rows(
            source.conn, f"SELECT {', '.join(columns)} FROM findings ORDER BY id")]
        roots = [_named_params(r) for r in _rows(
            source.conn, "SELECT path, layout, last_scan_ns FROM cache_roots")]
        if not findings and not roots:
            return

        def write() -> None:
            with self._write() as conn:
                for row in findings:
                    present = _value(
                        conn,
                        "SELECT 1 AS present FROM findings WHERE audit_uuid = :audit_uuid"
                        " AND code = :code AND subject = :subject AND record_uuid IS :record_uuid"
                        " AND entry IS :entry AND message = :message LIMIT 1", row)
                    if present is None:
                        conn.execute(f"INSERT INTO findings ({', '.join(columns)})"
                                     f" VALUES ({', '.join(f':{c}' for c in columns)})", row)
                conn.executemany(
                    "INSERT INTO cache_roots (path, layout, last_scan_ns)"
                    " VALUES (:path, :layout, :last_scan_ns)"
                    " ON CONFLICT(path) DO UPDATE SET layout = excluded.layout,"
                    " last_scan_ns = excluded.last_scan_ns"
                    " WHERE excluded.last_scan_ns > cache_roots.last_scan_ns", roots)

        _retrying(write)

    def findings(self, audit_uuid: str | None = None) -> list[Finding]:
        """The findings of one audit pass, by default the latest."""
        if audit_uuid is None:
            audit_uuid = _value(
                self.conn,
                "SELECT audit_uuid FROM findings ORDER BY found_ns DESC, id DESC LIMIT 1")
            if audit_uuid is None:
                return []
        rows = _rows(
            self.conn,
            "SELECT code, subject, message, recorded, current, how, record_uuid, entry, runtime,"
            " kernel, inferred, hint FROM findings WHERE audit_uuid = ? ORDER BY id",
            (audit_uuid,))
        return [Finding(code=r["code"], subject=r["subject"], message=r["message"],
                        recorded=r["recorded"], current=r["current"], how=r["how"],
                        record_id=r["record_uuid"], entry=r["entry"], runtime=r["runtime"],
                        kernel=r["kernel"], inferred=bool(r["inferred"]), hint=r["hint"])
                for r in rows]


_TABLES = ("meta", "runs", "files", "file_states", "graphs", "graph_files", "compilers", "blobs",
           "records", "findings", "seen_states", "tests", "cache_roots")


def _enable_wal(conn: sqlite3.Connection) -> None:
    # A filesystem without shared memory (some network mounts) refuses WAL and answers with
    # the mode it kept: going on in that mode is slower under contention but correct.
    conn.execute("PRAGMA journal_mode = WAL")


def _build_migrations() -> Any:
    from sqlite_utils.migrations import Migrations

    migrations = Migrations("cacheaudit")

    @migrations(name="0001_initial")
    def initial(db: sqlite_utils.Database) -> None:
        for statement in _statements(SCHEMA):
            db.conn.execute(statement)
        db.conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
        meta = {"schema_version": "1", "ledger_id": uuid.uuid4().hex,
                "created_at": str(time.time_ns()), "created_by": f"cacheaudit {__version__}"}
        db.conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                            sorted(meta.items()))

    @migrations(name="0002_records_by_run_and_test")
    def records_by_run_and_test(db: sqlite_utils.Database) -> None:
        # New ledgers already have both from SCHEMA; a version 1 ledger gains them here.
        db.conn.execute(
            "CREATE INDEX IF NOT EXISTS records_by_run ON records (run_id, started_ns)")
        db.conn.execute("CREATE INDEX IF NOT EXISTS records_by_test ON records (test_id)"
                        " WHERE test_id IS NOT NULL")
        db.conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")

    return migrations


class _LazyMigrations:
    """Builds the sqlite-utils migration set on first use, keeping sqlite-utils off the hot path."""

    _migrations: Any = None

    def apply(self, db: sqlite_utils.Database) -> None:
        if self._migrations is None:
            self._migrations = _build_migrations()
        self._migrations.apply(db)


_MIGRATIONS = _LazyMigrations()


def new_record_id() -> str:
    return uuid.uuid4().hex


def open_ledger(path: str, *, create: bool = True) -> Ledger:
    """The ledger at `path` with its spool folded in: what every command and report reads, so
    that a record a writer could only spool is never missing from it."""
    ledger = Ledger.open(path, create=create)
    try:
        ingest_spool(ledger)
    except BaseException:
        ledger.close()
        raise
    return ledger


def open_existing(path: str | None = None) -> Ledger | None:
    """The ledger at `path` (or the default place) for reading, with its spool folded in; None
    when no file is there yet. Readers never create a ledger."""
    location = os.path.abspath(path or default_ledger_path())
    if not os.path.exists(location):
        return None
    return open_ledger(location, create=False)


# ------------------------------------------------------------------------------------ the spool
#
# When a writer cannot reach the ledger (locked past every retry, disk full, a damaged file), the
# record goes to `<ledger>.spool/<record id>.json` instead, and the next reader folds it in: fail
# open, lose nothing.


def record_to_json(record: CompileRecord, run: RunInfo) -> dict[str, Any]:
    """A record and its run as plain JSON, the spool's format."""
    return {
        "format": 1,
        "run": {"run_uuid": run.run_uuid, "label": run.label, "started_ns": run.started_ns,
                "host": run.host, "pid": run.pid,
                "command": list(run.command) if run.command is not None else None},
        "record": {
            "record_id": record.record_id, "event": record.event,
            "started_ns": record.started_ns, "runtime": record.runtime,
            "kernel": record.kernel, "key": record.key, "entry": record.entry,
            "compiler": record.compiler.to_dict() if record.compiler else None,
            "argv": list(record.argv),
            "effective_argv": [t.to_list() for t in record.effective_argv],
            "cwd": record.cwd, "env": dict(record.env),
            "sources": [s.to_dict() for s in record.sources],
            "graph": None if record.graph is None else {
                "method": record.graph.method,
                "files": [[f.written, f.state.to_dict()] for f in record.graph.files]},
            "outputs": [s.to_dict() for s in record.outputs],
            "tracked": list(record.tracked) if record.tracked is not None else None,
            "exit_code": record.exit_code, "signal": record.signal,
            "duration_ns": record.duration_ns, "pid": record.pid, "host": record.host,
            "test_id": record.test_id, "observer": record.observer,
            "notes": list(record.notes), "extra": record.stored_extra(),
        },
    }


def record_from_json(data: Mapping[str, Any]) -> tuple[CompileRecord, RunInfo]:
    run_data = data["run"]
    run = RunInfo(run_uuid=run_data["run_uuid"], label=run_data["label"],
                  started_ns=run_data["started_ns"], host=run_data["host"], pid=run_data["pid"],
                  command=tuple(run_data["command"]) if run_data.get("command") else None)
    r = dict(data["record"])
    graph = r.get("graph")
    facts, extra = split_stored_extra(r.get("extra"))
    record = CompileRecord(
        record_id=r["record_id"], event=r["event"], started_ns=r["started_ns"],
        runtime=r.get("runtime"), kernel=r.get("kernel"), key=r.get("key"),
        entry=r.get("entry"), compiler=CompilerIdentity.from_dict(r.get("compiler")),
        argv=tuple(r.get("argv") or ()),
        effective_argv=tuple(ArgToken(t, o) for t, o in r.get("effective_argv") or ()),
        cwd=r.get("cwd") or "", env=dict(r.get("env") or {}),
        sources=tuple(FileState.from_dict(s) for s in r.get("sources") or ()),
        graph=None if graph is None else IncludeGraph(
            tuple(GraphFile(FileState.from_dict(s), w) for w, s in graph["files"]),
            graph["method"]),
        outputs=tuple(FileState.from_dict(s) for s in r.get("outputs") or ()),
        tracked=tuple(r["tracked"]) if r.get("tracked") is not None else None,
        exit_code=r.get("exit_code"), signal=r.get("signal"),
        duration_ns=r.get("duration_ns") or 0, pid=r.get("pid") or 0, host=r.get("host") or "",
        test_id=r.get("test_id"), observer=r.get("observer") or "",
        notes=tuple(r.get("notes") or ()), extra=extra, **facts)
    return record, run


def spool_dir(ledger_path: str) -> str:
    return ledger_path + ".spool"


def spool_record(ledger_path: str, record: CompileRecord, run: RunInfo) -> str:
    """Write a record beside the ledger for a later reader to fold in; returns the file."""
    directory = spool_dir(ledger_path)
    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, f"{record.record_id}.json")
    temporary = f"{final}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8", errors="surrogateescape") as handle:
        json.dump(record_to_json(record, run), handle, ensure_ascii=False)
    os.replace(temporary, final)
    return final


# What a spooled record that can never be stored raises: a value the schema refuses (an unknown
# event, a missing start time) or a field of the wrong type.
_UNSTORABLE = (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError, OverflowError,
               ValueError, KeyError, TypeError, AttributeError)


def ingest_spool(ledger: Ledger) -> int:
    """Fold spooled records into the ledger and delete their files; returns how many.

    A file that cannot be read or stored is renamed to `.bad` beside the others, for a human to
    look at, never deleted. While the ledger cannot be written at all (locked past every retry,
    read-only, disk full) the files stay for the next reader.
    """
    directory = spool_dir(ledger.path)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except OSError:
        return 0
    added = 0
    for name in names:
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as handle:
                record, run = record_from_json(json.load(handle))
            added += ledger.add_records([record], run)
        except OSError:
            continue  # gone (another reader took it) or unreadable now: try again next time
        except sqlite3.OperationalError:
            return added
        except _UNSTORABLE:
            with contextlib.suppress(OSError):
                os.replace(path, path + ".bad")
            continue
        with contextlib.suppress(OSError):
            os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(directory)
    return added


# ------------------------------------------------------------------------------------ combine


@dataclass
class CombineResult:
    combined: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    records: int = 0


def combine(target: Ledger, sources: Sequence[str], *, keep: bool = True,
            batch: int = 500) -> CombineResult:
    """Merge ledgers (pytest-xdist workers, ranks, hosts) into `target`.

    Records keep their ids, so combining twice adds nothing; file states, graphs, compilers and
    JSON values are content-addressed, so the thousands of records that share a CUTLASS graph
    still share one copy. Findings (deduplicated) and known cache roots come along too. A source
    that cannot be read is skipped, named, and left in place (coverage.py's `combine` does the
    same); the others are deleted unless `keep`.
    """
    result = CombineResult()
    for source in sources:
        path = os.path.abspath(source)
        if path == os.path.abspath(target.path):
            continue
        try:
            opened = Ledger.open(path, create=False)
        except LedgerError as exc:
            result.skipped.append(f"{source}: {exc}")
            continue
        with opened:
            ingest_spool(opened)
            runs = opened.runs()
            records = opened.records(order="r.started_ns, r.id")
            for start in range(0, len(records), batch):
                by_run: dict[str, list[CompileRecord]] = {}
                for record in records[start:start + batch]:
                    by_run.setdefault(str(record.run_uuid), []).append(record)
                for run_uuid, group in by_run.items():
                    # Stored under `run`: a record's own run_uuid is never written with it.
                    run = runs.get(run_uuid) or RunInfo(run_uuid=run_uuid, label="combined")
                    result.records += target.add_records(group, run)
            windows: dict[str, list[TestWindow]] = {}
            for window in opened.tests():
                windows.setdefault(window.run_uuid, []).append(window)
            for run_uuid, group in windows.items():
                target.add_tests(runs.get(run_uuid) or RunInfo(run_uuid=run_uuid,
                                                               label="combined"), group)
            target.remember_states(opened.seen_states())
            target._copy_findings_and_roots(opened)
        result.combined.append(source)
        if not keep:
            with contextlib.suppress(OSError):
                os.remove(path)
                for suffix in ("-wal", "-shm"):
                    if os.path.exists(path + suffix):
                        os.remove(path + suffix)
    return result

