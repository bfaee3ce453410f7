"""The `cacheaudit` command: parse, call the library, render. Decisions live elsewhere."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from cacheaudit import cli_checks as checks
from cacheaudit.exceptions import CacheAuditError, ExitCode, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from cacheaudit import audit, render
    from cacheaudit.audit import AuditOptions
    from cacheaudit.config import Settings
    from cacheaudit.ledger import Ledger

app = typer.Typer(
    name="cacheaudit",
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Audit the compile caches of GPU kernel JIT runtimes: which compiler, which options, "
    "fresh or cached, and did every input that changed enter the key.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
shim_app = typer.Typer(help="Install and inspect the compiler shim.", no_args_is_help=True)
app.add_typer(shim_app, name="shim")

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


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"cacheaudit {version('cacheaudit')}")
        except PackageNotFoundError:  # pragma: no cover - run from a source tree
            typer.echo("cacheaudit (version unknown: not installed)")
        raise typer.Exit(ExitCode.CLEAN)


@app.callback()
def _top(version: Annotated[bool, typer.Option(
        "--version", callback=_show_version, is_eager=True,
        help="Print the version and exit.")] = False) -> None:
    """Audit the compile caches of GPU kernel JIT runtimes."""


def _console(color: str = "auto", *, stderr: bool = False) -> Console:
    from cacheaudit.render import make_console

    try:
        return make_console(color, stderr=stderr)
    except ValueError as exc:
        raise UsageError(str(exc)) from exc


def _stderr_console(color: str = "auto") -> Console:
    return _console(color, stderr=True)


def _format(value: str | None, json_output: bool, default: str = "full") -> str:
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


def _view(chosen: str, console: Console, verbose: bool, quiet: bool) -> render.View:
    from cacheaudit.render import View

    return View(format=chosen, width=console.width, verbose=verbose, quiet=quiet)


def _settings() -> Settings:
    """The configuration, its warnings (a pyproject.toml of other tools that does not parse)
    said on stderr, one line each."""
    from cacheaudit.config import load_settings

    settings = load_settings()
    for warning in settings.warnings:
        typer.echo(f"cacheaudit: warning: {warning}", err=True)
    return settings


def _ledger_location(option: Path | None, settings: Settings | None = None, *,
                     creates: bool = False) -> str:
    """The ledger to use. `creates`: the command makes it when absent, and refuses a path given
    on the command line or in CACHEAUDIT_LEDGER whose directory does not exist: a mistyped path
    must not leave a new directory tree behind. The default location and the configuration's
    `ledger` (a project's `.cacheaudit/` on a fresh checkout) are made as needed."""
    from cacheaudit.config import ledger_location

    settings = settings if settings is not None else _settings()
    location = ledger_location(option, settings)
    if creates and option:
        checks.check_ledger_directory(option, location)
    return location


def _fail_on(option: str | None, settings: Settings) -> str:
    from cacheaudit.config import effective_fail_on

    return effective_fail_on(option, settings)


def _write_output(path: Path, text: str) -> None:
    """A file the user named: one that cannot be written is a usage error, not a crash. A new
    file is made 0600 (a snapshot or report names the user's paths and settings)."""
    from cacheaudit.ledger.private import write_output

    try:
        write_output(str(path), text.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from exc


def _check_writable(path: Path) -> None:
    """Refuse an output file that cannot be written before any work is done for it."""
    directory = path.resolve().parent
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a directory")
    if not directory.is_dir():
        raise UsageError(f"cannot write {path}: no directory {directory}")
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"cannot write {path}: permission denied")


@app.command()
def report(
    ledger: LedgerOption = None,
    json_output: JsonOption = False,
    kernel: Annotated[str | None, typer.Option(help="Only this kernel.")] = None,
    runtime: Annotated[str | None, typer.Option(help="Only this runtime.")] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many, newest last.")] = 50,
    graph: Annotated[bool, typer.Option("--graph", help="With --json: list every input.")] = False,
    output_format: Annotated[str | None, typer.Option(
        "--output-format", "--format", metavar="<full|concise|json>",
        help="full (a block per record), concise (a line per record) or json.")] = None,
    quiet: QuietOption = False,
    color: ColorOption = "auto",
) -> None:
    """The recorded compiles with the four answers per kernel."""
    from cacheaudit import documents
    from cacheaudit.ledger import open_existing
    from cacheaudit.render_records import records_lines

    chosen = _format(output_format, json_output)
    if chosen not in ("full", "concise", "json"):
        raise UsageError(f"report --output-format must be full, concise or json, not {chosen}")
    checks.refuse_conflicts((graph and chosen != "json",
                             "--graph lists inputs in the JSON only: add --json, or leave out "
                             "--graph"))
    location = _ledger_location(ledger)
    opened = open_existing(location)
    if opened is None:
        typer.echo(f"no ledger at {location} yet: nothing has been recorded there", err=True)
        if chosen == "json":
            sys.stdout.write(documents.records_json([], total=0) + "\n")
        return
    with opened:
        records = opened.recent_records(kernel=kernel, runtime=runtime, limit=limit)
        total = opened.count_records(kernel=kernel, runtime=runtime)
    if chosen == "json":
        sys.stdout.write(documents.records_json(records, total=total, with_graph=graph) + "\n")
        return
    console = _console(color)
    _emit(records_lines(records, _view(chosen, console, False, quiet), total), console)


def _emit(lines: list[render.Line], console: Console) -> None:
    from cacheaudit.render import emit

    emit(lines, console)


# Literal types: typer offers them as choices in the help and refuses anything else.
Severity = Literal["error", "warning", "info", "never"]
FailOnOption = Annotated[Severity | None, typer.Option(
    "--fail-on", help="Exit 1 when a finding reaches this severity "
    "(default error, or [tool.cacheaudit] fail-on).")]
YesOption = Annotated[bool, typer.Option(
    "--yes", help="Run compile commands from records this user did not seal (another user's "
    "ledger, a record changed after it was written); see them first with `verify --dry-run`.")]


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


def _audit_options(settings: Settings, select: list[str] | None, ignore: list[str] | None,
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


@app.command()
def scan(
    paths: Annotated[list[str] | None, typer.Argument(
        help="Cache roots to scan (default: every root the known runtimes would use).")] = None,
    ledger: LedgerOption = None,
    output_format: OutputFormatOption = None,
    json_output: JsonOption = False,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
    color: ColorOption = "auto",
    fail_on: FailOnOption = None,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    reconstruct: ReconstructOption = None,
    verify_keys: VerifyKeysOption = None,
    include_dir: IncludeDirOption = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on long scans.")] = True,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Then rebuild the entries whose verdict is only a warning or "
        "unverifiable and compare the binaries (the rebuild oracle, see `verify`).")] = False,
    yes: YesOption = False,
    allow_empty: Annotated[bool, typer.Option(
        "--allow-empty", help="Pass when there is nothing to scan: no cache root found, or a "
        "cache variable naming a directory that does not exist (default: exit 2).")] = False,
) -> None:
    """Audit cache entries: every input that changed without the key noticing."""
    from cacheaudit import audit, output

    settings = _settings()
    fail_on = _fail_on(fail_on, settings)
    chosen = _format(output_format, json_output)
    options = _audit_options(settings, select, ignore, reconstruct, verify_keys, include_dir)
    from cacheaudit.ledger import open_ledger

    console = _console(color)
    with open_ledger(_ledger_location(ledger, settings, creates=True)) as opened, _progress(
            progress and chosen in ("full", "concise")) as advance:
        result = audit.scan(paths or settings.paths, os.environ, ledger=opened, options=options,
                            progress=advance)
        if not allow_empty:
            checks.refuse_nothing_scanned(result, _cache_variables())
        if verify:
            result = _verify_scan(result, opened, yes)
    for layout, root in result.empty_roots:
        typer.echo(f"cacheaudit: root {root} ({layout}): no entries", err=True)
    if chosen == "json":
        from cacheaudit import documents

        summary = output.summary_line(len(result.entries), len(result.roots), result.matched,
                                      result.reconstructed, result.findings)
        sys.stdout.write(documents.scan_json(result, summary=summary, fail_on=fail_on) + "\n")
    else:
        from cacheaudit.render import Totals, render

        if not result.roots:
            typer.echo(f"cacheaudit: no cache roots found (give a path, or set "
                       f"{', '.join(_cache_variables())})", err=True)
        totals = Totals(len(result.entries), len(result.roots), result.matched,
                        result.reconstructed)
        render(result.findings, [totals.text()], _view(chosen, console, verbose, quiet),
               console)
    if audit.fails(result.findings, fail_on):
        raise typer.Exit(ExitCode.FINDINGS)


