"""What the commands of `cacheaudit` share: the option types, the console and output format, the
configuration and the ledger's location, the scan's options, progress. Light to import: each
helper imports what it needs when it runs (`cacheaudit --help` imports none of it)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from cacheaudit import cli_checks as checks
from cacheaudit.exceptions import UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from cacheaudit import render
    from cacheaudit.audit import AuditOptions
    from cacheaudit.config import Settings

LedgerOption = Annotated[
    Path | None,
    typer.Option("--ledger", envvar="CACHEAUDIT_LEDGER", show_envvar=True,
                 help="Ledger file (default: $XDG_CACHE_HOME/cacheaudit/ledger.db)."),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]
OutputFormatOption = Annotated[str | None, typer.Option(
    "--output-format", "--format", metavar="<full|concise|json|markdown|github|sarif>",
    help="full (the default: a block per finding), concise (a line per finding), json, "
    "markdown, github (workflow annotations) or sarif (SARIF 2.1.0); --json is "
    "--output-format json, and --format table is full.")]
QuietOption = Annotated[bool, typer.Option(
    "--quiet", "-q", help="Only the summary, and nothing at all when there is no finding.")]
VerboseOption = Annotated[bool, typer.Option(
    "--verbose", "-v", help="List every entry of findings that concern many.")]
ColorOption = Annotated[str, typer.Option(
    "--color", metavar="WHEN", help="Colour: auto (on a terminal, unless NO_COLOR is set or "
    "FORCE_COLOR asks for it), always or never.")]

# Literal types: typer offers them as choices in the help and refuses anything else.
Severity = Literal["error", "warning", "info", "never"]
FailOnOption = Annotated[Severity | None, typer.Option(
    "--fail-on", help="Exit 1 when a finding reaches this severity "
    "(default error, or [tool.cacheaudit] fail-on).")]
YesOption = Annotated[bool, typer.Option(
    "--yes", help="Run compile commands from records this user did not seal (another user's "
    "ledger, a record changed after it was written); see them first with `verify --dry-run`.")]
SelectOption = Annotated[list[str] | None, typer.Option(
    help="Only these codes or code prefixes (CA101,CA2).")]
IgnoreOption = Annotated[list[str] | None, typer.Option(
    help="Leave out these codes or code prefixes.")]
ReconstructOption = Annotated[bool | None, typer.Option(
    "--reconstruct/--no-reconstruct",
    help="Run the compiler's dependency pass for entries built before recording.")]
VerifyKeysOption = Annotated[bool | None, typer.Option(
    "--verify-keys/--no-verify-keys",
    help="Recompute every entry's key, not only where a tracked input changed.")]
IncludeDirOption = Annotated[list[str] | None, typer.Option(
    "--include-dir", help="An installed library's include tree (or its package directory) "
    "that entries built without recording were compiled against, where the scan cannot "
    "find it on PYTHONPATH (a package's include/ directory); repeatable.")]


def console(color: str = "auto", *, stderr: bool = False) -> Console:
    from cacheaudit.render import make_console

    try:
        return make_console(color, stderr=stderr)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def stderr_console(color: str = "auto") -> Console:
    return console(color, stderr=True)


def chosen_format(value: str | None, json_output: bool, default: str = "full") -> str:
    """The output format: `--json` is json; `--format table` (the old name) is full."""
    from cacheaudit.render import output_format

    if json_output:
        if value not in (None, "json"):
            raise UsageError(f"--json and --format {value} contradict each other: give one")
        return "json"
    try:
        return output_format(value or default)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def view(chosen: str, shown_on: Console, verbose: bool, quiet: bool) -> render.View:
    from cacheaudit.render import View

    return View(format=chosen, width=shown_on.width, verbose=verbose, quiet=quiet)


def emit(lines: list[render.Line], shown_on: Console) -> None:
    from cacheaudit.render import emit as emit_lines

    emit_lines(lines, shown_on)


def read_settings() -> Settings:
    """The configuration, its warnings (a pyproject.toml of other tools that does not parse)
    said on stderr, one line each."""
    from cacheaudit.config import load_settings

    settings = load_settings()
    for warning in settings.warnings:
        typer.echo(f"cacheaudit: warning: {warning}", err=True)
    return settings


def ledger_location(option: Path | None, settings: Settings | None = None, *,
                    creates: bool = False) -> str:
    """The ledger to use. `creates`: the command makes it when absent, and refuses a path given
    on the command line or in CACHEAUDIT_LEDGER whose directory does not exist: a mistyped path
    must not leave a new directory tree behind. The default location and the configuration's
    `ledger` (a project's `.cacheaudit/` on a fresh checkout) are made as needed."""
    from cacheaudit.config import ledger_location as configured_location

    settings = settings if settings is not None else read_settings()
    location = configured_location(option, settings)
    if creates and option:
        checks.check_ledger_directory(option, location)
    return location


def fail_on(option: str | None, settings: Settings) -> str:
    from cacheaudit.config import effective_fail_on

    return effective_fail_on(option, settings)


def _codes(values: list[str] | None) -> list[str]:
    """`--select CA101,CA2 --select CA301` -> ["CA101", "CA2", "CA301"]."""
    return [code.strip().upper() for value in values or [] for code in value.split(",")
            if code.strip()]


def _check_codes(codes: list[str], option: str) -> None:
    from cacheaudit.model import FINDING_CODES

    for code in codes:
        if not any(known.startswith(code) for known in FINDING_CODES):
            raise UsageError(f"{option} {code}: no finding code starts with it "
                             f"(codes: {', '.join(sorted(FINDING_CODES))})")


def audit_options(settings: Settings, select: list[str] | None, ignore: list[str] | None,
                  reconstruct: bool | None, verify_keys: bool | None,
                  include_dir: list[str] | None) -> AuditOptions:
    """The scan's options for every command that scans (`scan`, `evict`, `stats`): each
    command-line option beats `[tool.cacheaudit]`, include directories add up."""
    from cacheaudit.audit import AuditOptions

    selected = _codes(select) or _codes(settings.select)
    ignored = _codes(ignore) or _codes(settings.ignore)
    _check_codes(selected, "--select")
    _check_codes(ignored, "--ignore")
    checks.check_selection(selected, ignored)
    checks.check_directories(include_dir or [], "--include-dir")
    return AuditOptions(
        select=frozenset(selected), ignore=frozenset(ignored),
        reconstruct=settings.reconstruct if reconstruct is None else reconstruct,
        verify_keys=settings.verify_keys if verify_keys is None else verify_keys,
        include_dirs=tuple(os.path.abspath(os.path.expanduser(d)) for d in include_dir or ())
        + tuple(settings.include_dirs))


@contextlib.contextmanager
def progress(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for scans long enough to want one on a terminal; elsewhere (a
    CI log) a line at most every 10 s."""
    if not enabled:
        yield None
        return
    if not sys.stderr.isatty():
        from cacheaudit.progress import ProgressLines

        yield ProgressLines(_stderr_line)
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("auditing entries", total=None)

        def advance(done: int, total: int) -> None:
            if total >= 50:
                bar.update(task, completed=done, total=total)

        yield advance


def _stderr_line(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()
