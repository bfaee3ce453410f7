"""`diff` over runs, ledgers and hosts, for people: a table (the default), a line per kernel
(concise), or Markdown for a bug report. The JSON is `documents.run_diff_json` and
`documents.host_diff_json`. Plain text: every value whole (a digest is 32 hex digits, a path
its full length), names that are not UTF-8 shown with escapes (`render.printable`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from cacheaudit.render import count_text, printable

if TYPE_CHECKING:
    from cacheaudit.audit.diff import KernelDiff, OneSided, RunDiff
    from cacheaudit.audit.diff_hosts import FleetDiff, HostKernel

DIFF_FORMATS = ("table", "concise", "json", "markdown")

Row = tuple[str, str, str, str]


def _value(value: str | None) -> str:
    return "(unset)" if value is None else "''" if value == "" else value


def kernel_name(runtime: str | None, kernel: str | None, key: str | None) -> str:
    name = kernel or "(unnamed)"
    details = [f"runtime {runtime}" if runtime else "", f"key {key}" if key else ""]
    shown = ", ".join(d for d in details if d)
    return f"{name} ({shown})" if shown else name


def _title(kernel: KernelDiff) -> str:
    key = kernel.key_a if kernel.key_a == kernel.key_b else None
    return kernel_name(kernel.runtime, kernel.kernel, key)


def rows(kernel: KernelDiff) -> list[Row]:
    """(answer, subject, A, B) for each thing that differs, in the design card's order."""
    found: list[Row] = []
    found += [("key", "key", _value(c.before), _value(c.after)) for c in kernel.key]
    found += [("compiler", c.subject, _value(c.before), _value(c.after))
              for c in kernel.compiler]
    found += [("options", t.text, t.origin if t.change == "removed" else "-",
               t.origin if t.change == "added" else "-") for t in kernel.options]
    found += [("environment", c.subject, _value(c.before), _value(c.after))
              for c in kernel.environment]
    found += [("event", "event", _value(c.before), _value(c.after)) for c in kernel.event]
    found += [("inputs", f"{f.path} ({f.change})", _value(f.before) if f.change != "added"
               else "-", _value(f.after) if f.change != "removed" else "-")
              for f in kernel.inputs]
    found += [("binary", "digest", _value(c.before), _value(c.after)) for c in kernel.binary]
    return found


def _table(header: Row, body: Sequence[Row], indent: str = "  ") -> list[str]:
    widths = [max(len(row[i]) for row in (header, *body)) for i in range(3)]
    return [indent + "  ".join(cell.ljust(widths[i]) if i < 3 else cell
                               for i, cell in enumerate(row)).rstrip()
            for row in (header, *body)]


def _only_line(item: OneSided, run: RunDiff) -> str:
    side = run.a if item.side == "a" else run.b
    record = item.record
    return (f"only in {'A' if item.side == 'a' else 'B'} ({side}): "
            f"{kernel_name(record.runtime, record.kernel, record.key)}, {record.event}")


def _summary(run: RunDiff) -> str:
    only_a = sum(1 for o in run.only if o.side == "a")
    only_b = len(run.only) - only_a
    return (f"{count_text(run.uses_a, 'kernel use')} in A, {run.uses_b} in B: "
            f"{run.identical} identical, {len(run.differing)} differing, "
            f"{only_a} only in A, {only_b} only in B")


def _first_lines(run: RunDiff) -> list[str]:
    first = run.first
    if first is None:
        return ["no kernel's binary or inputs differ"]
    return [f"first kernel whose binary or inputs differ: {_title(first)}, use "
            f"{first.position + 1} of A", f"  why: {first.why}"]


def run_table(run: RunDiff) -> str:
    lines = [f"A: {run.a}", f"B: {run.b}", _summary(run)]
    if run.same:
        lines.append("no differences")
        return printable("\n".join(lines) + "\n")
    lines += ["", *_first_lines(run)]
    for kernel in run.differing:
        lines += ["", f"{_title(kernel)}: {', '.join(kernel.answers)} differ"]
        lines += _table(("answer", "subject", "A", "B"), rows(kernel))
    if run.only:
        lines.append("")
        lines += [_only_line(item, run) for item in run.only]
    return printable("\n".join(lines) + "\n")


def run_concise(run: RunDiff) -> str:
    lines = [f"{_title(k)}: {', '.join(k.answers)}: {k.why}" for k in run.differing]
    lines += [_only_line(item, run) for item in run.only]
    first = run.first
    lines.append(_summary(run) + (f"; first differing: {_title(first)}" if first else ""))
    return printable("\n".join(lines) + "\n")


def _md(text: str) -> str:
    return printable(text).replace("|", "\\|").replace("`", "'")


def _md_table(body: Sequence[Row], header: Row = ("answer", "subject", "A", "B")) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---" * len(header) + "|"] + [
        "| " + " | ".join(f"`{_md(cell)}`" if i else _md(cell) for i, cell in enumerate(row))
        + " |" for row in body]


