"""The commands that judge cache entries: `scan`, `verify` (the rebuild oracle) and `explain`.
cli.py registers them on the app."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from cacheaudit import cli_checks as checks
from cacheaudit import cli_shared as shared
from cacheaudit.cli_shared import (
    ColorOption,
    FailOnOption,
    IgnoreOption,
    IncludeDirOption,
    JsonOption,
    LedgerOption,
    OutputFormatOption,
    QuietOption,
    ReconstructOption,
    SelectOption,
    VerboseOption,
    VerifyKeysOption,
    YesOption,
)
from cacheaudit.exceptions import ExitCode, UsageError

if TYPE_CHECKING:
    from cacheaudit import audit
    from cacheaudit.ledger import Ledger


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
    from cacheaudit.audit import roots

    settings = shared.read_settings()
    fail_on = shared.fail_on(fail_on, settings)
    chosen = shared.chosen_format(output_format, json_output)
    options = shared.audit_options(settings, select, ignore, reconstruct, verify_keys,
                                   include_dir)
    from cacheaudit.ledger import open_ledger

    console = shared.console(color)
    location = shared.ledger_location(ledger, settings, creates=True)
    with open_ledger(location) as opened, shared.progress(
            progress and chosen in ("full", "concise")) as advance:
        result = audit.scan(paths or settings.paths, os.environ, ledger=opened, options=options,
                            progress=advance)
        if not allow_empty:
            checks.refuse_nothing_scanned(result, roots.cache_variables(os.environ))
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
                       f"{', '.join(roots.cache_variables(os.environ))})", err=True)
        totals = Totals(len(result.entries), len(result.roots), result.matched,
                        result.reconstructed)
        render(result.findings, [totals.text()], shared.view(chosen, console, verbose, quiet),
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

    settings = shared.read_settings()
    fail_on = shared.fail_on(fail_on, settings)
    checks.check_timeout(timeout)
    entries = entries_of(targets or settings.paths, os.environ, StateCache())
    options = VerifyOptions(sample=sample, seed=seed, jobs=jobs, timeout=timeout,
                            dry_run=dry_run, yes=yes)
    with contextlib.ExitStack() as stack:
        opened = open_existing(shared.ledger_location(ledger, settings))
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

        console = shared.console()
        render(result.findings, [summary], shared.view("full", console, False, False), console)
    if audit.fails(result.findings, fail_on):
        raise typer.Exit(ExitCode.FINDINGS)


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

    chosen = shared.chosen_format(output_format, json_output)
    if chosen not in ("full", "json"):
        raise UsageError(f"explain --output-format must be full or json, not {chosen}")
    checks.refuse_conflicts((not target.strip(), "explain needs an entry path, a key prefix or "
                                                 "a record id, not an empty string"))

    with contextlib.ExitStack() as stack:
        opened = open_existing(shared.ledger_location(ledger))
        if opened is not None:
            stack.enter_context(opened)
        explanation = build(target, os.environ, opened)
        if chosen == "json":
            sys.stdout.write(documents.explanation_json(explanation) + "\n")
        else:
            console = shared.console(color)
            shared.emit(explanation_lines(explanation,
                                          shared.view(chosen, console, verbose, False)), console)