def _say(line: str) -> None:
    typer.echo(f"cacheaudit verify: {line}", err=True)


def _verify_scan(result: audit.ScanResult, ledger: Ledger, yes: bool) -> audit.ScanResult:
    """`scan --verify`: the rebuild oracle over the scan's suspects."""
    from cacheaudit.audit.verify import VerifyOptions, verify_scan

    verified, _ = verify_scan(result, os.environ, ledger=ledger,
                              options=VerifyOptions(yes=yes), say=_say)
    return verified


@app.command("verify")
def verify_command(
    targets: Annotated[list[str] | None, typer.Argument(
        metavar="[ENTRY...]", help="Entry directories (or files in them) or cache roots "
        "(default: every entry of the roots the known runtimes would use).")] = None,
    ledger: LedgerOption = None,
    json_output: JsonOption = False,
    fail_on: FailOnOption = None,
    sample: Annotated[int | None, typer.Option(
        "--sample", min=1, help="Rebuild only N entries, chosen by --seed.")] = None,
    seed: Annotated[int, typer.Option(help="The sample's seed: the same seed, the same "
                                           "entries.")] = 0,
    jobs: Annotated[int | None, typer.Option(
        "-j", "--jobs", min=1, help="Compiles at once (default and at most: the cores "
        "present).")] = None,
    timeout: Annotated[float, typer.Option(
        help="Seconds one compile may take before it is killed.")] = 300.0,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print the commands that would run, and run nothing.")] = False,
    yes: YesOption = False,
) -> None:
    """The rebuild oracle: compile entries again in a private temporary directory and compare
    the binaries: CA403 when a fresh compile differs from the cached binary, CA404 when two
    fresh compiles differ from each other."""
    from cacheaudit import audit
    from cacheaudit.audit.verify import VerifyOptions, entries_of, verify
    from cacheaudit.digest import StateCache
    from cacheaudit.ledger import open_existing

    settings = _settings()
    fail_on = _fail_on(fail_on, settings)
    checks.check_timeout(timeout)
    entries = entries_of(targets or settings.paths, os.environ, StateCache())
    options = VerifyOptions(sample=sample, seed=seed, jobs=jobs, timeout=timeout,
                            dry_run=dry_run, yes=yes)
    with contextlib.ExitStack() as stack:
        opened = open_existing(_ledger_location(ledger, settings))
        if opened is not None:
            stack.enter_context(opened)
        result = verify(entries, os.environ, ledger=opened, options=options, say=_say)
    if dry_run:
        commands = [{"entry": r.entry.path, "command": r.shown(), "origin": r.origin,
                     "notes": r.notes, "needs_yes": r.needs_yes} for r in result.planned]
        if json_output:
            from cacheaudit import documents

            sys.stdout.write(documents.verify_plan_json(commands) + "\n")
        for command in [] if json_output else commands:
            mark = f"  # needs --yes: {command['needs_yes']}" if command["needs_yes"] else ""
            typer.echo(f"{command['command']}{mark}")
        return
    summary = result.summary()
    if json_output:
        from cacheaudit import documents

        sys.stdout.write(documents.verify_json(result, summary=summary, fail_on=fail_on) + "\n")
    else:
        from cacheaudit.render import render

        console = _console()
        render(result.findings, [summary], _view("full", console, False, False), console)
    if audit.fails(result.findings, fail_on):
        raise typer.Exit(ExitCode.FINDINGS)


