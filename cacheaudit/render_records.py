"""The human output of recorded compiles (`cacheaudit report`), of one entry in full
(`cacheaudit explain`), of what `cacheaudit evict` did and of what `cacheaudit stats` counted, in
the block style of `cacheaudit.render`: a headline naming the entry (the source, the root), then
indented evidence lines that wrap between words, never inside a path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from cacheaudit.documents import injected_by_environment
from cacheaudit.evidence import local_time_text
from cacheaudit.findings import ns_text
from cacheaudit.render import INDENT, Line, View, count_text, evidence, findings_lines, wrap

if TYPE_CHECKING:
    from cacheaudit.audit.evict import EvictResult
    from cacheaudit.audit.stats import Stats, Tally

# ------------------------------------------------------------------------------ records

_STAND_IN = re.compile(r"^[0-9a-f]{10}-")


def observer_text(observer: str) -> str:
    """Who recorded a compile, as a person says it: `shim:ad4942f9e9-nvcc` (a recording
    session's stand-in for a compiler setting) is the compiler shim in front of nvcc."""
    kind, _, name = observer.partition(":")
    if kind == "shim":
        return f"through the compiler shim ({_STAND_IN.sub('', name) or 'compiler'})"
    if kind == "adapter":
        return f"by the {name} adapter, in the runtime's process"
    return f"by {observer}" if observer else ""


def _short(digest: str | None, width: int = 12) -> str:
    return digest[:width] if digest else "-"


def record_block(record: Any, view: View) -> list[Line]:
    """One recorded compile: where it went, then its four answers (compiler, options, event,
    inputs) as evidence lines."""

    where = record.entry or ", ".join(s.path for s in record.sources) or "-"
    name = " ".join(part for part in (record.runtime, "kernel" if record.kernel else "",
                                      record.kernel) if part) or "a compile"
    head = f"{where}: {name}, {record.event} at {ns_text(record.started_ns)}"
    lines = [Line(t, ((0, len(where), "bold"),) if i == 0 else ())
             for i, t in enumerate(wrap(head, view.width, "", INDENT))]
    width = view.width
    lines += evidence("record", record.record_id, width)
    if record.test_id:
        lines += evidence("test", record.test_id, width)
    compiler = record.compiler
    if compiler is None:
        lines += evidence("compiler", "not recorded", width)
    else:
        path = compiler.path + (f" -> {compiler.resolved}" if compiler.resolved
                                and compiler.resolved != compiler.path else "")
        lines += evidence("compiler", path, width)
        lines += evidence("", f"{compiler.version_line or compiler.kind}, xxh3 "
                              f"{_short(compiler.digest)}", width)
        if compiler.host is not None:
            lines += evidence("host", f"{compiler.host.path}: {compiler.host.version_line}",
                              width)
        if compiler.error:
            lines += evidence("", compiler.error, width, "yellow")
    argv = " ".join(t.text for t in record.effective_argv if t.origin == "argv") or "-"
    lines += evidence("options", argv, width)
    injected = set(injected_by_environment(record))
    for token in record.effective_argv:
        if token.origin != "argv":
            style = "bold magenta" if token.text in injected else "magenta"
            lines += evidence("", f"+ {token.text} (from {token.origin})", width, style)
    for variable, value in sorted(record.env.items()):
        if variable in _SHOWN_VARIABLES:
            lines += evidence("", f"{variable}={value}", width, "magenta")
    lines += evidence("event", _event_text(record), width)
    inputs = ", ".join(s.path for s in record.sources) or "-"
    if record.graph is not None:
        inputs += (f" + {count_text(len(record.graph.files), 'other file')} the compiler read "
                   f"({record.graph.method}, graph {_short(record.graph.digest, 8)})")
    lines += evidence("inputs", inputs, width)
    if record.modified_during_compile:
        lines += evidence("", "modified during the compile (CA401): "
                          + ", ".join(record.modified_during_compile), width, "bold red")
    for note in record.notes:
        lines += evidence("note", note, width, "yellow")
    for state in record.outputs:
        lines += evidence("output", f"{state.path} xxh3 {_short(state.digest)}", width)
    return lines


def _headline(block: Sequence[Line]) -> int:
    """How many lines of `block` its wrapped headline takes: evidence lines, which follow,
    carry their label's style."""
    return next((i for i, line in enumerate(block[1:], start=1) if line.spans), len(block))


# Shown beside the options because they change what the compiler reads without touching argv.
_SHOWN_VARIABLES = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "NVCC_CCBIN")


