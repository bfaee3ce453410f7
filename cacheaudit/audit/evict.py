"""`cacheaudit evict`: remove exactly the entries a scan found stale, safely beside readers.

Which entries: those of the scanned roots with at least one finding that passes `--select` and
`--ignore`, reaches the severity threshold (error by default) and, where given, belongs to one
of the runtimes named; given entry paths narrow it to those entries. Nothing outside a
recognised cache root is touched: a target that lies in no root, a root's parent, and an entry
(or a part the layout names) whose real path leads out of its root are refused.

How: each runtime's layout names the paths that make up an entry (`Layout.evict_paths`, the one
whose removal makes the runtime miss first) and says when an entry is busy
(`Layout.eviction_blocker`). A directory is renamed to a sibling `.cacheaudit-evicted-<uuid>`
(same directory, so the same filesystem: the rename is atomic, and a lookup finds the whole
entry or nothing), then removed; a file is unlinked. A process that already opened the entry's
files (a loaded cubin, a mapped library) keeps them, as unlink semantics give it. An entry whose
binary changed between the scan and the removal (a runtime rebuilt it meanwhile) is left alone.

Every removal, and every failed one, is logged in the ledger (`evictions`, docs/ledger.md) with
the findings that chose it (`findings`, under the pass's audit id).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from cacheaudit.audit.options import AuditOptions
from cacheaudit.audit.scan import ScanResult, entry_at, scan
from cacheaudit.digest import StateCache
from cacheaudit.exceptions import UsageError
from cacheaudit.ledger import Ledger, RunInfo
from cacheaudit.ledger.evictions import Eviction, add_evictions
from cacheaudit.model import CacheEntry, Finding, Severity
from cacheaudit.runtimes import layout_for
from cacheaudit.runtimes import layouts as all_layouts

TRASH_PREFIX = ".cacheaudit-evicted-"
"""The name an evicted directory has between its rename and its removal; one left behind (the
evicting process was killed) is a leftover that the next `evict` of its root removes."""

EVICTED, WOULD_EVICT, SKIPPED, FAILED = "evicted", "would-evict", "skipped", "failed"


@dataclass(frozen=True)
class EvictOptions:
    audit: AuditOptions = field(default_factory=AuditOptions)
    """`--select`/`--ignore`, and how the scan judges (reconstruction, keys)."""
    severity: Severity = Severity.ERROR
    """The least severe finding that gets an entry evicted."""
    runtimes: frozenset[str] = frozenset()
    """Only entries of these runtimes (all when empty)."""
    dry_run: bool = False


@dataclass(frozen=True)
class Outcome:
    """What happened to one chosen entry: evicted, would-evict (a dry run), skipped, failed."""

    entry: CacheEntry
    findings: tuple[Finding, ...]
    status: str
    paths: tuple[str, ...] = ()
    bytes: int = 0
    reason: str = ""

    @property
    def deciding(self) -> Finding:
        """The finding that chose the entry: the most severe, the scan's first among equals."""
        return max(self.findings, key=lambda f: f.severity.rank)


