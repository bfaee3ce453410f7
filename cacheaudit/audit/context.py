"""What a judgement needs, in one typed object: the records loaded for the scanned entries, the
environment now, the file-state cache, the compiler identities already taken, and the memos that
thousands of entries sharing a graph or a compiler make worth keeping.

The scan (`scan.py`) fills the context (it reads the ledger, runs compilers); the checks
(`checks/`) only read it, and ask it questions whose answers come from the disk and the process
table now (a file's state, whether a process still runs), never from a subprocess or a ledger
write. The one lazy read is a session run's compiles (`LoadedRecords.compiles_of_run`), which the
scan provides as a reader so that only a runtime that reads its configuration once pays for it.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from cacheaudit import envvars
from cacheaudit.audit.observations import ObservedEnvironments
from cacheaudit.audit.options import AuditOptions
from cacheaudit.digest import StateCache, changed_files
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, FileState, IncludeGraph
from cacheaudit.policy import Policy
from cacheaudit.processes import alive_since, process_run, run_process_alive

FileChange = tuple[FileState, FileState]
"""(recorded, now) of one file; `now is recorded` when the file is provably unchanged."""

ProcessKey = tuple[str, ...]
"""Which runtime process asked for a compile (see `runtime_process`)."""

FirstCompile = tuple[int, dict[str, str]]
"""(start, environment) of the first compile of a run or a runtime process."""


@dataclass(frozen=True)
class CompilerNow:
    """A compiler's identity now, taken once per scan (thousands of entries share one)."""

    identity: CompilerIdentity | None
    error: str | None = None
    not_run: str = ""
    """Why the compiler (a ledger record's) was identified without running it; "" when its
    `--version` ran."""


class Construction(NamedTuple):
    """The first compile of the runtime process that made a record: when the runtime, which
    reads its configuration once, was constructed, and under which environment."""

    started_ns: int
    env: dict[str, str]
    process: str
    """That process, in words ("process 4242")."""


def _no_compiles(run_uuid: str) -> list[CompileRecord]:
    return []


@dataclass
class LoadedRecords:
    """What the ledger holds about the scanned entries, read by the scan in a few queries."""

    ties: dict[str, str] = field(default_factory=dict)
    """Entry path -> the id of the compile record that built it (`identity.choose`)."""
    records: dict[str, CompileRecord] = field(default_factory=dict)
    """Record id -> the record, for the entries' compiles."""
    lookups: dict[str, list[CompileRecord]] = field(default_factory=dict)
    """Entry path -> the hits in-process observers saw for it, oldest first."""
    first_envs: dict[str, FirstCompile] = field(default_factory=dict)
    """Run id -> its first compile, for the runs of `records`."""
    compiles_of_run: Callable[[str], list[CompileRecord]] = _no_compiles
    """A session run's compiles, oldest first, without graphs (read on first use)."""


@dataclass(frozen=True)
class RegistryView:
    """What the environment registry says of one runtime, asked once per scan."""

    implicit_now: frozenset[str]
    """The variables set now that change the runtime's binaries but not its key."""
    problem: str | None = None
    """Why the registry could not answer for the runtime (it does not know it)."""


@dataclass
class Memos:
    """Answers shared by many entries, each computed once per scan."""

    graph_changes: dict[str, list[FileChange]] = field(default_factory=dict)
    graph_paths: dict[str, frozenset[str]] = field(default_factory=dict)
    untracked: dict[tuple[object, ...], tuple[int, str]] = field(default_factory=dict)
    search: dict[tuple[object, ...], tuple[str, ...]] = field(default_factory=dict)
    system: dict[tuple[object, ...], tuple[str, ...]] = field(default_factory=dict)
    shadows: dict[tuple[str, tuple[str, ...]], list[tuple[str, str]]] = field(
        default_factory=dict)
    process_firsts: dict[tuple[str, str], dict[ProcessKey, FirstCompile]] = field(
        default_factory=dict)
    registry: dict[tuple[str, str | None], RegistryView] = field(default_factory=dict)