def _cache_variables() -> list[str]:
    """The variables that name the runtimes' cache roots, from their specs, each once."""
    from cacheaudit import runtimes

    return list(dict.fromkeys(name for declared in runtimes.specs()
                              for name in declared.cache_variables))


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
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


SeverityOption = Annotated[str, typer.Option(
    "--severity", help="Evict entries with a finding of at least this severity: error, "
    "warning or info.")]


@app.command()
def evict(
    targets: Annotated[list[str] | None, typer.Argument(
        metavar="[ROOT|ENTRY...]", help="Cache roots to scan, or entries (directories, or files "
        "in them) to consider (default: every root the known runtimes would use).")] = None,
    ledger: LedgerOption = None,
    json_output: JsonOption = False,
    select: Annotated[list[str] | None, typer.Option(
        help="Only findings of these codes or code prefixes (CA101,CA2) choose entries.")] = None,
    ignore: Annotated[list[str] | None, typer.Option(
        help="Findings of these codes or code prefixes choose no entry.")] = None,
    reconstruct: ReconstructOption = None,
    verify_keys: VerifyKeysOption = None,
    include_dir: IncludeDirOption = None,
    severity: SeverityOption = "error",
    runtime: Annotated[list[str] | None, typer.Option(
        "--runtime", help="Only entries of this runtime (repeatable).")] = None,
    dry_run: Annotated[bool, typer.Option(
        "--dry-run", help="Print what would be evicted, and change nothing.")] = False,
    progress: Annotated[bool, typer.Option(help="Show progress on long scans.")] = True,
) -> None:
    """Remove the entries a scan finds stale, so that the runtime compiles them afresh: each
    entry goes whole (renamed out of the way, then deleted), only inside recognised cache roots,
    logged in the ledger."""
    from cacheaudit import documents
    from cacheaudit.audit.evict import EVICTED, WOULD_EVICT, EvictOptions
    from cacheaudit.audit.evict import evict as run_evict
    from cacheaudit.ledger import open_ledger
    from cacheaudit.model import Severity

    if severity not in ("error", "warning", "info"):
        raise UsageError(f"--severity must be error, warning or info, not {severity!r}")
    from cacheaudit.spec import names

    for name in runtime or ():
        if name not in names():
            raise UsageError(f"--runtime {name}: no such runtime ({', '.join(names())})")
    settings = _settings()
    options = EvictOptions(
        audit=_audit_options(settings, select, ignore, reconstruct, verify_keys, include_dir),
        severity=Severity(severity), runtimes=frozenset(runtime or ()), dry_run=dry_run)
    with open_ledger(_ledger_location(ledger, settings)) as opened, _progress(
            progress and not json_output) as advance:
        result = run_evict(targets or settings.paths, os.environ, ledger=opened,
                           options=options, progress=advance)
    if json_output:
        sys.stdout.write(documents.evict_json(result) + "\n")
    else:
        from cacheaudit.render import emit
        from cacheaudit.render_records import evict_lines

        console = _console()
        emit(evict_lines(result, _view("full", console, False, False)), console)
    done = WOULD_EVICT if dry_run else EVICTED
    if any(o.status != done for o in result.outcomes):
        raise typer.Exit(ExitCode.FINDINGS)


