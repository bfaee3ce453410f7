"""The open ledger: records, findings, tests and cache roots written in short transactions
(content-addressed), and read back by column name."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from cacheaudit import __version__, bounded
from cacheaudit.exceptions import LedgerBusy, LedgerError, LedgerReadOnly
from cacheaudit.ledger import private
from cacheaudit.ledger.opening import connect_read_only, writable
from cacheaudit.ledger.redact import redact_record, redact_run
from cacheaudit.ledger.rows import (
    STATE_COLUMNS,
    Row,
    _blob_json,
    _chunks,
    _is_busy,
    _params,
    _retrying,
    _row,
    _rows,
    _select_list,
    _state_from_row,
    _value,
)
from cacheaudit.ledger.schema import _TABLES, BUSY_TIMEOUT_S, prepare
from cacheaudit.ledger.values import Attribution, RunInfo, TestWindow, default_ledger_path
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

_BLOB_COLUMNS = ("tracked_id", "effective_argv_id", "extra_id", "argv_id", "env_id", "notes_id")

T = TypeVar("T")


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _string_pairs(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(item, list) and len(item) == 2 and all(isinstance(x, str) for x in item)
        for item in value)


def _string_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(item, str) for item in value.values())


def _wrappers(value: Any) -> tuple[str, ...]:
    return tuple(item for item in value if isinstance(item, str)) if isinstance(value, list) else ()


# The JSON shape each stored value has when cacheaudit wrote it: a ledger from elsewhere may
# hold valid JSON of any other shape, which the record leaves out (with a note) like a value
# the bounded reader refuses.
_BLOB_SHAPES: dict[str, tuple[str, Any]] = {
    "tracked_id": ("a list of strings", _strings),
    "effective_argv_id": ("a list of [text, origin] pairs", _string_pairs),
    "extra_id": ("an object", lambda value: isinstance(value, dict)),
    "argv_id": ("a list of strings", _strings),
    "env_id": ("an object of strings", _string_map),
    "notes_id": ("a list of strings", _strings),
}


class Ledger:
    """An open ledger file. Use `Ledger.open()`; close it, or use it as a context manager."""

    def __init__(self, path: str, conn: sqlite3.Connection, *,
                 patience_s: float = BUSY_TIMEOUT_S, read_only: bool = False) -> None:
        self.path = path
        self.conn = conn
        self.patience_s = patience_s
        self.read_only = read_only
        """Opened read-only: the file or its directory cannot be written here."""
        self.unwritable: str | None = None
        """Why writes into this ledger stopped (busy past `patience_s`, read-only): once one
        write failed so, the next fail at once instead of waiting again."""
        self.tell: Callable[[str], None] | None = None
        """Told once, in one line, when this ledger turns out not to be writable (the readers'
        way in sets it; a recorder spools instead and says so itself)."""
        self._told = False
        self.unseen: str | None = None
        """What a read-only connection cannot read (a WAL it cannot share), or None."""
        self._ids: dict[tuple[str, str], int] = {}
        self._graph_cache: dict[int, IncludeGraph] = {}
        self._compiler_cache: dict[int, CompilerIdentity] = {}
        self._blob_cache: dict[int, Any] = {}
        self._refused_blobs: dict[int, str] = {}

    # ---------------------------------------------------------------- opening

    @classmethod
    def open(cls, path: str | None = None, *, create: bool = True,
             patience_s: float = BUSY_TIMEOUT_S) -> Ledger:
        """Open (and with `create`, make or upgrade) the ledger at `path` or the default place.

        A new ledger is made 0600 in directories made 0700 (`private`); its WAL and SHM take
        its mode. A ledger that cannot be written (a read-only mount, no write permission) is
        opened read-only: readable, and every write raises `LedgerReadOnly`. Writes wait
        `patience_s` for another process's lock, then raise `LedgerBusy`."""
        path = os.path.abspath(path or default_ledger_path())
        exists = os.path.exists(path)
        if not exists and not create:
            raise LedgerError(f"no ledger at {path}")
        if exists and os.path.isdir(path):
            raise LedgerError(f"{path} is a directory, not a cacheaudit ledger")
        if not exists:
            try:
                private.make_directories(os.path.dirname(path))
                private.create_file(path)
            except OSError as exc:
                raise LedgerError(f"cannot create a ledger at {path}: {exc.strerror}") from exc
        read_only, unseen = False, None
        try:
            if writable(path):
                conn = sqlite3.connect(path, timeout=patience_s, isolation_level=None,
                                       check_same_thread=False)
            else:
                conn, unseen = connect_read_only(path, patience_s)
                read_only = True
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                raise LedgerError(
                    f"{path} is not a cacheaudit ledger (not an SQLite file)") from exc
            raise LedgerError(f"cannot open {path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open {path}: {exc}") from exc
        ledger = cls(path, conn, patience_s=patience_s, read_only=read_only)
        ledger.unseen = unseen
        if read_only:
            ledger.unwritable = f"the ledger {path} is read-only"
        try:
            prepare(conn, path, create, patience_s, read_only=read_only)
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

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _retry(self, write: Callable[[], T]) -> T:
        """Run a write transaction, retrying while another writer holds the lock, for at most
        `patience_s`; then `LedgerBusy`. A ledger found unwritable once fails at once."""
        if self.unwritable is not None:
            self._cannot_write(self.unwritable, LedgerReadOnly if self.read_only else LedgerBusy)
        try:
            return _retrying(write, self.patience_s)
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                self._cannot_write(
                    f"the ledger {self.path} is busy: another process has held its write lock "
                    f"for over {self.patience_s:g} s", LedgerBusy, exc)
            if "readonly" in str(exc) or "read-only" in str(exc):
                self.read_only = True
                self._cannot_write(f"the ledger {self.path} is read-only ({exc})",
                                   LedgerReadOnly, exc)
            raise

    def try_again(self) -> None:
        """Let the next write wait for the lock again after a busy one: for a connection kept
        open between writes (an in-process recorder's), where a later write may find it free."""
        if not self.read_only:
            self.unwritable = None

    def _cannot_write(self, why: str, kind: type[LedgerError],
                      cause: BaseException | None = None) -> None:
        self.unwritable = why
        if self.tell is not None and not self._told:
            self._told = True
            with contextlib.suppress(Exception):
                self.tell(f"{why}: nothing this command learnt is kept in it")
        raise kind(why) from cause

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

        Returns how many were new. Retries while other writers hold the lock, for at most the
        ledger's patience (then `LedgerBusy`). Command lines are stored redacted
        (`ledger.redact`; a recorder redacts before it seals, so this changes nothing there).
        """
        batch = [redact_record(r) for r in records]
        run = redact_run(run)

        def write() -> int:
            with self._write():
                run_id = self._run_id(run)
                return sum(self._insert_record(r, run_id) for r in batch)

        return self._retry(write)

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

        self._retry(write)
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
                f"SELECT g.graph_id AS graph_id, {STATE_COLUMNS}, w.path AS written"
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
            try:
                value = bounded.loads(body) if body is not None else None
            except bounded.Refused as exc:
                # A ledger from elsewhere may hold anything: the record loses this one value
                # and says so in its notes, instead of every report that reads it failing.
                self._refused_blobs[blob_id] = f"ledger value {blob_id} {exc}: left out"
                value = None
            self._blob_cache[blob_id] = value
        return self._blob_cache[blob_id]

    def _load_shaped(self, row: Row, column: str) -> Any:
        """A record's stored value if it has the shape cacheaudit writes, else None, noted."""
        blob_id = row[column]
        value = self._load_blob(blob_id)
        what, fits = _BLOB_SHAPES[column]
        if value is not None and not fits(value):
            self._refused_blobs[blob_id] = (f"ledger value {blob_id} is a JSON "
                                            f"{type(value).__name__} that is not {what}: left out")
            return None
        return value

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
                wrappers=_wrappers(bounded.loads_or(row["wrappers"], [])), kind=row["kind"],
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

    @staticmethod
    def _kernel_filter(kernel: str | None, runtime: str | None) -> tuple[str, list[Any]]:
        conditions, params = [], []
        if kernel:
            conditions.append("r.kernel = ?")
            params.append(kernel)
        if runtime:
            conditions.append("r.runtime = ?")
            params.append(runtime)
        return " AND ".join(conditions), params

    def count_records(self, *, kernel: str | None = None, runtime: str | None = None) -> int:
        """How many records `recent_records` chooses from (its filter, no limit)."""
        where, params = self._kernel_filter(kernel, runtime)
        sql = "SELECT count(*) AS count FROM records r" + (f" WHERE {where}" if where else "")
        return int(_value(self.conn, sql, _params(params)))

    def recent_records(self, *, kernel: str | None = None, runtime: str | None = None,
                       limit: int = 50, with_files: bool = True) -> list[CompileRecord]:
        """The newest `limit` records, of one kernel or runtime when given, newest last."""
        where, params = self._kernel_filter(kernel, runtime)
        found = self.records(where=where, params=params,
                             order="r.started_ns DESC, r.id DESC", limit=max(limit, 0),
                             with_files=with_files)
        found.reverse()
        return found

    def record(self, record_uuid: str) -> CompileRecord | None:
        found = self.records(where="r.record_uuid = ?", params=(record_uuid,))
        return found[0] if found else None

    def _record_from_row(self, row: Row, with_graphs: bool, with_files: bool = True,
                         files: tuple[tuple[FileState, ...], tuple[FileState, ...]] | None = None
                         ) -> CompileRecord:
        sources = self.load_graph(row["sources_id"]) if with_graphs and with_files else None
        outputs = self.load_graph(row["outputs_id"]) if with_graphs and with_files else None
        tracked = self._load_shaped(row, "tracked_id")
        effective = self._load_shaped(row, "effective_argv_id") or []
        facts, extra = split_stored_extra(self._load_shaped(row, "extra_id"))
        return CompileRecord(
            record_id=row["record_uuid"], event=row["event"], started_ns=row["started_ns"],
            runtime=row["runtime"], kernel=row["kernel"], key=row["key"], entry=row["entry"],
            compiler=self.load_compiler(row["compiler_id"]),
            argv=tuple(self._load_shaped(row, "argv_id") or ()),
            effective_argv=tuple(ArgToken(t, o) for t, o in effective),
            env=dict(self._load_shaped(row, "env_id") or {}), cwd=row["cwd"] or "",
            sources=files[0] if files else tuple(f.state for f in sources.files) if sources
            else (),
            graph=self.load_graph(row["graph_id"]) if with_graphs else None,
            outputs=files[1] if files else tuple(f.state for f in outputs.files) if outputs
            else (),
            tracked=tuple(tracked) if tracked is not None else None,
            exit_code=row["exit_code"], signal=row["signal"], duration_ns=row["duration_ns"],
            pid=row["pid"], host=row["host"], test_id=row["test_id"], observer=row["observer"],
            notes=tuple(self._load_shaped(row, "notes_id") or ()) + self._refusals(row),
            extra=extra,
            run_uuid=row["run_uuid"], graph_id=None if with_graphs else row["graph_id"],
            **facts)

    def _refusals(self, row: Row) -> tuple[str, ...]:
        return tuple(self._refused_blobs[row[c]] for c in _BLOB_COLUMNS
                     if row[c] in self._refused_blobs)

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

        self._retry(write)

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
                                       command=tuple(bounded.loads_or(r["command"], []))
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

        self._retry(write)

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

        self._retry(write)

    def seen_states(self) -> list[FileState]:
        rows = _rows(self.conn,
                     f"SELECT {STATE_COLUMNS} FROM seen_states v"
                     " JOIN file_states s ON s.id = v.state_id JOIN files f ON f.id = v.file_id")
        return [_state_from_row(r) for r in rows]

    def identity_candidates(self, *, entries: Iterable[str] = (), sources: Iterable[str] = (),
                            source_digests: Iterable[str] = (),
                            output_digests: Iterable[str] = ()) -> list[CompileRecord]:
        """The compile records that may have built the scanned entries, each with the paths and
        digests of its sources and outputs (`_identity_records`;
        the audit chooses among them, `audit/identity.py`): those already attributed
        to an entry path of `entries`, those whose primary sources hold a path of `sources` or
        a content digest of `source_digests`, and those whose outputs hold a digest of
        `output_digests` (asked only for entries without a source file).

        Indexed queries in chunks: the cost follows the entries scanned, not the ledger."""
        found: set[str] = set()
        # CROSS JOIN fixes the join order (SQLite's rule): from the few values asked about,
        # through the indexes, to the records; never a scan of the records.
        by_state = " CROSS JOIN graph_files g ON g.state_id = s.id CROSS JOIN records r ON r.{}"
        queries = (
            (entries, "files e CROSS JOIN records r ON r.entry_id = e.id WHERE e.path"),
            (sources, "files f CROSS JOIN file_states s ON s.file_id = f.id"
                      + by_state.format("sources_id = g.graph_id") + " WHERE f.path"),
            (source_digests, "file_states s" + by_state.format("sources_id = g.graph_id")
                             + " WHERE s.digest"),
            (output_digests, "file_states s" + by_state.format("outputs_id = g.graph_id")
                             + " WHERE s.digest"),
        )
        for values, condition in queries:
            for part in _chunks({v for v in values if v}):
                sql = (f"SELECT DISTINCT r.record_uuid AS record_uuid FROM {condition}"
                       f" IN ({', '.join('?' * len(part))}) AND r.event = 'compile'")
                found.update(row["record_uuid"] for row in _rows(self.conn, sql, _params(part)))
        return self._identity_records(sorted(found))

    def _identity_records(self, uuids: Sequence[str]) -> list[CompileRecord]:
        """The records of `uuids` as `records(with_files=False)` reads them (the shared include
        graph loaded once), with the paths and digests of their sources and outputs (states with
        nothing else known): what identity needs, read by the thousand."""
        found: list[CompileRecord] = []
        for part in _chunks(uuids):
            rows = _rows(self.conn, f"SELECT {self._RECORD_COLUMNS}{self._RECORD_FROM}"
                                    f" WHERE r.record_uuid IN ({', '.join('?' * len(part))})",
                         _params(part))
            members = self._graph_members({row[c] for row in rows
                                           for c in ("sources_id", "outputs_id")})
            self._load_graphs(row["graph_id"] for row in rows)  # shared: few, each once
            found += [self._record_from_row(row, True, with_files=False, files=(
                members.get(row["sources_id"], ()), members.get(row["outputs_id"], ())))
                for row in rows]
        return found

    def _graph_members(self, graph_ids: Iterable[int | None]) -> dict[int, tuple[FileState, ...]]:
        """Graph id -> its files as (path, digest) states, for small graphs read by the
        thousand (sources and outputs): no stat fields, no `IncludeGraph`."""
        members: dict[int, list[FileState]] = {}
        for part in _chunks({g for g in graph_ids if g is not None}):
            for row in _rows(
                    self.conn,
                    "SELECT g.graph_id AS graph_id, f.path AS path, s.present AS present,"
                    " s.digest AS digest FROM graph_files g JOIN file_states s ON s.id ="
                    " g.state_id JOIN files f ON f.id = s.file_id"
                    f" WHERE g.graph_id IN ({', '.join('?' * len(part))})"
                    " ORDER BY g.graph_id, g.position", part):
                members.setdefault(row["graph_id"], []).append(FileState(
                    row["path"], bool(row["present"]), digest=row["digest"] or None))
        return {graph_id: tuple(states) for graph_id, states in members.items()}

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

        self._retry(write)

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
