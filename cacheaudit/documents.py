"""The JSON documents the commands print, each in the envelope of `cacheaudit.contract`.

One function per kind of document (docs/json.md lists them with their fields), and the only
place a JSON payload is built: the audit layer returns results, the human renderers live in
`cacheaudit.output` and `cacheaudit.render`. Times are integer
nanoseconds (`*_ns`) beside UTC ISO 8601 with `Z`, never local time; digests are xxh3-128 hex.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cacheaudit import contract
from cacheaudit.evidence import utc_iso
from cacheaudit.model import CompileRecord, CompilerIdentity, FileState, Finding, Severity

if TYPE_CHECKING:
    from cacheaudit.audit import RunReport, ScanResult
    from cacheaudit.audit.evict import EvictResult, Outcome
    from cacheaudit.audit.stats import Stats, Tally
    from cacheaudit.audit.verify import VerifyResult
    from cacheaudit.explain import Explanation

ENV_ORIGIN_PREFIX = "env:"
SEVERITIES = tuple(s.value for s in sorted(Severity, key=lambda s: -s.rank))


def _when(ns: int | None) -> str | None:
    return utc_iso(ns) if ns else None


def injected_by_environment(record: CompileRecord) -> list[str]:
    """The tokens the environment added to the compiler's argv (NVCC_APPEND_FLAGS, ...); a
    response file's tokens came from argv and are not among them."""
    return [t.text for t in record.effective_argv if t.origin.startswith(ENV_ORIGIN_PREFIX)]


def compiler_summary(compiler: CompilerIdentity | None) -> dict[str, Any] | None:
    if compiler is None:
        return None
    return {
        "invoked": compiler.invoked,
        "path": compiler.path,
        "resolved": compiler.resolved,
        "wrappers": list(compiler.wrappers),
        "kind": compiler.kind,
        "version": compiler.version_line,
        "version_text": compiler.version_text,
        "digest": compiler.digest,
        "error": compiler.error,
        "host": compiler_summary(compiler.host),
    }


def state_summary(state: FileState) -> dict[str, Any]:
    """A file state of a record: `size` in bytes (-1 when absent), `digest` xxh3-128 hex."""
    return {"path": state.path, "exists": state.exists, "size": state.size,
            "digest": state.digest, "mtime_ns": state.mtime_ns,
            "mtime": _when(state.mtime_ns)}


def record_summary(record: CompileRecord, *, with_graph: bool = False) -> dict[str, Any]:
    """The four answers of one record as plain data: compiler, options, event, inputs."""
    graph = record.graph
    inputs: dict[str, Any] = {
        "sources": [state_summary(s) for s in record.sources],
        "graph": None if graph is None else {
            "digest": graph.digest, "method": graph.method, "file_count": len(graph.files)},
        "tracked": list(record.tracked) if record.tracked is not None else None,
        "modified_during_compile": list(record.modified_during_compile),
    }
    if with_graph and graph is not None:
        inputs["graph"]["files"] = [
            dict(state_summary(f.state), written=f.written) for f in graph.files]
    return {
        "record_id": record.record_id,
        "started": utc_iso(record.started_ns),
        "started_ns": record.started_ns,
        "runtime": record.runtime,
        "kernel": record.kernel,
        "key": record.key,
        "entry": record.entry,
        "event": record.event,
        "compiler": compiler_summary(record.compiler),
        "options": {
            "argv": list(record.argv),
            "effective_argv": [{"token": t.text, "origin": t.origin}
                               for t in record.effective_argv],
            "injected_by_environment": injected_by_environment(record),
            "environment": dict(record.env),
            "cwd": record.cwd,
        },
        "inputs": inputs,
        "outputs": [state_summary(s) for s in record.outputs],
        "exit_code": record.exit_code,
        "signal": record.signal,
        "duration_ms": round(record.duration_ns / 1e6, 1),
        "test_id": record.test_id,
        "observer": record.observer,
        "notes": list(record.notes),
    }


