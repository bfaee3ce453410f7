"""`cacheaudit stats`: per runtime and cache root, what the cache holds and how it served.

Entries and bytes come from the disk (each layout's reader, and the files its `evict_paths`
names for an entry); compiles, disk and memory hits from the ledger's records of those entries,
counted by the same rule as the audit of a run (`scope.count`: a compile through the shim inside
an in-process observer's compile is one build, a link step is none), plus one disk hit for each
entry whose runtime's hit marker was touched after its build and which no disk-hit record
covers; stale and unverifiable entries from a scan (`judge=False` leaves them unknown);
evictions from the ledger's `evictions` table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from cacheaudit.audit.evict import tree_bytes
from cacheaudit.audit.options import AuditOptions
from cacheaudit.audit.scan import discover, scan
from cacheaudit.audit.scope import count, marked_after_build
from cacheaudit.digest import StateCache
from cacheaudit.ledger import Ledger
from cacheaudit.ledger.evictions import evictions
from cacheaudit.model import CacheEntry, CompileRecord, Finding, Severity
from cacheaudit.runtimes import layout_for

UNVERIFIABLE = "CA501"


@dataclass
class Tally:
    """One runtime in one root (a root may hold two runtimes' entries)."""

    runtime: str
    root: str
    entries: int = 0
    bytes: int = 0
    compiles: int = 0
    disk_hits: int = 0
    disk_hits_unrecorded: int = 0
    """Of `disk_hits`, those seen only by the runtime's hit marker."""
    memory_hits: int = 0
    stale: int | None = None
    """Entries with an error-level finding (what `evict` removes by default); None unjudged."""
    unverifiable: int | None = None
    """Entries with a CA501 finding; None unjudged."""
    evicted: int = 0
    """Entries `evict` removed from this root, as the ledger logged them."""
    oldest_ns: int | None = None
    newest_ns: int | None = None
    """Build times (the binary's mtime) of the oldest and the newest entry."""

    @property
    def hit_rate(self) -> float | None:
        """Hits over lookups (hits and compiles), as ccache counts it; None without lookups."""
        hits = self.disk_hits + self.memory_hits
        lookups = hits + self.compiles
        return hits / lookups if lookups else None


@dataclass
class Stats:
    tallies: list[Tally]
    judged: bool
    roots: list[tuple[str, str]] = field(default_factory=list)
    ledger: str | None = None

    def total(self) -> Tally:
        """Every tally added up (runtime and root "*")."""
        total = Tally(runtime="*", root="*")
        for tally in self.tallies:
            for name in ("entries", "bytes", "compiles", "disk_hits", "disk_hits_unrecorded",
                         "memory_hits", "evicted"):
                setattr(total, name, getattr(total, name) + getattr(tally, name))
            if self.judged:
                total.stale = (total.stale or 0) + (tally.stale or 0)
                total.unverifiable = (total.unverifiable or 0) + (tally.unverifiable or 0)
            total.oldest_ns = _least(total.oldest_ns, tally.oldest_ns)
            total.newest_ns = _most(total.newest_ns, tally.newest_ns)
        return total


def _least(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _most(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _entries(paths: Sequence[str], env: Mapping[str, str]
             ) -> tuple[list[tuple[str, str]], list[CacheEntry]]:
    """The roots and their entries, read without judging."""
    cache = StateCache()
    roots = discover(paths, env)
    entries: dict[str, CacheEntry] = {}
    for layout, root in roots:
        for item in layout.read(root, cache):
            if isinstance(item, CacheEntry):
                entries.setdefault(item.path, item)
    return [(layout.layout, root) for layout, root in roots], list(entries.values())


def _chunks(items: list[str], size: int = 500) -> Iterator[list[str]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def _records_by_entry(ledger: Ledger, paths: list[str]) -> dict[str, list[CompileRecord]]:
    found: dict[str, list[CompileRecord]] = {}
    for part in _chunks(paths):
        for record in ledger.records(where=f"e.path IN ({', '.join('?' * len(part))})",
                                     params=part, order="r.started_ns, r.id"):
            if record.entry:
                found.setdefault(record.entry, []).append(record)
    return found


def _entry_bytes(entry: CacheEntry) -> int:
    try:
        paths = tuple(layout_for(entry.layout).evict_paths(entry))
    except Exception:  # noqa: BLE001 - a failing hook: the entry's own path
        paths = (entry.path,)
    return sum(tree_bytes(p) for p in paths)


def stats(paths: Sequence[str], env: Mapping[str, str], *, ledger: Ledger | None,
          judge: bool = True, options: AuditOptions | None = None,
          progress: Callable[[int, int], None] | None = None) -> Stats:
    """The tallies of the roots `paths` name (every existing default root when empty)."""
    findings: list[Finding] = []
    if judge:
        result = scan(paths, env, ledger=ledger, options=options, progress=progress)
        roots, entries, findings = result.roots, result.entries, result.findings
    else:
        roots, entries = _entries(paths, env)
    records = _records_by_entry(ledger, [e.path for e in entries]) if ledger else {}
    removed = evictions(ledger) if ledger else []
    stale = {f.entry for f in findings if f.entry and f.severity is Severity.ERROR}
    unverifiable = {f.entry for f in findings if f.entry and f.code == UNVERIFIABLE}
    groups: dict[tuple[str, str], list[CacheEntry]] = {}
    for entry in entries:
        groups.setdefault((entry.runtime, entry.root), []).append(entry)
    for layout, root in roots:
        # A root with no entries still gets a row: an empty cache is a fact worth showing.
        runtime = layout_for(layout).runtime
        if not any(r == root for _, r in groups):
            groups.setdefault((runtime, root), [])
    tallies = []
    for (runtime, root), members in sorted(groups.items()):
        group_records = [r for e in members for r in records.get(e.path, [])]
        marked = {e.path for e in members if marked_after_build(e)}
        counted = count(group_records, set(), marked, len(members), 0)
        built = [e.built_ns for e in members if e.built_ns is not None]
        tallies.append(Tally(
            runtime=runtime, root=root, entries=len(members),
            bytes=sum(_entry_bytes(e) for e in members), compiles=counted.compiles,
            disk_hits=counted.disk_hits, disk_hits_unrecorded=counted.disk_hits_unrecorded,
            memory_hits=counted.memory_hits,
            stale=sum(1 for e in members if e.path in stale) if judge else None,
            unverifiable=sum(1 for e in members if e.path in unverifiable) if judge else None,
            evicted=sum(1 for v in removed if v.root == root and v.runtime == runtime
                        and v.outcome == "evicted"),
            oldest_ns=min(built, default=None), newest_ns=max(built, default=None)))
    return Stats(tallies=tallies, judged=judge, roots=roots,
                 ledger=ledger.path if ledger else None)