@app.command()
def stats(
    paths: Annotated[list[str] | None, typer.Argument(
        help="Cache roots (default: every root the known runtimes would use).")] = None,
    ledger: LedgerOption = None,
    json_output: JsonOption = False,
    judge: Annotated[bool, typer.Option(
        "--scan/--no-scan", help="Judge the entries to count the stale and unverifiable ones "
        "(--no-scan: only count, faster).")] = True,
    select: SelectOption = None,
    ignore: IgnoreOption = None,
    reconstruct: ReconstructOption = None,
    verify_keys: VerifyKeysOption = None,
    include_dir: IncludeDirOption = None,
    progress: Annotated[bool, typer.Option(help="Show progress on long scans.")] = True,
) -> None:
    """Per runtime and cache root: entries, bytes, recorded compiles, disk and memory hits and
    the hit rate, stale and unverifiable entries, evictions, the oldest and newest entry."""
    from cacheaudit import documents
    from cacheaudit.audit.stats import stats as tally
    from cacheaudit.ledger import open_existing

    settings = _settings()
    options = _audit_options(settings, select, ignore, reconstruct, verify_keys, include_dir)
    with contextlib.ExitStack() as stack:
        opened = open_existing(_ledger_location(ledger, settings))
        if opened is not None:
            stack.enter_context(opened)
        advance = stack.enter_context(_progress(progress and judge and not json_output))
        result = tally(paths or settings.paths, os.environ, ledger=opened, judge=judge,
                       options=options, progress=advance)
    if json_output:
        sys.stdout.write(documents.stats_json(result) + "\n")
    else:
        from cacheaudit.render import emit
        from cacheaudit.render_records import stats_lines

        console = _console()
        emit(stats_lines(result, _view("full", console, False, False)), console)


