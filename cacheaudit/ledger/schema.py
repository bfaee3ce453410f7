"""The ledger's schema: one commented SQL string, its version history, and the named migrations
that create or upgrade a ledger file (through sqlite-utils, imported only when one runs)."""

from __future__ import annotations

import functools
import sqlite3
import time
from typing import TYPE_CHECKING, Any

from cacheaudit import __version__
from cacheaudit.exceptions import LedgerError
from cacheaudit.ids import uuid4_hex
from cacheaudit.ledger.rows import _retrying, _rows, _value

if TYPE_CHECKING:
    import sqlite_utils

WRITER_PATIENCE_S = 0.5
"""How long a recording writer (the shim, an in-process adapter) waits for another process's
write lock before it spools the record instead: a compile must never wait on the ledger. A
write transaction of the recorder takes milliseconds, so only a lock held on purpose (or a
stuck process) outlasts it."""

READER_PATIENCE_S = 5.0
"""How long a command that reads the ledger (report, scan, explain, combine) waits for another
process's write lock before it says the ledger is busy, for each thing it writes."""

BUSY_TIMEOUT_S = READER_PATIENCE_S
"""The default patience of `Ledger.open` (kept under its old name)."""

APPLICATION_ID = 0x43414144  # "CAAD": lets `file` and our own open() tell a ledger apart.

# The schema, one statement per table, each column commented. Statements are separated by ";\n"
# and no comment may contain a semicolon: `_statements` splits on it.
#
# Schema history:
#   1 (0.1.0): first version.
#   2: indexes on records by run and by test (audit_run and the pytest fixture read by them).
#   3: indexes that tie an entry to its compile in proportion to the entries scanned (records by
#      sources and outputs, graph members by state, states by digest); the entries that scans
#      before it attributed to shim records by the binary's digest alone are forgotten (made
#      again by the next scan, by the identity rule of docs/design.md).
#   4: evictions, what `cacheaudit evict` removed (or failed to remove) and the finding why.
#   5: records by kernel name alone (`report --kernel K` without --runtime read every
#      record's index entry: 10^6 records, a scan of the whole index per report).
#   6: fewer index insertions per record written (issue 16, 50,000 records/s): the two kernel
#      indexes are one, (kernel, started_ns, id, runtime); the indexes by key, sources and outputs
#      are partial (compiles only, present values only), so that a hit is written into four
#      indexes instead of eight. Version 5's index by kernel name is no longer built.
SCHEMA_VERSION = 6

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

CREATE INDEX IF NOT EXISTS file_states_by_digest ON file_states (digest);

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

CREATE INDEX IF NOT EXISTS graph_files_by_state ON graph_files (state_id);

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

-- Each index on records serves a query, and each costs every record written a B-tree insertion:
-- a hit (most of a fleet's ledger) has no key query, sources or outputs, so those indexes are
-- partial and a hit pays for four (uuid, kernel, entry, run).
-- A kernel's history, with or without its runtime (report --kernel, explain's previous compile,
-- diff's fleet pass), newest first: id breaks ties of started_ns as the readers order, and the
-- runtime is covered, so a kernel's records of one runtime are read in order, no sort.
CREATE INDEX IF NOT EXISTS records_by_kernel ON records (kernel, started_ns, id, runtime);

-- The compiles of a cache key (the inductor adapter); a hit is looked up by its entry instead.
CREATE INDEX IF NOT EXISTS records_by_key ON records (key) WHERE event = 'compile';

CREATE INDEX IF NOT EXISTS records_by_entry ON records (entry_id);

CREATE INDEX IF NOT EXISTS records_by_run ON records (run_id, started_ns);

CREATE INDEX IF NOT EXISTS records_by_test ON records (test_id) WHERE test_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS records_by_sources ON records (sources_id)
    WHERE sources_id IS NOT NULL;

CREATE INDEX IF NOT EXISTS records_by_outputs ON records (outputs_id)
    WHERE outputs_id IS NOT NULL;

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
);

