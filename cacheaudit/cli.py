"""The `cacheaudit` command: parse, call the library, render. Decisions live elsewhere."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cacheaudit.exceptions import CacheAuditError, ExitCode, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from cacheaudit.ledger import Ledger

app = typer.Typer(
    name="cacheaudit",
    help="Audit the compile caches of GPU kernel JIT runtimes: which compiler, which options, "
    "fresh or cached, and did every input that changed enter the key.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
shim_app = typer.Typer(help="Install and inspect the compiler shim.", no_args_is_help=True)
app.add_typer(shim_app, name="shim")

LedgerOption = Annotated[
    Path | None,
    typer.Option("--ledger", envvar="CACHEAUDIT_LEDGER", show_envvar=True,
                 help="Ledger file (default: $XDG_CACHE_HOME/cacheaudit/ledger.db)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


def _console() -> Console:
    from rich.console import Console

    return Console()


def _open_ledger(path: Path | None, *, create: bool = False) -> Ledger:
    from cacheaudit.ledger import Ledger, default_ledger_path, ingest_spool

    ledger = Ledger.open(str(path) if path else default_ledger_path(), create=create)
    ingest_spool(ledger)
    return ledger


@app.command()
def report(
    ledger: LedgerOption = None,
    json_output: JsonOption = False,
    kernel: Annotated[str | None, typer.Option(help="Only this kernel.")] = None,
    runtime: Annotated[str | None, typer.Option(help="Only this runtime.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many, newest last.")] = 50,
    graph: Annotated[bool, typer.Option("--graph", help="With --json: list every input.")] = False,
) -> None:
    """The recorded compiles with the four answers per kernel."""
    from cacheaudit import output

    conditions, params = [], []
    if kernel:
        conditions.append("r.kernel = ?")
        params.append(kernel)
    if runtime:
        conditions.append("r.runtime = ?")
        params.append(runtime)
    from cacheaudit.ledger import default_ledger_path

    location = str(ledger) if ledger else default_ledger_path()
    if not os.path.exists(location):
        typer.echo(f"no ledger at {location} yet: nothing has been recorded there", err=True)
        if json_output:
            sys.stdout.write(output.records_json([]) + "\n")
        return
    with _open_ledger(ledger) as opened:
        records = opened.records(where=" AND ".join(conditions), params=params,
                                 order="r.started_ns DESC, r.id DESC", limit=limit)
    records.reverse()
    if json_output:
        sys.stdout.write(output.records_json(records, with_graph=graph) + "\n")
    else:
        output.render_records(records, _console())


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="Keep the temporary directory.")] = False,
    compiler: Annotated[str, typer.Option(
        help="auto (nvcc when on PATH, else g++), nvcc or g++.")] = "auto",
    json_output: JsonOption = False,
) -> None:
    """Record a built-in example through the shim and show the four answers per compile."""
    import shutil

    from cacheaudit import output
    from cacheaudit.demo import run_demo

    console = _console()
    say = (lambda _line: None) if json_output else console.print
    if compiler not in ("auto", "nvcc", "g++"):
        raise UsageError(f"--compiler must be auto, nvcc or g++, not {compiler!r}")
    result = run_demo(say=say, compiler=compiler)
    try:
        if json_output:
            sys.stdout.write(output.records_json(result.records) + "\n")
            return
        output.render_records(result.records, console)
        console.print(
            "The two compiles had the same argv; the second one's binary differs because the "
            "environment changed what the compiler did (highlighted above). A runtime keyed on "
            "argv and source alone would have served the first binary for both.")
    finally:
        if keep:
            console.print(f"kept {result.workdir} (ledger: {result.workdir}/ledger.db)")
        else:
            shutil.rmtree(result.workdir, ignore_errors=True)


@shim_app.command("install")
def shim_install(
    directory: Annotated[Path, typer.Argument(help="Directory to fill with compiler names.")],
    names: Annotated[list[str] | None, typer.Option(
        "--name", help="Only these compiler names (repeatable).")] = None,
    force: Annotated[bool, typer.Option(help="Replace existing files of those names.")] = False,
) -> None:
    """Lay out a masquerade directory: put it first on PATH, or name DIR/nvcc in a runtime's
    compiler setting (DG_JIT_NVCC_COMPILER, FLASHINFER_NVCC, ...)."""
    from cacheaudit.shim import install_masquerade

    for line in install_masquerade(str(directory), names=names or None, force=force):
        typer.echo(line)


def main(argv: list[str] | None = None) -> int:
    """Entry point: library errors become one line and a documented exit status."""
    command = typer.main.get_command(app)
    try:
        status = command.main(args=argv, prog_name="cacheaudit", standalone_mode=False)
    except CacheAuditError as exc:
        sys.stderr.write(f"cacheaudit: error: {exc}\n")
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        sys.stderr.write("cacheaudit: aborted\n")
        return ExitCode.USAGE
    except Exception as exc:  # click's own usage errors, and the unexpected
        # typer vendors click in some releases: recognise its exceptions by shape, not class.
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None),
                                                                  int):
            exc.show()  # type: ignore[attr-defined]
            return ExitCode.USAGE
        if os.environ.get("CACHEAUDIT_DEBUG"):
            raise
        sys.stderr.write(f"cacheaudit: internal error: {type(exc).__name__}: {exc} "
                         "(set CACHEAUDIT_DEBUG=1 for a traceback)\n")
        return ExitCode.INTERNAL
    return status if isinstance(status, int) else ExitCode.CLEAN