@app.command()
def explain(
    target: Annotated[str, typer.Argument(
        help="An entry directory (or a file in it), a key prefix, or a record id.")],
    ledger: LedgerOption = None,
    json_output: JsonOption = False,
    output_format: Annotated[str | None, typer.Option(
        "--output-format", "--format", metavar="<full|json>",
        help="full (the default) or json.")] = None,
    verbose: VerboseOption = False,
    color: ColorOption = "auto",
) -> None:
    """One entry in full: the four answers, the key's labelled components, and what changed
    since the kernel's previous compile."""
    from cacheaudit import documents
    from cacheaudit.explain import explain as build
    from cacheaudit.ledger import open_existing
    from cacheaudit.render_records import explanation_lines

    chosen = _format(output_format, json_output)
    if chosen not in ("full", "json"):
        raise UsageError(f"explain --output-format must be full or json, not {chosen}")
    checks.refuse_conflicts((not target.strip(), "explain needs an entry path, a key prefix or "
                                                 "a record id, not an empty string"))

    with contextlib.ExitStack() as stack:
        opened = open_existing(_ledger_location(ledger))
        if opened is not None:
            stack.enter_context(opened)
        explanation = build(target, os.environ, opened)
        if chosen == "json":
            sys.stdout.write(documents.explanation_json(explanation) + "\n")
        else:
            console = _console(color)
            _emit(explanation_lines(explanation, _view(chosen, console, verbose, False)),
                  console)


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="The command to run, after --.")],
    ledger: LedgerOption = None,
    fail_on: Annotated[Severity, typer.Option(
        "--fail-on", help="Exit 1 (when the command itself succeeded) if a finding reaches "
        "this severity.")] = "never",
    report_json: Annotated[Path | None, typer.Option(
        "--report-json", help="Also write the report as JSON to this file.")] = None,
    output_format: Annotated[str | None, typer.Option(
        "--output-format", "--format", metavar="<full|concise|markdown|github|sarif>",
        help="How the report at exit is shown on stderr: full (the default), concise, "
        "markdown, github or sarif (JSON: --report-json).")] = None,
    quiet: QuietOption = False,
    verbose: VerboseOption = False,
    color: ColorOption = "auto",
) -> None:
    """Run any command with the compiler shim and the in-process adapters active; print the
    report at exit. The exit status is the command's unless --fail-on says otherwise."""
    from cacheaudit import audit, documents, runner

    chosen = _format(output_format, False)
    if chosen == "json":
        raise UsageError("run prints its report on stderr, beside the command's output: "
                         "write the JSON report to a file with --report-json FILE")
    console = _stderr_console(color)
    if report_json is not None:
        _check_writable(report_json)
    outcome = runner.run_recorded(command, ledger=_ledger_location(ledger, creates=True))
    report = outcome.report
    # From here on the command has run: nothing cacheaudit fails at may change its status.
    if report is None:
        typer.echo(f"cacheaudit: warning: the audit failed, the command's exit status stands: "
                   f"{outcome.problem}", err=True)
        raise typer.Exit(outcome.status)
    from cacheaudit.render import render

    render(report.findings, [f"{report.summary()} in run {report.run_uuid}"],
           _view(chosen, console, verbose, quiet), console)
    if report_json is not None:
        from cacheaudit.ledger.private import write_output
        from cacheaudit.ledger.redact import redact_command

        shown = list(redact_command(command))
        try:
            document = documents.run_report_json(report, shown, outcome.status)
            write_output(str(report_json), (document + "\n").encode("utf-8"))
        except OSError as exc:
            typer.echo(f"cacheaudit: warning: cannot write {report_json}: "
                       f"{exc.strerror or exc}", err=True)
    status = outcome.status
    if status == 0 and audit.fails(report.findings, fail_on):
        status = ExitCode.FINDINGS
    raise typer.Exit(status)


@app.command()
def combine(
    sources: Annotated[list[Path], typer.Argument(help="Ledger files to merge.")],
    ledger: LedgerOption = None,
    keep: Annotated[bool, typer.Option(help="Keep the merged files (default: delete them).")]
    = False,
) -> None:
    """Merge ledgers (pytest-xdist workers, ranks, hosts) into one, sharing graphs and states."""
    from cacheaudit.ledger import combine as merge
    from cacheaudit.ledger import open_ledger

    with open_ledger(_ledger_location(ledger, creates=True)) as opened:
        result = merge(opened, [str(s) for s in sources], keep=keep)
        total = opened.count("records")
    for problem in result.skipped:
        typer.echo(f"cacheaudit: skipped {problem}", err=True)
    typer.echo(f"combined {len(result.combined)} ledger(s), {result.records} new record(s); "
               f"{opened.path} holds {total}")
    if result.skipped and not result.combined:
        raise typer.Exit(ExitCode.USAGE)


@app.command()
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
        _check_writable(out)
    taken = collect(os.environ, ledger=_ledger_location(ledger), timeout=timeout,
                    anonymize=anonymize)
    text = dumps(taken) + "\n" if json_output else to_markdown(taken)
    if out is None:
        sys.stdout.write(text)
    else:
        _write_output(out, text)
        typer.echo(f"wrote {out}", err=True)