def run_markdown(run: RunDiff) -> str:
    lines = ["## cacheaudit diff", "", f"- A: `{_md(run.a)}`", f"- B: `{_md(run.b)}`",
             f"- {_summary(run)}", ""]
    if run.same:
        return "\n".join([*lines, "No differences.", ""])
    first = run.first
    if first is not None:
        lines += [f"**First kernel whose binary or inputs differ:** `{_md(_title(first))}` "
                  f"(use {first.position + 1} of A): {_md(first.why)}", ""]
    for kernel in run.differing:
        lines += [f"### `{_md(_title(kernel))}`", "", *_md_table(rows(kernel)), ""]
    if run.only:
        lines += ["### On one side only", ""] + [f"- {_md(_only_line(o, run))}"
                                                 for o in run.only] + [""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------ by host


def _fleet_summary(fleet: FleetDiff) -> str:
    return (f"{count_text(len(fleet.hosts), 'host')}, "
            f"{count_text(fleet.kernels, 'kernel')} compiled on two hosts or more, "
            f"{len(fleet.differing)} differing")


def _odd_line(fleet: FleetDiff) -> str:
    odd = fleet.odd_hosts.most_common()
    return "odd ones out: " + ", ".join(
        f"{host} ({count_text(count, 'kernel')})" for host, count in odd[:20]) + (
        f", and {len(odd) - 20} more" if len(odd) > 20 else "")


def _groups(kernel: HostKernel, limit: int = 8) -> list[str]:
    lines = []
    for index, group in enumerate(kernel.groups):
        hosts = ", ".join(group.hosts[:limit]) + (
            f", ... ({len(group.hosts)} hosts)" if len(group.hosts) > limit else "")
        role = "majority" if index == 0 else "odd"
        lines.append(f"  {role}: {hosts}")
    return lines


def _read(fleet: FleetDiff, quote: Callable[[str], str] = str) -> list[str]:
    """What was read: the ledger (or how many, the first and the last), and each one that
    could not be, with why."""
    if len(fleet.ledgers) > 1:
        lines = [f"ledgers: {len(fleet.ledgers)}, {quote(fleet.ledgers[0])} to "
                 f"{quote(fleet.ledgers[-1])}"]
    else:
        lines = [f"ledger: {quote(fleet.ledger)}"]
    return lines + [f"not compared: {quote(skipped)}" for skipped in fleet.skipped]


def host_table(fleet: FleetDiff) -> str:
    lines = [*_read(fleet), _fleet_summary(fleet)]
    if fleet.same:
        lines.append("no differences between hosts")
        return printable("\n".join(lines) + "\n")
    lines.append(_odd_line(fleet))
    for kernel in fleet.differing:
        lines += ["", f"{kernel_name(kernel.runtime, kernel.kernel, kernel.key)}: "
                      f"{', '.join(kernel.parts)} differ between hosts"]
        lines += _groups(kernel)
        for group, odd in zip(kernel.groups[1:], kernel.odd, strict=False):
            lines.append(f"  {group.hosts[0]} against {kernel.groups[0].hosts[0]}:")
            lines += _table(("answer", "subject", kernel.groups[0].hosts[0], group.hosts[0]),
                            rows(odd), indent="    ")
    return printable("\n".join(lines) + "\n")


def host_concise(fleet: FleetDiff) -> str:
    lines = [f"{kernel_name(k.runtime, k.kernel, k.key)}: {', '.join(k.parts)}: odd "
             f"{', '.join(k.odd_hosts[:8])}" + (f" ({len(k.odd_hosts)} hosts)"
                                                if len(k.odd_hosts) > 8 else "")
             + (f": {k.odd[0].why}" if k.odd else "") for k in fleet.differing]
    lines.append(_fleet_summary(fleet))
    return printable("\n".join(lines) + "\n")


def host_markdown(fleet: FleetDiff) -> str:
    lines = ["## cacheaudit diff --by-host", "",
             *(f"- {line}" for line in _read(fleet, lambda text: f"`{_md(text)}`")),
             f"- {_fleet_summary(fleet)}", ""]
    if fleet.same:
        return "\n".join([*lines, "No differences between hosts.", ""])
    lines += [f"- {_md(_odd_line(fleet))}", ""]
    for kernel in fleet.differing:
        lines += [f"### `{_md(kernel_name(kernel.runtime, kernel.kernel, kernel.key))}`", "",
                  f"Differs in {', '.join(kernel.parts)}.", ""]
        lines += [f"- {_md(line.strip())}" for line in _groups(kernel)] + [""]
        for group, odd in zip(kernel.groups[1:], kernel.odd, strict=False):
            header = ("answer", "subject", kernel.groups[0].hosts[0], group.hosts[0])
            lines += [*_md_table(rows(odd), header), ""]
    return "\n".join(lines)
