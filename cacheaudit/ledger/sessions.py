"""What a session asks of its ledger at its end, without the records' model: its run, its test
windows, whether it recorded anything, the cache roots earlier scans found. `LedgerWrites` and
so `Ledger` build on it; `SessionLedger` is it alone, for a `pytest --cacheaudit` session that
recorded nothing (its end then costs SQLite, not the record model's import: docs/performance.md,
"Fixed costs")."""

from __future__ import annotations

from collections.abc import Iterable

from cacheaudit import __version__
from cacheaudit.ledger.connection import LedgerConnection
from cacheaudit.ledger.opened import Opening
from cacheaudit.ledger.rows import _blob_json, _params, _rows, _value

TYPE_CHECKING = False
if TYPE_CHECKING:
    from cacheaudit.ledger.values import RunInfo, TestWindow


class SessionWrites(LedgerConnection):
    """A session's run, its tests and the questions its end asks."""

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

    def mend_record_indexes(self) -> None:
        """The schema's record indexes made where one is missing, as every combine first does
        (a combine killed between dropping and rebuilding them leaves the records without):
        what `combine` of no sources writes, without importing the combine."""
        from cacheaudit.ledger.schema import _RECORD_INDEXES

        def write() -> None:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                for statement in _RECORD_INDEXES.values():
                    self.conn.execute(statement)
                self.conn.execute("COMMIT")
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK")
                raise

        self._retry(write)

    def known_roots(self) -> list[str]:
        return [r["path"] for r in _rows(self.conn, "SELECT path FROM cache_roots")]

    def has_records_of(self, run_uuid: str) -> bool:
        """Whether any record belongs to the run `run_uuid` (one index look-up, nothing read)."""
        return _value(self.conn, "SELECT 1 FROM records WHERE run_id = (SELECT id FROM runs"
                      " WHERE run_uuid = ?) LIMIT 1", (run_uuid,)) is not None


class SessionLedger(Opening, SessionWrites):
    """An open ledger file for a session's end (`SessionWrites`); `Ledger` is the whole of it.
    Use `SessionLedger.open()`."""
