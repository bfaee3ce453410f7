"""Records written by the batch: the paths, file states and graphs of a whole batch interned in
a few statements (looked up by the hundred, the new ones inserted with `executemany` under ids
handed out here), then every record row in one `executemany`.

Handing out ids is safe because a batch runs inside the writer's `BEGIN IMMEDIATE`: no other
connection can insert between the `max(id)` read and the inserts, and a rollback clears the
ids remembered (`LedgerConnection._write`). Nothing is ever deleted from the interned tables,
so an id remembered from an earlier, committed batch stays right.

One record at a time (the shim's case) costs what it did: a handful of statements.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

import xxhash

from cacheaudit.ledger.rows import _blob_json, _chunks, _params, _rows, _value
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    IncludeGraph,
)

if TYPE_CHECKING:
    from cacheaudit.ledger.writes import LedgerWrites

BATCH_SIZE = 10_000
"""Records per transaction in `add_records_in_batches`: large enough that the per-transaction
cost (a commit, a few look-ups) vanishes, small enough that a writer holds the lock for well
under a second and a batch's rows stay a few MiB."""

MEMO_LIMIT = 200_000
"""Ids a ledger object remembers between batches before it forgets them (they are looked up
again when needed): a million records would otherwise hold millions of ids."""

_INSERT_RECORD = (
    "INSERT INTO records (record_uuid, run_id, event, runtime, kernel, key,"
    " entry_id, compiler_id, argv_id, effective_argv_id, env_id, cwd_id, sources_id,"
    " graph_id, outputs_id, tracked_id, exit_code, signal, started_ns, duration_ns, pid,"
    " host, test_id, observer, notes_id, extra_id)"
    # Only a record already present is skipped: OR IGNORE would also drop, without a word, a
    # record that breaks NOT NULL or CHECK (an unknown event, say).
    f" VALUES ({', '.join('?' * 26)}) ON CONFLICT(record_uuid) DO NOTHING")


