"""What `cacheaudit evict` removed: written once per evict pass, read by `stats` and by people
(`sqlite3 ledger.db 'SELECT * FROM evictions'`). The table is documented in docs/ledger.md."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from cacheaudit.ledger.rows import _params, _retrying, _rows
from cacheaudit.ledger.store import Ledger
from cacheaudit.ledger.values import RunInfo


@dataclass(frozen=True)
class Eviction:
    """One entry an evict pass removed (`outcome` "evicted") or failed to (`error` says why),
    with the finding that chose it: the most severe, first in the scan's order."""

    audit_uuid: str
    evicted_ns: int
    runtime: str
    layout: str
    root: str
    entry: str
    kernel: str | None
    key: str | None
    bytes: int
    code: str
    subject: str
    record_uuid: str | None
    codes: tuple[str, ...]
    outcome: str
    error: str = ""
    run_uuid: str = ""


def add_evictions(ledger: Ledger, evictions: Iterable[Eviction], run: RunInfo) -> None:
    """Store an evict pass's rows in one transaction, under the pass's run."""
    rows = list(evictions)
    if not rows:
        return

    def write() -> None:
        with ledger._write() as conn:
            run_id = ledger._run_id(run)
            conn.executemany(
                "INSERT INTO evictions (audit_uuid, run_id, evicted_ns, runtime, layout, root,"
                " entry, kernel, key, bytes, code, subject, record_uuid, codes, outcome, error)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [_params((e.audit_uuid, run_id, e.evicted_ns, e.runtime, e.layout, e.root,
                          e.entry, e.kernel, e.key, e.bytes, e.code, e.subject, e.record_uuid,
                          json.dumps(list(e.codes)), e.outcome, e.error)) for e in rows])

    _retrying(write)


def evictions(ledger: Ledger, *, root: str | None = None) -> list[Eviction]:
    """Every eviction the ledger holds (of one root when given), oldest first."""
    sql = ("SELECT v.*, runs.run_uuid FROM evictions v JOIN runs ON runs.id = v.run_id"
           + (" WHERE v.root = ?" if root is not None else "") + " ORDER BY v.evicted_ns, v.id")
    return [Eviction(
        audit_uuid=r["audit_uuid"], evicted_ns=r["evicted_ns"], runtime=r["runtime"],
        layout=r["layout"], root=r["root"], entry=r["entry"], kernel=r["kernel"], key=r["key"],
        bytes=r["bytes"], code=r["code"], subject=r["subject"], record_uuid=r["record_uuid"],
        codes=tuple(json.loads(r["codes"])), outcome=r["outcome"], error=r["error"],
        run_uuid=r["run_uuid"]) for r in _rows(ledger.conn, sql, () if root is None else (root,))]
