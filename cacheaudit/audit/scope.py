"""The audit of a scope: one run (`cacheaudit run`, a pytest session, the processes a start-up
hook session recorded), a time window, or one test. Every integration asks this module, so the
verdicts and the counts are the same whoever renders them.

Which entries a scope is answerable for, by the evidence:

1. built: the scope's compile records, tied to their entries by the scan;
2. hit, recorded: the hit records in-process observers wrote (Triton, torch, cuda.core, ...);
3. hit, marked: a runtime's own hit marker inside the window (DeepJIT touches `.committed`);
4. hit, opened: a file of the entry opened inside the window (`cacheaudit.watch`'s observer,
   re-exported here: inotify on every entry directory of the cache roots known when the scope
   started);
5. may have been served: an entry whose opens nobody could watch (no inotify, the watch limit,
   a root created or named inside the job, an entry that appeared during the run without a
   recorded compile). Its error-level findings are kept, saying so: a stale entry that a run may
   have been served is never silent.

The counts (`Counts`) come from the same evidence and are what the human summary and the JSON
both print.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cacheaudit.audit.observations import ObservedEnvironments
from cacheaudit.audit.options import AuditOptions, keep
from cacheaudit.audit.report import Counts, RunReport
from cacheaudit.audit.run import audit_records, roots_of
from cacheaudit.audit.scan import ScanResult, scan
from cacheaudit.ledger import Ledger, TestWindow
from cacheaudit.model import CacheEntry, CompileRecord, Finding
from cacheaudit.watch import (
    NOT_OBSERVED,
    WATCH_BUDGET,
    Observation,
    ScopeObserver,
    WatchPlan,
    known_roots,
    plan_watch,
)

__all__ = ["NOT_OBSERVED", "WATCH_BUDGET", "Counts", "Observation", "RunReport", "Scope",
           "ScopeObserver", "WatchPlan", "audit_run", "audit_scope", "count", "known_roots",
           "plan_watch"]

# ------------------------------------------------------------------------------ the scope


@dataclass(frozen=True)
class Scope:
    """What is audited: a run's records (all, or one test's) and a time window for the hits that
    leave no record."""

    run_uuid: str
    started_ns: int
    finished_ns: int | None = None
    """None: up to now (the fixture asks in the middle of its test)."""
    test_id: str | None = None
    """Only this test's records (the fixture); its hits are those inside the window."""
    roots: tuple[str, ...] = ()
    """Cache roots to audit besides those the records and the ledger know."""

    def within(self, ns: int | None) -> bool:
        if ns is None or ns < self.started_ns:
            return False
        return self.finished_ns is None or ns <= self.finished_ns


SHIM_OBSERVER = "shim:"
_OBJECTS = (".o", ".obj", ".a", ".so", ".lo")


def _through_shim(record: CompileRecord) -> bool:
    return record.event == "compile" and record.observer.startswith(SHIM_OBSERVER)


def _link_only(record: CompileRecord) -> bool:
    return all(s.path.endswith(_OBJECTS) for s in record.sources)


def count(records: Sequence[CompileRecord], built: set[str], hit_unrecorded: set[str],
          judged: int, possibly_served: int) -> Counts:
    builds = [r for r in records if r.event == "compile" and not _through_shim(r)
              and not r.reconstructed and r.runtime_error is None]
    spans = [(r.host, r.started_ns, r.started_ns + max(r.duration_ns, 0)) for r in builds]
    shim = [r for r in records if _through_shim(r)]
    standalone = [r for r in shim if not _link_only(r) and not any(
        host == r.host and start <= r.started_ns <= end for host, start, end in spans)]
    recorded_hits = {r.entry for r in records if r.event == "disk-hit" and r.entry}
    unrecorded = hit_unrecorded - recorded_hits - built
    return Counts(
        compiles=len(builds) + len(standalone),
        disk_hits=sum(1 for r in records if r.event == "disk-hit") + len(unrecorded),
        disk_hits_unrecorded=len(unrecorded),
        memory_hits=sum(1 for r in records if r.event == "memory-hit"),
        invocations=len(shim), entries_judged=judged, possibly_served=possibly_served)


# ------------------------------------------------------------------------------ the audit


def _records(ledger: Ledger, scope: Scope) -> list[CompileRecord]:
    if scope.test_id is not None:
        return ledger.records(where="runs.run_uuid = ? AND r.test_id = ?",
                              params=(scope.run_uuid, scope.test_id), with_files=True)
    return ledger.records(where="runs.run_uuid = ?", params=(scope.run_uuid,), with_files=True)


def _may_have_been_served(finding: Finding, reason: str) -> Finding:
    return dataclasses.replace(
        finding, message=f"{finding.message} (this run may have been served this entry: its "
                         f"opens were not observed)",
        how=f"{finding.how}; opens not observed: {reason}" if finding.how else
        f"opens not observed: {reason}")


