"""The commands of the ledger's records: `report` (what was recorded), `run` (record a command's
compiles and audit them) and `combine` (merge ledgers). cli.py registers them on the app."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from cacheaudit import cli_checks as checks
from cacheaudit import cli_shared as shared
from cacheaudit.cli_shared import (
    ColorOption,
    JsonOption,
    LedgerOption,
    QuietOption,
    Severity,
    VerboseOption,
)
from cacheaudit.exceptions import ExitCode, UsageError


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

    chosen = shared.chosen_format(output_format, json_output)
    if chosen not in ("full", "concise", "json"):
        raise UsageError(f"report --output-format must be full, concise or json, not {chosen}")
    checks.refuse_conflicts((graph and chosen != "json",
                             "--graph lists inputs in the JSON only: add --json, or leave out "
                             "--graph"))
    location = shared.ledger_location(ledger)
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
    console = shared.console(color)
    shared.emit(records_lines(records, shared.view(chosen, console, False, quiet), total),
                console)


# `cacheaudit run COMMAND --option`: what follows COMMAND is the command's, not run's.
RUN_CONTEXT = {"allow_interspersed_args": False}


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

    chosen = shared.chosen_format(output_format, False)
    if chosen == "json":
        raise UsageError("run prints its report on stderr, beside the command's output: "
                         "write the JSON report to a file with --report-json FILE")
    console = shared.stderr_console(color)
    if report_json is not None:
        checks.check_writable(report_json)
    outcome = runner.run_recorded(command, ledger=shared.ledger_location(ledger, creates=True))
    report = outcome.report
    # From here on the command has run: nothing cacheaudit fails at may change its status.
    if report is None:
        typer.echo(f"cacheaudit: warning: the audit failed, the command's exit status stands: "
                   f"{outcome.problem}", err=True)
        raise typer.Exit(outcome.status)
    from cacheaudit.render import render

    render(report.findings, [f"{report.summary()} in run {report.run_uuid}"],
           shared.view(chosen, console, verbose, quiet), console)
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


def combine(
    sources: Annotated[list[Path], typer.Argument(help="Ledger files to merge.")],
    ledger: LedgerOption = None,
    keep: Annotated[bool, typer.Option(help="Keep the merged files (default: delete them).")]
    = False,
) -> None:
    """Merge ledgers (pytest-xdist workers, ranks, hosts) into one, sharing graphs and states."""
    from cacheaudit.ledger import combine as merge
    from cacheaudit.ledger import open_ledger

    with open_ledger(shared.ledger_location(ledger, creates=True)) as opened:
        result = merge(opened, [str(s) for s in sources], keep=keep)
        total = opened.count("records")
    for problem in result.skipped:
        typer.echo(f"cacheaudit: skipped {problem}", err=True)
    typer.echo(f"combined {len(result.combined)} ledger(s), {result.records} new record(s); "
               f"{opened.path} holds {total}")
    if result.skipped and not result.combined:
        raise typer.Exit(ExitCode.USAGE)