def _event_text(record: Any) -> str:
    if record.runtime_error:
        return f"refused by the runtime: {record.runtime_error}"
    if record.signal:
        status = f"killed by signal {record.signal}"
    elif record.exit_code not in (0, None):
        status = f"exit {record.exit_code}"
    else:
        status = "ok"
    return ", ".join(part for part in (record.event, status,
                                       f"{record.duration_ns / 1e6:.0f} ms",
                                       observer_text(record.observer)) if part)


def records_lines(records: Sequence[Any], view: View, total: int | None = None) -> list[Line]:
    """`cacheaudit report`: a block per record, and how many of how many were shown."""
    lines: list[Line] = []
    if not view.quiet:
        for record in records:
            block = record_block(record, view)
            # concise: the headline only, on one line.
            lines += [Line(" ".join(line.text.strip() for line in block[:_headline(block)]))] \
                if view.format == "concise" else [*block, Line("")]
    shown = count_text(len(records), "recorded compile")
    if total is not None and total > len(records):
        shown = (f"the last {len(records)} of {total} recorded compiles shown (--limit {total} "
                 "shows them all)")
    return lines + [Line(t) for t in wrap(f"cacheaudit: {shown}", view.width, "", INDENT)]


# ------------------------------------------------------------------------------ explain


def explanation_lines(explanation: Any, view: View) -> list[Line]:
    """`cacheaudit explain`: the entry, its compile, the tracked set, the key's components,
    the changes since the kernel's previous compile, and the findings with their summary."""
    width = view.width
    lines: list[Line] = []
    entry, record = explanation.entry, explanation.record
    if entry is not None:
        head = f"{entry.path}: {entry.runtime} kernel {entry.kernel}"
        lines += [Line(t) for t in wrap(head, width, "", INDENT)]
        lines += evidence("key", entry.key or "-", width)
        lines += evidence("built", ns_text(entry.built_ns), width)
        hits = [r.started_ns for r in getattr(explanation, "lookups", ()) or ()]
        if entry.committed_ns is None and hits:
            # A runtime without a hit marker (Inductor, FlashInfer): its recorded hits say.
            lines += evidence("last hit", f"{ns_text(max(hits))} (the last hit recorded in "
                                          "the ledger)", width)
        else:
            lines += evidence("last hit", f"{ns_text(entry.committed_ns)} (the runtime's hit "
                                          "marker, or its commit)", width)
        for problem in entry.problems:
            lines += evidence("problem", problem, width, "yellow")
        lines.append(Line(""))
    if record is not None:
        lines += record_block(record, view)
        if record.compiler is not None and record.compiler.version_text:
            lines += evidence("--version", "", width)
            lines += [Line(f"{INDENT}{INDENT}{text}")
                      for text in record.compiler.version_text.rstrip().splitlines()]
        lines.append(Line(""))
    for lookup in explanation.lookups:
        lines += evidence(lookup.event, f"at {ns_text(lookup.started_ns)} (pid {lookup.pid})",
                          width)
    if explanation.tracked is not None:
        tracked = explanation.tracked
        lines += [Line(t) for t in wrap(f"tracked set: {tracked.how}", width, "", INDENT)]
        for name, path in sorted(tracked.names.items()):
            lines += evidence(f"<{name}>", path, width)
        if not tracked.names:
            lines += evidence("", "only the source itself", width)
        if tracked.error:
            lines += evidence("problem", tracked.error, width, "yellow")
        if record is not None and record.graph is not None:
            untracked = [f for f in record.graph.files if f.path not in tracked.paths]
            lines += evidence("untracked", f"{len(untracked)} of "
                              f"{count_text(len(record.graph.files), 'file')} the compiler read",
                              width)
        lines.append(Line(""))
    if explanation.key is not None:
        key = explanation.key
        if key.components:
            lines.append(Line("key components (as a new runtime would compute them now):"))
            for component in key.components:
                value = component.value + (f" [{component.digest}]" if component.digest
                                           else "")
                lines += evidence(component.label.strip() or "-", value, width)
        matches = key.matches(entry.key if entry else None)
        said = {True: ("matches the entry's key", "green"),
                False: ("differs from the entry's key", "bold red"),
                None: (f"not recomputed: {key.note}", "yellow")}[matches]
        text = f"recomputed key {key.recomputed or '-'}: {said[0]}"
        lines += [Line(t, ((0, len(t), said[1]),)) for t in wrap(text, width, "", INDENT)]
        lines.append(Line(""))
    if explanation.previous is not None:
        lines.append(Line(f"changes since the previous compile of this kernel "
                          f"({ns_text(explanation.previous.started_ns)}):"))
        for change in explanation.changes:
            lines += evidence(change.component, f"{change.item}: {change.old or '-'} -> "
                              f"{change.new or '-'}", width)
        if not explanation.changes:
            lines += evidence("", "nothing", width)
        lines.append(Line(""))
    return lines + findings_lines(explanation.findings, (), view)


