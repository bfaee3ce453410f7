"""`cacheaudit diff`: two runs or ledgers compared kernel by kernel, the hosts of a combined
ledger (`--by-host`), or two snapshots; what A and B are is decided by what they name (a file
that is an SQLite ledger, a snapshot, else a run id in --ledger). cli.py registers it."""

from __future__ import annotations

import os
import sys
from typing import IO, Annotated

import typer

from cacheaudit import cli_checks as checks
from cacheaudit import cli_shared as shared
from cacheaudit.cli_shared import JsonOption, LedgerOption
from cacheaudit.exceptions import ExitCode, UsageError

DiffFormatOption = Annotated[str | None, typer.Option(
    "--output-format", "--format", metavar="<table|concise|json|markdown>",
    help="table (the default), concise (a line per kernel), json, or markdown for a bug "
    "report; --json is --format json. Snapshots: table or json.")]


def diff(
    targets: Annotated[list[str] | None, typer.Argument(
        metavar="A B", help="Two things to compare: ledger files, run ids in --ledger (or "
        "their prefixes), or snapshots taken with --json. With --by-host: a combined ledger, "
        "or the hosts' own ledgers (files, or directories of them), read in place.",
        show_default=False)] = None,
    by_host: Annotated[bool, typer.Option(
        "--by-host", help="Compare the hosts of a fleet: the kernels whose binary or inputs "
        "differ between hosts for the same key. One combined ledger (`cacheaudit combine`; "
        "else --ledger), or each host's ledger, without combining them first.")] = False,
    output_format: DiffFormatOption = None,
    json_output: JsonOption = False,
    ledger: LedgerOption = None,
) -> None:
    """What differs between two runs or ledgers, kernel by kernel (the first kernel whose
    binary or inputs differ, and why), between the hosts of a fleet (--by-host), or between
    two snapshots (environments). Exit 0 when identical, 1 when runs, ledgers or hosts
    differ."""
    chosen = diff_format(output_format, json_output)
    given = list(targets or [])
    if by_host:
        status = diff_hosts(given, ledger, chosen)
    else:
        if len(given) != 2:
            raise UsageError("diff needs two things to compare: A and B (ledgers, run ids or "
                             "snapshots), or --by-host" + (f"; {len(given)} were given"
                                                           if given else ""))
        status = diff_two(given[0], given[1], ledger, chosen, sys.stdout)
    if status:
        raise typer.Exit(status)


SQLITE_MAGIC = b"SQLite format 3\x00"
LEDGER_SUFFIXES = (".db", ".sqlite", ".sqlite3", ".ledger")


def diff_format(option: str | None, json_output: bool) -> str:
    checks.refuse_conflicts((json_output and option not in (None, "json"),
                             f"--json and --format {option} contradict each other; give one"))
    chosen = "json" if json_output else (option or "table")
    chosen = {"full": "table"}.get(chosen, chosen)
    from cacheaudit.render_diff import DIFF_FORMATS

    if chosen not in DIFF_FORMATS:
        raise UsageError(f"--format must be one of {', '.join(DIFF_FORMATS)} for diff, "
                         f"not {option!r}")
    return chosen


def kind_of(argument: str) -> str:
    """What a diff argument names: "ledger" (an SQLite file, or a file named as a ledger is:
    opening it says what is wrong with it), "snapshot" (another file, or a missing path that
    looks like one), else "run" (a run id, looked up in --ledger). A directory is none of
    them: refused, naming it."""
    if os.path.isdir(argument):
        raise UsageError(f"{argument}: a directory, not a ledger file, a snapshot or a run id; "
                         "give a ledger file in it, or compare the ledgers in it with --by-host")
    if os.path.exists(argument):
        try:
            with open(argument, "rb") as handle:
                head = handle.read(len(SQLITE_MAGIC))
        except OSError:
            return "snapshot"
        return "ledger" if head == SQLITE_MAGIC or argument.endswith(LEDGER_SUFFIXES) \
            else "snapshot"
    if argument.endswith(LEDGER_SUFFIXES):
        raise UsageError(f"{argument}: no such ledger file")
    if os.sep in argument or argument.endswith(".json"):
        return "snapshot"
    return "run"


def _open(path: str):  # type: ignore[no-untyped-def]
    from cacheaudit.ledger import open_ledger

    return open_ledger(os.path.abspath(path), create=False)