def records_json(records: Sequence[CompileRecord], *, total: int | None = None,
                 with_graph: bool = False, command: str = "report") -> str:
    """`report --json`: the recorded compiles, newest last, and `total`, how many the ledger
    holds under the same filter (more than listed when `--limit` cut; all of them by default)."""
    return contract.dumps(contract.document("records", command, {
        "total": len(records) if total is None else total,
        "records": [record_summary(r, with_graph=with_graph) for r in records]}))


# ------------------------------------------------------------------------------ findings


def findings_payload(findings: Sequence[Finding]) -> dict[str, Any]:
    """What every document about findings holds: the counts by severity and by code, then
    the findings."""
    by_code = Counter(f.code for f in findings)
    by_severity = Counter(f.severity.value for f in findings)
    return {"severity_counts": {s: by_severity[s] for s in SEVERITIES},
            "counts": dict(sorted(by_code.items())),
            "findings": [f.to_dict() for f in findings]}


def scan_totals(*, entries: int, roots: int, matched: int, reconstructed: int,
                findings: int) -> dict[str, int]:
    """The summary line's numbers: entries judged and in how many roots, how many tied to an
    observed compile, judged on inputs reconstructed after the build, or neither."""
    return {"roots": roots, "entries": entries, "matched": matched,
            "reconstructed": reconstructed,
            "unverified": max(entries - matched - reconstructed, 0), "findings": findings}


def findings_json(findings: Sequence[Finding], extra: Mapping[str, Any], *,
                  kind: str = "scan", command: str | None = None) -> str:
    """A document of kind `kind` (scan, verify, run) about `findings`, with `extra`'s members
    (the summary, totals, the command's own facts) first."""
    return contract.dumps(contract.document(kind, command or kind,
                                            {**extra, **findings_payload(findings)}))


def scan_json(result: ScanResult, *, summary: str, fail_on: str, command: str = "scan") -> str:
    """`scan --json`: an `audit.ScanResult` with the summary line and its numbers."""
    totals = scan_totals(entries=len(result.entries), roots=len(result.roots),
                         matched=result.matched, reconstructed=result.reconstructed,
                         findings=len(result.findings))
    return findings_json(result.findings, {
        "summary": summary, "totals": totals,
        "roots": [{"layout": layout, "root": root} for layout, root in result.roots],
        "entries": len(result.entries), "matched": result.matched,
        "reconstructed": result.reconstructed, "reconstructed_now": result.reconstructed_now,
        "ledger": result.ledger, "fail_on": fail_on}, kind="scan", command=command)


def verify_json(result: VerifyResult, *, summary: str, fail_on: str) -> str:
    """`verify --json`: the oracle's verdict per entry and its findings."""
    return findings_json(result.findings, {
        "summary": summary, "entries": len(result.entries), "total": result.total,
        "seed": result.seed, "outcomes": result.counts(),
        "verdicts": [{"entry": v.entry.path, "outcome": v.outcome, "note": v.note}
                     for v in result.verdicts],
        "fail_on": fail_on}, kind="verify")


def verify_plan_json(commands: Sequence[Mapping[str, Any]]) -> str:
    """`verify --dry-run --json`: the commands the oracle would run."""
    return contract.dumps(contract.document("verify-plan", "verify",
                                            {"commands": list(commands)}))


def run_report_json(report: RunReport, command: Sequence[str], status: int) -> str:
    """`cacheaudit run --report-json`: the run's findings with the command run (`argv`) and
    its status, and the counts the human summary prints (`events` holds them under the record
    event names)."""
    return findings_json(report.findings, {
        "summary": report.summary(), "run": report.run_uuid, "argv": list(command),
        "exit_status": status, "events": report.events(),
        "activity": report.counts.as_dict(), "possibly_served": dict(report.unobserved)},
        kind="run")


# ------------------------------------------------------------------------------ explain