def audit_scope(ledger: Ledger, scope: Scope, env: Mapping[str, str], *,
                observation: Observation | None = None,
                options: AuditOptions | None = None) -> RunReport:
    """Judge what `scope` did: scan the cache roots its records touched, those known when it
    started and those given, keep the findings about the entries it answers for (see the module
    docstring), add each runtime's record-level findings, count, and name the tests involved.

    `env` is the environment the scope's jobs got (the session's), used for default roots and
    where no observer saw the environment of a hit. `observation`: what the scope's observer
    saw; None means nothing was observed, so every entry is one the scope may have been served.
    """
    options = options or AuditOptions()
    observation = observation or NOT_OBSERVED
    records = _records(ledger, scope)
    run_records = records if scope.test_id is None else ledger.records(
        where="runs.run_uuid = ?", params=(scope.run_uuid,))
    scanned = sorted(set(roots_of(records)) | set(known_roots(ledger, env, scope.roots))
                     | set(observation.plan.roots))
    observed_envs = ObservedEnvironments.of([scope.run_uuid], run_records)
    result = scan(scanned, env, ledger=ledger, options=options,
                  observed=observed_envs) if scanned else None
    # The scan tied the run's compiles to their entries: read them again.
    records = _records(ledger, scope)
    ids = {r.record_id for r in records}
    entries = result.entries if result else []
    windows = ledger.tests(scope.run_uuid)
    built = {r.entry for r in records if r.entry and r.event == "compile"}
    answerable = {r.entry for r in records if r.entry}
    opened = observation.opened(scope)
    marked = {e.path for e in entries if scope.within(e.committed_ns)}
    hit_since_built = {e.path for e in entries if e.path in built and e.path in marked
                       and marked_after_build(e)}
    hit_unrecorded = marked | set(opened)
    answerable |= hit_unrecorded
    unobserved = {e.path: reason for e in entries if e.path not in answerable
                  and (reason := observation.unobserved(e)) is not None}
    kept: list[Finding] = []
    served_unseen: dict[str, str] = {}
    for finding in (result.findings if result else []):
        if finding.record_id in ids or finding.entry in answerable:
            kept.append(finding)
        elif finding.entry in unobserved and finding.severity.value == "error":
            served_unseen[finding.entry] = unobserved[finding.entry]
            kept.append(_may_have_been_served(finding, unobserved[finding.entry]))
    judged = frozenset(f.record_id for f in kept if f.record_id)
    kept += keep(audit_records(records, judged=judged), options)
    # A policy may prove the same stale file from the entry and from the records (torch-ext's
    # CA106), and a scan reports an entry's finding from an earlier run's hit that this run's
    # hit carries again: one finding per code, subject and entry (per record where there is no
    # entry), the one of this run's record first.
    entry_of = {r.record_id: r.entry for r in records if r.entry}
    unique: dict[tuple[str, str, str | None], Finding] = {}
    for finding in kept:
        identity = (finding.code, finding.subject,
                    finding.entry or entry_of.get(finding.record_id or "") or finding.record_id)
        held = unique.get(identity)
        if held is None:
            unique[identity] = finding
        elif held.record_id not in ids and finding.record_id in ids:
            unique[identity] = (finding if finding.entry else
                                dataclasses.replace(finding, entry=held.entry))
    hit_times = {path: ns for path, (ns, _binary) in opened.items()}
    findings = [_with_tests(f, records, windows, result, hit_times)
                for f in unique.values()]
    in_scope = {e.path for e in entries if e.path in answerable}
    counts = count(records, built - hit_since_built, hit_unrecorded,
                   len(in_scope) + len(unobserved), len(unobserved))
    return RunReport(run_uuid=scope.run_uuid, records=records, findings=findings,
                     roots=result.roots if result else [], counts=counts,
                     unobserved=served_unseen)


def marked_after_build(entry: CacheEntry) -> bool:
    """Whether the hit marker of an entry the scope built was touched by a later hit, not by the
    build's own commit. A runtime that writes its marker and then renames the entry directory
    into place (DeepJIT) leaves the marker no newer than the directory's ctime; only a hit makes
    it newer (touching a file does not change its directory). Test windows cannot tell: under
    pytest-xdist the tests of other workers run at the same time."""
    marker = entry.committed_ns
    if marker is None:
        return False
    try:
        published_ns = os.stat(entry.path).st_ctime_ns
    except OSError:
        return False
    return marker > published_ns


def audit_run(ledger: Ledger, run_uuid: str, env: Mapping[str, str], *,
              started_ns: int | None = None, roots: Sequence[str] = (),
              options: AuditOptions | None = None,
              observation: Observation | None = None) -> RunReport:
    """The audit of a whole run (`audit_scope` with the run's window, from `started_ns` or its
    first record, to now)."""
    if started_ns is None:
        first = ledger.records(where="runs.run_uuid = ?", params=(run_uuid,), with_files=False,
                               with_graphs=False)
        started_ns = min((r.started_ns for r in first), default=time.time_ns())
    return audit_scope(ledger, Scope(run_uuid, started_ns, roots=tuple(roots)), env,
                       observation=observation, options=options)


def _with_tests(finding: Finding, records: Sequence[CompileRecord],
                windows: Sequence[TestWindow], result: ScanResult | None,
                hit_times: Mapping[str, int]) -> Finding:
    tests: list[str] = []
    for record in records:
        if record.test_id and (record.record_id == finding.record_id or (
                finding.entry is not None and record.entry == finding.entry)):
            tests.append(record.test_id)
    entry = next((e for e in (result.entries if result else []) if e.path == finding.entry),
                 None)
    times: list[int] = []
    if entry is not None and entry.committed_ns is not None:
        # A runtime that marks every disk hit on the entry (DeepJIT touches `.committed`)
        # says when it was hit: the test running then caused it.
        times.append(entry.committed_ns)
    if finding.entry in hit_times:
        times.append(hit_times[finding.entry])
    tests += [w.nodeid for w in windows for ns in times if w.started_ns <= ns <= w.finished_ns]
    unique = tuple(dict.fromkeys(tests))
    return dataclasses.replace(finding, tests=unique) if unique else finding