def diff_two(a: str, b: str, ledger: os.PathLike[str] | None, chosen: str,
             out: IO[str]) -> int:
    kinds = (kind_of(a), kind_of(b))
    if "snapshot" in kinds:
        if kinds != ("snapshot", "snapshot"):
            which = a if kinds[0] != "snapshot" else b
            raise UsageError(f"diff compares a snapshot with a snapshot, not with {which} "
                             f"(a {'ledger' if 'ledger' in kinds else 'run id'})")
        return _snapshots(a, b, chosen, out)
    from cacheaudit.audit.diff import compare
    from cacheaudit.audit.diff_queries import find_run, side_records

    location = shared.ledger_location(ledger) if "run" in kinds else None
    sides = []
    for argument, kind in zip((a, b), kinds, strict=False):
        if kind == "ledger":
            with _open(argument) as opened:
                sides.append((side_records(opened), f"ledger {opened.path}"))
        else:
            assert location is not None
            if not os.path.exists(location):
                raise UsageError(f"{argument}: no such file, and no ledger at {location} to "
                                 "find it in as a run id (give --ledger)")
            with _open(location) as opened:
                run = find_run(opened, argument)
                sides.append((side_records(opened, run.run_uuid),
                              f"run {run.run_uuid} in {opened.path}"))
    (records_a, label_a), (records_b, label_b) = sides
    found = compare(records_a, records_b, label_a=label_a, label_b=label_b)
    from cacheaudit import render_diff
    from cacheaudit.documents import run_diff_json

    text = {"json": lambda: run_diff_json(found) + "\n", "table": lambda: render_diff.run_table(
        found), "concise": lambda: render_diff.run_concise(found),
        "markdown": lambda: render_diff.run_markdown(found)}[chosen]()
    out.write(text)
    return ExitCode.CLEAN if found.same else ExitCode.FINDINGS


def diff_hosts(given: list[str], ledger: os.PathLike[str] | None, chosen: str) -> int:
    from cacheaudit import render_diff
    from cacheaudit.audit.diff_hosts import diff_by_host
    from cacheaudit.documents import host_diff_json

    found = diff_by_host(fleet_ledgers(given, ledger))
    if not found.ledgers:
        raise UsageError("no ledger could be read: " + "; ".join(found.skipped))
    text = {"json": lambda: host_diff_json(found) + "\n",
            "table": lambda: render_diff.host_table(found),
            "concise": lambda: render_diff.host_concise(found),
            "markdown": lambda: render_diff.host_markdown(found)}[chosen]()
    sys.stdout.write(text)
    if found.skipped:
        # The hosts of an unreadable ledger went uncompared: never an all-clear.
        for skipped in found.skipped:
            print(f"cacheaudit: not compared: {skipped}", file=sys.stderr)
        return ExitCode.USAGE
    return ExitCode.CLEAN if found.same else ExitCode.FINDINGS


def fleet_ledgers(given: list[str], ledger: os.PathLike[str] | None) -> list[str]:
    """The ledgers `--by-host` reads: each file given, every ledger file in each directory
    given (by name, sorted), else the one at --ledger or the default location."""
    if not given:
        location = shared.ledger_location(ledger)
        if not os.path.exists(location):
            raise UsageError(f"no ledger at {location}: give the hosts' ledgers, or combine "
                             "them first (`cacheaudit combine`)")
        return [location]
    found: list[str] = []
    for argument in given:
        if os.path.isdir(argument):
            inside = sorted(os.path.join(argument, name) for name in os.listdir(argument)
                            if name.endswith(LEDGER_SUFFIXES))
            if not inside:
                raise UsageError(f"{argument}: a directory with no ledger in it (files named "
                                 f"{', '.join('*' + s for s in LEDGER_SUFFIXES)})")
            found += inside
        elif kind_of(argument) != "ledger":
            raise UsageError(f"{argument}: not a ledger; --by-host compares the hosts of "
                             "ledgers (each host's, or one `cacheaudit combine` made)")
        else:
            found.append(argument)
    return found


def _snapshots(a: str, b: str, chosen: str, out: IO[str]) -> int:
    """Two snapshots, as `diff` compared them before runs could be: exit 0 either way."""
    from cacheaudit import documents, output
    from cacheaudit.snapshot import diff as snapshot_diff
    from cacheaudit.snapshot import load_snapshot

    if chosen not in ("table", "json"):
        raise UsageError(f"--format {chosen}: two snapshots are compared as a table or json")
    groups = snapshot_diff(load_snapshot(a), load_snapshot(b))
    if chosen == "json":
        out.write(documents.snapshot_diff_json(groups) + "\n")
    else:
        output.render_snapshot_diff(groups, shared.console())
    return ExitCode.CLEAN