@dataclass
class AuditContext:
    """Everything the checks read. One per scan (or per `explain`)."""

    env: Mapping[str, str]
    options: AuditOptions = field(default_factory=AuditOptions)
    cache: StateCache = field(default_factory=StateCache)
    loaded: LoadedRecords = field(default_factory=LoadedRecords)
    compilers: dict[str, CompilerNow] = field(default_factory=dict)
    """Compiler path -> its identity now, taken by the scan before a check asks."""
    memos: Memos = field(default_factory=Memos)
    observed: ObservedEnvironments | None = None
    """Inside a scope (a run, a test): the environments its observers saw the entries under,
    which CA202 judges an entry of the run against instead of `env` (`observations.py`)."""
    env_now: dict[str, str] = field(init=False)
    """The registry's compile-affecting variables in `env`, values redacted."""

    def __post_init__(self) -> None:
        self.env_now = envvars.compile_environment(self.env)

    # ---------------------------------------------------------------- records

    def record_for(self, entry: CacheEntry) -> CompileRecord | None:
        """The compile that built `entry`, as the scan tied it (docs/design.md, "Tying an
        entry to its compile"), or a record reconstructed for it."""
        record_id = self.loaded.ties.get(entry.path)
        return self.loaded.records.get(record_id) if record_id else None

    def lookups_for(self, entry: CacheEntry) -> list[CompileRecord]:
        """Hits an in-process observer saw for this entry, oldest first."""
        return self.loaded.lookups.get(entry.path, [])

    # ---------------------------------------------------------------- the disk now

    def changes(self, graph: IncludeGraph) -> list[FileChange]:
        """The graph's files that differ from their recorded state, verified once per graph."""
        key = graph.digest
        if key not in self.memos.graph_changes:
            self.memos.graph_changes[key] = changed_files((f.state for f in graph.files),
                                                          self.cache)
        return self.memos.graph_changes[key]

    def untracked(self, graph: IncludeGraph, excluded: frozenset[str] | set[str], *,
                  trees: Sequence[str] = (), system: Sequence[str] = ()) -> tuple[int, str]:
        """How many graph files are outside `excluded`, and where they live: the trees users
        edit first (a CUTLASS or CuTe checkout), then the compiler's own (`system`), each with
        its count. A file's tree is the search directory it lies in (`trees`, the -I order)
        with the first directory below it (`<cutlass>/include/cute`), else its directory.
        Thousands of entries share a graph and a tracked set, so the answer is computed once
        for each."""
        members = self.memos.graph_paths.get(graph.digest)
        if members is None:
            members = self.memos.graph_paths[graph.digest] = frozenset(graph.paths)
        excluded = frozenset(excluded) & members
        memo_key = (graph.digest, excluded, tuple(trees), tuple(system))
        if memo_key not in self.memos.untracked:
            counts = Counter(_tree_of(p, trees) for p in graph.paths if p not in excluded)
            ordered = sorted(counts.items(),
                             key=lambda item: (_under_any(item[0], system), -item[1], item[0]))
            shown = ordered[:_TREES_SHOWN]
            top = ", ".join(f"{n} in {d}" for d, n in shown)
            if len(ordered) > len(shown):
                rest = sum(n for _, n in ordered[len(shown):])
                top += f", and {rest} more in {len(ordered) - len(shown)} other directories"
            self.memos.untracked[memo_key] = (sum(counts.values()), top)
        return self.memos.untracked[memo_key]

    # ---------------------------------------------------------------- the environment registry

    def registry(self, runtime: str, variant: str | None = None) -> RegistryView:
        """The registry's answers for `runtime` (in `variant`, for the entries its policy's
        `environment_variant` names) about the environment now; a registry that raises for it
        (a runtime it does not know) gives a view with the reason instead."""
        view = self.memos.registry.get((runtime, variant))
        if view is None:
            try:
                problem = envvars.problem(runtime)
                implicit = frozenset() if problem is not None else frozenset(
                    name for name in self.env_now if not envvars.selects_compiler(name)
                    and envvars.is_implicit_input(name, runtime, variant))
                view = RegistryView(implicit, problem)
            except Exception as exc:  # noqa: BLE001 - the entry is reported unverified (CA501)
                view = RegistryView(frozenset(), f"{type(exc).__name__}: {exc}")
            self.memos.registry[(runtime, variant)] = view
        return view

    # ---------------------------------------------------------------- processes

    def construction(self, record: CompileRecord, policy: Policy) -> Construction | None:
        """The first compile of the runtime process that made `record`; None when nothing says
        which process made it.

        A bare shim's run is one process. A session's run (`cacheaudit run`, pytest) is shared
        by every process below it; there the runtime's pid comes from the policy (DeepJIT and
        DeepGEMM, for example, name their build directories after it)."""
        run_uuid = record.run_uuid or ""
        bare = process_run(run_uuid)
        if bare is not None:
            first = self.loaded.first_envs.get(run_uuid)
            return None if first is None else Construction(*first, f"process {bare[1]}")
        process = runtime_process(record, policy)
        if process is None:
            return None
        first = self._firsts_by_process(run_uuid, policy).get(process)
        return None if first is None else Construction(*first, f"process {process[1]}")

    def _firsts_by_process(self, run_uuid: str, policy: Policy
                           ) -> dict[ProcessKey, FirstCompile]:
        """`runtime_process` -> (start, environment) of that process's first compile in a
        session's run, worked out once per run and runtime."""
        memo_key = (run_uuid, policy.runtime)
        if memo_key not in self.memos.process_firsts:
            firsts: dict[ProcessKey, FirstCompile] = {}
            for earlier in self.loaded.compiles_of_run(run_uuid):
                process = runtime_process(earlier, policy)
                if process is not None:
                    firsts.setdefault(process, (earlier.started_ns, dict(earlier.env)))
            self.memos.process_firsts[memo_key] = firsts
        return self.memos.process_firsts[memo_key]