@app.command("diff")
def diff_snapshots(
    before: Annotated[Path, typer.Argument(help="A snapshot taken with --json.")],
    after: Annotated[Path, typer.Argument(help="Another one.")],
    json_output: JsonOption = False,
) -> None:
    """What differs between two snapshots (two machines, before and after an upgrade), grouped
    by compilers, packages, environment and caches."""
    from cacheaudit import documents, output
    from cacheaudit.snapshot import diff, load_snapshot

    groups = diff(load_snapshot(str(before)), load_snapshot(str(after)))
    if json_output:
        sys.stdout.write(documents.snapshot_diff_json(groups) + "\n")
    else:
        output.render_snapshot_diff(groups, _console())


@app.command()
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

    console = _console()
    def prose(line: str) -> None:
        # Wrapped between words; a path longer than the line overflows it, whole.
        console.print(line, soft_wrap=False, overflow="ignore")

    say = (lambda _line: None) if json_output else prose
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
            (_stderr_console() if json_output else console).print(output.escape_markup(
                f"kept {result.workdir}: try `cacheaudit explain {result.workdir}/cache/cache/"
                f"<entry> --ledger {result.workdir}/ledger.db`"), soft_wrap=True)
        else:
            shutil.rmtree(result.workdir, ignore_errors=True)


def _compiler_settings() -> str:
    """The runtimes' compiler settings, from their specs, for help texts."""
    from cacheaudit import runtimes

    return ", ".join(dict.fromkeys(setting.name for declared in runtimes.specs()
                                   for setting in declared.compiler_settings))


@shim_app.command("install", help=(
    "Lay out a masquerade directory: put it first on PATH, or name DIR/nvcc in a runtime's "
    f"compiler setting ({_compiler_settings()})."))
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


class _Terminated(BaseException):
    """SIGTERM or SIGHUP, raised where the main thread is, so that every `finally` runs: the
    children cacheaudit started are killed and its temporary directories removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _terminate(signum: int, _frame: object) -> None:
    from cacheaudit import children

    children.kill_all()
    raise _Terminated(signum)


@contextlib.contextmanager
def _terminable() -> Iterator[None]:
    import signal

    # A signal the caller ignores (nohup) stays ignored.
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(sig) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> int:
    """Entry point: library errors become one line and a documented exit status."""
    with _terminable():
        try:
            status = _main(argv)
            sys.stdout.flush()
        except _Terminated as exc:
            sys.stderr.write(f"cacheaudit: terminated by signal {exc.signum}\n")
            return 128 + exc.signum
        except BrokenPipeError:
            return checks.quiet_broken_pipe()
        except SystemExit as exc:
            if checks.is_broken_pipe(exc):
                return checks.quiet_broken_pipe()
            raise
        return status


def _main(argv: list[str] | None) -> int:
    from cacheaudit import scratch

    # What a cacheaudit process killed outright (a shim, a scan) left in TMPDIR.
    scratch.sweep()
    command = typer.main.get_command(app)
    try:
        status = command.main(args=argv, prog_name="cacheaudit", standalone_mode=False)
    except CacheAuditError as exc:
        sys.stderr.write(f"cacheaudit: error: {exc}\n")
        return exc.exit_code
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort as exc:
        # click turns Ctrl-C into Abort: the shell's convention for SIGINT, not a usage error.
        if isinstance(exc.__context__, KeyboardInterrupt):
            sys.stderr.write("cacheaudit: interrupted\n")
            return ExitCode.INTERRUPTED
        sys.stderr.write("cacheaudit: aborted\n")
        return ExitCode.USAGE
    except KeyboardInterrupt:
        sys.stderr.write("cacheaudit: interrupted\n")
        return ExitCode.INTERRUPTED
    except BrokenPipeError:
        raise
    except Exception as exc:  # click's own usage errors, and the unexpected
        # typer vendors click in some releases: recognise its exceptions by shape, not class.
        if callable(getattr(exc, "show", None)) and isinstance(getattr(exc, "exit_code", None),
                                                                  int):
            if type(exc).__name__ == "NoArgsIsHelpError":
                exc.show()  # type: ignore[attr-defined]  # the help itself, as asked
            else:
                sys.stderr.write(checks.usage_line(exc))  # type: ignore[arg-type]
            return ExitCode.USAGE
        if os.environ.get("CACHEAUDIT_DEBUG"):
            raise
        sys.stderr.write(f"cacheaudit: internal error: {type(exc).__name__}: {exc} "
                         "(set CACHEAUDIT_DEBUG=1 for a traceback)\n")
        return ExitCode.INTERNAL
    return status if isinstance(status, int) else ExitCode.CLEAN