-- Entries `cacheaudit evict` removed, or tried to: one row per entry and pass. The findings that
-- chose the entry are in findings under the same audit_uuid.
CREATE TABLE IF NOT EXISTS evictions (
    id INTEGER PRIMARY KEY,
    audit_uuid TEXT NOT NULL,               -- the evict pass, as findings.audit_uuid
    run_id INTEGER NOT NULL REFERENCES runs(id),  -- the evict command's run (label 'evict')
    evicted_ns INTEGER NOT NULL,            -- wall clock when the entry went (or the try failed)
    runtime TEXT NOT NULL,
    layout TEXT NOT NULL,
    root TEXT NOT NULL,                     -- the cache root the entry lay in
    entry TEXT NOT NULL,                    -- the entry's path
    kernel TEXT,
    key TEXT,
    bytes INTEGER NOT NULL,                 -- what its files held on disk before the eviction
    code TEXT NOT NULL,                     -- the deciding finding: the most severe, first
    subject TEXT NOT NULL,                  -- that finding's subject (the changed file, ...)
    record_uuid TEXT,                       -- the compile record that finding is about
    codes TEXT NOT NULL,                    -- JSON list of every finding code that chose it
    outcome TEXT NOT NULL CHECK (outcome IN ('evicted', 'failed')),
    error TEXT NOT NULL                     -- why it failed, what stayed behind, or ''
);