def runtime_process(record: CompileRecord, policy: Policy) -> ProcessKey | None:
    """Which runtime process asked for a compile of a session's run: the pid the runtime named
    its build directory after (the runtime itself, even behind a wrapper script), else the
    process the shim recorded, the nearest ancestor that is not a shell; None when neither is
    known. The two kinds of key never equal each other."""
    pid = policy.compiling_process(record)
    if pid is not None:
        return (record.host, str(pid))
    recorded = process_run(record.runtime_process)
    return None if recorded is None else (recorded[0], str(recorded[1]), recorded[2])


def live_process(record: CompileRecord, policy: Policy) -> tuple[int, str] | None:
    """(pid, how it was found) of the runtime process that asked for this compile, when it
    still runs; None when it is gone or the record does not say which it was."""
    pid = run_process_alive(record.run_uuid)
    if pid is not None:
        return pid, f"the compiling process {pid}, whose pid and start time are the run id, " \
                    f"still runs"
    pid = policy.compiling_process(record)
    if pid is not None:
        if alive_since(record.host, pid, record.started_ns):
            return pid, (f"process {pid}, which named the build directory after itself, "
                         f"still runs and started before the compile")
        return None
    pid = run_process_alive(record.runtime_process)
    if pid is not None:
        return pid, (f"the runtime process {pid} the shim recorded (its pid and start time) "
                     f"still runs")
    return None


_TREES_SHOWN = 4


def _under_any(path: str, directories: Sequence[str]) -> bool:
    return any(path == d or path.startswith(d.rstrip("/") + "/") for d in directories)


def _tree_of(path: str, trees: Sequence[str]) -> str:
    """The tree a header belongs to: the first search directory holding it, with the directory
    just below it when there is one; else the header's own directory."""
    for tree in trees:
        base = tree.rstrip("/")
        if path.startswith(base + "/"):
            below = path[len(base) + 1:].split("/", 1)
            return f"{base}/{below[0]}" if len(below) == 2 else base
    return os.path.dirname(path)
