"""Rendering: records and findings as rich tables, JSON and Markdown. No decisions are made here."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from typing import Any

from cacheaudit.model import CompileRecord, CompilerIdentity, FileState

ENV_ORIGIN_PREFIX = "env:"


def _short(digest: str | None, width: int = 12) -> str:
    return digest[:width] if digest else "-"


def _when(ns: int) -> str:
    moment = datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).astimezone()
    return moment.strftime("%Y-%m-%d %H:%M:%S")


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
    injected = [t.text for t in record.effective_argv if t.origin.startswith(ENV_ORIGIN_PREFIX)]
    graph = record.graph
    inputs: dict[str, Any] = {
        "sources": [_state_summary(s) for s in record.sources],
        "graph": None if graph is None else {
            "digest": graph.digest, "method": graph.method, "file_count": len(graph.files)},
        "tracked": list(record.tracked) if record.tracked is not None else None,
        "modified_during_compile": list(record.extra.get("modified_during_compile", [])),
    }
    if with_graph and graph is not None:
        inputs["graph"]["files"] = [
            dict(_state_summary(f.state), written=f.written) for f in graph.files]
    return {
        "record_id": record.record_id,
        "started": _when(record.started_ns),
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


def _compiler_lines(compiler: CompilerIdentity | None) -> list[str]:
    if compiler is None:
        return ["-"]
    first = compiler.path
    if compiler.resolved and compiler.resolved != compiler.path:
        first += f" -> {compiler.resolved}"
    lines = [first, f"{compiler.version_line or compiler.kind}  [dim]xxh3 "
             f"{_short(compiler.digest)}[/dim]"]
    if compiler.host is not None:
        lines.append(f"host {compiler.host.path}: {compiler.host.version_line}")
    if compiler.error:
        lines.append(f"[yellow]{compiler.error}[/yellow]")
    return lines


def _option_lines(record: CompileRecord) -> list[str]:
    lines = [" ".join(t.text for t in record.effective_argv if t.origin == "argv") or "-"]
    for token in record.effective_argv:
        if token.origin != "argv":
            lines.append(f"[bold magenta]+ {token.text}[/bold magenta]  (from {token.origin})")
    for name, value in sorted(record.env.items()):
        if name in _SHOWN_VARIABLES:
            lines.append(f"[magenta]{name}={value}[/magenta]")
    return lines


# Shown beside the options because they change what the compiler reads without touching argv.
_SHOWN_VARIABLES = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "NVCC_CCBIN")


def _event_line(record: CompileRecord) -> str:
    if record.signal:
        status = f"[red]killed by signal {record.signal}[/red]"
    elif record.exit_code not in (0, None):
        status = f"[red]exit {record.exit_code}[/red]"
    else:
        status = "ok"
    took = f"{record.duration_ns / 1e6:.0f} ms"
    return f"{record.event}, {status}, {took}  [dim]{record.observer}[/dim]"


def _input_lines(record: CompileRecord) -> list[str]:
    first = ", ".join(s.path for s in record.sources) or "-"
    if record.graph is not None:
        first += (f" + {len(record.graph.files)} headers  [dim]({record.graph.method}, graph "
                  f"{_short(record.graph.digest, 8)})[/dim]")
    lines = [first]
    late = record.extra.get("modified_during_compile")
    if late:
        lines.append(f"[bold red]CA401 modified during the compile: {', '.join(late)}[/bold red]")
    for note in record.notes:
        lines.append(f"[yellow]{note}[/yellow]")
    return lines


def render_records(records: Sequence[CompileRecord], console: Any) -> None:
    """The recorded compiles, one block a record, the four answers as numbered lines."""
    from rich.table import Table

    console.print(f"[bold]{len(records)} recorded compile(s)[/bold]")
    for record in records:
        title = (f"[bold]{record.runtime or '-'}:{record.kernel or '?'}[/bold]  "
                 f"{_when(record.started_ns)}")
        if record.test_id:
            title += f"  [dim]{record.test_id}[/dim]"
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="cyan", no_wrap=True)
        grid.add_column(overflow="fold")
        grid.add_row("1 compiler", "\n".join(_compiler_lines(record.compiler)))
        grid.add_row("2 options", "\n".join(_option_lines(record)))
        grid.add_row("3 event", _event_line(record))
        grid.add_row("4 inputs", "\n".join(_input_lines(record)))
        if record.outputs:
            grid.add_row("  outputs", "\n".join(
                f"{s.path}  [dim]xxh3 {_short(s.digest)}[/dim]" for s in record.outputs))
        console.print(title)
        console.print(grid)
        console.print()
