"""The judge: cache entries and compile records, checked against the disk and environment now.

Each entry a reader found is tied to the compile that built it (by the binary's bytes), the
runtime's policy says which inputs its key covers, and every difference between what the compile
read then and what is on disk now becomes a finding with its evidence: the file or variable, the
recorded and the current value, and how that was established. Entries built before recording
started are reconstructed by running the compiler's dependency pass with the entry's own recorded
command; what that yields is marked as inferred from timestamps, not proven by content.

Reads the ledger and the disk; writes nothing but reconstructed records and attributions back to
the ledger (so that the next scan need not repeat the work).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import tempfile
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cacheaudit import compilers, envvars
from cacheaudit.digest import StateCache, changed_files, normalise_path
from cacheaudit.findings import make_finding, ns_text, state_text
from cacheaudit.layout import Layout as Reader
from cacheaudit.ledger import Attribution, Ledger, RunInfo, new_record_id
from cacheaudit.model import (
    CacheEntry,
    CacheLeftover,
    CompileRecord,
    CompilerIdentity,
    FileState,
    Finding,
    IncludeGraph,
    Severity,
)
from cacheaudit.policy import EnvFamilies, Policy, TrackedSet
from cacheaudit.processes import alive_since, process_run, run_process_alive
from cacheaudit.runtimes import layouts as all_readers
from cacheaudit.runtimes import policy_for
from cacheaudit.switches import is_masquerade_dir


@dataclass(frozen=True)
class AuditOptions:
    select: frozenset[str] = frozenset()
    ignore: frozenset[str] = frozenset()
    reconstruct: bool = True
    verify_keys: bool = False


@dataclass
class ScanResult:
    roots: list[tuple[str, str]]
    entries: list[CacheEntry]
    leftovers: list[CacheLeftover]
    findings: list[Finding]
    matched: int = 0
    reconstructed: int = 0
    ledger: str | None = None


def fails(findings: Iterable[Finding], fail_on: str) -> bool:
    """Whether any finding reaches the `--fail-on` threshold (error, warning, info or never)."""
    if fail_on == "never":
        return False
    threshold = Severity(fail_on).rank
    return any(f.severity.rank >= threshold for f in findings)


def keep(findings: Iterable[Finding], options: AuditOptions) -> list[Finding]:
    """`--select`/`--ignore` by code or code prefix (`CA1` selects CA101-CA106)."""
    def wanted(code: str) -> bool:
        if options.select and not any(code.startswith(s) for s in options.select):
            return False
        return not any(code.startswith(i) for i in options.ignore)

    return [f for f in findings if wanted(f.code)]


# ------------------------------------------------------------------------------ search paths


def search_directories(record: CompileRecord) -> list[str]:
    """Where the compiler looked for `<...>` headers, in order: -I, CPATH, -isystem,
    C/CPLUS_INCLUDE_PATH, -idirafter (gcc's rules, which nvcc's preprocessor follows)."""
    kind = record.compiler.kind if record.compiler else "gcc"
    command = compilers.parse_command(kind, [t.text for t in record.effective_argv])
    by_option: dict[str, list[str]] = {}
    for option, directory in command.include_dirs:
        by_option.setdefault(option, []).append(normalise_path(directory, record.cwd or "/"))

    def env_dirs(name: str) -> list[str]:
        return [normalise_path(d, record.cwd or "/") for d in record.env.get(name, "").split(":")
                if d]

    ordered = (by_option.get("-I", []) + by_option.get("--include-path", [])
               + env_dirs("CPATH") + by_option.get("-isystem", [])
               + by_option.get("--system-include", []) + env_dirs("CPLUS_INCLUDE_PATH")
               + env_dirs("C_INCLUDE_PATH") + by_option.get("-idirafter", []))
    seen: set[str] = set()
    return [d for d in ordered if not (d in seen or seen.add(d))]  # type: ignore[func-returns-value]


def _runtime_process(record: CompileRecord, policy: Policy) -> tuple[str, ...] | None:
    """Which runtime process asked for a compile of a session's run: the pid the runtime named
    its build directory after (the runtime itself, even behind a wrapper script), else the
    process the shim recorded, the nearest ancestor that is not a shell; None when neither is
    known. The two kinds of key never equal each other."""
    find = getattr(policy, "compiling_process", None)
    pid = find(record) if find is not None else None
    if pid is not None:
        return (record.host, str(pid))
    recorded = process_run(record.runtime_process)
    return None if recorded is None else (recorded[0], str(recorded[1]), recorded[2])


# ------------------------------------------------------------------------------ the auditor


@dataclass
class _Compiled:
    """A compiler's identity now, looked up once per scan."""

    identity: CompilerIdentity | None
    error: str | None = None


