"""The `cacheaudit` command: parse, call the library, render. Decisions live elsewhere."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cacheaudit.exceptions import CacheAuditError, ExitCode, UsageError

if TYPE_CHECKING:
    from rich.console import Console

    from cacheaudit import audit
    from cacheaudit.config import Settings
    from cacheaudit.ledger import Ledger

app = typer.Typer(
    name="cacheaudit",
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


def _console() -> Console:
    from rich.console import Console

    return Console()


def _settings() -> Settings:
    from cacheaudit.config import load_settings

    return load_settings()


def _ledger_location(option: Path | None, settings: Settings | None = None) -> str:
    from cacheaudit.config import ledger_location

    return ledger_location(option, settings if settings is not None else _settings())


def _write_output(path: Path, text: str) -> None:
    """A file the user named: one that cannot be written is a usage error, not a crash."""
    try:
        path.write_text(text, encoding="utf-8")
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
    limit: Annotated[int, typer.Option(help="At most this many, newest last.")] = 50,
    graph: Annotated[bool, typer.Option("--graph", help="With --json: list every input.")] = False,
) -> None:
    """The recorded compiles with the four answers per kernel."""
    from cacheaudit import output
    from cacheaudit.ledger import open_existing

    location = _ledger_location(ledger)
    opened = open_existing(location)
    if opened is None:
        typer.echo(f"no ledger at {location} yet: nothing has been recorded there", err=True)
        if json_output:
            sys.stdout.write(output.records_json([]) + "\n")
        return
    with opened:
        records = opened.recent_records(kernel=kernel, runtime=runtime, limit=limit)
    if json_output:
        sys.stdout.write(output.records_json(records, with_graph=graph) + "\n")
    else:
        output.render_records(records, _console())


FailOnOption = Annotated[str | None, typer.Option(
    "--fail-on", help="Exit 1 when a finding reaches this severity: error, warning, info, never "
    "(default error, or [tool.cacheaudit] fail-on).")]
FormatOption = Annotated[str, typer.Option(
    "--format", help="table, json or markdown.")]


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


@app.command()
def scan(
    paths: Annotated[list[str] | None, typer.Argument(
        help="Cache roots to scan (default: every root the known runtimes would use).")] = None,
    ledger: LedgerOption = None,
    output_format: FormatOption = "table",
    json_output: JsonOption = False,
    fail_on: FailOnOption = None,
    select: Annotated[list[str] | None, typer.Option(
        help="Only these codes or code prefixes (CA101,CA2).")] = None,
    ignore: Annotated[list[str] | None, typer.Option(
        help="Leave out these codes or code prefixes.")] = None,
    reconstruct: Annotated[bool | None, typer.Option(
        "--reconstruct/--no-reconstruct",
        help="Run the compiler's dependency pass for entries built before recording.")] = None,
    verify_keys: Annotated[bool | None, typer.Option(
        "--verify-keys/--no-verify-keys",
        help="Recompute every entry's key, not only where a tracked input changed.")] = None,
    include_dir: Annotated[list[str] | None, typer.Option(
        "--include-dir", help="An installed library's include tree (or its package directory) "
        "that entries built without recording were compiled against, where the scan cannot "
        "find it on PYTHONPATH (a package's include/ directory); repeatable.")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar on long scans.")] = True,
    verify: Annotated[bool, typer.Option(
        "--verify", help="Then rebuild the entries whose verdict is only a warning or "
        "unverifiable and compare the binaries (the rebuild oracle, see `verify`).")] = False,
    yes: YesOption = False,
) -> None:
    """Audit cache entries: every input that changed without the key noticing."""
    from cacheaudit import audit, output
    from cacheaudit.config import fail_on_problem

    settings = _settings()
    fail_on = fail_on or settings.fail_on
    if problem := fail_on_problem(fail_on, "--fail-on"):
        raise UsageError(problem)
    output_format = "json" if json_output else output_format
    if output_format not in ("table", "json", "markdown"):
        raise UsageError(f"--format must be table, json or markdown, not {output_format!r}")
    selected = _codes(select) or _codes(settings.select)
    ignored = _codes(ignore) or _codes(settings.ignore)
    _check_codes(selected, "--select")
    _check_codes(ignored, "--ignore")
    options = audit.AuditOptions(
        select=frozenset(selected), ignore=frozenset(ignored),
        reconstruct=settings.reconstruct if reconstruct is None else reconstruct,
        verify_keys=settings.verify_keys if verify_keys is None else verify_keys,
        include_dirs=tuple(os.path.abspath(os.path.expanduser(d)) for d in include_dir or ())
        + tuple(settings.include_dirs))
    from cacheaudit.ledger import open_ledger

    console = _console()
    with open_ledger(_ledger_location(ledger, settings)) as opened, _progress(
            progress and output_format == "table") as advance:
        result = audit.scan(paths or settings.paths, os.environ, ledger=opened, options=options,
                            progress=advance)
        if verify:
            result = _verify_scan(result, opened, yes)
    summary = output.summary_line(len(result.entries), len(result.roots), result.matched,
                                  result.reconstructed, result.findings)
    if output_format == "json":
        sys.stdout.write(output.findings_json(result.findings, {
            "roots": [{"layout": layout, "root": root} for layout, root in result.roots],
            "entries": len(result.entries), "matched": result.matched,
            "reconstructed": result.reconstructed,
            "reconstructed_now": result.reconstructed_now, "ledger": result.ledger,
            "fail_on": fail_on, "summary": summary}) + "\n")
    elif output_format == "markdown":
        sys.stdout.write(output.findings_markdown(result.findings, summary))
    else:
        if not result.roots:
            console.print(f"no cache roots found (give a path, or set "
                          f"{', '.join(_cache_variables())})")
        output.render_findings(result.findings, console, summary)
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
    from cacheaudit import audit, output
    from cacheaudit.audit.verify import VerifyOptions, entries_of, verify
    from cacheaudit.config import fail_on_problem
    from cacheaudit.digest import StateCache
    from cacheaudit.ledger import open_existing

    settings = _settings()
    fail_on = fail_on or settings.fail_on
    if problem := fail_on_problem(fail_on, "--fail-on"):
        raise UsageError(problem)
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
            import json

            sys.stdout.write(json.dumps({"commands": commands}, indent=2) + "\n")
        for command in [] if json_output else commands:
            mark = f"  # needs --yes: {command['needs_yes']}" if command["needs_yes"] else ""
            typer.echo(f"{command['command']}{mark}")
        return
    summary = result.summary()
    if json_output:
        sys.stdout.write(output.findings_json(result.findings, {
            "entries": len(result.entries), "total": result.total, "seed": result.seed,
            "verdicts": [{"entry": v.entry.path, "outcome": v.outcome, "note": v.note}
                         for v in result.verdicts],
            "fail_on": fail_on, "summary": summary}) + "\n")
    else:
        output.render_findings(result.findings, _console(), summary)
    if audit.fails(result.findings, fail_on):
        raise typer.Exit(ExitCode.FINDINGS)


def _cache_variables() -> list[str]:
    """The variables that name the runtimes' cache roots, from their specs, each once."""
    from cacheaudit import runtimes

    return list(dict.fromkeys(name for declared in runtimes.specs()
                              for name in declared.cache_variables))