# ------------------------------------------------------------------------------ evict, stats


def evict_lines(result: EvictResult, view: View) -> list[Line]:
    """`cacheaudit evict`: a block per chosen entry (`ENTRY: what happened`, then the findings
    that chose it, its size, and why it was skipped or failed), then the summary."""
    width = view.width
    lines: list[Line] = [] if result.scan.roots else [Line("no cache roots found")]
    for outcome in result.outcomes:
        deciding = outcome.deciding
        verb = outcome.status.replace("-", " ")
        head = f"{outcome.entry.path}: {verb} ({deciding.code} {deciding.severity.value})"
        lines += [Line(t, ((0, len(outcome.entry.path), "bold"),) if i == 0 else ())
                  for i, t in enumerate(wrap(head, width, "", INDENT))]
        shown = sorted({(f.code, f.subject) for f in outcome.findings},
                       key=lambda pair: (pair != (deciding.code, deciding.subject), pair))
        for number, (code, subject) in enumerate(shown):
            lines += evidence("finding" if number == 0 else "", f"{code} {subject}", width)
        if outcome.bytes:
            lines += evidence("size", count_text(outcome.bytes, "byte"), width)
        if outcome.reason:
            lines += evidence("why", outcome.reason, width)
        lines.append(Line(""))
    return lines + [Line(t) for t in wrap(result.summary(), width, "", INDENT)]


def stats_lines(stats: Stats, view: View) -> list[Line]:
    """`cacheaudit stats`: a block per runtime and root (`ROOT: runtime`, then a fact a line),
    then the total where there are several."""
    width = view.width

    def block(tally: Tally, where: str, what: str) -> list[Line]:
        head = [Line(t, ((0, len(where), "bold"),) if i == 0 else ())
                for i, t in enumerate(wrap(f"{where}: {what}", width, "", INDENT))]
        rate = "-" if tally.hit_rate is None else f"{tally.hit_rate:.1%}"
        marked = (f" ({tally.disk_hits_unrecorded} seen by a hit marker)"
                  if tally.disk_hits_unrecorded else "")
        judged = (f"{tally.stale}, unverifiable {tally.unverifiable}"
                  if tally.stale is not None else "not judged (--no-scan)")
        return [*head,
                *evidence("entries", f"{tally.entries}, {count_text(tally.bytes, 'byte')}",
                          width),
                *evidence("oldest", local_time_text(tally.oldest_ns), width),
                *evidence("newest", local_time_text(tally.newest_ns), width),
                *evidence("compiles", str(tally.compiles), width),
                *evidence("hits", f"{tally.disk_hits} from disk{marked}, {tally.memory_hits} "
                          "in memory", width),
                *evidence("hit rate", rate, width),
                *evidence("stale", judged, width),
                *evidence("evicted", str(tally.evicted), width),
                Line("")]

    lines: list[Line] = []
    for tally in stats.tallies:
        lines += block(tally, tally.root, tally.runtime)
    if not stats.tallies:
        lines.append(Line("no cache roots found"))
    if len(stats.tallies) > 1:
        lines += block(stats.total(), "total",
                       count_text(len(stats.tallies), "runtime root"))
    while lines and not lines[-1].text:
        lines.pop()
    return lines
