"""The cache entries' opens while a scope runs: which entries exist when it starts (every
layout over the known cache roots), their directories watched through `cacheaudit.opens`, and
what was seen, by entry.

Apart from the audit (`cacheaudit.audit.scope` judges what this saw) so that a process that
only observes imports no judge: the start-up hook starts an observer in every session it
prepares, and most of those sessions compile nothing (measured: importing the audit package
costs ~120 ms, this module and the layouts ~30 ms and ~60 ms).
"""

from __future__ import annotations

import os

from cacheaudit.opens import Ignoring, ObservedOpens, OpenObserver
from cacheaudit.plain import MappingProxyType
from cacheaudit.runtimes import layouts, layouts_declaring

# Not `typing` (it imports `re` and `enum`, ~20 ms of a session's first process), nor
# `contextlib`, `collections.abc` or `types` (~2 ms together).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import NamedTuple, Protocol

    from cacheaudit.layout import Layout
    from cacheaudit.ledger import Ledger
    from cacheaudit.ledger.sessions import SessionWrites
    from cacheaudit.model import CacheEntry

    class Window(Protocol):
        """A scope's time window (`cacheaudit.audit.Scope`)."""

        def within(self, ns: int | None) -> bool: ...
else:
    from cacheaudit.plain import NamedTuple


_NONE: Mapping[str, str] = MappingProxyType({})


# Named tuples, not dataclasses: `dataclasses` imports `inspect`, and a session's first process
# starts an observer before anything else of cacheaudit needs them.
class WatchPlan(NamedTuple):
    """The entries known when a scope starts, and the directories that hold them."""

    roots: tuple[str, ...] = ()
    entries: Mapping[str, str] = _NONE
    """Entry path -> the directory watched for it."""
    binaries: Mapping[str, str] = _NONE
    """Binary path -> its entry: an open of one is the runtime loading that kernel."""
    problems: Mapping[str, str] = _NONE
    """Root -> why its entries could not be listed."""

    @property
    def directories(self) -> list[str]:
        return sorted(set(self.entries.values()))


def known_roots(ledger: SessionWrites | None, env: Mapping[str, str],
                roots: Sequence[str] = ()) -> list[str]:
    """The cache roots a scope can know at its start: those given, those earlier scans found
    (kept in the ledger) and every layout's default roots under `env` (the job's environment),
    each an existing directory that some layout takes for a root."""
    return sorted(_roots_and_readers(ledger, env, roots))


def _roots_and_readers(ledger: SessionWrites | None, env: Mapping[str, str],
                       roots: Sequence[str]) -> dict[str, tuple[Layout, ...]]:
    """`known_roots`, each with the layouts that take it for a root: for a root given or kept
    in the ledger, any layout; for a default root, those whose default roots name it (the
    specs' roots modules say which, so that no other reader is loaded: a session's first
    process on a machine with one runtime's cache loads that runtime's reader alone)."""
    anywhere = {os.path.abspath(r) for r in roots}
    if ledger is not None:
        import contextlib

        with contextlib.suppress(Exception):
            anywhere.update(ledger.known_roots())
    found: dict[str, tuple[Layout, ...]] = {}
    for root, declaring in layouts_declaring(env).items():
        if root not in anywhere and (claiming := _claiming(declaring, root)):
            found[root] = claiming
    if any(os.path.isdir(c) for c in anywhere):
        readers = layouts()
        for candidate in anywhere:
            if os.path.isdir(candidate) and (claiming := _claiming(readers, candidate)):
                found[candidate] = claiming
    return found


def _claiming(readers: Sequence[Layout], root: str) -> tuple[Layout, ...]:
    """The readers that take `root` for one of theirs; one that fails to say does not (its
    entries there are then audited as not observed)."""
    claiming = []
    for reader in readers:
        try:
            if reader.is_root(root):
                claiming.append(reader)
        except Exception:  # noqa: BLE001 - a reader that fails to say claims nothing
            continue
    return tuple(claiming)


def plan_watch(ledger: Ledger | None, env: Mapping[str, str],
               roots: Sequence[str] = ()) -> WatchPlan:
    """Every entry of the known roots and the directory of its binary, read by the layouts
    by stat alone (no file is read to know it is there). Never raises: a root that cannot be
    read is in `problems`."""
    entries: dict[str, str] = {}
    binaries: dict[str, str] = {}
    problems: dict[str, str] = {}
    known = _roots_and_readers(ledger, env, roots)
    if not known:  # no root, no entry to read: neither the states nor the model are needed
        return WatchPlan()
    from cacheaudit.digest import StatOnlyCache
    from cacheaudit.model import CacheEntry

    cache = StatOnlyCache()  # the entries' paths are the plan; their contents are the audit's
    for root, readers in sorted(known.items()):
        for layout in readers:
            try:
                for item in layout.read(root, cache):
                    if not isinstance(item, CacheEntry) or item.path in entries:
                        continue
                    binary = item.binary.path if item.binary is not None else None
                    directory = os.path.dirname(binary) if binary else item.path
                    entries[item.path] = directory
                    if binary:
                        binaries[binary] = item.path
            except Exception as exc:  # noqa: BLE001 - the root is audited as unobserved
                problems[root] = f"its entries could not be listed: {type(exc).__name__}: {exc}"
    return WatchPlan(tuple(sorted(known)), entries, binaries, problems)


