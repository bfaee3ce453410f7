"""Rendering: records and findings as rich tables, JSON and Markdown. No decisions are made here.

Everything recorded (test ids, argv tokens, paths, messages) goes through `_e` before it meets
rich markup: `test_k[fp16-128]` must keep its brackets and `-DTAG=[/x]` must not be read as a
closing tag.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cacheaudit.documents import (  # noqa: F401 - the JSON documents, named here as before
    compiler_summary,
    explanation_json,
    findings_json,
    injected_by_environment,
    record_summary,
    records_json,
    run_report_json,
)
from cacheaudit.findings import ns_text
from cacheaudit.model import CompileRecord, CompilerIdentity, Finding

if TYPE_CHECKING:
    from rich.console import Console

    from cacheaudit.audit import RunReport
    from cacheaudit.explain import Explanation

def escape_markup(value: object) -> str:
    """Recorded text as literal rich markup."""
    from rich.markup import escape

    return escape(str(value))


_e = escape_markup


def _short(digest: str | None, width: int = 12) -> str:
    return digest[:width] if digest else "-"


def _compiler_lines(compiler: CompilerIdentity | None) -> list[str]:
    if compiler is None:
        return ["-"]
    first = _e(compiler.path)
    if compiler.resolved and compiler.resolved != compiler.path:
        first += f" -> {_e(compiler.resolved)}"
    lines = [first, f"{_e(compiler.version_line or compiler.kind)}  [dim]xxh3 "
             f"{_e(_short(compiler.digest))}[/dim]"]
    if compiler.host is not None:
        lines.append(f"host {_e(compiler.host.path)}: {_e(compiler.host.version_line)}")
    if compiler.error:
        lines.append(f"[yellow]{_e(compiler.error)}[/yellow]")
    return lines


def _option_lines(record: CompileRecord) -> list[str]:
    lines = [_e(" ".join(t.text for t in record.effective_argv if t.origin == "argv") or "-")]
    for token in record.effective_argv:
        if token.origin != "argv":
            lines.append(f"[bold magenta]+ {_e(token.text)}[/bold magenta]  "
                         f"(from {_e(token.origin)})")
    for name, value in sorted(record.env.items()):
        if name in _SHOWN_VARIABLES:
            lines.append(f"[magenta]{_e(f'{name}={value}')}[/magenta]")
    return lines


# Shown beside the options because they change what the compiler reads without touching argv.
_SHOWN_VARIABLES = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "NVCC_CCBIN")


def _event_line(record: CompileRecord) -> str:
    if record.runtime_error:
        return f"[red]refused by the runtime: {_e(record.runtime_error)}[/red]"
    if record.signal:
        status = f"[red]killed by signal {record.signal}[/red]"
    elif record.exit_code not in (0, None):
        status = f"[red]exit {record.exit_code}[/red]"
    else:
        status = "ok"
    took = f"{record.duration_ns / 1e6:.0f} ms"
    return f"{_e(record.event)}, {status}, {took}  [dim]{_e(record.observer)}[/dim]"


def _input_lines(record: CompileRecord) -> list[str]:
    first = _e(", ".join(s.path for s in record.sources) or "-")
    if record.graph is not None:
        first += (f" + {len(record.graph.files)} headers  [dim]({_e(record.graph.method)}, "
                  f"graph {_short(record.graph.digest, 8)})[/dim]")
    lines = [first]
    late = record.modified_during_compile
    if late:
        lines.append(f"[bold red]CA401 modified during the compile: "
                     f"{_e(', '.join(late))}[/bold red]")
    for note in record.notes:
        lines.append(f"[yellow]{_e(note)}[/yellow]")
    return lines


def render_records(records: Sequence[CompileRecord], console: Console) -> None:
    """The recorded compiles, one block a record, the four answers as numbered lines."""
    from rich.table import Table

    console.print(f"[bold]{len(records)} recorded compile(s)[/bold]")
    for record in records:
        title = (f"[bold]{_e(record.runtime or '-')}:{_e(record.kernel or '?')}[/bold]  "
                 f"{ns_text(record.started_ns)}")
        if record.test_id:
            title += f"  [dim]{_e(record.test_id)}[/dim]"
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row("1 compiler", "\n".join(_compiler_lines(record.compiler)))
        grid.add_row("2 options", "\n".join(_option_lines(record)))
        grid.add_row("3 event", _event_line(record))
        grid.add_row("4 inputs", "\n".join(_input_lines(record)))
        if record.outputs:
            grid.add_row("  outputs", "\n".join(
                f"{_e(s.path)}  [dim]xxh3 {_short(s.digest)}[/dim]" for s in record.outputs))
        console.print(title)
        console.print(grid)
        console.print()


# ------------------------------------------------------------------------------------ findings

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow", "info": "cyan"}


def group_findings(findings: Sequence[Finding]) -> list[tuple[Finding, list[Finding]]]:
    """Findings that say the same thing about many entries (one variable drifted under 300
    kernels) collapse into one row; the first stands for the group."""
    groups: dict[tuple[Any, ...], list[Finding]] = {}
    for finding in findings:
        key = (finding.code, finding.subject, finding.recorded, finding.current, finding.inferred)
        groups.setdefault(key, []).append(finding)
    ordered = sorted(groups.values(), key=lambda g: (-g[0].severity.rank, g[0].code,
                                                       g[0].subject))
    return [(group[0], group) for group in ordered]


def _where(group: list[Finding]) -> str:
    first = group[0]
    name = f"{first.runtime or '-'}:{first.kernel}" if first.kernel else (first.entry or "-")
    return name if len(group) == 1 else f"{name} and {len(group) - 1} more"


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


def render_findings(findings: Sequence[Finding], console: Console, summary: str) -> None:
    from rich.table import Table

    if not findings:
        console.print(f"[green]{_e(summary)}[/green]")
        return
    table = Table(show_lines=True, title=_e(summary), title_justify="left")
    table.add_column("code", no_wrap=True)
    table.add_column("where", overflow="fold")
    table.add_column("what", overflow="fold")
    table.add_column("recorded -> now", overflow="fold")
    for first, group in group_findings(findings):
        style = _SEVERITY_STYLE[first.severity.value]
        code = f"[{style}]{first.code}[/{style}]\n{first.severity.value}"
        if first.inferred:
            code += "\n[dim]inferred[/dim]"
        what = (f"[bold]{_e(first.subject)}[/bold]\n{_e(first.message)}\n"
                f"[dim]how: {_e(first.how)}[/dim]")
        if first.hint:
            what += f"\n[green]fix: {_e(first.hint)}[/green]"
        values = "" if first.recorded is None and first.current is None else _e(
            f"{first.recorded or '-'}\n-> {first.current or '-'}")
        table.add_row(code, _e(_where(group)), what, values)
    console.print(table)


def _md(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", "<br>")


def findings_markdown(findings: Sequence[Finding], summary: str) -> str:
    lines = ["## cacheaudit scan", "", summary, ""]
    if not findings:
        return "\n".join(lines)
    lines += ["| code | severity | where | subject | recorded | now |",
              "|---|---|---|---|---|---|"]
    for first, group in group_findings(findings):
        lines.append(f"| {first.code} | {first.severity.value}"
                     f"{' (inferred)' if first.inferred else ''} | {_md(_where(group))} | "
                     f"{_md(first.subject)} | {_md(first.recorded)} | {_md(first.current)} |")
    lines += ["", "<details><summary>Details</summary>", ""]
    for first, group in group_findings(findings):
        lines += [f"- **{first.code}** {_md(first.subject)}: {_md(first.message)}",
                  f"  - how: {_md(first.how)}"]
        if first.hint:
            lines.append(f"  - fix: {_md(first.hint)}")
        lines += [f"  - entry: `{f.entry}`" for f in group[:20] if f.entry]
        if len(group) > 20:
            lines.append(f"  - and {len(group) - 20} more entries")
    lines += ["", "</details>", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ explain


def render_explanation(explanation: Explanation, console: Console) -> None:
    from rich.table import Table

    entry, record = explanation.entry, explanation.record
    if entry is not None:
        console.print(f"[bold]{_e(entry.runtime)}:{_e(entry.kernel)}[/bold]  {_e(entry.path)}")
        console.print(f"  key {_e(entry.key)}  built {ns_text(entry.built_ns)}  last disk hit "
                      f"or commit {ns_text(entry.committed_ns)}")
        for problem in entry.problems:
            console.print(f"  [yellow]{_e(problem)}[/yellow]")
    if record is not None:
        console.print()
        render_records([record], console)
        if record.compiler is not None and record.compiler.version_text:
            console.print("[cyan]compiler --version[/cyan]")
            console.print(record.compiler.version_text.rstrip(), markup=False)
            console.print()
    for lookup in explanation.lookups:
        console.print(f"  {_e(lookup.event)} at {ns_text(lookup.started_ns)} (pid {lookup.pid})")
    if explanation.tracked is not None:
        tracked = explanation.tracked
        console.print(f"[cyan]tracked set[/cyan] ({_e(tracked.how)})")
        for name, path in sorted(tracked.names.items()):
            console.print(_e(f"  <{name}> -> {path}"))
        if not tracked.names:
            console.print("  only the source itself")
        if tracked.error:
            console.print(f"  [yellow]{_e(tracked.error)}[/yellow]")
        if record is not None and record.graph is not None:
            untracked = [f for f in record.graph.files if f.path not in tracked.paths]
            console.print(f"  untracked: {len(untracked)} of {len(record.graph.files)} files "
                          f"the compiler read")
    if explanation.key is not None:
        key = explanation.key
        table = Table(title="key components (as a new runtime would compute them now)",
                      title_justify="left")
        table.add_column("component")
        table.add_column("value", overflow="fold")
        table.add_column("digest", no_wrap=True)
        for component in key.components:
            table.add_row(_e(component.label), _e(component.value), _e(component.digest or ""))
        if key.components:
            console.print(table)
        matches = key.matches(entry.key if entry else None)
        verdict = {True: "[green]matches the entry's key[/green]",
                   False: "[bold red]differs from the entry's key[/bold red]",
                   None: f"[yellow]not recomputed: {_e(key.note)}[/yellow]"}[matches]
        console.print(f"recomputed key {_e(key.recomputed or '-')}: {verdict}")
    if explanation.previous is not None:
        table = Table(title=f"changes since the previous compile of this kernel "
                            f"({ns_text(explanation.previous.started_ns)})", title_justify="left")
        for column in ("component", "item", "before", "now"):
            table.add_column(column, overflow="fold")
        for change in explanation.changes:
            table.add_row(_e(change.component), _e(change.item), _e(change.old or "-"),
                          _e(change.new or "-"))
        if not explanation.changes:
            table.add_row("-", "nothing", "", "")
        console.print(table)
    if explanation.findings:
        render_findings(explanation.findings, console, f"{len(explanation.findings)} finding(s)")
    else:
        console.print("[green]no findings[/green]")


# ------------------------------------------------------------------------------------ run


def render_run_report(report: RunReport, console: Console) -> None:
    """The run's summary line (the same counts as `run_report_json`), then its findings."""
    console.print(f"cacheaudit: {_e(report.summary())} in run {_e(report.run_uuid)}")
    if report.findings:
        render_findings(report.findings, console,
                        f"{len(report.findings)} finding(s) about this run")


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
