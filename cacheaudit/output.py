"""Records, findings and explanations as JSON, and the snapshot diff's table. No decisions are
made here. The human output of findings, records and explanations is `cacheaudit.render`'s.

Everything recorded (test ids, argv tokens, paths, messages) goes through `_e` before it meets
rich markup: `test_k[fp16-128]` must keep its brackets and `-DTAG=[/x]` must not be read as a
closing tag.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cacheaudit.findings import ns_text
from cacheaudit.model import CompileRecord, CompilerIdentity, FileState, Finding

if TYPE_CHECKING:
    from rich.console import Console

    from cacheaudit.audit import RunReport
    from cacheaudit.audit.evict import EvictResult
    from cacheaudit.audit.stats import Stats, Tally
    from cacheaudit.explain import Explanation

ENV_ORIGIN_PREFIX = "env:"


def injected_by_environment(record: CompileRecord) -> list[str]:
    """The tokens the environment added to the compiler's argv (NVCC_APPEND_FLAGS, ...); a
    response file's tokens came from argv and are not among them."""
    return [t.text for t in record.effective_argv if t.origin.startswith(ENV_ORIGIN_PREFIX)]


def escape_markup(value: object) -> str:
    """Recorded text as literal rich markup."""
    from rich.markup import escape

    return escape(str(value))


_e = escape_markup


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


def _state_summary(state: FileState) -> dict[str, Any]:
    return {"path": state.path, "exists": state.exists, "size": state.size,
            "digest": state.digest, "mtime_ns": state.mtime_ns}


def record_summary(record: CompileRecord, *, with_graph: bool = False) -> dict[str, Any]:
    """The four answers of one record as plain data: compiler, options, event, inputs."""
    injected = injected_by_environment(record)
    graph = record.graph
    inputs: dict[str, Any] = {
        "sources": [_state_summary(s) for s in record.sources],
        "graph": None if graph is None else {
            "digest": graph.digest, "method": graph.method, "file_count": len(graph.files)},
        "tracked": list(record.tracked) if record.tracked is not None else None,
        "modified_during_compile": list(record.modified_during_compile),
    }
    if with_graph and graph is not None:
        inputs["graph"]["files"] = [
            dict(_state_summary(f.state), written=f.written) for f in graph.files]
    return {
        "record_id": record.record_id,
        "started": ns_text(record.started_ns),
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
            "injected_by_environment": injected,
            "environment": dict(record.env),
            "cwd": record.cwd,
        },
        "inputs": inputs,
        "outputs": [_state_summary(s) for s in record.outputs],
        "exit_code": record.exit_code,
        "signal": record.signal,
        "duration_ms": round(record.duration_ns / 1e6, 1),
        "test_id": record.test_id,
        "observer": record.observer,
        "notes": list(record.notes),
    }


def records_json(records: Iterable[CompileRecord], *, with_graph: bool = False) -> str:
    return json.dumps({"records": [record_summary(r, with_graph=with_graph) for r in records]},
                      indent=2, ensure_ascii=False)


# ------------------------------------------------------------------------------------ findings

def summary_line(scanned: int, roots: int, matched: int, reconstructed: int,
                 findings: Sequence[Finding]) -> str:
    counts = Counter(f.severity.value for f in findings)
    verdict = ", ".join(f"{counts[s]} {s}{'s' if counts[s] != 1 else ''}"
                        for s in ("error", "warning", "info") if counts[s]) or "no findings"
    untied = max(scanned - matched - reconstructed, 0)
    return (f"{scanned} entr{'y' if scanned == 1 else 'ies'} in {roots} cache "
            f"root{'' if roots == 1 else 's'} ({matched} tied to an observed compile, "
            f"{reconstructed} judged on inputs reconstructed after the build, {untied} "
            f"unverified): {verdict}")


def findings_json(findings: Sequence[Finding], extra: Mapping[str, Any]) -> str:
    counts = Counter(f.code for f in findings)
    return json.dumps({**extra, "counts": dict(sorted(counts.items())),
                       "findings": [f.to_dict() for f in findings]}, indent=2,
                      ensure_ascii=False)


# ------------------------------------------------------------------------------------ explain


def explanation_json(explanation: Explanation) -> str:
    record = explanation.record
    entry = explanation.entry
    return json.dumps({
        "entry": None if entry is None else {
            "runtime": entry.runtime, "layout": entry.layout, "path": entry.path,
            "kernel": entry.kernel, "key": entry.key,
            "binary": entry.binary.to_dict() if entry.binary else None,
            "built": ns_text(entry.built_ns) if entry.built_ns else None,
            "last_hit": ns_text(entry.committed_ns) if entry.committed_ns else None,
            "problems": list(entry.problems)},
        "record": None if record is None else record_summary(record, with_graph=True),
        "previous_record": explanation.previous.record_id if explanation.previous else None,
        "lookups": [{"event": r.event, "at": ns_text(r.started_ns), "pid": r.pid}
                    for r in explanation.lookups],
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
        "findings": [f.to_dict() for f in explanation.findings],
    }, indent=2, ensure_ascii=False)


