"""The audit of one run (a test session, a `cacheaudit run`): the cache roots its records touched,
scanned and narrowed to the entries the run built or hit, plus the findings records carry on
their own (`audit_records`), with the tests involved named on each finding."""

from __future__ import annotations

import dataclasses
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

from cacheaudit.audit.checks import modified_during_compile
from cacheaudit.audit.options import AuditOptions, keep
from cacheaudit.audit.scan import ScanResult, discover, scan
from cacheaudit.findings import make_finding
from cacheaudit.ledger import Ledger
from cacheaudit.model import CompileRecord, Finding
from cacheaudit.runtimes import layouts, policy_for


class _Earlier(Sequence[CompileRecord]):
    """The first `stop` records of a run, without copying them: a record's history (most
    policies never look at it, and a run may hold thousands of records)."""

    __slots__ = ("_run", "_stop")

    def __init__(self, run: list[CompileRecord], stop: int) -> None:
        self._run = run
        self._stop = stop

    def __len__(self) -> int:
        return self._stop

    @overload
    def __getitem__(self, index: int) -> CompileRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[CompileRecord]: ...

    def __getitem__(self, index: int | slice) -> CompileRecord | list[CompileRecord]:
        if isinstance(index, slice):
            return self._run[:self._stop][index]
        if index < 0:
            index += self._stop
        if not 0 <= index < self._stop:
            raise IndexError(index)
        return self._run[index]

    def __iter__(self) -> Iterator[CompileRecord]:
        for index in range(self._stop):
            yield self._run[index]

    def __reversed__(self) -> Iterator[CompileRecord]:
        for index in range(self._stop - 1, -1, -1):
            yield self._run[index]


def audit_records(records: Sequence[CompileRecord],
                  judged: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings that records carry on their own, whether or not a cache entry accounts for them:
    each runtime policy's record-level checks (a runtime reusing in-process state after a header
    changed, for example), judged against the earlier records of the same run; and inputs
    modified during a compile (CA401) for records not in `judged` (those an entry audit already
    covered)."""
    runs: dict[str, list[CompileRecord]] = {}
    for record in sorted(records, key=lambda r: (r.started_ns, r.record_id)):
        runs.setdefault(record.run_uuid or "", []).append(record)
    findings: list[Finding] = []
    for run in runs.values():
        for index, record in enumerate(run):
            if record.record_id not in judged:
                findings += modified_during_compile(record)
            if not record.runtime:
                continue
            try:
                policy = policy_for(record.runtime)
            except KeyError:
                continue  # a runtime without a policy carries no record-level checks
            try:
                findings += policy.record_findings(record, _Earlier(run, index))
            except Exception as exc:  # noqa: BLE001 - one runtime's check never stops the audit
                findings.append(make_finding(
                    "CA501", subject=record.runtime, record=record,
                    message=f"the record-level checks of runtime {record.runtime!r} failed: "
                            f"{type(exc).__name__}: {exc}",
                    how="the runtime's policy (record_findings)"))
    return findings


@dataclass
class RunReport:
    """What a test session or a `cacheaudit run` did with JIT caches, and the findings about it."""

    run_uuid: str
    records: list[CompileRecord]
    findings: list[Finding]
    roots: list[tuple[str, str]] = field(default_factory=list)

    def events(self) -> Counter[str]:
        return Counter(r.event for r in self.records)

    def summary(self) -> str:
        """What was recorded, in one line. A runtime's build shows up twice when its compiler
        also ran through the shim (torch: the adapter's record and the shim's compile and link
        records), so compiler invocations are counted apart from runtimes' compiles."""
        events = self.events()
        invocations = sum(1 for r in self.records if r.event == "compile" and not r.runtime)
        compiles = events["compile"] - invocations
        return (f"{compiles} compile(s), {events['disk-hit']} disk hit(s), "
                f"{events['memory-hit']} memory hit(s), {invocations} compiler invocation(s) "
                f"through the shim recorded")


