"""Checks of an entry as a whole: corrupt or partial entries and leftovers (CA402), inputs
modified while the compiler ran (CA401), and the reasons an entry stays unverified (CA501)."""

from __future__ import annotations

import os
import traceback

from cacheaudit.evidence import TimeEvidence
from cacheaudit.findings import make_finding
from cacheaudit.model import CacheEntry, CacheLeftover, CompileRecord, Finding
from cacheaudit.policy import TrackedSet


def leftover_finding(leftover: CacheLeftover) -> Finding:
    """CA402 for something in a cache root that is not an entry (a crashed writer's tmp/)."""
    return make_finding("CA402", subject=leftover.path, message=leftover.reason,
                        current=TimeEvidence("last changed", leftover.mtime_ns),
                        how=f"{leftover.layout} layout of {leftover.root}")


def problem_findings(entry: CacheEntry) -> list[Finding]:
    """CA402 for each reason the reader found the entry corrupt or partial."""
    return [make_finding("CA402", subject=entry.path, message=problem, entry=entry,
                         how=f"{entry.layout} layout") for problem in entry.problems]


def modified_during_compile(record: CompileRecord,
                            entry: CacheEntry | None = None) -> list[Finding]:
    """CA401 for each input the shim saw change while the compiler ran."""
    return [make_finding(
        "CA401", subject=path, entry=entry, record=record,
        message="this input was modified while the compiler ran: the binary may hold a version "
                "other than the one recorded",
        recorded=TimeEvidence("compile started", record.started_ns),
        current="mtime or ctime after the start",
        how="timestamps at the end of the compile (ccache's too-new rule)")
        for path in record.modified_during_compile]


# ------------------------------------------------------------------------------ unverified


def no_policy_finding(entry: CacheEntry, reason: str) -> Finding:
    """CA501: no runtime policy says what the entry's key covers, so nothing can be judged."""
    return make_finding(
        "CA501", subject=entry.path, entry=entry,
        message=f"cacheaudit cannot judge entries of runtime {entry.runtime!r} ({reason}): "
                f"what its key covers is unknown, so this entry's inputs, environment and "
                f"compiler were not verified; the scan went on",
        how=f"{entry.layout} layout; the runtime registry (cacheaudit.runtimes) has no policy "
            f"for it")


def registry_finding(entry: CacheEntry, problem: str) -> Finding:
    """CA501: the environment registry cannot say which variables the runtime's key misses."""
    return make_finding(
        "CA501", subject=entry.path, entry=entry,
        message=f"the environment registry cannot judge runtime {entry.runtime!r} ({problem}): "
                f"which variables change its binaries but not its key is unknown, so this "
                f"entry's environment was not verified (CA201, CA202); the scan went on",
        how="the environment registry (cacheaudit.envvars)")


NOT_RECONSTRUCTABLE = ("record the next build instead (cacheaudit run, pytest --cacheaudit), or "
                       "evict the entry so that the runtime rebuilds it under recording")


def no_record_finding(entry: CacheEntry, why: str | None = None) -> Finding:
    """CA501 for an entry no recorded compile built, saying why its inputs cannot be
    reconstructed (`why`, from the runtime's policy) and what the user can do."""
    reason = why or "the runtime's entries hold no compile command to rebuild them from"
    return make_finding(
        "CA501", subject=entry.path, entry=entry,
        message=f"no recorded compile for this entry, and its inputs cannot be reconstructed: "
                f"{reason}; nothing about its dependencies can be verified",
        how="ledger lookup: no compile recorded for this entry's path, or of its source for "
            "this cache root and confirmed by its binary (docs/design.md, \"Tying an entry to "
            "its compile\"); then the runtime's policy, for a command to rebuild it from",
        hint=NOT_RECONSTRUCTABLE)


def tracked_set_findings(entry: CacheEntry, record: CompileRecord,
                         tracked: TrackedSet) -> list[Finding]:
    """CA501 when the policy could not compute what the key covers."""
    if not tracked.error:
        return []
    return [make_finding(
        "CA501", subject=entry.path, entry=entry, record=record,
        message=f"the runtime's tracked set cannot be computed: {tracked.error}",
        how=tracked.how)]


def internal_error_finding(entry: CacheEntry, exc: BaseException) -> Finding:
    """CA501 for an error while judging one entry, naming it and where it was raised."""
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return make_finding(
        "CA501", subject=entry.path, entry=entry,
        message=f"cacheaudit could not judge this entry ({type(exc).__name__}: {exc}): "
                f"its inputs were not verified; the scan went on",
        how=f"internal error at {os.path.basename(where.filename)}:{where.lineno} "
            f"({where.name}); please report it with this entry's files")
