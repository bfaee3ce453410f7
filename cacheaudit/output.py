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


def _compiler_cell(compiler: CompilerIdentity | None) -> str:
    if compiler is None:
        return "-"
    lines = [f"{compiler.path}", f"{compiler.version_line or compiler.kind}",
             f"xxh3 {_short(compiler.digest)}"]
    if compiler.wrappers:
        lines.insert(1, f"-> {compiler.resolved}")
    if compiler.host is not None:
        lines.append(f"host {compiler.host.path} ({compiler.host.version_line})")
    if compiler.error:
        lines.append(f"[yellow]{compiler.error}[/yellow]")
    return "\n".join(lines)


def _options_cell(record: CompileRecord, width: int = 60) -> str:
    argv = " ".join(t.text for t in record.effective_argv if t.origin == "argv")
    if len(argv) > width:
        argv = argv[: width - 1] + "…"
    lines = [argv or "-"]
    for token in record.effective_argv:
        if token.origin != "argv":
            lines.append(f"[bold magenta]{token.text}[/bold magenta] ({token.origin})")
    for name, value in sorted(record.env.items()):
        if name in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "NVCC_CCBIN"):
            lines.append(f"{name}={value}")
    return "\n".join(lines)


def _inputs_cell(record: CompileRecord) -> str:
    lines = [", ".join(s.path.rsplit("/", 1)[-1] for s in record.sources) or "-"]
    if record.graph is not None:
        lines.append(f"{len(record.graph.files)} headers ({record.graph.method}, "
                     f"graph {_short(record.graph.digest, 8)})")
    late = record.extra.get("modified_during_compile")
    if late:
        lines.append(f"[bold red]CA401 modified during compile: {len(late)}[/bold red]")
    return "\n".join(lines)


def _status_cell(record: CompileRecord) -> str:
    if record.signal:
        return f"[red]signal {record.signal}[/red]"
    if record.exit_code not in (0, None):
        return f"[red]exit {record.exit_code}[/red]"
    return "ok"


def render_records(records: Sequence[CompileRecord], console: Any) -> None:
    """The recorded compiles, one row a record, the four answers as columns."""
    from rich.table import Table

    table = Table(title=f"{len(records)} recorded compile(s)", show_lines=True)
    table.add_column("when / kernel", overflow="fold")
    table.add_column("1. compiler", overflow="fold")
    table.add_column("2. options (env-injected in magenta)", overflow="fold")
    table.add_column("3. event", no_wrap=True)
    table.add_column("4. inputs", overflow="fold")
    for record in records:
        who = "\n".join(x for x in (
            _when(record.started_ns), f"{record.runtime or '?'}:{record.kernel or '?'}",
            record.test_id or "") if x)
        table.add_row(who, _compiler_cell(record.compiler), _options_cell(record),
                      f"{record.event}\n{_status_cell(record)}\n{record.duration_ns / 1e6:.0f} ms",
                      _inputs_cell(record))
    console.print(table)