class Observation(NamedTuple):
    """What a scope's observer saw: the plan it watched and the opens."""

    plan: WatchPlan
    opens: ObservedOpens
    problem: str | None = None
    """Why nothing at all could be observed."""

    def saw_nothing(self) -> bool:
        """No entry opened, and every entry known at the start watched: a run that recorded
        nothing besides was served nothing from a disk cache known at its start. Where some
        were not watched, they may have been served unseen."""
        return (not self.opens.opens and self.problem is None and not self.opens.unwatched
                and not self.plan.problems)

    def unobserved(self, entry: CacheEntry) -> str | None:
        """Why this entry's opens were not seen, or None when they were."""
        if self.problem is not None:
            return self.problem
        directory = self.plan.entries.get(entry.path)
        if directory is None:
            if entry.root in self.plan.problems:
                return f"{entry.root}: {self.plan.problems[entry.root]}"
            if entry.root not in self.plan.roots:
                return (f"its cache root {entry.root} was not known when the run started "
                        "(created or named inside the job)")
            return "the entry appeared during the run, and no recorded compile built it"
        return self.opens.unwatched.get(directory)

    def opened(self, scope: Window) -> dict[str, tuple[int, bool]]:
        """Entry -> (last open inside the scope's window, whether it was the binary)."""
        seen: dict[str, tuple[int, bool]] = {}
        by_directory: dict[str, list[str]] = {}
        for entry, directory in self.plan.entries.items():
            by_directory.setdefault(directory, []).append(entry)
        for path, opened in self.opens.opens.items():
            if not scope.within(opened.last_ns):
                continue
            entry = self.plan.binaries.get(path)
            binary = entry is not None
            if entry is None:
                # Another file of an entry directory (a metadata file the runtime reads first):
                # the entry's, when the directory holds one entry.
                owners = by_directory.get(os.path.dirname(path), [])
                if len(owners) != 1:
                    continue
                entry = owners[0]
            before = seen.get(entry)
            seen[entry] = (max(opened.last_ns, before[0] if before else 0),
                           binary or (before[1] if before else False))
        return seen


WATCH_BUDGET = "CACHEAUDIT_OPEN_WATCHES"
"""How many inotify watches the observer may take (default: half the user's limit); 0 turns
the observer off, and every entry is audited as one the run may have been served."""


def _watch_budget(env: Mapping[str, str]) -> int | None:
    value = env.get(WATCH_BUDGET, "").strip()
    try:
        return max(0, int(value)) if value else None
    except ValueError:
        return None


NOT_OBSERVED = Observation(WatchPlan(), ObservedOpens(),
                           problem="no observer watched the cache entries' opens")


class ScopeObserver:
    """Watches the opens of every entry known at the start, from a thread of this process;
    `stop()` ends it. Fails open: what it could not watch is audited as possibly served."""

    def __init__(self, ledger: Ledger | None, env: Mapping[str, str],
                 roots: Sequence[str] = ()) -> None:
        self.problem: str | None = None
        self.plan = WatchPlan()
        self._watch: OpenObserver | None = None
        self._final: Observation | None = None
        try:
            self.plan = plan_watch(ledger, env, roots)
            self._watch = OpenObserver(self.plan.directories,
                                       budget=_watch_budget(env)).start()
        except Exception as exc:  # noqa: BLE001 - observing never stops the run
            self.problem = f"the observer could not start: {type(exc).__name__}: {exc}"

    @classmethod
    def start(cls, ledger: str, env: Mapping[str, str],
              roots: Sequence[str] = ()) -> ScopeObserver:
        """An observer of the entries known to the ledger at `ledger` (read, never created) and
        to `env`; never raises. The ledger's roots are read alone (`known_roots_at`): neither
        its readers nor the record model are imported for them."""
        if ledger and os.path.isfile(os.path.abspath(ledger)):
            from cacheaudit.ledger.opening import known_roots_at

            roots = (*roots, *known_roots_at(os.path.abspath(ledger)))
        return cls(None, env, roots)

    def observation(self) -> Observation:
        """What was seen so far (or in all, once stopped)."""
        if self._final is not None:
            return self._final
        opens = self._watch.observed() if self._watch is not None else ObservedOpens()
        return Observation(self.plan, opens, self.problem)

    def ignoring(self) -> Ignoring:
        """cacheaudit's own reads of the entries inside the block are not hits."""
        if self._watch is None or self._final is not None:
            return Ignoring(None)
        return self._watch.ignoring()

    def stop(self) -> Observation:
        if self._final is None:
            opens = self._watch.stop() if self._watch is not None else ObservedOpens()
            self._final = Observation(self.plan, opens, self.problem)
        return self._final
