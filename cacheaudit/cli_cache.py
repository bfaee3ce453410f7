"""The commands that keep a cache: `evict` (remove the stale entries) and `stats` (what it holds
and how it is used). cli.py registers them on the app."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated

import typer

from cacheaudit import cli_shared as shared
from cacheaudit.cli_shared import (
    IgnoreOption,
    IncludeDirOption,
    JsonOption,
    LedgerOption,
    ReconstructOption,
    SelectOption,
    VerifyKeysOption,
)
from cacheaudit.exceptions import ExitCode, UsageError

SeverityOption = Annotated[str, typer.Option(
    "--severity", help="Evict entries with a finding of at least this severity: error, "
    "warning or info.")]


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
    settings = shared.read_settings()
    options = EvictOptions(
        audit=shared.audit_options(settings, select, ignore, reconstruct, verify_keys,
                                   include_dir),
        severity=Severity(severity), runtimes=frozenset(runtime or ()), dry_run=dry_run)
    with open_ledger(shared.ledger_location(ledger, settings)) as opened, shared.progress(
            progress and not json_output) as advance:
        result = run_evict(targets or settings.paths, os.environ, ledger=opened,
                           options=options, progress=advance)
    if json_output:
        sys.stdout.write(documents.evict_json(result) + "\n")
    else:
        from cacheaudit.render import emit
        from cacheaudit.render_records import evict_lines

        console = shared.console()
        emit(evict_lines(result, shared.view("full", console, False, False)), console)
    done = WOULD_EVICT if dry_run else EVICTED
    if any(o.status != done for o in result.outcomes):
        raise typer.Exit(ExitCode.FINDINGS)


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

    settings = shared.read_settings()
    options = shared.audit_options(settings, select, ignore, reconstruct, verify_keys,
                                   include_dir)
    with contextlib.ExitStack() as stack:
        opened = open_existing(shared.ledger_location(ledger, settings))
        if opened is not None:
            stack.enter_context(opened)
        advance = stack.enter_context(shared.progress(progress and judge and not json_output))
        result = tally(paths or settings.paths, os.environ, ledger=opened, judge=judge,
                       options=options, progress=advance)
    if json_output:
        sys.stdout.write(documents.stats_json(result) + "\n")
    else:
        from cacheaudit.render import emit
        from cacheaudit.render_records import stats_lines

        console = shared.console()
        emit(stats_lines(result, shared.view("full", console, False, False)), console)