def chunked(values: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """`values` in lists of `size`, read as they come."""
    if size < 1:
        raise ValueError(f"batch size must be at least 1, not {size}")
    iterator = iter(values)
    while batch := list(itertools.islice(iterator, size)):
        yield batch


PAGE_CACHE_KIB = 65_536
"""SQLite's page cache for a connection that writes by the batch (the default is 2 MiB): a
ledger of a million records has indexes of random keys (record ids, digests, paths) far larger
than that, and each insertion into one then reads its pages back in. Bounded: 64 MiB."""


def widen_page_cache(ledger: LedgerWrites) -> None:
    current = int(_value(ledger.conn, "PRAGMA cache_size"))
    # Negative values are KiB, positive ones pages; only ever widened.
    if -current < PAGE_CACHE_KIB and current < PAGE_CACHE_KIB // 4:
        ledger.conn.execute(f"PRAGMA cache_size = -{PAGE_CACHE_KIB}")


def bound_memo(ledger: LedgerWrites) -> None:
    if len(ledger._ids) > MEMO_LIMIT:
        ledger._ids.clear()


def _state_params(file_id: int, state: FileState) -> tuple[Any, ...]:
    return (file_id, int(state.exists), state.size, state.mtime_ns, state.ctime_ns, state.inode,
            state.digest or "", int(state.settled), state.error or "")


class _Member(NamedTuple):
    """A `GraphFile` of a record's sources or outputs, as cheap as a tuple: a batch makes two
    for every compile record."""

    state: FileState
    written: str

    @property
    def path(self) -> str:
        return self.state.path


class _StatesGraph(NamedTuple):
    """A record's sources or outputs as the graph they are stored as (`IncludeGraph`'s files,
    method and digest; the path as written is the state's own)."""

    files: tuple[_Member, ...]
    method: str
    digest: str


def _states_graph(states: tuple[FileState, ...], method: str) -> _StatesGraph | None:
    if not states:
        return None
    return _StatesGraph(tuple(map(_Member, states, [s.path for s in states])), method,
                        _states_digest(method, states))


_LENGTH = 8  # json_digest's length prefix of each part, in bytes


def _part(text: str) -> bytes:
    data = text.encode("utf-8", "surrogateescape")
    return len(data).to_bytes(_LENGTH, "little") + data


_METHOD_PARTS = {method: _part(repr(method)) for method in ("sources", "outputs")}


def _states_digest(method: str, states: tuple[FileState, ...]) -> str:
    """`graph_digest(method, ((s.path, s) for s in states))`, the bytes it hashes made in one
    go: a batch of compiles addresses two of these per record, and the generic digest (a
    hasher fed part by part) was a fifth of a compile record's Python time."""
    head = _METHOD_PARTS.get(method) or _part(repr(method))
    if len(states) == 1:
        # A compile's own source or binary: one state, so no join of parts.
        (s,) = states
        return xxhash.xxh3_128_hexdigest(head + _part(repr(
            (s.path, s.path, s.exists, s.size, s.mtime_ns, s.ctime_ns, s.inode, s.digest,
             s.settled))))
    return xxhash.xxh3_128_hexdigest(head + b"".join(
        _part(repr((s.path, s.path, s.exists, s.size, s.mtime_ns, s.ctime_ns, s.inode, s.digest,
                    s.settled))) for s in states))


StoredGraph = IncludeGraph | _StatesGraph


def _next_id(ledger: LedgerWrites, table: str) -> int:
    return int(_value(ledger.conn, f"SELECT coalesce(max(id), 0) AS top FROM {table}")) + 1


def _intern_files(ledger: LedgerWrites, paths: Iterable[str]) -> set[int]:
    """Every path of `paths` gets an id in the memo: the known looked up by the hundred, the
    rest inserted at once. Returns the ids inserted."""
    memo = ledger._ids
    unknown = {p for p in paths if ("file", p) not in memo}
    if not unknown:
        return set()
    for part in _chunks(unknown):
        for row in _rows(ledger.conn, "SELECT id, path FROM files WHERE path IN"
                         f" ({', '.join('?' * len(part))})", _params(part)):
            path = row["path"]
            memo[("file", path)] = row["id"]
            unknown.discard(path)
    if not unknown:
        return set()
    first = _next_id(ledger, "files")
    rows = [(first + n, path) for n, path in enumerate(sorted(unknown))]
    ledger.conn.executemany("INSERT INTO files (id, path) VALUES (?, ?)",
                            [row if row[1].isascii() else _params(row) for row in rows])
    memo.update((("file", path), row_id) for row_id, path in rows)
    return {row_id for row_id, _path in rows}


def _intern_states(ledger: LedgerWrites, states: Iterable[FileState], new_files: set[int]
                   ) -> list[int]:
    """The id of each of `states`, in their order, each remembered in the memo. A state of a
    file inserted in this batch is new for certain; one of an older file is looked up by the
    unique index first. Each state's parameters are made once (a batch of compiles has two
    states a record)."""
    memo = ledger._ids
    ids: list[int] = []
    new: dict[tuple[Any, ...], int] = {}
    first = 0
    for state in states:
        params = _state_params(memo[("file", state.path)], state)
        # A file inserted in this batch has no state stored or remembered yet: only the
        # batch's own new states can hold it (most states of a batch of compiles).
        found = new.get(params)
        if found is None and params[0] not in new_files:
            found = memo.get(("state", params))
            if found is None:
                found = _value(ledger.conn,
                               "SELECT id FROM file_states WHERE file_id = ? AND present = ?"
                               " AND size = ? AND mtime_ns = ? AND ctime_ns = ? AND inode = ?"
                               " AND digest = ? AND settled = ? AND error = ?",
                               _params(params))
                if found is not None:
                    found = memo[("state", params)] = int(found)
        if found is None:
            if not new:
                first = _next_id(ledger, "file_states")
            found = new[params] = first + len(new)
        ids.append(found)
    if new:
        ledger.conn.executemany(
            "INSERT INTO file_states (id, file_id, present, size, mtime_ns, ctime_ns, inode,"
            " digest, settled, error) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            # A state's text is its digest and error (the path is its file's id).
            [(row_id, *params) if (params[6] + params[8]).isascii()
             else _params((row_id, *params)) for params, row_id in new.items()])
        memo.update((("state", params), row_id) for params, row_id in new.items())
    return ids


def _intern_graphs(ledger: LedgerWrites, graphs: Iterable[StoredGraph]) -> None:
    """Every graph of `graphs` gets an id in the memo (by digest), its files and states too."""
    memo = ledger._ids
    unknown = {g.digest: g for g in graphs if ("graph", g.digest) not in memo}
    for part in _chunks(unknown):
        for row in _rows(ledger.conn, "SELECT id, digest FROM graphs WHERE digest IN"
                         f" ({', '.join('?' * len(part))})", part):
            memo[("graph", row["digest"])] = row["id"]
            del unknown[row["digest"]]
    if not unknown:
        return
    files = [f for g in unknown.values() for f in g.files]
    new_files = _intern_files(
        ledger, itertools.chain.from_iterable((f.path, f.written) for f in files))
    state_ids = iter(_intern_states(ledger, [f.state for f in files], new_files))
    first = _next_id(ledger, "graphs")
    ordered = list(unknown.items())
    ledger.conn.executemany(
        "INSERT INTO graphs (id, digest, method, file_count) VALUES (?, ?, ?, ?)",
        [(first + n, digest, graph.method, len(graph.files))
         if (digest + graph.method).isascii()
         else _params((first + n, digest, graph.method, len(graph.files)))
         for n, (digest, graph) in enumerate(ordered)])
    # The members in the order their states were interned: graph by graph, position by position.
    ledger.conn.executemany(
        "INSERT INTO graph_files (graph_id, position, state_id, written_id) VALUES (?, ?, ?, ?)",
        [(first + n, position, next(state_ids), memo[("file", f.written)])
         for n, (_digest, graph) in enumerate(ordered)
         for position, f in enumerate(graph.files)])
    memo.update((("graph", digest), first + n) for n, (digest, _graph) in enumerate(ordered))


def _blob(ledger: LedgerWrites, value: Any) -> int | None:
    """A JSON value's id, remembered by its text: records of a batch share their flags."""
    if value is None:
        return None
    body = _blob_json(value)
    cached = ledger._ids.get(("blob-body", body))
    if cached is None:
        cached = ledger._blob_id(value)
        if cached is not None:
            ledger._ids[("blob-body", body)] = cached
    return cached


def insert_records(ledger: LedgerWrites, batch: list[CompileRecord], run_id: int) -> int:
    """Store `batch` (already redacted) inside the caller's write transaction; returns how
    many were new."""
    memo = ledger._ids
    graphs = [(_states_graph(r.sources, "sources"), r.graph, _states_graph(r.outputs, "outputs"))
              for r in batch]
    _intern_files(ledger, [p for r in batch for p in (r.entry, r.cwd) if p])
    _intern_graphs(ledger, [g for triple in graphs for g in triple if g is not None])

    def graph_id(graph: StoredGraph | None) -> int | None:
        return None if graph is None else memo[("graph", graph.digest)]

    # The records of a batch share their compiler and most of their JSON values (flags,
    # environment): each is turned into its id once for the batch, by the object itself
    # where it is one the records share (the batch keeps it alive), else by its items.
    known: dict[tuple[str, Any], int | None] = {}

    def blob(kind: str, key: Any, stored: Callable[[Any], Any], value: Any) -> int | None:
        found = known.get((kind, key), _UNKNOWN)
        if found is _UNKNOWN:
            found = known[(kind, key)] = _blob(ledger, stored(value))
        return found  # type: ignore[return-value]

    def compiler_id(compiler: CompilerIdentity | None) -> int | None:
        if compiler is None:
            return None
        found = known.get(("compiler", id(compiler)), _UNKNOWN)
        if found is _UNKNOWN:
            found = known[("compiler", id(compiler))] = ledger._compiler_id(compiler)
        return found  # type: ignore[return-value]

    rows = []
    for record, (sources, graph, outputs) in zip(batch, graphs, strict=True):
        stored_extra = record.stored_extra()
        argv, effective, env, tracked, notes = (record.argv, record.effective_argv,
                                                record.env, record.tracked, record.notes)
        row = (
            record.record_id, run_id, record.event, record.runtime, record.kernel, record.key,
            memo[("file", record.entry)] if record.entry else None,
            compiler_id(record.compiler),
            blob("argv", tuple(argv), list, argv) if argv else None,
            blob("effective", id(effective), _token_lists, effective)
            if effective else None,
            blob("env", tuple(env.items()), dict, env) if env else None,
            memo[("file", record.cwd)] if record.cwd else None,
            graph_id(sources), graph_id(graph), graph_id(outputs),
            blob("tracked", tuple(tracked), list, tracked)
            if tracked is not None else None,
            record.exit_code, record.signal, record.started_ns, record.duration_ns,
            record.pid, record.host, record.test_id, record.observer,
            blob("notes", tuple(notes), list, notes) if notes else None,
            _blob(ledger, stored_extra) if stored_extra else None,
        )
        # The row's text, checked at once (`_params` per value was a quarter of a hit's
        # Python time): only a record with a non-ASCII value is converted value by value.
        text = (f"{record.record_id}{record.event}{record.runtime}{record.kernel}{record.key}"
                f"{record.host}{record.test_id}{record.observer}")
        rows.append(row if text.isascii() else _params(row))
    before = ledger.conn.total_changes
    ledger.conn.executemany(_INSERT_RECORD, rows)
    return ledger.conn.total_changes - before


_UNKNOWN = object()


def _token_lists(tokens: Iterable[ArgToken]) -> list[list[str]]:
    return [t.to_list() for t in tokens]