@contextlib.contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr for scans long enough to want one, only on a terminal."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("auditing entries", total=None)

        def advance(done: int, total: int) -> None:
            if total >= 50:
                bar.update(task, completed=done, total=total)

        yield advance


@app.command()
def explain(
    target: Annotated[str, typer.Argument(
        help="An entry directory (or a file in it), a key prefix, or a record id.")],
    ledger: LedgerOption = None,
    json_output: JsonOption = False,
) -> None:
    """One entry in full: the four answers, the key's labelled components, and what changed
    since the kernel's previous compile."""
    from cacheaudit import output
    from cacheaudit.explain import explain as build
    from cacheaudit.ledger import open_existing

    with contextlib.ExitStack() as stack:
        opened = open_existing(_ledger_location(ledger))
        if opened is not None:
            stack.enter_context(opened)
        explanation = build(target, os.environ, opened)
        if json_output:
            sys.stdout.write(output.explanation_json(explanation) + "\n")
        else:
            output.render_explanation(explanation, _console())


@app.command(context_settings={"allow_interspersed_args": False})
def run(
    command: Annotated[list[str], typer.Argument(help="The command to run, after --.")],
    ledger: LedgerOption = None,
    fail_on: Annotated[str, typer.Option(
        "--fail-on", help="Exit 1 (when the command itself succeeded) if a finding reaches "
        "this severity: error, warning, info or never.")] = "never",
    report_json: Annotated[Path | None, typer.Option(
        "--report-json", help="Also write the report as JSON to this file.")] = None,
) -> None:
    """Run any command with the compiler shim and the in-process adapters active; print the
    report at exit. The exit status is the command's unless --fail-on says otherwise."""
    from cacheaudit import audit, output, runner
    from cacheaudit.config import fail_on_problem

    if problem := fail_on_problem(fail_on, "--fail-on"):
        raise UsageError(problem)
    if report_json is not None:
        _check_writable(report_json)
    outcome = runner.run_recorded(command, ledger=_ledger_location(ledger))
    report = outcome.report
    console = _stderr_console()
    # From here on the command has run: nothing cacheaudit fails at may change its status.
    if report is None:
        typer.echo(f"cacheaudit: warning: the audit failed, the command's exit status stands: "
                   f"{outcome.problem}", err=True)
        raise typer.Exit(outcome.status)
    output.render_run_report(report, console)
    if report_json is not None:
        try:
            report_json.write_text(output.run_report_json(report, command, outcome.status)
                                   + "\n", encoding="utf-8")
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

    with open_ledger(_ledger_location(ledger)) as opened:
        result = merge(opened, [str(s) for s in sources], keep=keep)
        total = opened.count("records")
    for problem in result.skipped:
        typer.echo(f"cacheaudit: skipped {problem}", err=True)
    typer.echo(f"combined {len(result.combined)} ledger(s), {result.records} new record(s); "
               f"{opened.path} holds {total}")
    if result.skipped and not result.combined:
        raise typer.Exit(ExitCode.USAGE)