@dataclass
class Auditor:
    """Judges entries one at a time; remembers what entries share (graphs, compilers)."""

    env: Mapping[str, str]
    ledger: Ledger | None = None
    options: AuditOptions = field(default_factory=AuditOptions)
    cache: StateCache = field(default_factory=StateCache)
    full_records: bool = False
    """Load each record's own sources and outputs too (explain shows them; a scan needs only
    the shared include graph)."""
    now_ns: int = field(default_factory=time.time_ns)
    attributions: list[Attribution] = field(default_factory=list)
    """Records this auditor tied to their entries, for `save_attributions`."""
    _by_output: dict[str, str] = field(default_factory=dict)
    _records: dict[str, CompileRecord] = field(default_factory=dict)
    _lookups: dict[str, list[CompileRecord]] = field(default_factory=dict)
    _graph_changes: dict[str, list[tuple[FileState, FileState]]] = field(default_factory=dict)
    _shadows: dict[tuple[str, tuple[str, ...]], list[tuple[str, str]]] = field(
        default_factory=dict)
    _compilers: dict[str, _Compiled] = field(default_factory=dict)
    _graph_paths: dict[str, frozenset[str]] = field(default_factory=dict)
    _untracked_memo: dict[tuple[str, frozenset[str]], tuple[int, str]] = field(
        default_factory=dict)
    _search_memo: dict[tuple[object, ...], tuple[str, ...]] = field(default_factory=dict)
    _first_envs: dict[str, tuple[int, dict[str, str]]] = field(default_factory=dict)
    _process_firsts: dict[tuple[str, str], dict[tuple[str, ...], tuple[int, dict[str, str]]]] = (
        field(default_factory=dict))
    _env_now: dict[str, str] = field(default_factory=dict)
    reconstructed: int = 0
    matched: int = 0

    def __post_init__(self) -> None:
        self._env_now = envvars.compile_environment(self.env)

    # ---------------------------------------------------------------- the ledger side

    def load(self, entries: Sequence[CacheEntry]) -> None:
        """Tie entries to their compile records, in a few queries for the whole scan."""
        if self.ledger is None:
            return
        self._by_output = self.ledger.compiles_by_output()
        wanted = sorted({self._by_output[e.binary.digest] for e in entries
                         if e.binary is not None and e.binary.digest in self._by_output})
        self._records = self.ledger.records_by_uuid(wanted, with_files=self.full_records)
        # A few entries (explain) are looked up by path; a whole scan reads every hit at once,
        # which costs less than thousands of paths in IN lists.
        few = len(entries) <= 500
        self._lookups = self.ledger.lookups_by_entry([e.path for e in entries] if few else None)
        self._first_envs = self.ledger.first_compile_environments(
            r.run_uuid for r in self._records.values() if r.run_uuid is not None)
        # Known file states let an unchanged header be verified by one stat.
        remembered: set[str] = set()
        for record in self._records.values():
            if record.graph is not None and record.graph.digest not in remembered:
                remembered.add(record.graph.digest)
                self.cache.remember(f.state for f in record.graph.files)

    def save_attributions(self) -> None:
        """Write what the audit learnt about its records (their entries) into the ledger. A
        ledger that cannot be written only loses it until the next audit finds it again."""
        if self.ledger is not None:
            with contextlib.suppress(Exception):
                self.ledger.attribute(self.attributions)
        self.attributions.clear()

    def record_for(self, entry: CacheEntry) -> CompileRecord | None:
        if entry.binary is None or entry.binary.digest is None:
            return None
        record_id = self._by_output.get(entry.binary.digest)
        return self._records.get(record_id) if record_id else None

    def lookups_for(self, entry: CacheEntry) -> list[CompileRecord]:
        """Hits an in-process observer saw for this entry, oldest first."""
        return self._lookups.get(entry.path, [])

    # ---------------------------------------------------------------- per entry

    def audit_leftover(self, leftover: CacheLeftover) -> Finding:
        return make_finding("CA402", subject=leftover.path, message=leftover.reason,
                        current=f"last changed {ns_text(leftover.mtime_ns)}",
                        how=f"{leftover.layout} layout of {leftover.root}")

    def audit_entry(self, entry: CacheEntry) -> list[Finding]:
        """Every finding about one entry. Fails open: an error while judging it (a cache holding
        what no runtime wrote, a policy meeting a case it does not know) becomes a CA501 finding
        for this entry, naming the error, and the scan goes on to the next one."""
        findings = [make_finding("CA402", subject=entry.path, message=problem, entry=entry,
                             how=f"{entry.layout} layout") for problem in entry.problems]
        try:
            return self._judge(entry, findings)
        except Exception as exc:  # noqa: BLE001 - reported as a finding, never swallowed
            where = traceback.extract_tb(exc.__traceback__)[-1]
            return [*findings, make_finding(
                "CA501", subject=entry.path, entry=entry,
                message=f"cacheaudit could not judge this entry ({type(exc).__name__}: {exc}): "
                        f"its inputs were not verified; the scan went on",
                how=f"internal error at {os.path.basename(where.filename)}:{where.lineno} "
                    f"({where.name}); please report it with this entry's files")]

    def _judge(self, entry: CacheEntry, findings: list[Finding]) -> list[Finding]:
        findings = list(findings)
        try:
            policy = policy_for(entry.runtime)
        except KeyError:
            return findings
        record = self.record_for(entry)
        if record is None and self.options.reconstruct:
            record = self._reconstruct(entry, policy, findings)
        if record is None:
            findings.append(make_finding(
                "CA501", subject=entry.path, entry=entry,
                message="no recorded compile for this entry and no way to reconstruct its "
                        "inputs: nothing about its dependencies can be verified",
                how="ledger lookup by the binary's content digest"))
            return findings
        self.matched += 1
        if not record.entry:
            self.attributions.append(Attribution(record.record_id, entry.runtime, entry.kernel,
                                                 entry.key, entry.path))
        tracked = policy.tracked(entry, record)
        if tracked.error:
            findings.append(make_finding(
                "CA501", subject=entry.path, entry=entry, record=record,
                message=f"the runtime's tracked set cannot be computed: {tracked.error}",
                how=tracked.how))
        findings += self._inputs(entry, record, policy, tracked)
        findings += self._shadowing(entry, record, policy, tracked)
        if not record.reconstructed:
            # A reconstruction knows the files, not the environment of the original compile.
            findings += self._environment(entry, record)
        findings += self._configuration(entry, record, policy)
        findings += self._compiler(entry, record, policy)
        findings += modified_during_compile(record, entry)
        return findings

    def _inputs(self, entry: CacheEntry, record: CompileRecord, policy: Policy,
                tracked: TrackedSet) -> list[Finding]:
        findings: list[Finding] = []
        graph = record.graph
        if graph is None:
            return findings
        changes = self._changes(graph)
        inferred = record.reconstructed
        if inferred and entry.built_ns:
            changes = changes + [(f.state, f.state) for f in graph.files
                                 if f.state.exists and f.state.mtime_ns > entry.built_ns]
        changed_tracked: list[tuple[FileState, FileState]] = []
        seen: set[str] = set()
        for old, new in changes:
            if old.path in seen:
                continue
            seen.add(old.path)
            if old.path in tracked.paths:
                # A tracked file touched after the build but equal in content is the key's
                # business: recomputing the key tells whether the runtime would see it.
                if new is not old:
                    changed_tracked.append((old, new))
            elif not new.exists:
                findings.append(make_finding(
                    "CA104", subject=old.path, entry=entry, record=record,
                    message="a file the compiler read is gone: the next compile of this kernel "
                            "reads something else, while the cached binary still holds it",
                    recorded=state_text(old), current="absent",
                    how="stat of the recorded path"))
            elif inferred and new is old:
                findings.append(make_finding(
                    "CA101", subject=old.path, entry=entry, record=record, inferred=True,
                    message=f"untracked dependency modified after the binary was written "
                            f"({ns_text(entry.built_ns)}); the key does not cover it",
                    recorded=f"binary written {ns_text(entry.built_ns)}",
                    current=f"mtime {ns_text(old.mtime_ns)}",
                    how="timestamps: the entry predates recording, its dependencies come from "
                        "a dependency pass run now (inferred, not proven by content)"))
            else:
                last_hit = entry.committed_ns if entry.committed_ns and (
                    entry.committed_ns > new.mtime_ns) else None
                served = (f"; the runtime has hit the entry since ({ns_text(last_hit)})"
                          if last_hit else "")
                findings.append(make_finding(
                    "CA101", subject=old.path, entry=entry, record=record,
                    message=f"untracked dependency changed since the build, key unchanged: a "
                            f"hit serves a binary built from the old content{served}",
                    recorded=state_text(old), current=state_text(new),
                    how="content hash (xxh3-128) of the recorded file against the file now"))
        findings += self._tracked_changes(entry, record, policy, changed_tracked)
        count, top = self._untracked(graph, tracked.paths | seen)
        if count:
            findings.append(make_finding(
                "CA102", subject=f"{count} untracked dependenc{'y' if count == 1 else 'ies'}",
                entry=entry, record=record,
                message=f"the compiler read {count} file{'' if count == 1 else 's'} the key does "
                        f"not cover, unchanged so far; an edit to any of them would go unseen "
                        f"(under {top})",
                how=f"include graph ({graph.method}) minus the tracked set ({tracked.how})"))
        return findings

    def _untracked(self, graph: IncludeGraph, excluded: frozenset[str] | set[str]
                   ) -> tuple[int, str]:
        """How many graph files are outside `excluded`, and where most of them live. Thousands
        of entries share a graph and a tracked set, so the answer is computed once for each."""
        members = self._graph_paths.get(graph.digest)
        if members is None:
            members = self._graph_paths[graph.digest] = frozenset(graph.paths)
        excluded = frozenset(excluded) & members
        memo_key = (graph.digest, excluded)
        if memo_key not in self._untracked_memo:
            roots = Counter(os.path.dirname(p) for p in graph.paths if p not in excluded)
            top = ", ".join(f"{d} ({n})" for d, n in roots.most_common(3))
            self._untracked_memo[memo_key] = (sum(roots.values()), top)
        return self._untracked_memo[memo_key]

    def _tracked_changes(self, entry: CacheEntry, record: CompileRecord, policy: Policy,
                         changes: list[tuple[FileState, FileState]]) -> list[Finding]:
        findings: list[Finding] = []
        if not changes and not self.options.verify_keys:
            return findings
        check = policy.check_key(entry, record, env=self.env)
        matches = check.matches(entry.key)
        if not changes:
            if matches is False:
                findings.append(make_finding(
                    "CA501", subject=entry.path, entry=entry, record=record,
                    message="the key recomputed from unchanged inputs differs from the entry's: "
                            "this runtime version keys differently from the policy, so claims "
                            "about its tracked set are unverified",
                    recorded=entry.key, current=check.recomputed, how="key recomputation"))
            return findings
        proven = self._memory_hits_after(entry, changes)
        live = (self._live_process(record, policy)
                if getattr(policy, "caches_header_digests", True) else None)
        for old, new in changes:
            if old.path in proven:
                findings.append(proven[old.path])
            elif matches is True:
                findings.append(make_finding(
                    "CA103", subject=old.path, entry=entry, record=record,
                    message="a tracked input changed but the key recomputed from it did not: the "
                            "runtime would serve the old binary",
                    recorded=state_text(old), current=state_text(new),
                    how=f"key recomputation ({entry.key}) with the file as it is now"))
            elif live is not None:
                pid, process_how = live
                findings.append(make_finding(
                    "CA106", subject=old.path, entry=entry, record=record,
                    message=f"a tracked header changed after the runtime in process {pid} "
                            f"hashed it; that process caches header digests for its lifetime and "
                            f"keeps computing the old key",
                    recorded=state_text(old), current=state_text(new),
                    how=f"content hash; {process_how} (inferred from the process table)",
                    inferred=True))
            elif matches is None and check.note:
                findings.append(make_finding(
                    "CA501", subject=old.path, entry=entry, record=record,
                    message=f"a tracked input changed and the key cannot be recomputed to "
                            f"confirm the runtime sees it: {check.note}",
                    recorded=state_text(old), current=state_text(new),
                    how="key recomputation"))
        return findings

    def _live_process(self, record: CompileRecord, policy: Policy) -> tuple[int, str] | None:
        """(pid, how it was found) of the runtime process that asked for this compile, when it
        still runs; None when it is gone or the record does not say which it was."""
        pid = run_process_alive(record.run_uuid)
        if pid is not None:
            return pid, f"the compiling process {pid}, whose pid and start time are the run id, " \
                        f"still runs"
        find = getattr(policy, "compiling_process", None)
        pid = find(record) if find is not None else None
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

    def _memory_hits_after(self, entry: CacheEntry, changes: list[tuple[FileState, FileState]]
                           ) -> dict[str, Finding]:
        """CA106 proven: an in-process observer saw a memory hit after a tracked file changed."""
        proven: dict[str, Finding] = {}
        for hit in self._lookups.get(entry.path, []):
            if hit.event != "memory-hit":
                continue
            for old, new in changes:
                if hit.started_ns > new.mtime_ns and old.path not in proven:
                    proven[old.path] = make_finding(
                        "CA106", subject=old.path, entry=entry, record=hit,
                        message=f"the runtime served this kernel from memory at "
                                f"{ns_text(hit.started_ns)} (pid {hit.pid}), after this tracked "
                                f"header changed: its in-process header digests were stale",
                        recorded=state_text(old), current=state_text(new),
                        how="memory hit observed in the runtime's process after the file's mtime")
        return proven

    def _changes(self, graph: IncludeGraph) -> list[tuple[FileState, FileState]]:
        key = graph.digest
        if key not in self._graph_changes:
            self._graph_changes[key] = changed_files((f.state for f in graph.files), self.cache)
        return self._graph_changes[key]

    def _shadowing(self, entry: CacheEntry, record: CompileRecord, policy: Policy,
                   tracked: TrackedSet) -> list[Finding]:
        if record.graph is None:
            return []
        argv_key = (tuple(t.text for t in record.effective_argv), record.cwd,
                    tuple(record.env.get(n) for n in ("CPATH", "C_INCLUDE_PATH",
                                                      "CPLUS_INCLUDE_PATH")))
        if argv_key not in self._search_memo:
            self._search_memo[argv_key] = tuple(search_directories(record))
        directories = self._search_memo[argv_key]
        memo_key = (record.graph.digest, directories)
        if memo_key not in self._shadows:
            self._shadows[memo_key] = _find_shadows(record.graph, directories, record.started_ns)
        findings: list[Finding] = []
        live: tuple[int, str] | None = None
        looked = not getattr(policy, "caches_header_digests", True)
        for original, shadow in self._shadows[memo_key]:
            if os.path.realpath(shadow) not in tracked.paths:
                findings.append(make_finding(
                    "CA105", subject=original, entry=entry, record=record,
                    message=f"{shadow} now comes earlier in the include search path than the "
                            f"header the compiler used: a new compile reads it, the cached "
                            f"binary does not",
                    recorded=original, current=shadow,
                    how="search path rebuilt from the recorded -I/-isystem/CPATH, checked on "
                        "disk now"))
                continue
            # The runtime's own parser finds the shadow first and hashes it: a new runtime
            # computes another key and misses. Only a runtime that hashed the old header by
            # name and still runs goes on with the old key.
            if not looked:
                live, looked = self._live_process(record, policy), True
            if live is not None:
                pid, process_how = live
                findings.append(make_finding(
                    "CA106", subject=original, entry=entry, record=record, inferred=True,
                    message=f"{shadow} now shadows this tracked header in the runtime's own "
                            f"search order, after the runtime in process {pid} hashed the "
                            f"header by name; that process keeps computing the old key",
                    recorded=original, current=shadow,
                    how=f"the tracked set resolved now ({tracked.how}); {process_how} "
                        f"(inferred from the process table)"))
        return findings

    def _environment(self, entry: CacheEntry, record: CompileRecord) -> list[Finding]:
        findings = []
        nvcc = record.compiler is None or record.compiler.kind == "nvcc"
        for name in sorted(set(record.env) | set(self._env_now)):
            if envvars.selects_compiler(name) or not envvars.is_implicit_input(name, entry.runtime):
                continue
            if name.startswith("NVCC_") and not nvcc:
                continue  # only nvcc reads NVCC_*: a g++ build did not change with them
            then, now = record.env.get(name), self._env_now.get(name)
            if then != now:
                findings.append(make_finding(
                    "CA202", subject=name, entry=entry, record=record,
                    message=f"{name} changes what the compiler does but not {entry.runtime}'s "
                            f"key: a hit serves a binary built under the recorded value",
                    recorded="(unset)" if then is None else then,
                    current="(unset)" if now is None else now,
                    how="recorded compile environment against this environment"))
        return findings

    def _configuration(self, entry: CacheEntry, record: CompileRecord,
                       policy: Policy) -> list[Finding]:
        """CA204: a setting the runtime reads once, at construction, differs between the first
        compile of the runtime's process and this one; the runtime went on with the first
        value."""
        flavour = getattr(policy, "flavour", None)
        if flavour is None:
            return []  # a runtime without a <PREFIX>_JIT_* family
        construction = self._construction(record, policy)
        if construction is None:
            return []
        started_ns, first_env, process = construction
        if started_ns >= record.started_ns or _jit_part(first_env) == _jit_part(record.env):
            return []  # the common case, thousands of times a scan: nothing to resolve
        # The families the runtime read were settled at construction: judge them by the
        # environment it was constructed in.
        families = self._families(entry, policy, first_env)
        findings: list[Finding] = []
        for prefix in families.prefixes:
            before = {s.suffix: s for s in envvars.resolve_jit_settings(
                prefix, first_env, flavour=flavour)}
            for now in envvars.resolve_jit_settings(prefix, record.env, flavour=flavour):
                then = before.get(now.suffix)
                if then is None or now.read_at != "construction" or then.value == now.value:
                    continue
                findings.append(make_finding(
                    "CA204", subject=f"{prefix}_{now.suffix}", entry=entry, record=record,
                    message=f"{prefix}_{now.suffix} changed after the runtime read its "
                            f"configuration (its first compile in {process}, "
                            f"{ns_text(started_ns)}): {entry.runtime} still used the first "
                            f"value for this compile",
                    recorded=f"{then.name or 'default'}={then.value}",
                    current=f"{now.name or 'default'}={now.value}",
                    how=f"environment of the first compile in {process} against this "
                        f"compile's; env prefix {prefix}: {families.how}"))
        return findings

    def _construction(self, record: CompileRecord, policy: Policy
                      ) -> tuple[int, dict[str, str], str] | None:
        """(start, environment) of the first compile of the runtime process that made `record`,
        and that process in words; None when nothing says which process made it.

        A bare shim's run is one process. A session's run (`cacheaudit run`, pytest) is shared
        by every process below it; there the runtime's pid comes from the policy (DeepJIT and
        DeepGEMM name their build directories after it)."""
        run_uuid = record.run_uuid or ""
        bare = process_run(run_uuid)
        if bare is not None:
            first = self._first_envs.get(run_uuid)
            return None if first is None else (*first, f"process {bare[1]}")
        process = _runtime_process(record, policy)
        if process is None:
            return None
        first = self._firsts_by_process(run_uuid, policy).get(process)
        return None if first is None else (*first, f"process {process[1]}")

    def _firsts_by_process(self, run_uuid: str, policy: Policy
                           ) -> dict[tuple[str, ...], tuple[int, dict[str, str]]]:
        """`_runtime_process` -> (start, environment) of that process's first compile in a
        session's run, read once per run and runtime."""
        memo_key = (run_uuid, policy.runtime)
        if memo_key not in self._process_firsts:
            firsts: dict[tuple[str, ...], tuple[int, dict[str, str]]] = {}
            if self.ledger is not None:
                for earlier in self.ledger.records(
                        where="runs.run_uuid = ? AND r.event = 'compile'", params=(run_uuid,),
                        order="r.started_ns, r.id", with_graphs=False):
                    process = _runtime_process(earlier, policy)
                    if process is not None:
                        firsts.setdefault(process, (earlier.started_ns, dict(earlier.env)))
            self._process_firsts[memo_key] = firsts
        return self._process_firsts[memo_key]

    @staticmethod
    def _families(entry: CacheEntry, policy: Policy, env: Mapping[str, str]) -> EnvFamilies:
        find = getattr(policy, "env_families", None)
        if find is None:
            return EnvFamilies(policy.env_prefixes, f"{entry.runtime}'s families")
        return find(entry, env)  # type: ignore[no-any-return]

    def _identify(self, path: str) -> _Compiled:
        """The compiler at `path` now, identified once per scan (thousands of entries share
        one)."""
        if path not in self._compilers:
            if not os.path.exists(path):
                self._compilers[path] = _Compiled(None, f"{path} no longer exists")
            else:
                now = compilers.identify(path, env=self.env, skip=is_masquerade_dir, path=path)
                self._compilers[path] = _Compiled(now, now.error)
        return self._compilers[path]

    def _compiler(self, entry: CacheEntry, record: CompileRecord,
                  policy: Policy) -> list[Finding]:
        recorded = record.compiler
        if recorded is None or record.reconstructed:
            return []
        found = self._identify(recorded.path)
        if found.identity is None:
            return [make_finding("CA501", subject=recorded.path, entry=entry, record=record,
                             message=f"the compiler that built this entry is gone: {found.error}",
                             recorded=recorded.version_line, current="absent",
                             how="stat of the recorded compiler path")]
        now = found.identity
        findings = []
        if (now.digest != recorded.digest or now.version_text != recorded.version_text
                or now.resolved != recorded.resolved) and not policy.compiler_change_in_key(
                    recorded, now):
            findings.append(make_finding(
                "CA301", subject=recorded.path, entry=entry, record=record,
                message=f"the compiler at {recorded.path} is not the one that built this entry, "
                        f"and {entry.runtime}'s key does not change with it",
                recorded=f"{recorded.resolved} xxh3 {(recorded.digest or '-')[:16]} "
                         f"({recorded.version_line})",
                current=f"{now.resolved} xxh3 {(now.digest or '-')[:16]} ({now.version_line})",
                how="content hash and --version of the compiler now"))
        old_host, new_host = recorded.host, now.host
        if old_host is not None and new_host is not None and (
                old_host.digest != new_host.digest or old_host.version_text
                != new_host.version_text or old_host.resolved != new_host.resolved):
            findings.append(make_finding(
                "CA302", subject=old_host.path, entry=entry, record=record,
                message=f"nvcc's host compiler changed; it preprocesses and compiles part of "
                        f"every kernel, and {entry.runtime}'s key never covers it",
                recorded=f"{old_host.resolved} ({old_host.version_line})",
                current=f"{new_host.resolved} ({new_host.version_line})",
                how="identity of the host compiler nvcc would use now"))
        return findings

    # ---------------------------------------------------------------- reconstruction

    def _reconstruct(self, entry: CacheEntry, policy: Policy,
                     findings: list[Finding]) -> CompileRecord | None:
        command = policy.dependency_command(entry)
        if command is None or entry.source is None:
            return None
        argv, cwd = command
        if not argv or not os.path.exists(argv[0]):
            findings.append(make_finding(
                "CA501", subject=argv[0] if argv else entry.path, entry=entry,
                message="the entry predates recording and its compiler is gone: its inputs "
                        "cannot be reconstructed", how="the compile command in the entry"))
            return None
        from cacheaudit import graph as graph_module

        kind = compilers.compiler_kind(argv[0])
        command_line = compilers.parse_command(kind, argv[1:])
        with tempfile.TemporaryDirectory(prefix="cacheaudit-scan-") as workdir:
            depfile = os.path.join(workdir, "deps.d")
            result = graph_module.start_dependency_pass(
                argv[0], command_line.dependency_argv(depfile), cwd, self.env).wait(timeout=300)
        if not result.ok or result.depfile_text is None:
            findings.append(make_finding(
                "CA501", subject=entry.path, entry=entry,
                message=f"the entry predates recording and the dependency pass over its "
                        f"recorded command failed: {result.error or result.stderr.strip()[:300]}",
                how="the compile command in the entry, run with -M"))
            return None
        sources, include_graph = graph_module.graph_from_depfile(
            result.depfile_text, cwd, [entry.source.path], self.cache, f"{kind} -M (reconstructed)")
        record = CompileRecord(
            record_id=new_record_id(), event="compile", started_ns=entry.built_ns or 0,
            runtime=entry.runtime, kernel=entry.kernel, key=entry.key, entry=entry.path,
            compiler=self._identify(argv[0]).identity,
            argv=tuple(argv[1:]), cwd=cwd, sources=sources, graph=include_graph,
            outputs=(entry.binary,) if entry.binary is not None else (), exit_code=0,
            pid=os.getpid(), host=socket.gethostname(), observer=f"reconstructed:{entry.layout}",
            notes=("reconstructed after the fact: the graph is what the compiler reads now",),
            reconstructed=True)
        self.reconstructed += 1
        if self.ledger is not None:
            # Kept so that the next scan need not run the pass again; a scan that cannot write
            # still reports.
            with contextlib.suppress(Exception):
                self.ledger.add_records([record], RunInfo(run_uuid=f"scan:{uuid.uuid4().hex}",
                                                          label="scan"))
        return record

    # ---------------------------------------------------------------- environment, once

    def environment_findings(self, entries: Sequence[CacheEntry]) -> list[Finding]:
        """CA201 and CA203: the scan's environment, judged for the runtimes of `entries`."""
        findings = []
        runtimes = {e.runtime for e in entries}
        for name, value in sorted(self._env_now.items()):
            if envvars.selects_compiler(name):
                continue
            blind = sorted(r for r in runtimes if envvars.is_implicit_input(name, r))
            if blind:
                findings.append(make_finding(
                    "CA201", subject=name,
                    message=f"{name} is set and changes compiles, but the key of "
                            f"{', '.join(blind)} does not include it: entries built under "
                            f"another value are served as if it were the same",
                    current=value, how="this environment against the variable registry"))
        if not any(name.startswith("DJ_") for name in self.env):
            return findings  # CA203 is about a DJ_ value taken or ignored: none is set
        for (prefix, flavour), how in sorted(self._families_found(entries).items()):
            findings += self._prefix_lookup(prefix, flavour, how)
        return findings

    def _families_found(self, entries: Sequence[CacheEntry]) -> dict[tuple[str, str], str]:
        """(prefix, flavour) -> why, for the `<PREFIX>_JIT_*` families the entries' runtimes
        read in this environment. Where nothing tells a DeepJIT entry's prefix, each family its
        runtime can have counts, since a `DJ_` value reaches any of them."""
        found: dict[tuple[str, str], str] = {}
        for entry in entries:
            try:
                policy = policy_for(entry.runtime)
            except KeyError:
                continue
            flavour = getattr(policy, "flavour", None)
            if flavour is None:
                continue
            families = self._families(entry, policy, self.env)
            prefixes = families.prefixes or policy.env_prefixes
            how = families.how if families.prefixes else (
                f"{families.how}, so it may be any of {', '.join(p + '_' for p in prefixes)}")
            for prefix in prefixes:
                found.setdefault((prefix, flavour), f"the runtime of {entry.path} ({how})")
        return found

    def _prefix_lookup(self, prefix: str, flavour: str, why: str) -> list[Finding]:
        """CA203 for one family: a `DJ_JIT_<X>` set while `<prefix>_JIT_<X>` is not, which
        DeepJIT takes in its place and DeepGEMM <= 2.6 and DeepEP's EPv2 JIT ignore."""
        findings = []
        runtime = envvars.FLAVOUR_NAMES[flavour]
        for setting in envvars.resolve_jit_settings(prefix, self.env, flavour=flavour):
            own = f"{prefix}_{setting.suffix}"
            fallback = f"DJ_{setting.suffix}"
            if setting.origin == "fallback":
                findings.append(make_finding(
                    "CA203", subject=own,
                    message=f"{own} is unset; a {runtime} runtime with env prefix {prefix} "
                            f"falls back to {setting.name}",
                    current=f"{setting.name}={setting.value}",
                    how=f"{runtime}'s lookup order: prefixed, then DJ_, then the default; "
                        f"{prefix}_ is read by {why}"))
            elif setting.origin == "default" and fallback in setting.ignored:
                default = setting.default if setting.default is not None else "(none)"
                findings.append(make_finding(
                    "CA203", subject=own,
                    message=f"{own} is unset and {fallback} is set, but {runtime} reads only "
                            f"{prefix}_ variables: it ignores {fallback} and uses its default "
                            f"({default})",
                    current=f"{fallback}={envvars.redact(fallback, self.env[fallback])}",
                    how=f"{runtime}'s lookup: {prefix}_ only, no DJ_ fallback; {why}"))
        return findings


