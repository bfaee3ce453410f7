"""The commands about the machine and its set-up: `snapshot` (the environment for a bug report;
`diff`, in cli_diff, compares two), `demo` (a cache going stale, caught) and `shim install` (the
masquerade directory). cli.py registers them on the app."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Literal

import typer

from cacheaudit import cli_checks as checks
from cacheaudit import cli_shared as shared
from cacheaudit.cli_shared import JsonOption, LedgerOption
from cacheaudit.exceptions import UsageError


def _write_output(path: Path, text: str) -> None:
    """A file the user named: one that cannot be written is a usage error, not a crash. A new
    file is made 0600 (a snapshot or report names the user's paths and settings)."""
    from cacheaudit.ledger.private import write_output

    try:
        write_output(str(path), text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from exc


def snapshot(
    json_output: JsonOption = False,
    out: Annotated[Path | None, typer.Option("-o", "--output",
                                             help="Write to this file instead of stdout.")] = None,
    anonymize: Annotated[bool, typer.Option(
        help="Replace the home directory, user and host names, and GPU UUIDs.")] = False,
    ledger: LedgerOption = None,
    timeout: Annotated[float, typer.Option(help="Seconds each probe may take.")] = 10.0,
) -> None:
    """The environment snapshot for a bug report: Markdown to paste into an issue (or --json):
    compilers, packages, GPU, the compile-affecting environment with each *_JIT_* setting's
    origin, cache roots, and the latest findings and kernels from the ledger. No secrets."""
    from cacheaudit.contract import dumps
    from cacheaudit.snapshot import collect, to_markdown

    checks.check_timeout(timeout)
    if out is not None:
        checks.check_writable(out)
    taken = collect(os.environ, ledger=shared.ledger_location(ledger), timeout=timeout,
                    anonymize=anonymize)
    text = dumps(taken) + "\n" if json_output else to_markdown(taken)
    if out is None:
        sys.stdout.write(text)
    else:
        _write_output(out, text)
        typer.echo(f"wrote {out}", err=True)


def demo(
    keep: Annotated[bool, typer.Option(help="Keep the temporary directory.")] = False,
    compiler: Annotated[Literal["auto", "nvcc", "g++"], typer.Option(
        help="auto: nvcc when on PATH, else g++.")] = "auto",
    json_output: JsonOption = False,
) -> None:
    """Make a JIT cache go stale and catch it: a reference runtime with DeepJIT's cache
    semantics, an edited untracked header, an injected flag, and the findings."""
    import shutil

    from cacheaudit import output
    from cacheaudit.demo import render, result_json, run_demo
    from cacheaudit.render import print_prose

    console = shared.console()
    say = (lambda _line: None) if json_output else (
        lambda line: print_prose(console, line))
    result = run_demo(say=say, compiler=compiler)
    try:
        if json_output:
            sys.stdout.write(result_json(result) + "\n")
            return
        render(result, console)
    finally:
        if keep:
            # After JSON, stdout holds the document only: the hint goes to stderr, its
            # paths whole (soft_wrap) whatever the width.
            (shared.stderr_console() if json_output else console).print(output.escape_markup(
                f"kept {result.workdir}: try `cacheaudit explain {result.workdir}/cache/cache/"
                f"<entry> --ledger {result.workdir}/ledger.db`"), soft_wrap=True)
        else:
            shutil.rmtree(result.workdir, ignore_errors=True)


def _compiler_settings() -> str:
    """The runtimes' compiler settings, from their specs, for help texts."""
    from cacheaudit import runtimes

    return ", ".join(dict.fromkeys(setting.name for declared in runtimes.specs()
                                   for setting in declared.compiler_settings))


SHIM_INSTALL_HELP = (
    "Lay out a masquerade directory: put it first on PATH, or name DIR/nvcc in a runtime's "
    f"compiler setting ({_compiler_settings()}).")


def shim_install(
    directory: Annotated[Path, typer.Argument(help="Directory to fill with compiler names.")],
    names: Annotated[list[str] | None, typer.Option(
        "--name", help="Only these compiler names (repeatable).")] = None,
    force: Annotated[bool, typer.Option(help="Replace existing files of those names.")] = False,
) -> None:
    """Lay out a masquerade directory (its help names the runtimes' compiler settings)."""
    from cacheaudit.shim import install_masquerade

    checks.check_new_directory(directory)  # a mistyped path leaves no new tree behind
    for line in install_masquerade(str(directory), names=names or None, force=force):
        typer.echo(line)