@dataclass
class EvictResult:
    scan: ScanResult
    outcomes: list[Outcome]
    dry_run: bool
    audit_uuid: str | None = None
    """The pass's id in the ledger (findings and evictions), None for a dry run."""

    def of(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    def summary(self) -> str:
        done = self.of(WOULD_EVICT if self.dry_run else EVICTED)
        verb = "would evict" if self.dry_run else "evicted"
        entries, roots = len(self.scan.entries), len(self.scan.roots)
        text = (f"{verb} {len(done)} of {entries} entr{'y' if entries == 1 else 'ies'} in "
                f"{roots} root{'' if roots == 1 else 's'}, {sum(o.bytes for o in done)} bytes")
        for status in (SKIPPED, FAILED):
            if self.of(status):
                text += f"; {len(self.of(status))} {status}"
        return text


# ------------------------------------------------------------------------------ targets


def _within(path: str, root_real: str) -> bool:
    real = os.path.realpath(path)
    return real == root_real or real.startswith(root_real.rstrip(os.sep) + os.sep)


def resolve_targets(targets: Sequence[str]) -> tuple[list[str], set[str], set[str]]:
    """(roots to scan, the roots given whole, the entry paths given) from the command line's
    targets: each a cache root or a path inside an entry. Anything else is a UsageError naming
    it: evict never removes what no layout recognises."""
    roots: list[str] = []
    whole: set[str] = set()
    entries: set[str] = set()
    cache = StateCache()
    for target in targets:
        absolute = os.path.abspath(os.path.expanduser(target))
        if not os.path.lexists(absolute):
            raise UsageError(f"{target}: no such file or directory")
        if any(layout.is_root(absolute) for layout in all_layouts()):
            roots.append(absolute)
            whole.add(absolute)
            continue
        entry = entry_at(absolute, cache)
        if entry is None:
            if (root := _root_above(absolute)) is not None:
                raise UsageError(f"{target}: inside the cache root {root} but in none of its "
                                 "entries; give the root or an entry")
            raise UsageError(f"{target}: not inside a cache root of any known runtime; evict "
                             "removes entries of recognised cache roots only")
        if not _within(entry.path, os.path.realpath(entry.root)):
            raise UsageError(f"{target}: entry {entry.path} leads out of its cache root "
                             f"{entry.root} (to {os.path.realpath(entry.path)}); not evicted")
        roots.append(entry.root)
        entries.add(entry.path)
    return list(dict.fromkeys(roots)), whole, entries


def _root_above(path: str) -> str | None:
    directory = os.path.dirname(path)
    while True:
        if any(layout.is_root(directory) for layout in all_layouts()):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def chosen(result: ScanResult, options: EvictOptions,
           only: set[str] | None = None) -> list[tuple[CacheEntry, tuple[Finding, ...]]]:
    """The scan's entries that the options pick, each with the findings that pick it, in the
    scan's order."""
    threshold = options.severity.rank
    by_entry: dict[str, list[Finding]] = {}
    for finding in result.findings:
        if finding.entry and finding.severity.rank >= threshold:
            by_entry.setdefault(finding.entry, []).append(finding)
    return [(entry, tuple(by_entry[entry.path])) for entry in result.entries
            if entry.path in by_entry and (only is None or entry.path in only)
            and (not options.runtimes or entry.runtime in options.runtimes)]


# ------------------------------------------------------------------------------ removing


def tree_bytes(path: str) -> int:
    """Bytes the files at `path` hold (a file, or every file below a directory), symlinks
    counted as links, never followed."""
    try:
        st = os.lstat(path)
    except OSError:
        return 0
    if not os.path.isdir(path) or os.path.islink(path):
        return st.st_size
    total = 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def _refusal(entry: CacheEntry, paths: tuple[str, ...]) -> str | None:
    """Why the paths a layout named for `entry` must not be removed: outside its root, the
    root itself, none at all."""
    if not paths:
        return "its layout names nothing to remove"
    root_real = os.path.realpath(entry.root)
    for path in paths:
        parent_real = os.path.realpath(os.path.dirname(path))
        if not _within(parent_real, root_real) or not _within(path, root_real):
            return f"{path} leads out of the cache root {entry.root}"
        if os.path.realpath(path) == root_real or root_real.startswith(
                os.path.realpath(path).rstrip(os.sep) + os.sep):
            return (f"{path} is the cache root itself (or holds it): remove it by hand if you "
                    "mean to")
    return None


def _changed(entry: CacheEntry) -> bool:
    """Whether the binary the scan judged was replaced or rewritten since."""
    binary = entry.binary
    if binary is None or not binary.exists:
        return False
    try:
        st = os.stat(binary.path)
    except OSError:
        return True
    return (st.st_size, st.st_mtime_ns, st.st_ino) != (binary.size, binary.mtime_ns,
                                                       binary.inode)


def remove(paths: tuple[str, ...]) -> tuple[bool, str]:
    """Remove an entry's paths in the layout's order: (whether the entry is gone from the
    cache, what went wrong or ''). A directory goes by one rename to a sibling trash name, then
    is deleted; a file or a symlink is unlinked. A trash directory that cannot be deleted
    leaves the entry gone, and is named."""
    leftover: list[str] = []
    for position, path in enumerate(paths):
        if not os.path.lexists(path):
            if position == 0:
                return False, f"{path} is gone already (removed since the scan)"
            continue
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                trash = os.path.join(os.path.dirname(path), TRASH_PREFIX + uuid.uuid4().hex)
                os.rename(path, trash)
                shutil.rmtree(trash, ignore_errors=True)
                if os.path.lexists(trash):
                    leftover.append(trash)
            else:
                os.unlink(path)
        except OSError as exc:
            return position > 0, f"cannot remove {path}: {exc.strerror or exc}"
    if leftover:
        return True, (f"its trash directory {leftover[0]} could not be deleted completely (the "
                      "next evict here removes it)")
    return True, ""


def sweep_trash(directories: set[str]) -> None:
    """Remove what a killed evict left under a trash name in the directories this pass
    touched: nothing but evict ever writes those names."""
    for directory in directories:
        try:
            names = [n for n in os.listdir(directory) if n.startswith(TRASH_PREFIX)]
        except OSError:
            continue
        for name in names:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def _act(entry: CacheEntry, findings: tuple[Finding, ...], dry_run: bool) -> Outcome:
    try:
        layout = layout_for(entry.layout)
        paths = tuple(layout.evict_paths(entry))
        blocker = layout.eviction_blocker(entry)
    except Exception as exc:  # noqa: BLE001 - a failing hook skips the entry, never the pass
        return Outcome(entry, findings, SKIPPED,
                       reason=f"its layout cannot say what to remove: {exc}")
    if blocker is None:
        blocker = _refusal(entry, paths)
    size = sum(tree_bytes(p) for p in paths)
    if blocker is not None:
        return Outcome(entry, findings, SKIPPED, paths, size, blocker)
    if dry_run:
        return Outcome(entry, findings, WOULD_EVICT, paths, size)
    if _changed(entry):
        return Outcome(entry, findings, SKIPPED, paths, size,
                       "its binary changed since the scan judged it (rebuilt meanwhile)")
    gone, problem = remove(paths)
    return Outcome(entry, findings, EVICTED if gone else FAILED, paths, size, problem)


def evict(targets: Sequence[str], env: Mapping[str, str], *, ledger: Ledger | None,
          options: EvictOptions | None = None,
          progress: Callable[[int, int], None] | None = None) -> EvictResult:
    """Scan the targets' roots (every default root when there are none), choose entries by
    `options`, remove them (or, with `dry_run`, say what would go), and log the pass."""
    options = options or EvictOptions()
    roots, whole, entries = resolve_targets(targets)
    result = scan(roots, env, ledger=ledger, options=options.audit, progress=progress)
    # Entries given narrow the choice to them, beside every entry of a root given whole.
    only = None if not entries else entries | {e.path for e in result.entries
                                               if e.root in whole}
    outcomes = [_act(entry, findings, options.dry_run)
                for entry, findings in chosen(result, options, only)]
    evict_result = EvictResult(scan=result, outcomes=outcomes, dry_run=options.dry_run)
    if options.dry_run:
        return evict_result
    sweep_trash({os.path.dirname(p) for o in outcomes if o.status == EVICTED for p in o.paths})
    if ledger is not None and outcomes:
        evict_result.audit_uuid = _log(ledger, outcomes)
    return evict_result


def _log(ledger: Ledger, outcomes: list[Outcome]) -> str:
    logged = [o for o in outcomes if o.status in (EVICTED, FAILED)]
    audit_uuid = ledger.add_findings([f for o in logged for f in o.findings])
    now = time.time_ns()
    add_evictions(ledger, [Eviction(
        audit_uuid=audit_uuid, evicted_ns=now, runtime=o.entry.runtime, layout=o.entry.layout,
        root=o.entry.root, entry=o.entry.path, kernel=o.entry.kernel, key=o.entry.key,
        bytes=o.bytes, code=o.deciding.code, subject=o.deciding.subject,
        record_uuid=o.deciding.record_id, codes=tuple(sorted({f.code for f in o.findings})),
        outcome=o.status, error=o.reason) for o in logged],
        RunInfo(run_uuid=uuid.uuid4().hex, label="evict"))
    return audit_uuid
