"""The ledger's write path: records, findings, tests, cache roots, seen states and
attributions, each in one short transaction, with paths, file states, include graphs, compiler
identities, runs and JSON values interned (stored once, referenced by id). Records go in by
the batch (`batching`: a few statements per batch, not a few per record)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from cacheaudit.ids import uuid4_hex
from cacheaudit.ledger import batching
from cacheaudit.ledger.redact import redact_records, redact_run
from cacheaudit.ledger.rows import _blob_json, _params, _value
from cacheaudit.ledger.sessions import SessionWrites
from cacheaudit.ledger.values import Attribution, RunInfo
from cacheaudit.model import (
    CompileRecord,
    CompilerIdentity,
    FileState,
    Finding,
    content_digest,
)
from cacheaudit.plain import PausedCollector


class LedgerWrites(SessionWrites):
    """What a `Ledger` stores, and the content-addressed ids it stores it under."""

    # ---------------------------------------------------------------- interning

    def _intern(self, kind: str, insert: str, select: str, params: tuple[Any, ...],
                memo_key: Any, key_params: int | None = None) -> int:
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
            params, params)

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

    # ---------------------------------------------------------------- writing

    def add_records(self, records: Iterable[CompileRecord], run: RunInfo) -> int:
        """Store records in one short transaction; a record already present is skipped.

        Returns how many were new. Retries while other writers hold the lock, for at most the
        ledger's patience (then `LedgerBusy`). Command lines are stored redacted
        (`ledger.redact`; a recorder redacts before it seals, so this changes nothing there).
        A failure rolls the whole call back: none of its records is stored.
        """
        batch = redact_records(records)
        run = redact_run(run)

        def write() -> int:
            with self._write():
                run_id = self._run_id(run)
                return batching.insert_records(self, batch, run_id)

        return self._retry(write)

    def add_records_in_batches(self, records: Iterable[CompileRecord], run: RunInfo, *,
                               batch_size: int = batching.BATCH_SIZE) -> int:
        """Store many records, `batch_size` to a transaction (`add_records` for each batch),
        reading `records` as it goes: an importer or a benchmark with a million records holds
        one batch at a time, and the ids remembered between batches are bounded.

        Returns how many were new. A batch that fails is rolled back whole and its error
        raised; every batch before it stays committed, and none after it is tried."""
        added = 0
        batching.widen_page_cache(self)
        for batch in batching.chunked(records, batch_size):
            batching.bound_memo(self)
            # Python's cycle collector paused while a batch is stored (not while `records`
            # is read): the batch's rows and interned ids are objects that all survive, and
            # the full collections they set off were a seventh of a compile record's CPU time.
            with PausedCollector():
                added += self.add_records(batch, run)
        return added

    def add_findings(self, findings: Iterable[Finding], audit_uuid: str | None = None) -> str:
        """Store the findings of one audit pass; returns its audit id."""
        audit_uuid = audit_uuid or uuid4_hex()
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

    def remember_roots(self, roots: Iterable[tuple[str, str]]) -> None:
        rows = [_params((root, layout, time.time_ns())) for layout, root in roots]
        if not rows:
            return

        def write() -> None:
            with self._write() as conn:
                conn.executemany("INSERT OR REPLACE INTO cache_roots (path, layout, last_scan_ns)"
                                 " VALUES (?, ?, ?)", rows)

        self._retry(write)

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
