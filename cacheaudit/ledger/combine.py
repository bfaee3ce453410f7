"""`combine`: several ledgers (pytest-xdist workers, ranks, hosts) merged into one, idempotently."""

from __future__ import annotations

import contextlib
import functools
import os
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field

from cacheaudit.exceptions import LedgerError
from cacheaudit.ledger.combine_sql import (
    copy_ledger,
    needs_redaction,
    record_indexes_built_once,
)
from cacheaudit.ledger.opening import read_only_uri
from cacheaudit.ledger.rows import _named_params, _rows, _value
from cacheaudit.ledger.schema import SCHEMA_VERSION, damaged_file, stored_version
from cacheaudit.ledger.spool import ingest_spool
from cacheaudit.ledger.store import Ledger
from cacheaudit.ledger.values import COMPANION_SUFFIXES, RunInfo, TestWindow
from cacheaudit.model import CompileRecord


@dataclass
class CombineResult:
    combined: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    records: int = 0


def combine(target: Ledger, sources: Sequence[str], *, keep: bool = True,
            batch: int = 500, set_wise: bool = True) -> CombineResult:
    """Merge ledgers (pytest-xdist workers, ranks, hosts) into `target`.

    Records keep their ids, so combining twice adds nothing; file states, graphs, compilers and
    JSON values are content-addressed, so the thousands of records that share a CUTLASS graph
    still share one copy. Findings (deduplicated) and known cache roots come along too. A source
    that cannot be read is skipped, named, and left in place (coverage.py's `combine` does the
    same); the others are deleted unless `keep`.

    A source of this cacheaudit's schema version is copied set-wise (`combine_sql`: attached,
    `INSERT ... SELECT`, ids remapped by natural keys), at SQLite's speed; one of another
    version (upgraded when opened), one recorded without redaction (`needs_redaction`), or any
    source when not `set_wise`, record by record through the ledger's write path, as before.
    Both store the same.
    """
    result = CombineResult()
    _refuse_damaged(target)
    with record_indexes_built_once(target.conn, target._retry,
                                   list(sources) if set_wise else [], target.path):
        for source in sources:
            path = os.path.abspath(source)
            if path == os.path.abspath(target.path):
                continue
            same_schema = set_wise and _schema_version(path) == SCHEMA_VERSION
            try:
                opened = Ledger.open(path, create=False)
            except LedgerError as exc:
                result.skipped.append(f"{source}: {exc}")
                continue
            try:
                opened.check_columns()
                _refuse_damaged(opened)
            except LedgerError as exc:
                opened.close()
                result.skipped.append(f"{source}: {exc}")
                continue
            with opened:
                ingest_spool(opened)
                if same_schema and not needs_redaction(opened.conn):
                    copy = functools.partial(copy_ledger, target.conn, path)
                    result.records += target._retry(copy)
                else:
                    result.records += _combine_records(target, opened, batch)
            result.combined.append(source)
            if not keep:
                with contextlib.suppress(OSError):
                    os.remove(path)
                    for suffix in COMPANION_SUFFIXES:
                        if os.path.exists(path + suffix):
                            os.remove(path + suffix)
    return result


def _refuse_damaged(target: Ledger) -> None:
    """Refuse a ledger SQLite finds damaged, to combine into or from: combining drops and
    rebuilds the target's record indexes and copies into every table, so damage met halfway
    would leave the target changed, a source half combined. Reads all of it, once, where
    combining reads each source whole anyway."""
    try:
        problems = [row[0] for row in target.conn.execute("PRAGMA main.quick_check(1)")]
    except sqlite3.DatabaseError as exc:
        raise LedgerError(damaged_file(target.path, exc)) from exc
    if problems != ["ok"]:
        raise LedgerError(damaged_file(target.path, problems[0]))


def _schema_version(path: str) -> int | None:
    """The source's schema version before `Ledger.open` upgrades it; None when it cannot be
    read here (`Ledger.open` then says why)."""
    try:
        conn = sqlite3.connect(read_only_uri(path), uri=True)
    except sqlite3.Error:
        return None
    try:
        conn.row_factory = sqlite3.Row
        return stored_version(conn, path)
    except (sqlite3.Error, LedgerError, ValueError):
        return None
    finally:
        conn.close()


def _combine_records(target: Ledger, opened: Ledger, batch: int) -> int:
    """The per-record copy: every record, test window, seen state, finding and root of
    `opened` read into objects and written through `target`'s write path."""
    added = 0
    runs = opened.runs()
    records = opened.records(order="r.started_ns, r.id")
    for start in range(0, len(records), batch):
        by_run: dict[str, list[CompileRecord]] = {}
        for record in records[start:start + batch]:
            by_run.setdefault(str(record.run_uuid), []).append(record)
        for run_uuid, group in by_run.items():
            # Stored under `run`: a record's own run_uuid is never written with it.
            run = runs.get(run_uuid) or RunInfo(run_uuid=run_uuid, label="combined")
            added += target.add_records(group, run)
    windows: dict[str, list[TestWindow]] = {}
    for window in opened.tests():
        windows.setdefault(window.run_uuid, []).append(window)
    for run_uuid, group in windows.items():
        target.add_tests(runs.get(run_uuid) or RunInfo(run_uuid=run_uuid,
                                                       label="combined"), group)
    target.remember_states(opened.seen_states())
    _copy_findings_and_roots(target, opened)
    return added


_FINDING_COLUMNS = ("audit_uuid", "found_ns", "code", "severity", "subject", "message",
                    "recorded", "current", "how", "inferred", "record_uuid", "entry",
                    "runtime", "kernel", "hint")
"""Every column of `findings` but its id: what a copied finding carries."""


def _copy_findings_and_roots(target: Ledger, source: Ledger) -> None:
    """`combine`'s share of another ledger's findings and cache roots. A finding already in
    `target` (same audit, code, subject, record and entry) is not copied again; a root keeps
    its latest scan time."""
    columns = _FINDING_COLUMNS
    findings = [_named_params(r) for r in _rows(
        source.conn, f"SELECT {', '.join(columns)} FROM findings ORDER BY id")]
    roots = [_named_params(r) for r in _rows(
        source.conn, "SELECT path, layout, last_scan_ns FROM cache_roots")]
    if not findings and not roots:
        return

    def write() -> None:
        with target._write() as conn:
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

    target._retry(write)