CREATE INDEX IF NOT EXISTS evictions_by_entry ON evictions (entry, evicted_ns)
"""


_TABLES = ("meta", "runs", "files", "file_states", "graphs", "graph_files", "compilers", "blobs",
           "records", "findings", "seen_states", "tests", "cache_roots", "evictions")


def _statements(schema: str) -> list[str]:
    return [s.strip() for s in schema.split(";\n") if s.strip()]


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
        meta = {"schema_version": "1", "ledger_id": uuid4_hex(),
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

    @migrations(name="0003_entry_identity")
    def entry_identity(db: sqlite_utils.Database) -> None:
        for statement in _IDENTITY_INDEXES:
            db.conn.execute(statement)
        # A shim never knows its entry: every entry a shim record holds was attributed by a
        # scan, which before this version went by the binary's digest alone (twin caches, link
        # steps, identical binaries under two keys were tied wrongly). The next scan ties them
        # again by the identity rule.
        db.conn.execute("UPDATE records SET entry_id = NULL WHERE observer LIKE 'shim:%'")
        db.conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")

    @migrations(name="0004_evictions")
    def evictions(db: sqlite_utils.Database) -> None:
        # New ledgers have the table from SCHEMA already; IF NOT EXISTS makes this a no-op there.
        for statement in _EVICTION_STATEMENTS:
            db.conn.execute(statement)
        db.conn.execute("UPDATE meta SET value = '4' WHERE key = 'schema_version'")

    @migrations(name="0005_records_by_kernel_name")
    def records_by_kernel_name(db: sqlite_utils.Database) -> None:
        # Version 5 built records_by_kernel_name here; version 6 replaces it (and the index it
        # stood beside) with one index, so a ledger upgraded past 5 no longer builds it only to
        # drop it in the next step.
        db.conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")

    @migrations(name="0006_fewer_record_indexes")
    def fewer_record_indexes(db: sqlite_utils.Database) -> None:
        db.conn.execute("DROP INDEX IF EXISTS records_by_kernel_name")
        for name, statement in _RECORD_INDEXES.items():
            stored = db.conn.execute(
                "SELECT sql FROM sqlite_master WHERE type = 'index' AND name = ?",
                (name,)).fetchone()
            if stored is None or _normal_sql(stored[0]) != _normal_sql(statement):
                db.conn.execute(f"DROP INDEX IF EXISTS {name}")
                db.conn.execute(statement)
        db.conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")

    return migrations


def _without_comments(statement: str) -> str:
    return "\n".join(line for line in statement.splitlines() if not line.startswith("--"))


_RECORD_INDEXES = {s.split()[5]: s for s in map(_without_comments, _statements(SCHEMA))
                   if s.startswith("CREATE INDEX") and " ON records (" in s}
"""The indexes on records as this version has them, by name (migration 0006 rebuilds any that
an older ledger has in another form)."""


def _normal_sql(statement: str) -> str:
    """An index's CREATE statement compared as SQLite stores it (without IF NOT EXISTS) and
    without regard to spacing."""
    return " ".join(statement.replace("IF NOT EXISTS ", "").split())


_IDENTITY_INDEXES = [s for s in _statements(SCHEMA) if s.startswith("CREATE INDEX") and any(
    name in s for name in ("records_by_sources", "records_by_outputs", "graph_files_by_state",
                           "file_states_by_digest"))]


_EVICTION_STATEMENTS = [s for s in _statements(SCHEMA)
                        if "EXISTS evictions (" in s or " ON evictions (" in s]


class _LazyMigrations:
    """Builds the sqlite-utils migration set on first use, keeping sqlite-utils off the hot path."""

    _migrations: Any = None

    def apply(self, db: sqlite_utils.Database) -> None:
        if self._migrations is None:
            self._migrations = _build_migrations()
        self._migrations.apply(db)


_MIGRATIONS = _LazyMigrations()


def prepare(conn: sqlite3.Connection, path: str, create: bool,
            patience_s: float = BUSY_TIMEOUT_S, *, read_only: bool = False) -> None:
    """Make a freshly opened connection ready: busy timeout, synchronous mode, and the schema
    created or upgraded (`create`) or refused with one line naming `path`. A `read_only`
    connection is never upgraded: an older ledger there is refused."""
    conn.execute(f"PRAGMA busy_timeout = {int(patience_s * 1000)}")
    # In WAL mode NORMAL never corrupts; a power cut may lose the last records, which an
    # auditor can afford, while an fsync per compile record it cannot.
    conn.execute("PRAGMA synchronous = NORMAL")
    version = stored_version(conn, path)
    if version == SCHEMA_VERSION:
        return
    if version is not None and version > SCHEMA_VERSION:
        raise LedgerError(
            f"{path} has ledger schema version {version}, newer than this cacheaudit "
            f"({__version__}) understands ({SCHEMA_VERSION}); upgrade cacheaudit")
    if version is None and not create:
        raise LedgerError(
            f"{path} is empty or not a cacheaudit ledger yet; run `cacheaudit scan` "
            "or record into it first")
    if read_only:
        raise LedgerError(
            f"{path} has ledger schema version {version}, older than this cacheaudit's "
            f"({SCHEMA_VERSION}), and cannot be written to be upgraded; copy it somewhere "
            "writable and read the copy")
    # An older ledger is upgraded by whoever opens it first, reader or writer: the records
    # in it stay readable only through the current schema.
    _retrying(lambda: _enable_wal(conn), patience_s)
    _retrying(lambda: _migrate(conn, path), patience_s)


def stored_version(conn: sqlite3.Connection, path: str) -> int | None:
    """The schema version, None for an empty file; LedgerError for a foreign database."""
    tables = {row["name"] for row in _rows(
        conn, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not tables:
        return None
    application_id = _value(conn, "PRAGMA application_id")
    if "meta" not in tables or application_id != APPLICATION_ID:
        raise LedgerError(
            f"{path} is an SQLite database but not a cacheaudit ledger "
            f"(tables: {', '.join(sorted(tables)[:5])})")
    version = _value(conn, "SELECT value FROM meta WHERE key = 'schema_version'")
    if version is None:
        raise LedgerError(f"{path} is a damaged cacheaudit ledger: no schema version")
    try:
        number = int(version)
    except ValueError:
        raise LedgerError(f"{path} is a damaged cacheaudit ledger: its schema version is "
                          f"{version!r}, not a number") from None
    # Checked on the set just read, so the shim's open pays nothing for it: a ledger that
    # lost tables would otherwise fail later, mid-command, as if cacheaudit had a bug. An
    # older version gains its missing tables by migrating.
    missing = [table for table in _TABLES if table not in tables]
    if number == SCHEMA_VERSION and missing:
        which = (f"its table {missing[0]} is" if len(missing) == 1
                 else f"its tables {', '.join(missing)} are")
        raise LedgerError(f"{path} is a damaged cacheaudit ledger: {which} missing{RESTORE}")
    return number


def damage(conn: sqlite3.Connection, path: str, error: sqlite3.DatabaseError) -> str | None:
    """What is wrong with the ledger at `path` when `error` came out of reading it, in one
    line; None when the file is sound and the error is not its fault (a bug of ours, another
    file attached). Only asked once something failed: the checks read the whole file."""
    code = (getattr(error, "sqlite_errorcode", 0) or 0) & 0xFF
    if code == _SQLITE_NOTADB:
        return f"{path} is not a cacheaudit ledger (not an SQLite file)"
    if str(error).startswith("Could not decode to UTF-8"):
        # cacheaudit writes UTF-8 text alone: other bytes there are damage (an overwritten
        # page SQLite's checks pass, a hand edit). The error quotes the bytes: not repeated.
        return (f"{path} is a damaged cacheaudit ledger: a text value in it is not UTF-8"
                f"{RESTORE}")
    if code != _SQLITE_CORRUPT and not str(error).startswith(("no such table", "no such column")):
        return None
    try:
        problems = [row[0] for row in conn.execute("PRAGMA main.quick_check(1)")]
    except sqlite3.DatabaseError as exc:
        return damaged_file(path, exc)
    if problems != ["ok"]:
        return damaged_file(path, problems[0])
    if code == _SQLITE_CORRUPT:
        return damaged_file(path, error)
    lacking = missing_columns(conn)
    if lacking:
        return f"{path} is a damaged cacheaudit ledger: {lacking}{RESTORE}"
    return None


def damaged_file(path: str, error: sqlite3.DatabaseError | str) -> str:
    """The line for a file SQLite itself finds damaged (a truncated copy, overwritten pages):
    `error`, or the first problem a quick_check row names."""
    lines = [line.strip() for line in str(error).splitlines()
             if line.strip() and not line.startswith("***")]
    return f"{path} is a damaged SQLite file ({lines[0] if lines else error}){RESTORE}"


RESTORE = ": restore it from a copy, or move it away and record again"
_SQLITE_CORRUPT = 11
_SQLITE_NOTADB = 26


def missing_columns(conn: sqlite3.Connection) -> str:
    """The columns this version's tables have that the ledger's lack, as "table records has no
    column kernel"; "" when none is missing. One query (~0.3 ms): the readers' way in asks it
    of every ledger, so that a command fails at the opening, before writing, rather than at
    the first query that reads such a column."""
    present: dict[str, set[str]] = {}
    for table, column in conn.execute(
            "SELECT m.name, p.name FROM main.sqlite_master AS m, pragma_table_info(m.name) AS p"
            " WHERE m.type = 'table'"):
        present.setdefault(table, set()).add(column)
    lacking = []
    for table, wanted in _columns().items():
        absent = [column for column in wanted if column not in present.get(table, ())]
        if table not in present:
            lacking.append(f"table {table} is missing")
        elif absent:
            lacking.append(f"table {table} has no column {', '.join(absent)}")
    return "; ".join(lacking)


@functools.cache
def _columns() -> dict[str, tuple[str, ...]]:
    """Each table's columns as this version's SCHEMA makes them, read from SQLite itself."""
    expected = sqlite3.connect(":memory:")
    try:
        for statement in _statements(SCHEMA):
            expected.execute(statement)
        return {table: tuple(row[1] for row in expected.execute(f"PRAGMA table_info({table})"))
                for table in _TABLES}
    finally:
        expected.close()


def _migrate(conn: sqlite3.Connection, path: str) -> None:
    """Create or upgrade the schema under one write lock, so racing shims do it once."""
    import sqlite_utils

    conn.execute("BEGIN IMMEDIATE")
    try:
        if stored_version(conn, path) != SCHEMA_VERSION:
            _MIGRATIONS.apply(sqlite_utils.Database(conn, execute_plugins=False))
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