def explanation_json(explanation: Explanation) -> str:
    record = explanation.record
    entry = explanation.entry
    return contract.dumps(contract.document("explanation", "explain", {
        "entry": None if entry is None else {
            "runtime": entry.runtime, "layout": entry.layout, "path": entry.path,
            "root": entry.root, "kernel": entry.kernel, "key": entry.key,
            "binary": None if entry.binary is None else state_summary(entry.binary),
            "built": _when(entry.built_ns), "built_ns": entry.built_ns,
            "last_hit": _when(entry.committed_ns), "last_hit_ns": entry.committed_ns,
            "problems": list(entry.problems)},
        "record": None if record is None else record_summary(record, with_graph=True),
        "previous_record": explanation.previous.record_id if explanation.previous else None,
        "lookups": [{"event": r.event, "at": utc_iso(r.started_ns), "at_ns": r.started_ns,
                     "pid": r.pid} for r in explanation.lookups],
        "tracked": None if explanation.tracked is None else {
            "names": dict(explanation.tracked.names), "paths": sorted(explanation.tracked.paths),
            "error": explanation.tracked.error, "how": explanation.tracked.how},
        "key": None if explanation.key is None else {
            "entry": entry.key if entry else None, "recomputed": explanation.key.recomputed,
            "matches": explanation.key.matches(entry.key if entry else None),
            "note": explanation.key.note,
            "components": [{"label": c.label, "value": c.value, "digest": c.digest}
                           for c in explanation.key.components]},
        "changes_since_previous": [{"component": c.component, "item": c.item, "old": c.old,
                                    "new": c.new} for c in explanation.changes],
        **findings_payload(explanation.findings),
    }))


# ------------------------------------------------------------------------------ snapshots