def _jit_part(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if "_JIT_" in name}


def _find_shadows(graph: IncludeGraph, directories: Sequence[str],
                  started_ns: int) -> list[tuple[str, str]]:
    shadows = []
    for graph_file in graph.files:
        path = graph_file.path
        for index, directory in enumerate(directories):
            if not path.startswith(directory.rstrip("/") + "/"):
                continue
            relative = path[len(directory.rstrip("/")) + 1:]
            for earlier in directories[:index]:
                candidate = os.path.join(earlier, relative)
                try:
                    st = os.stat(candidate)
                except OSError:
                    continue
                if os.path.realpath(candidate) != path and st.st_ctime_ns > started_ns:
                    shadows.append((path, candidate))
                    break
            break
    return shadows


def modified_during_compile(record: CompileRecord,
                            entry: CacheEntry | None = None) -> list[Finding]:
    """CA401 for each input the shim saw change while the compiler ran."""
    return [make_finding(
        "CA401", subject=path, entry=entry, record=record,
        message="this input was modified while the compiler ran: the binary may hold a version "
                "other than the one recorded",
        recorded=f"compile started {ns_text(record.started_ns)}",
        current="mtime or ctime after the start",
        how="timestamps at the end of the compile (ccache's too-new rule)")
        for path in record.modified_during_compile]