def roots_of(records: Iterable[CompileRecord]) -> list[str]:
    """Cache roots the records touched: found by walking up from each entry, output and working
    directory (the shim sees `<root>/tmp/<uuid>/kernel.cubin` before the runtime renames it)."""
    readers = layouts()
    candidates: set[str] = set()
    for record in records:
        paths = [record.entry or "", record.cwd] + [s.path for s in record.outputs]
        for path in paths:
            directory = os.path.dirname(path) if path and not os.path.isdir(path) else path
            for _ in range(6):
                if not directory or directory == os.path.dirname(directory):
                    break
                candidates.add(directory)
                directory = os.path.dirname(directory)
    return sorted(c for c in candidates if os.path.isdir(c) and any(
        r.is_root(c) for r in readers))


def audit_run(ledger: Ledger, run_uuid: str, env: Mapping[str, str], *,
              started_ns: int | None = None, roots: Sequence[str] = (),
              options: AuditOptions | None = None) -> RunReport:
    """Judge what one run did: scan the cache roots its records touched, the roots earlier scans
    found, the environment's default roots and `roots`; keep the findings about entries the run
    built or hit (a DeepJIT disk hit leaves no record, only a touched `.committed`, so an entry
    whose hit time falls after the run's start counts), add each runtime's record-level
    findings, and name the tests involved."""
    options = options or AuditOptions()
    records = ledger.records(where="runs.run_uuid = ?", params=(run_uuid,), with_files=True)
    started = started_ns if started_ns is not None else min(
        (r.started_ns for r in records), default=time.time_ns())
    defaults = [root for reader, root in discover([], env)]
    scanned = sorted(set(roots_of(records)) | {os.path.abspath(r) for r in roots}
                     | {r for r in ledger.known_roots() if os.path.isdir(r)} | set(defaults))
    scanned = [root for root in scanned if any(r.is_root(root) for r in layouts())]
    result = scan(scanned, env, ledger=ledger, options=options) if scanned else None
    # The scan attributed the run's compiles to their entries: read them again.
    records = ledger.records(where="runs.run_uuid = ?", params=(run_uuid,), with_files=True)
    ids = {r.record_id for r in records}
    entries = {r.entry for r in records if r.entry}
    hit_since_start = {e.path for e in (result.entries if result else [])
                       if e.committed_ns is not None and e.committed_ns >= started}
    findings = [f for f in (result.findings if result else [])
                if f.record_id in ids or f.entry in entries or f.entry in hit_since_start]
    judged = frozenset(f.record_id for f in findings if f.record_id)
    findings += keep(audit_records(records, judged=judged), options)
    # A policy may prove the same stale file from the entry and from the records (torch-ext's
    # CA106): one finding per code, file and record.
    unique: dict[tuple[str, str, str | None], Finding] = {}
    for finding in findings:
        unique.setdefault((finding.code, finding.subject, finding.record_id), finding)
    findings = list(unique.values())
    windows = ledger.tests(run_uuid)
    findings = [_with_tests(f, records, windows, result) for f in findings]
    return RunReport(run_uuid=run_uuid, records=records, findings=findings,
                     roots=result.roots if result else [])


def _with_tests(finding: Finding, records: Sequence[CompileRecord], windows: Sequence[Any],
                result: ScanResult | None) -> Finding:
    tests: list[str] = []
    for record in records:
        if record.test_id and (record.record_id == finding.record_id or (
                finding.entry is not None and record.entry == finding.entry)):
            tests.append(record.test_id)
    entry = next((e for e in (result.entries if result else []) if e.path == finding.entry),
                 None)
    if entry is not None and entry.committed_ns is not None:
        # A runtime that marks every disk hit on the entry (DeepJIT touches `.committed`, for
        # example) says when it was hit: the test running then caused it.
        tests += [w.nodeid for w in windows
                  if w.started_ns <= entry.committed_ns <= w.finished_ns]
    unique = tuple(dict.fromkeys(tests))
    return dataclasses.replace(finding, tests=unique) if unique else finding