# ------------------------------------------------------------------------------------ run


def run_report_json(report: RunReport, command: Sequence[str], status: int) -> str:
    """`cacheaudit run --report-json`: the run's findings with the command and its status, and
    the counts the human summary prints (`events` holds them under the record event names)."""
    return findings_json(report.findings, {
        "run": report.run_uuid, "command": list(command), "exit_status": status,
        "summary": report.summary(), "events": report.events(),
        "activity": report.counts.as_dict(), "possibly_served": dict(report.unobserved)})


# ------------------------------------------------------------------------------------ snapshots


def render_snapshot_diff(groups: Mapping[str, Sequence[Mapping[str, Any]]],
                         console: Console) -> None:
    from rich.table import Table

    changed = {name: rows for name, rows in groups.items() if rows}
    if not changed:
        console.print("no differences")
        return
    for name, rows in changed.items():
        table = Table(title=f"{_e(name)} ({len(rows)})", title_justify="left")
        for column in ("item", "field", "before", "after"):
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(_e(row["item"]), _e(row["field"]), _e(_plain(row["before"])),
                          _e(_plain(row["after"])))
        console.print(table)


def _plain(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


# ------------------------------------------------------------------------------ evict, stats
# Plain lines, one fact each and every path whole on its line: nothing here wraps at 80 columns.


def _utc(ns: int | None) -> str:
    import datetime

    if ns is None:
        return "-"
    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def evict_lines(result: EvictResult) -> list[str]:
    """`cacheaudit evict`: a line per chosen entry (`STATUS PATH: CODE subject`, the reason
    indented below for a skipped or failed one), then the summary."""
    lines = [] if result.scan.roots else ["no cache roots found"]
    for outcome in result.outcomes:
        deciding = outcome.deciding
        codes = sorted({f.code for f in outcome.findings})
        more = f" (+{', '.join(c for c in codes if c != deciding.code)})" if len(codes) > 1 \
            else ""
        verb = outcome.status.replace("-", " ")
        lines.append(f"{verb} {outcome.entry.path}: {deciding.code} {deciding.subject}{more}")
        if outcome.reason:
            lines.append(f"  why: {outcome.reason}")
    lines.append(result.summary())
    return lines


def evict_dict(result: EvictResult) -> dict[str, Any]:
    """`cacheaudit evict --json`: the plain value (wrapped in the JSON envelope by the caller)."""
    return {"dry_run": result.dry_run, "audit_uuid": result.audit_uuid,
            "roots": [{"layout": layout, "root": root} for layout, root in result.scan.roots],
            "entries": len(result.scan.entries),
            "outcomes": [o.to_dict() for o in result.outcomes], "summary": result.summary()}


def stats_dict(stats: Stats) -> dict[str, Any]:
    """`cacheaudit stats --json`: the plain value (wrapped in the JSON envelope by the caller)."""
    return stats.to_dict()


def stats_lines(stats: Stats) -> list[str]:
    """`cacheaudit stats`: a block per runtime and root, then the total where there are
    several."""
    def block(tally: Tally, title: str) -> list[str]:
        rate = "-" if tally.hit_rate is None else f"{tally.hit_rate:.1%}"
        marked = (f" ({tally.disk_hits_unrecorded} seen by a hit marker)"
                  if tally.disk_hits_unrecorded else "")
        judged = (f"stale {tally.stale}, unverifiable {tally.unverifiable}"
                  if tally.stale is not None else "stale and unverifiable: not judged (--no-scan)")
        return [title,
                f"  entries {tally.entries}, {tally.bytes} bytes; oldest {_utc(tally.oldest_ns)}, "
                f"newest {_utc(tally.newest_ns)}",
                f"  compiles {tally.compiles}, disk hits {tally.disk_hits}{marked}, memory hits "
                f"{tally.memory_hits}, hit rate {rate}",
                f"  {judged}, evicted {tally.evicted}"]

    lines: list[str] = []
    for tally in stats.tallies:
        lines += block(tally, f"{tally.runtime} {tally.root}")
    if not stats.tallies:
        lines.append("no cache roots found")
    if len(stats.tallies) > 1:
        lines += block(stats.total(), f"total: {len(stats.tallies)} runtime root(s)")
    return lines
