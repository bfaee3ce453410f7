"""What `diff` reads from ledgers: the runs a ledger holds, and the records of one run (or of
the whole ledger) in the order they were used (`diff --by-host` reads through `diff_fleet`).

Read-only; built on the ledger's public reads (`Ledger.records`, `Ledger.runs`), so that the
ledger package itself needs nothing new.
"""

from __future__ import annotations

from cacheaudit.exceptions import UsageError
from cacheaudit.ledger import Ledger
from cacheaudit.ledger.values import RunInfo
from cacheaudit.model import CompileRecord

ORDER_OF_USE = "r.started_ns, r.id"


def find_run(ledger: Ledger, wanted: str) -> RunInfo:
    """The run whose id is `wanted`, or the one run whose id starts with it (as git takes a
    commit's prefix); a usage error naming the ledger when none or several match."""
    runs = ledger.runs()
    if wanted in runs:
        return runs[wanted]
    matches = sorted(uuid for uuid in runs if uuid.startswith(wanted))
    if len(matches) == 1:
        return runs[matches[0]]
    if matches:
        shown = ", ".join(matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise UsageError(f"run id {wanted!r} is ambiguous in {ledger.path}: {shown}")
    raise UsageError(f"no run {wanted!r} in {ledger.path} ({len(runs)} run(s) there; "
                     "`cacheaudit report --json` names each record's run_uuid)")


def side_records(ledger: Ledger, run_uuid: str | None = None) -> list[CompileRecord]:
    """The records of one run, or of the whole ledger, in the order they were used."""
    if run_uuid is None:
        return ledger.records(order=ORDER_OF_USE)
    return ledger.records(where="runs.run_uuid = ?", params=(run_uuid,), order=ORDER_OF_USE)