def audit_records(records: Sequence[CompileRecord],
                  judged: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings that records carry on their own, whether or not a cache entry accounts for them:
    each runtime policy's record-level checks (NVRTC reusing a PCH after a header changed,
    torch's in-process versioner skipping a build), judged against the earlier records of the
    same run; and inputs modified during a compile (CA401) for records not in `judged` (those an
    entry audit already covered)."""
    runs: dict[str, list[CompileRecord]] = {}
    for record in sorted(records, key=lambda r: (r.started_ns, r.record_id)):
        runs.setdefault(record.run_uuid or "", []).append(record)
    findings: list[Finding] = []
    for run in runs.values():
        for index, record in enumerate(run):
            if record.record_id not in judged:
                findings += modified_during_compile(record)
            try:
                policy = policy_for(record.runtime) if record.runtime else None
            except KeyError:
                policy = None
            check = getattr(policy, "record_findings", None)
            if check is not None:
                findings += check(record, run[:index])
    return findings


# ------------------------------------------------------------------------------ scanning


def discover(paths: Sequence[str], env: Mapping[str, str]) -> list[tuple[Reader, str]]:
    """Cache roots to scan: the given paths (each matched to the layout it has), or with none,
    every existing default root of every known runtime."""
    readers = all_readers()
    found: list[tuple[Reader, str]] = []
    if paths:
        for path in paths:
            absolute = os.path.abspath(os.path.expanduser(path))
            matching = [r for r in readers if r.is_root(absolute)]
            found.extend((r, absolute) for r in matching)
            if not matching:
                from cacheaudit.exceptions import UsageError

                if not os.path.exists(absolute):
                    raise UsageError(f"{path}: no such directory")
                raise UsageError(f"{path}: not a cache root of any known runtime "
                                 f"({', '.join(r.layout for r in readers)})")
        return found
    for reader in readers:
        for root in reader.default_roots(env):
            if os.path.isdir(root) and reader.is_root(root):
                found.append((reader, root))
    return found


def scan(paths: Sequence[str], env: Mapping[str, str], *, ledger: Ledger | None = None,
         options: AuditOptions | None = None,
         progress: Callable[[int, int], None] | None = None) -> ScanResult:
    """Read every root, tie entries to their compiles, judge them, filter by select/ignore."""
    options = options or AuditOptions()
    roots = discover(paths, env)
    auditor = Auditor(env=env, ledger=ledger, options=options)
    seen: set[FileState] = set()
    if ledger is not None:
        seen = set(ledger.seen_states())
        auditor.cache.remember(seen)
    entries: list[CacheEntry] = []
    leftovers: list[CacheLeftover] = []
    read: set[str] = set()
    for reader, root in roots:
        for item in reader.read(root, auditor.cache):
            # A root may hold both DeepGEMM and DeepJIT entries (DG_JIT_CACHE_DIR serves both
            # generations): each reader then reports the shared tmp/ leftovers.
            if item.path in read:
                continue
            read.add(item.path)
            (entries if isinstance(item, CacheEntry) else leftovers).append(item)
    auditor.load(entries)
    findings: list[Finding] = [auditor.audit_leftover(left) for left in leftovers]
    for done, entry in enumerate(entries, 1):
        findings += auditor.audit_entry(entry)
        if progress is not None:
            progress(done, len(entries))
    findings += auditor.environment_findings(entries)
    auditor.save_attributions()
    if ledger is not None:
        with contextlib.suppress(Exception):  # a read-only ledger only costs the next scan time
            ledger.remember_states(s for e in entries for s in (e.binary, e.source)
                                   if s is not None and s not in seen)
            ledger.remember_roots((r.layout, root) for r, root in roots)
    return ScanResult(roots=[(r.layout, root) for r, root in roots], entries=entries,
                      leftovers=leftovers, findings=keep(findings, options),
                      matched=auditor.matched, reconstructed=auditor.reconstructed,
                      ledger=ledger.path if ledger else None)


# ------------------------------------------------------------------------------ a whole run


@dataclass
class RunReport:
    """What a test session or a `cacheaudit run` did with JIT caches, and the findings about it."""

    run_uuid: str
    records: list[CompileRecord]
    findings: list[Finding]
    roots: list[tuple[str, str]] = field(default_factory=list)

    def events(self) -> Counter[str]:
        return Counter(r.event for r in self.records)

    def summary(self) -> str:
        """What was recorded, in one line. A runtime's build shows up twice when its compiler
        also ran through the shim (torch: the adapter's record and the shim's compile and link
        records), so compiler invocations are counted apart from runtimes' compiles."""
        events = self.events()
        invocations = sum(1 for r in self.records if r.event == "compile" and not r.runtime)
        compiles = events["compile"] - invocations
        return (f"{compiles} compile(s), {events['disk-hit']} disk hit(s), "
                f"{events['memory-hit']} memory hit(s), {invocations} compiler invocation(s) "
                f"through the shim recorded")


def roots_of(records: Iterable[CompileRecord]) -> list[str]:
    """Cache roots the records touched: found by walking up from each entry, output and working
    directory (the shim sees `<root>/tmp/<uuid>/kernel.cubin` before the runtime renames it)."""
    readers = all_readers()
    candidates: set[str] = set()
    for record in records:
        paths = [record.entry or "", record.cwd] + [s.path for s in record.outputs]
        for path in paths:
            directory = os.path.dirname(path) if path and not os.path.isdir(path) else path
            for _ in range(6):
                if not directory or directory == os.path.dirname(directory):
                    break
                candidates.add(directory)
                directory = os.path.dirname(directory)
    return sorted(c for c in candidates if os.path.isdir(c) and any(
        r.is_root(c) for r in readers))


def audit_run(ledger: Ledger, run_uuid: str, env: Mapping[str, str], *,
              started_ns: int | None = None, roots: Sequence[str] = (),
              options: AuditOptions | None = None) -> RunReport:
    """Judge what one run did: scan the cache roots its records touched, the roots earlier scans
    found, the environment's default roots and `roots`; keep the findings about entries the run
    built or hit (a DeepJIT disk hit leaves no record, only a touched `.committed`, so an entry
    whose hit time falls after the run's start counts), add each runtime's record-level
    findings, and name the tests involved."""
    options = options or AuditOptions()
    records = ledger.records(where="runs.run_uuid = ?", params=(run_uuid,), with_files=True)
    started = started_ns if started_ns is not None else min(
        (r.started_ns for r in records), default=time.time_ns())
    defaults = [root for reader, root in discover([], env)]
    scanned = sorted(set(roots_of(records)) | {os.path.abspath(r) for r in roots}
                     | {r for r in ledger.known_roots() if os.path.isdir(r)} | set(defaults))
    scanned = [root for root in scanned if any(r.is_root(root) for r in all_readers())]
    result = scan(scanned, env, ledger=ledger, options=options) if scanned else None
    # The scan attributed the run's compiles to their entries: read them again.
    records = ledger.records(where="runs.run_uuid = ?", params=(run_uuid,), with_files=True)
    ids = {r.record_id for r in records}
    entries = {r.entry for r in records if r.entry}
    hit_since_start = {e.path for e in (result.entries if result else [])
                       if e.committed_ns is not None and e.committed_ns >= started}
    findings = [f for f in (result.findings if result else [])
                if f.record_id in ids or f.entry in entries or f.entry in hit_since_start]
    judged = frozenset(f.record_id for f in findings if f.record_id)
    findings += keep(audit_records(records, judged=judged), options)
    # A policy may prove the same stale file from the entry and from the records (torch-ext's
    # CA106): one finding per code, file and record.
    unique: dict[tuple[str, str, str | None], Finding] = {}
    for finding in findings:
        unique.setdefault((finding.code, finding.subject, finding.record_id), finding)
    findings = list(unique.values())
    windows = ledger.tests(run_uuid)
    findings = [_with_tests(f, records, windows, result) for f in findings]
    return RunReport(run_uuid=run_uuid, records=records, findings=findings,
                     roots=result.roots if result else [])


def _with_tests(finding: Finding, records: Sequence[CompileRecord], windows: Sequence[Any],
                result: ScanResult | None) -> Finding:
    tests: list[str] = []
    for record in records:
        if record.test_id and (record.record_id == finding.record_id or (
                finding.entry is not None and record.entry == finding.entry)):
            tests.append(record.test_id)
    entry = next((e for e in (result.entries if result else []) if e.path == finding.entry),
                 None)
    if entry is not None and entry.committed_ns is not None:
        # DeepJIT touches .committed on every disk hit: the test running then caused it.
        tests += [w.nodeid for w in windows
                  if w.started_ns <= entry.committed_ns <= w.finished_ns]
    unique = tuple(dict.fromkeys(tests))
    return dataclasses.replace(finding, tests=unique) if unique else finding