def _stderr_console() -> Console:
    from rich.console import Console

    return Console(stderr=True)


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
    import json

    from cacheaudit.snapshot import collect, to_markdown

    if out is not None:
        _check_writable(out)
    taken = collect(os.environ, ledger=_ledger_location(ledger), timeout=timeout,
                    anonymize=anonymize)
    text = json.dumps(taken, indent=2) + "\n" if json_output else to_markdown(taken)
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
    import json

    from cacheaudit import output
    from cacheaudit.snapshot import diff, load_snapshot

    groups = diff(load_snapshot(str(before)), load_snapshot(str(after)))
    if json_output:
        sys.stdout.write(json.dumps(groups, indent=2) + "\n")
    else:
        output.render_snapshot_diff(groups, _console())


@app.command()
def demo(
    keep: Annotated[bool, typer.Option(help="Keep the temporary directory.")] = False,
    compiler: Annotated[str, typer.Option(
        help="auto (nvcc when on PATH, else g++), nvcc or g++.")] = "auto",
    json_output: JsonOption = False,
) -> None:
    """Make a JIT cache go stale and catch it: a reference runtime with DeepJIT's cache
    semantics, an edited untracked header, an injected flag, and the findings."""
    import json
    import shutil

    from cacheaudit import output
    from cacheaudit.demo import render, result_json, run_demo

    if compiler not in ("auto", "nvcc", "g++"):
        raise UsageError(f"--compiler must be auto, nvcc or g++, not {compiler!r}")
    console = _console()
    say = (lambda _line: None) if json_output else console.print
    result = run_demo(say=say, compiler=compiler)
    try:
        if json_output:
            sys.stdout.write(json.dumps(result_json(result), indent=2) + "\n")
            return
        render(result, console)
    finally:
        if keep:
            console.print(output.escape_markup(
                f"kept {result.workdir}: try `cacheaudit explain {result.workdir}/cache/cache/"
                f"<entry> --ledger {result.workdir}/ledger.db`"))
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
            return _main(argv)
        except _Terminated as exc:
            sys.stderr.write(f"cacheaudit: terminated by signal {exc.signum}\n")
            return 128 + exc.signum


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
