"""The ledger's read path: rows back into `CompileRecord`s, with their include graphs,
compiler identities and JSON values each loaded once per `Ledger`; a stored value that is not
what cacheaudit writes is left out of its record, with a note."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cacheaudit import bounded
from cacheaudit.ledger.connection import LedgerConnection
from cacheaudit.ledger.rows import (
    STATE_COLUMNS,
    Row,
    _chunks,
    _params,
    _row,
    _rows,
    _select_list,
    _value,
)
from cacheaudit.ledger.schema import _TABLES
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    GraphFile,
    IncludeGraph,
    split_stored_extra,
)

_BLOB_COLUMNS = ("tracked_id", "effective_argv_id", "extra_id", "argv_id", "env_id", "notes_id")


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



def _state_from_row(row: Row) -> FileState:
    return FileState(row["path"], bool(row["present"]), row["size"], row["mtime_ns"],
                     row["ctime_ns"], row["inode"], row["digest"] or None, bool(row["settled"]),
                     row["error"] or None)


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value or ())


def _tuple_or_none(value: Any) -> tuple[Any, ...] | None:
    return tuple(value) if value is not None else None


def _tokens(value: Any) -> tuple[ArgToken, ...]:
    return tuple(ArgToken(text, origin) for text, origin in value or ())


def _mapping(value: Any) -> dict[str, Any]:
    return value or {}


class LedgerReads(LedgerConnection):
    """How a `Ledger` reads records (and their parts) back, for the queries built on it."""

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

    def record(self, record_uuid: str) -> CompileRecord | None:
        found = self.records(where="r.record_uuid = ?", params=(record_uuid,))
        return found[0] if found else None

    def _record_from_row(self, row: Row, with_graphs: bool, with_files: bool = True,
                         files: tuple[tuple[FileState, ...], tuple[FileState, ...]] | None = None
                         ) -> CompileRecord:
        sources = self.load_graph(row["sources_id"]) if with_graphs and with_files else None
        outputs = self.load_graph(row["outputs_id"]) if with_graphs and with_files else None
        facts, extra = self._stored(row, "extra_id", split_stored_extra)
        return CompileRecord(
            record_id=row["record_uuid"], event=row["event"], started_ns=row["started_ns"],
            runtime=row["runtime"], kernel=row["kernel"], key=row["key"], entry=row["entry"],
            compiler=self.load_compiler(row["compiler_id"]),
            argv=self._stored(row, "argv_id", _tuple),
            effective_argv=self._stored(row, "effective_argv_id", _tokens),
            # Mappings are the record's own (the tuples are shared: they cannot change).
            env=dict(self._stored(row, "env_id", _mapping)), cwd=row["cwd"] or "",
            sources=files[0] if files else tuple(f.state for f in sources.files) if sources
            else (),
            graph=self.load_graph(row["graph_id"]) if with_graphs else None,
            outputs=files[1] if files else tuple(f.state for f in outputs.files) if outputs
            else (),
            tracked=self._stored(row, "tracked_id", _tuple_or_none),
            exit_code=row["exit_code"], signal=row["signal"], duration_ns=row["duration_ns"],
            pid=row["pid"], host=row["host"], test_id=row["test_id"], observer=row["observer"],
            notes=self._stored(row, "notes_id", _tuple) + self._refusals(row),
            extra=dict(extra),
            run_uuid=row["run_uuid"], graph_id=None if with_graphs else row["graph_id"],
            **facts)

    def _stored(self, row: Row, column: str, make: Callable[[Any], Any]) -> Any:
        """A record's stored value of `column` in the form the record holds (`make` of
        `_load_shaped`), loaded, shape-checked and made once per value and ledger: the records
        of a scan share a handful of argvs, environments and notes, and making each again
        for every record was most of reading them back."""
        key = (column, row[column])
        try:
            return self._made[key]
        except KeyError:
            made = self._made[key] = make(self._load_shaped(row, column))
            return made

    def _refusals(self, row: Row) -> tuple[str, ...]:
        return tuple(self._refused_blobs[row[c]] for c in _BLOB_COLUMNS
                     if row[c] in self._refused_blobs)

    def records_by_uuid(self, uuids: Iterable[str], with_files: bool = True
                        ) -> dict[str, CompileRecord]:
        found: dict[str, CompileRecord] = {}
        for part in _chunks(uuids):
            marks = ", ".join("?" * len(part))
            for record in self.records(where=f"r.record_uuid IN ({marks})", params=part,
                                       with_files=with_files):
                found[record.record_id] = record
        return found