def snapshot_diff_json(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> str:
    """`diff --json`: the differences between two snapshots, by group."""
    return contract.dumps(contract.document("snapshot-diff", "diff", {
        "groups": {name: list(rows) for name, rows in groups.items()}}))


# ------------------------------------------------------------------------------ evict, stats


def _roots(roots: Iterable[tuple[str, str]]) -> list[dict[str, str]]:
    return [{"layout": layout, "root": root} for layout, root in roots]


def outcome_summary(outcome: Outcome) -> dict[str, Any]:
    """One entry `evict` chose and what became of it; `built_ns` is its binary's mtime."""
    entry = outcome.entry
    return {"entry": entry.path, "root": entry.root, "runtime": entry.runtime,
            "layout": entry.layout, "kernel": entry.kernel, "key": entry.key,
            "built_ns": entry.built_ns, "built": _when(entry.built_ns),
            "status": outcome.status, "paths": list(outcome.paths), "bytes": outcome.bytes,
            "reason": outcome.reason, "codes": sorted({f.code for f in outcome.findings}),
            "findings": [f.to_dict() for f in outcome.findings]}


def evict_json(result: EvictResult) -> str:
    """`evict --json` (and `--dry-run --json`): each chosen entry's outcome, and the summary
    line with its numbers (`totals.bytes`: what went, or would go)."""
    from cacheaudit.audit.evict import EVICTED, FAILED, SKIPPED, WOULD_EVICT

    done = result.of(WOULD_EVICT if result.dry_run else EVICTED)
    totals = {"roots": len(result.scan.roots), "entries": len(result.scan.entries),
              "chosen": len(result.outcomes), "evicted": len(result.of(EVICTED)),
              "would_evict": len(result.of(WOULD_EVICT)), "skipped": len(result.of(SKIPPED)),
              "failed": len(result.of(FAILED)), "bytes": sum(o.bytes for o in done)}
    return contract.dumps(contract.document("evict", "evict", {
        "summary": result.summary(), "totals": totals, "dry_run": result.dry_run,
        "audit_uuid": result.audit_uuid, "roots": _roots(result.scan.roots),
        "entries": len(result.scan.entries),
        "outcomes": [outcome_summary(o) for o in result.outcomes]}))


def tally_summary(tally: Tally, *, total: bool = False) -> dict[str, Any]:
    """One runtime in one root (`total`: every tally added up, runtime and root null)."""
    return {"runtime": None if total else tally.runtime, "root": None if total else tally.root,
            "entries": tally.entries, "bytes": tally.bytes, "compiles": tally.compiles,
            "disk_hits": tally.disk_hits, "disk_hits_unrecorded": tally.disk_hits_unrecorded,
            "memory_hits": tally.memory_hits, "hit_rate": tally.hit_rate,
            "stale": tally.stale, "unverifiable": tally.unverifiable, "evicted": tally.evicted,
            "oldest_ns": tally.oldest_ns, "oldest": _when(tally.oldest_ns),
            "newest_ns": tally.newest_ns, "newest": _when(tally.newest_ns)}


def stats_json(stats: Stats) -> str:
    """`stats --json`: a tally per runtime and root, and their total."""
    return contract.dumps(contract.document("stats", "stats", {
        "judged": stats.judged, "ledger": stats.ledger, "roots": _roots(stats.roots),
        "tallies": [tally_summary(t) for t in stats.tallies],
        "total": tally_summary(stats.total(), total=True)}))


# ------------------------------------------------------------------------------ run and host diffs


def _use(record: CompileRecord) -> dict[str, Any]:
    """A kernel use as a diff names it: enough to find the record again, and its binary."""
    from cacheaudit.audit.diff import binary_digests

    return {"record_id": record.record_id, "run_uuid": record.run_uuid, "host": record.host,
            "event": record.event, "started": utc_iso(record.started_ns),
            "started_ns": record.started_ns, "binaries": binary_digests(record.outputs)}


def _changes(changes: Sequence[Any]) -> list[dict[str, Any]]:
    return [{"subject": c.subject, "a": c.before, "b": c.after} for c in changes]


def kernel_diff_summary(kernel: Any) -> dict[str, Any]:
    """One matched kernel (`audit.diff.KernelDiff`): which answers differ, and how."""
    return {
        "runtime": kernel.runtime, "kernel": kernel.kernel, "key_a": kernel.key_a,
        "key_b": kernel.key_b, "matched_by": kernel.matched_by, "position": kernel.position,
        "differs": kernel.differs, "binary_or_inputs_differ": kernel.binary_or_inputs_differ,
        "answers": kernel.answers, "why": kernel.why,
        "a": _use(kernel.record_a), "b": _use(kernel.record_b),
        "compiler": _changes(kernel.compiler), "environment": _changes(kernel.environment),
        "options": [{"change": t.change, "token": t.text, "origin": t.origin}
                    for t in kernel.options],
        "event": _changes(kernel.event), "key": _changes(kernel.key),
        "inputs": [{"change": f.change, "path": f.path, "a": f.before, "b": f.after}
                   for f in kernel.inputs],
        "binary": _changes(kernel.binary),
    }


def run_diff_json(found: Any) -> str:
    """`diff A B --json` over ledgers or runs (`audit.diff.RunDiff`)."""
    first = found.first
    return contract.dumps(contract.document("run-diff", "diff", {
        "a": found.a, "b": found.b, "same": found.same,
        "totals": {"uses_a": found.uses_a, "uses_b": found.uses_b,
                   "matched": len(found.kernels), "identical": found.identical,
                   "differing": len(found.differing),
                   "only_a": sum(1 for o in found.only if o.side == "a"),
                   "only_b": sum(1 for o in found.only if o.side == "b")},
        "first_differing": None if first is None else kernel_diff_summary(first),
        "kernels": [kernel_diff_summary(k) for k in found.differing],
        "only": [{"side": o.side, "position": o.position, "runtime": o.record.runtime,
                  "kernel": o.record.kernel, "key": o.record.key, **_use(o.record)}
                 for o in found.only],
    }))


def host_diff_json(found: Any) -> str:
    """`diff --by-host --json` (`audit.diff_hosts.FleetDiff`)."""
    return contract.dumps(contract.document("host-diff", "diff", {
        "ledger": found.ledger, "ledgers": found.ledgers, "skipped": found.skipped,
        "same": found.same, "hosts": found.hosts,
        "totals": {"hosts": len(found.hosts), "kernels": found.kernels,
                   "compiles": found.compiles, "differing": len(found.differing)},
        "odd_hosts": [{"host": host, "kernels": count}
                      for host, count in found.odd_hosts.most_common()],
        "kernels": [{
            "runtime": k.runtime, "kernel": k.kernel, "key": k.key, "parts": k.parts,
            "groups": [{"hosts": g.hosts, "record_id": g.record_uuid} for g in k.groups],
            "odd_hosts": k.odd_hosts,
            "odd": [kernel_diff_summary(d) for d in k.odd],
        } for k in found.differing],
    }))
