"""All the audit's I/O, around the pure checks: finding cache roots, reading them, loading what
the ledger knows about their entries, reconstructing entries built before recording started
(a dependency pass with the entry's own command), identifying compilers, and writing back what
the audit learnt (reconstructed records, the entries compiles built).

Each entry a reader found is tied to the compile that built it (`identity.py`: its source, its
cache root, the binary's bytes as confirmation), the runtime's policy says which inputs its key
covers, and the checks (`checks/`) turn every difference between what the compile read then and
what is there now into a finding. An entry whose runtime has no policy, or that the environment
registry does not know, is reported unverified (CA501) and the scan goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from cacheaudit import children, compilers, scratch, seal
from cacheaudit.audit import execution
from cacheaudit.audit.checks import (
    compiler_findings,
    configuration_findings,
    environment_findings,
    input_findings,
    internal_error_finding,
    leftover_finding,
    modified_during_compile,
    no_policy_finding,
    no_record_finding,
    problem_findings,
    registry_finding,
    scan_environment_findings,
    shadow_findings,
    tracked_set_findings,
)
from cacheaudit.audit.context import AuditContext, LoadedRecords
from cacheaudit.audit.identity import Candidates, choose, places_of
from cacheaudit.audit.observations import ObservedEnvironments
from cacheaudit.audit.options import AuditOptions, keep
from cacheaudit.audit.roots import empty_default_roots, missing_named_roots
from cacheaudit.digest import StateCache
from cacheaudit.findings import make_finding, with_remedy
from cacheaudit.layout import Layout
from cacheaudit.ledger import Attribution, Ledger, RunInfo, new_record_id
from cacheaudit.model import (
    CacheEntry,
    CacheLeftover,
    CompileRecord,
    FileState,
    Finding,
    GraphFile,
    IncludeGraph,
)
from cacheaudit.policy import Policy
from cacheaudit.runtimes import layout_for, policy_for
from cacheaudit.runtimes import layouts as all_layouts


@dataclass
class ScanResult:
    roots: list[tuple[str, str]]
    entries: list[CacheEntry]
    leftovers: list[CacheLeftover]
    findings: list[Finding]
    matched: int = 0
    """Entries tied to an observed compile."""
    reconstructed: int = 0
    """Entries judged against inputs reconstructed after their build (now or by an earlier
    scan): what is said of them is inferred."""
    reconstructed_now: int = 0
    """Of those, the entries this scan ran a dependency pass for."""
    ledger: str | None = None
    empty_roots: list[tuple[str, str]] = field(default_factory=list)
    """(layout, root): default roots that exist but hold no entry a layout recognises; also
    in `roots` (scanned, with nothing in them)."""
    missing_roots: list[tuple[str, str]] = field(default_factory=list)
    """(variable, value): cache variables whose roots do not exist (`audit.roots`)."""


PolicyMemo = dict[str, tuple[Policy | None, str]]
"""A scan's answers of `policy_of` by runtime: the registry's look-up (a spec, a module, an
attribute) costs tens of microseconds, paid once per runtime instead of once per entry."""


def policy_of(entry: CacheEntry, memo: PolicyMemo | None = None) -> tuple[Policy | None, str]:
    """The policy that judges `entry`, or None and why there is none."""
    if memo is not None and entry.runtime in memo:
        return memo[entry.runtime]
    try:
        found: tuple[Policy | None, str] = (policy_for(entry.runtime), "")
    except KeyError as exc:
        found = None, str(exc.args[0]) if exc.args else f"no policy for {entry.runtime!r}"
    if memo is not None:
        memo[entry.runtime] = found
    return found


def rewrites_binary(entry: CacheEntry, memo: PolicyMemo | None = None) -> bool:
    """The policy's `rewrites_binary` for the entry; False where it has no policy or the hook
    fails (the binary's digest then confirms the tie, as for most runtimes)."""
    policy = policy_of(entry, memo)[0]
    try:
        return bool(policy.rewrites_binary(entry)) if policy is not None else False
    except Exception:  # noqa: BLE001 - a hook that fails leaves the stricter default
        return False


def build_places(entry: CacheEntry) -> tuple[str, ...]:
    """The layout's `build_places` for the entry; its cache root where that cannot be asked."""
    try:
        return tuple(layout_for(entry.layout).build_places(entry)) or (entry.root,)
    except Exception:  # noqa: BLE001 - an unknown layout or a failing hook: the root alone
        return (entry.root,)


@dataclass
class Auditor:
    """Judges entries one at a time: does the I/O an entry needs, then runs the checks over the
    context, which remembers what entries share (graphs, compilers)."""

    env: Mapping[str, str]
    ledger: Ledger | None = None
    options: AuditOptions = field(default_factory=AuditOptions)
    cache: StateCache = field(default_factory=StateCache)
    full_records: bool = False
    """Load each record's own sources and outputs too (explain shows them; a scan needs only
    the shared include graph)."""
    attributions: list[Attribution] = field(default_factory=list)
    """Records this auditor tied to their entries, for `save_attributions`."""
    matched: int = 0
    """Entries judged against an observed compile."""
    reconstructed: int = 0
    """Entries judged against a reconstruction (made now or by an earlier scan): inferences."""
    reconstructed_now: int = 0
    """Dependency passes this auditor ran to reconstruct entries."""
    observed: ObservedEnvironments | None = None
    """The environments a scope's observers saw its entries under (`AuditContext.observed`)."""
    context: AuditContext = field(init=False)
    _policies: dict[str, Policy] = field(init=False, default_factory=dict)
    _registered: PolicyMemo = field(init=False, default_factory=dict)
    _key: list[bytes | None] = field(init=False, default_factory=list)
    hold_reconstructions: bool = False
    """Keep reconstructed records back until `save_reconstructions` instead of writing each at
    once: a scan that loads its entries a chunk at a time must not find, for a later chunk's
    entry, a record it reconstructed for an earlier one (an entry with the same source and
    binary would be tied to it), which one load of every entry would not have seen."""
    _held: list[CompileRecord] = field(init=False, default_factory=list)
    _hits: dict[str, list[CompileRecord]] | None = field(init=False, default=None)
    """Every hit the ledger holds by entry path, read once by the first `load` of more than a
    few entries and kept for the later ones (a scan loads its entries a chunk at a time)."""
    _remembered: set[str] = field(init=False, default_factory=set)
    """Digests of the include graphs whose file states `load` gave the state cache."""
    pid: int = field(default_factory=os.getpid)
    """The scan's process, which its reconstructions name (a scan's forked worker makes them
    on its behalf)."""

    def __post_init__(self) -> None:
        self.context = AuditContext(env=self.env, options=self.options, cache=self.cache,
                                    observed=self.observed)

    # ---------------------------------------------------------------- the ledger side

    def load(self, entries: Sequence[CacheEntry]) -> None:
        """Tie entries to their compile records (`identity.py`), in a few indexed queries for
        all of `entries`: what is read follows the entries, not the ledger. What an earlier
        `load` read is replaced (a scan loads a chunk of entries, judges it and loads the
        next: memory holds one chunk's records, not the whole cache's); an entry's tie
        depends only on its own paths and digests, so the chunks do not change it."""
        ledger = self.ledger
        if ledger is None:
            return
        ties: dict[str, str] = {}
        chosen: dict[str, CompileRecord] = {}

        def tie(some: Sequence[CacheEntry], candidates: Candidates) -> list[CacheEntry]:
            """Tie what can be tied among `some`; the entries left untied."""
            left = []
            for entry in some:
                record = choose(entry, candidates, places=places_of(build_places(entry)),
                                rewrites_binary=rewrites_binary(entry, self._registered))
                if record is None:
                    left.append(entry)
                else:
                    ties[entry.path] = record.record_id
                    chosen[record.record_id] = record
            return left

        # Attributions first: after the first scan they tie nearly every entry, and only the
        # rest is looked up by source (or, without one, by binary).
        attributed = Candidates.index(ledger.identity_candidates(
            entries=[e.path for e in entries]))
        # Only step 1 of the rule here: these records' sources are not all the candidates.
        left = tie(entries, Candidates(by_entry=attributed.by_entry))
        if left:
            sourced = [e.source for e in left if e.source is not None]
            tie(left, Candidates.index(ledger.identity_candidates(
                sources=[s.path for s in sourced],
                source_digests=[s.digest for s in sourced if s.digest],
                output_digests=[e.binary.digest for e in left if e.source is None
                                and e.binary is not None and e.binary.digest])))
        # explain shows each record's own sources and outputs in full; a scan needs no more
        # of them than identity read.
        records = ledger.records_by_uuid(sorted(chosen)) if self.full_records else chosen
        # A few entries (explain) are looked up by path; a whole scan reads every hit at once,
        # which costs less than thousands of paths in IN lists, and keeps them for its chunks.
        if self._hits is not None:
            lookups = self._hits
        elif len(entries) <= 500:
            lookups = ledger.lookups_by_entry([e.path for e in entries])
        else:
            lookups = self._hits = ledger.lookups_by_entry(None)
        first_envs = ledger.first_compile_environments(
            r.run_uuid for r in records.values() if r.run_uuid is not None)

        def compiles_of_run(run_uuid: str) -> list[CompileRecord]:
            return ledger.records(where="runs.run_uuid = ? AND r.event = 'compile'",
                                  params=(run_uuid,), order="r.started_ns, r.id",
                                  with_graphs=False)

        self.context.loaded = LoadedRecords(ties=ties, records=records,
                                            lookups=lookups, first_envs=first_envs,
                                            compiles_of_run=compiles_of_run)
        # Known file states let an unchanged header be verified by one stat.
        remembered = self._remembered
        for record in records.values():
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
        return self.context.record_for(entry)

    def _seal_key(self) -> bytes | None:
        """This user's sealing secret, read once per audit (None: there is none)."""
        if not self._key:
            self._key.append(seal.user_key(self.env, create=False))
        return self._key[0]

    def lookups_for(self, entry: CacheEntry) -> list[CompileRecord]:
        """Hits an in-process observer saw for this entry, oldest first."""
        return self.context.lookups_for(entry)

    # ---------------------------------------------------------------- per entry

    def audit_leftover(self, leftover: CacheLeftover) -> Finding:
        return leftover_finding(leftover)

    def audit_entry(self, entry: CacheEntry) -> list[Finding]:
        """Every finding about one entry. Fails open: an error while judging it (a cache holding
        what no runtime wrote, a policy meeting a case it does not know) becomes a CA501 finding
        for this entry, naming the error, and the scan goes on to the next one."""
        findings = problem_findings(entry)
        try:
            return with_remedies(self._judge(entry, findings), entry, self._registered)
        except Exception as exc:  # noqa: BLE001 - reported as a finding, never swallowed
            return [*findings, internal_error_finding(entry, exc)]

    def policy_for_audit(self, entry: CacheEntry) -> tuple[Policy | None, str]:
        """The entry's policy as this audit uses it (`Policy.for_audit`: the audit's environment
        and the include trees the user named), once per runtime."""
        if entry.runtime in self._policies:
            return self._policies[entry.runtime], ""
        policy, missing = policy_of(entry, self._registered)
        if policy is not None:
            policy = policy.for_audit(self.env, self.options.include_dirs)
            self._policies[entry.runtime] = policy
        return policy, missing

    def _judge(self, entry: CacheEntry, findings: list[Finding]) -> list[Finding]:
        findings = list(findings)
        context = self.context
        policy, missing = self.policy_for_audit(entry)
        if policy is None:
            findings.append(no_policy_finding(entry, missing))
            return findings
        registry_problem = context.registry(entry.runtime).problem
        if registry_problem is not None:
            findings.append(registry_finding(entry, registry_problem))
        record = context.record_for(entry)
        reported = len(findings)
        if record is None and self.options.reconstruct:
            record = self._reconstruct(entry, policy, findings)
        if record is None:
            # A reconstruction that failed said why already (its compiler gone, say).
            if not any(f.code == "CA501" for f in findings[reported:]):
                findings.append(no_record_finding(entry, policy.reconstruction_problem(entry)))
            return findings + self._hit_findings(entry, None, policy, findings)
        if record.reconstructed:
            self.reconstructed += 1
        else:
            self.matched += 1
        if not record.entry:
            self.attributions.append(Attribution(record.record_id, entry.runtime, entry.kernel,
                                                 entry.key, entry.path))
        tracked = policy.tracked(entry, record)
        findings += tracked_set_findings(entry, record, tracked)
        findings += input_findings(context, entry, record, policy, tracked)
        findings += shadow_findings(context, entry, record, policy, tracked)
        if registry_problem is None:
            findings += environment_findings(context, entry, record, policy)
        findings += configuration_findings(context, entry, record, policy)
        current = None
        if record.compiler is not None and not record.reconstructed:
            execution.identify_recorded_compiler(context, entry, record, self._seal_key())
            if policy.looks_up_compiler_by_name and "/" not in record.compiler.invoked:
                current, _how = execution.resolve_compiler(entry, record.compiler.invoked,
                                                           self.env)
            if current is not None and current != record.compiler.path:
                execution.identify_compiler(context, current)
            else:
                current = None
        findings += compiler_findings(context, entry, record, policy, current)
        findings += modified_during_compile(record, entry)
        return findings + self._hit_findings(entry, record, policy, findings)

    def _hit_findings(self, entry: CacheEntry, record: CompileRecord | None, policy: Policy,
                      found: Sequence[Finding]) -> list[Finding]:
        """What the hits an in-process observer recorded for this entry carry on their own
        (`Policy.record_findings` of each, against the entry's compile record and the hits
        before it): an adapter that compared, at the hit, what the key does not cover (state
        of the serving process no file holds) leaves its evidence only in the hit's record, so
        a later scan reports it as the run that was served did. One finding per code and
        subject for the entry, from the first hit that carried it: every later hit served the
        same stale entry, and counting each would make a finding grow with the runs."""
        hits = self.lookups_for(entry)
        if not hits:
            return []
        seen = {(f.code, f.subject) for f in found}
        findings: list[Finding] = []
        history: list[CompileRecord] = [record] if record is not None else []
        for hit in hits:
            for finding in policy.record_findings(hit, list(history)):
                identity = (finding.code, finding.subject)
                if identity not in seen:
                    seen.add(identity)
                    findings.append(finding if finding.entry else dataclasses.replace(
                        finding, entry=entry.path, kernel=finding.kernel or entry.kernel))
            history.append(hit)
        return findings

    # ---------------------------------------------------------------- reconstruction

    def _reconstruct(self, entry: CacheEntry, policy: Policy,
                     findings: list[Finding]) -> CompileRecord | None:
        """A record for an entry built before recording: the compiler's dependency pass over
        the entry's own command, run now. Kept in the ledger for the next scan.

        What runs is never the cache's choice (`execution`): the compiler the user's
        configuration resolves, of the kind the command names, and only when the program the
        command names is that compiler; the command's options after the allowlist for a
        dependency pass. Anything refused is a CA501 for the entry, naming the refusal."""
        command = policy.dependency_command(entry)
        if command is None or entry.source is None:
            return None
        argv, cwd = command
        if not argv or ("/" in argv[0] and not os.path.exists(os.path.join(cwd, argv[0]))):
            findings.append(make_finding(
                "CA501", subject=argv[0] if argv else entry.path, entry=entry,
                message="the entry predates recording and its compiler is gone: its inputs "
                        "cannot be reconstructed", how="the compile command in the entry"))
            return None
        from cacheaudit import graph as graph_module

        def refuse(subject: str, why: str) -> None:
            findings.append(make_finding(
                "CA501", subject=subject, entry=entry,
                message=f"the entry predates recording and its inputs cannot be reconstructed: "
                        f"{why}: not run",
                how="the compile command in the entry, checked before any dependency pass "
                    "(docs/security.md: cacheaudit runs only a compiler the user's "
                    "configuration resolves, with options from an allowlist)"))

        compiler, how = execution.resolve_compiler(entry, argv[0], self.env)
        if compiler is None:
            refuse(argv[0], f"its command names {argv[0]}: {how}")
            return None
        if not execution.same_program(argv[0], compiler, cwd, self.env):
            refuse(argv[0], f"its command names {argv[0]}, which is not the compiler the user's "
                            f"configuration resolves ({compiler}, from {how})")
            return None
        kind = execution.named_kind(argv[0])
        checked = execution.checked_options(kind, argv[1:], cwd, self.env)
        if checked.args is None:
            refuse(entry.path, f"an option of its command is refused: {checked.refused}")
            return None
        command_line = compilers.parse_command(kind, checked.args)
        refused = execution.refuse_inputs(entry, command_line, cwd)
        if refused is not None:
            subject, why = refused
            findings.append(make_finding(
                "CA501", subject=subject, entry=entry,
                message=f"the entry predates recording and its inputs cannot be reconstructed: "
                        f"{why}: not compiled",
                how="the entry's sources, forced includes and include directories, checked "
                    "before any dependency pass"))
            return None
        with scratch.temporary_directory("scan") as workdir:
            depfile = os.path.join(workdir, "deps.d")
            result = graph_module.start_dependency_pass(
                compiler, command_line.dependency_argv(depfile), cwd, self.env
            ).wait(timeout=RECONSTRUCTION_TIMEOUT_S)
        if not result.ok or result.depfile_text is None:
            findings.append(make_finding(
                "CA501", subject=entry.path, entry=entry,
                message=f"the entry predates recording and the dependency pass over its "
                        f"recorded command failed: {result.error or result.stderr.strip()[:300]}",
                how="the compile command in the entry, run with -M"))
            return None
        try:
            sources, include_graph = graph_module.graph_from_depfile(
                result.depfile_text, cwd, [entry.source.path], self.cache,
                f"{kind} -M (reconstructed)")
        except graph_module.DepfileError as exc:
            # What the compiler wrote over a cache's files is as untrusted as they are (a
            # header named with a line end makes it unreadable): a finding for this entry.
            findings.append(make_finding(
                "CA501", subject=entry.path, entry=entry,
                message=f"the entry predates recording and the dependency pass over its "
                        f"recorded command wrote a depfile that cannot be read ({exc}): its "
                        f"inputs are unknown",
                how="the compile command in the entry, run with -M"))
            return None
        sources, include_graph, unknown = dated(sources, include_graph, entry.built_ns)
        record = CompileRecord(
            record_id=new_record_id(), event="compile", started_ns=entry.built_ns or 0,
            runtime=entry.runtime, kernel=entry.kernel, key=entry.key, entry=entry.path,
            compiler=execution.identify_compiler(self.context, compiler).identity,
            argv=tuple(argv[1:]), cwd=cwd, sources=sources, graph=include_graph,
            outputs=(entry.binary,) if entry.binary is not None else (), exit_code=0,
            pid=self.pid, host=socket.gethostname(), observer=f"reconstructed:{entry.layout}",
            notes=("reconstructed after the fact: the graph is what the compiler reads now",),
            reconstructed=True, unknown_at_build=unknown)
        self.reconstructed_now += 1
        if self.hold_reconstructions:
            self._held.append(record)
        else:
            self._keep_reconstruction(record)
        return record

    def _keep_reconstruction(self, record: CompileRecord) -> None:
        if self.ledger is not None:
            # Kept so that the next scan need not run the pass again; a scan that cannot write
            # still reports.
            with contextlib.suppress(Exception):
                self.ledger.add_records([record], RunInfo(run_uuid=f"scan:{uuid.uuid4().hex}",
                                                          label="scan"))

    def save_reconstructions(self) -> None:
        """Write the reconstructions `hold_reconstructions` kept back."""
        held, self._held = self._held, []
        for record in held:
            self._keep_reconstruction(record)

    # ---------------------------------------------------------------- environment, once

    def environment_findings(self, entries: Sequence[CacheEntry]) -> list[Finding]:
        """The scan's environment, judged once for the runtimes of `entries` (CA201, and each
        runtime policy's `scan_findings`)."""
        judged = [(entry, policy) for entry in entries
                  if (policy := policy_of(entry, self._registered)[0]) is not None]
        return with_remedies(scan_environment_findings(self.context, entries, judged))


def with_remedies(findings: list[Finding], entry: CacheEntry | None = None,
                  memo: PolicyMemo | None = None) -> list[Finding]:
    """`findings` with each hint naming its runtime's own remedy (`Policy.key_remedy`) for
    `entry` (None: findings about the environment, the runtime in general); `memo`, a scan's
    policies by runtime."""
    remedies: dict[str | None, str | None] = {}
    done: list[Finding] = []
    for finding in findings:
        runtime = entry.runtime if entry is not None else finding.runtime
        if runtime not in remedies:
            policy = None
            if runtime is not None and memo is not None and runtime in memo:
                policy = memo[runtime][0]
            elif runtime is not None:
                with contextlib.suppress(KeyError):
                    policy = policy_for(runtime)
            remedies[runtime] = policy.key_remedy(entry) if policy is not None else None
        done.append(with_remedy(finding, remedies[runtime]))
    return done


# ------------------------------------------------------------------ evidence and its age


UNKNOWN_AT_BUILD = ("content at build time unknown: changed after the entry was built, first "
                    "seen by a scan")


def unknown_state(state: FileState) -> FileState:
    """A file's state with its content left unknown: what a scan may say of a file that
    changed after the entry was built (its stat now, no digest)."""
    return state._replace(digest=None, settled=False, error=UNKNOWN_AT_BUILD)


def changed_after(state: FileState, built_ns: int | None) -> bool:
    """Whether the file's mtime or ctime is later than the entry's build: what a scan reads of
    it now need not be what the compiler read then."""
    return built_ns is not None and state.exists and max(state.mtime_ns,
                                                         state.ctime_ns) > built_ns


def dated(sources: tuple[FileState, ...], graph: IncludeGraph | None, built_ns: int | None
          ) -> tuple[tuple[FileState, ...], IncludeGraph | None, tuple[str, ...]]:
    """A reconstruction's sources and graph with every file changed after the build stored
    without content (`unknown_state`), and those files' paths: today's content is never
    stored as what the compiler read."""
    unknown: list[str] = []

    def age(state: FileState) -> FileState:
        if changed_after(state, built_ns):
            unknown.append(state.path)
            return unknown_state(state)
        return state

    sources = tuple(age(s) for s in sources)
    if graph is not None:
        graph = IncludeGraph(tuple(GraphFile(age(f.state), f.written) for f in graph.files),
                             graph.method)
    return sources, graph, tuple(unknown)


# ------------------------------------------------------------------ reconstruction deadline


RECONSTRUCTION_TIMEOUT_S = 60
"""The deadline of one entry's reconstruction pass (`-M`, the preprocessor only): nvcc 13.0 over
the CUTLASS reference TU takes 2.5 s on a loaded two-core machine. Its memory is bounded by
`children.PASS_LIMITS`."""


# ------------------------------------------------------------------------------ scanning


def entry_at(path: str, cache: StateCache) -> CacheEntry | None:
    """The entry a path lies in (its directory, or a file inside it): walk up to a directory
    some layout calls a root, and read it."""
    path = os.path.abspath(path)
    directory = path if os.path.isdir(path) else os.path.dirname(path)
    while True:
        for layout in all_layouts():
            if layout.is_root(directory):
                for item in layout.read(directory, cache):
                    if isinstance(item, CacheEntry) and (
                            path == item.path or path.startswith(item.path + os.sep)):
                        return item
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def discover(paths: Sequence[str], env: Mapping[str, str]) -> list[tuple[Layout, str]]:
    """Cache roots to scan: the given paths (each matched to the layout it has), or with none,
    every existing default root of every known runtime."""
    layouts = all_layouts()
    found: list[tuple[Layout, str]] = []
    if paths:
        for path in paths:
            absolute = os.path.abspath(os.path.expanduser(path))
            matching = [r for r in layouts if r.is_root(absolute)]
            found.extend((r, absolute) for r in matching)
            if not matching:
                from cacheaudit.exceptions import UsageError

                if not os.path.exists(absolute):
                    raise UsageError(f"{path}: no such directory")
                raise UsageError(f"{path}: not a cache root of any known runtime "
                                 f"({', '.join(r.layout for r in layouts)})")
        return found
    for layout in layouts:
        for root in layout.default_roots(env):
            if os.path.isdir(root) and layout.is_root(root):
                found.append((layout, root))
    return found


@contextlib.contextmanager
def _fewer_collections() -> Iterator[None]:
    """Run with the cyclic collector's first threshold raised: a scan makes millions of small
    objects that hold no cycles (states, records, findings), and at the default threshold the
    collector walks the growing heap again and again, a cost that grows faster than the
    entries (a sixth of a 10,000-entry scan). The thresholds are restored afterwards."""
    thresholds = gc.get_threshold()
    gc.set_threshold(max(thresholds[0], 50_000), *thresholds[1:])
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


SCAN_CHUNK = 2_000
"""Entries tied to their records and judged per ledger read: a scan holds one chunk's records
at a time (a record with its sources, outputs, argv and environment is a few KiB; 100,000 of
them were most of a scan's memory), while the ledger's queries stay batched by the
thousand."""


PARALLEL_FROM = 4_000
"""Entries from which a scan judges its chunks in forked workers, one per usable core (where
there are two or more): below it, the forks and each worker's own ledger reads (every hit,
the shared graph, the policies' memos) cost about what the second core saves."""


def scan(paths: Sequence[str], env: Mapping[str, str], *, ledger: Ledger | None = None,
         options: AuditOptions | None = None,
         progress: Callable[[int, int], None] | None = None,
         observed: ObservedEnvironments | None = None,
         chunk: int = SCAN_CHUNK, workers: int | None = None) -> ScanResult:
    """Read every root, tie entries to their compiles, judge them, filter by select/ignore.
    `observed`: a scope's observed environments (the audit of a run passes them). `chunk`:
    entries loaded and judged at a time (`SCAN_CHUNK`); `workers`: processes that judge the
    chunks (None: one per usable core from `PARALLEL_FROM` entries, in a process without
    other threads, else this one; 1: this one). The result depends on neither."""
    with _fewer_collections():
        return _scan(paths, env, ledger=ledger, options=options, progress=progress,
                     observed=observed, chunk=max(1, chunk), workers=workers)


def _scan(paths: Sequence[str], env: Mapping[str, str], *, ledger: Ledger | None,
          options: AuditOptions | None, progress: Callable[[int, int], None] | None,
          observed: ObservedEnvironments | None, chunk: int,
          workers: int | None) -> ScanResult:
    options = options or AuditOptions()
    roots = discover(paths, env)
    auditor = Auditor(env=env, ledger=ledger, options=options, observed=observed,
                      hold_reconstructions=True)
    seen: set[FileState] = set()
    if ledger is not None:
        seen = set(ledger.seen_states())
        auditor.cache.remember(seen)
    entries: list[CacheEntry] = []
    leftovers: list[CacheLeftover] = []
    read: set[str] = set()
    cores = max(1, workers) if workers is not None else (
        # A fork copies the locks other threads hold, not the threads that would release
        # them (an import, a log handler): a process with threads judges in-process.
        children.usable_cores() if threading.active_count() == 1 else 1)
    forks = _Forks(auditor, entries, chunk, cores, workers is not None) if cores > 1 else None
    try:
        for layout, root in roots:
            for item in layout.read(root, auditor.cache):
                # A root may hold entries of two runtimes (one cache directory serving two
                # generations of a runtime): each layout then reports the shared tmp/
                # leftovers.
                if item.path in read:
                    continue
                read.add(item.path)
                if isinstance(item, CacheEntry):
                    entries.append(item)
                    if forks is not None:
                        forks.read_one()
                else:
                    leftovers.append(item)
        # Filtered as they are made: what --select/--ignore drop is never held.
        findings = keep([auditor.audit_leftover(left) for left in leftovers], options)
        if forks is not None and forks.wanted():
            findings += forks.judged(progress)
        else:
            for start in range(0, len(entries), chunk):
                findings += _judge_chunk(auditor, entries[start:start + chunk], progress,
                                         start, len(entries))
    finally:
        if forks is not None:
            forks.close()
    auditor.context.loaded = LoadedRecords()  # the last chunk's records, no longer needed
    findings += keep(auditor.environment_findings(entries), options)
    auditor.save_reconstructions()
    auditor.save_attributions()
    if ledger is not None:
        with contextlib.suppress(Exception):  # a read-only ledger only costs the next scan time
            ledger.remember_states(s for e in entries for s in (e.binary, e.source)
                                   if s is not None and s not in seen)
            ledger.remember_roots((r.layout, root) for r, root in roots)
    empty, missing = ([], []) if paths else (empty_default_roots(env, roots),
                                              missing_named_roots(env))
    return ScanResult(roots=[(r.layout, root) for r, root in roots] + empty, entries=entries,
                      empty_roots=empty, missing_roots=missing,
                      leftovers=leftovers, findings=findings,
                      matched=auditor.matched, reconstructed=auditor.reconstructed,
                      reconstructed_now=auditor.reconstructed_now,
                      ledger=ledger.path if ledger else None)


def _judge_chunk(auditor: Auditor, part: Sequence[CacheEntry],
                 progress: Callable[[int, int], None] | None = None, start: int = 0,
                 total: int = 0) -> list[Finding]:
    """Tie one chunk of entries to their records and judge them: the findings --select and
    --ignore keep (filtered as they are made: what they drop is never held)."""
    auditor.load(part)
    found: list[Finding] = []
    for done, entry in enumerate(part, start + 1):
        found += keep(auditor.audit_entry(entry), auditor.options)
        if progress is not None:
            progress(done, total)
    return found


@dataclass
class _Judged:
    """A forked worker's answer for one chunk: its findings and what its auditor learnt on the
    way, which the scan's own auditor takes in, chunk by chunk, in the entries' order."""

    findings: list[Finding]
    attributions: list[Attribution]
    held: list[CompileRecord]
    matched: int
    reconstructed: int
    reconstructed_now: int


HEAD_CHUNKS = 2
"""Chunks read and not yet handed out from which a scan with a core to spare forks a worker to
judge them while it reads on (`_Forks`; at least `PARALLEL_FROM` entries unless workers were
asked for). Each such worker takes what is read so far, and the scan reads about three
entries while one is judged, so they grow about threefold: a few per scan."""


class _Forks:
    """A scan's forked workers (`children.ForkedMap`), each judging chunks of entries read
    before its fork, their findings merged in the entries' order: what one process judging
    every chunk would report, since an entry's tie and judgement depend only on the entry, its
    records and the disk, never on the entries judged before it (the memos only save work).

    While the scan reads (a third of its time), one worker per spare core judges the entries
    read so far, `HEAD_CHUNKS` chunks or more at a time; once reading is done, the rest is
    shared by one worker per core, in smaller chunks so that the last ones are shared out too.
    A scan of fewer than `PARALLEL_FROM` entries (unless `workers` was given) stays in this
    process. Each worker reads the ledger through a read-only connection of its own (one
    opened before a fork cannot be used after it) and returns its attributions and held
    reconstructions, which this process writes at the end as one process would. A chunk a
    worker did not deliver (it failed, it died) is judged here instead: fail open, never a
    lost entry."""

    def __init__(self, auditor: Auditor, entries: list[CacheEntry], chunk: int, cores: int,
                 forced: bool) -> None:
        self.auditor, self.entries, self.chunk, self.cores = auditor, entries, chunk, cores
        self.forced = forced
        """`workers` was given: fork whatever the size."""
        self.head = HEAD_CHUNKS * chunk if forced else max(HEAD_CHUNKS * chunk, PARALLEL_FROM)
        self.handed = 0
        """Entries handed to a pool so far (`entries[:handed]`)."""
        self.next_look = 0
        """How many entries read before the pools are asked again whether a core is free."""
        self.pools: list[children.ForkedMap] = []
        self.segments: list[tuple[children.ForkedMap, int, Sequence[CacheEntry]]] = []
        """(pool, task, entries) in the entries' order: where each chunk's findings come from."""

    def read_one(self) -> None:
        """After each entry read: hand what is read to a new worker when a core is free."""
        if len(self.entries) - self.handed < self.head or len(self.entries) < self.next_look:
            return
        self.next_look = len(self.entries) + 64  # a look is a system call per worker
        busy = sum(1 for pool in self.pools if not pool.poll())
        if busy < self.cores - 1:
            self._fork(self.entries[self.handed:], 1, self.chunk)

    def wanted(self) -> bool:
        return bool(self.pools) or self.forced or len(self.entries) >= PARALLEL_FROM

    def judged(self, progress: Callable[[int, int], None] | None) -> list[Finding]:
        """Every entry's findings, in order: the workers' and, for what none delivered, this
        process's."""
        # What the workers forked while reading have not begun goes to the last pool, with
        # what was read after them, so that every core shares the end.
        undone = {(id(pool), task) for pool in self.pools for task in pool.stop()}
        again = [i for i, (pool, task, _part) in enumerate(self.segments)
                 if (id(pool), task) in undone]
        rest = self.entries[self.handed:]
        size = max(1, min(self.chunk, -(-len(rest) // (self.cores * 4))))
        parts = [self.segments[i][2] for i in again]
        parts += [rest[start:start + size] for start in range(0, len(rest), size)]
        self.handed = len(self.entries)
        if parts:
            last = children.ForkedMap(self._work(parts), len(parts), self.cores)
            self.pools.append(last)
            for task, i in enumerate(again):
                self.segments[i] = (last, task, parts[task])
            self.segments += [(last, task, parts[task])
                              for task in range(len(again), len(parts))]
        auditor, findings, done = self.auditor, [], 0

        def meanwhile() -> None:
            for pool in self.pools:
                pool.poll()

        for pool, task, part in self.segments:
            result = pool.get(task, meanwhile)
            if isinstance(result, _Judged):
                findings += result.findings
                auditor.attributions += result.attributions
                auditor._held += result.held
                auditor.matched += result.matched
                auditor.reconstructed += result.reconstructed
                auditor.reconstructed_now += result.reconstructed_now
            else:
                findings += _judge_chunk(auditor, part)
            done += len(part)
            if progress is not None:
                progress(done, len(self.entries))
        self.close()
        return findings

    def close(self) -> None:
        for pool in self.pools:
            pool.close()

    def _fork(self, some: Sequence[CacheEntry], workers: int, size: int) -> None:
        parts = [some[start:start + size] for start in range(0, len(some), size)]
        self.handed += len(some)
        pool = children.ForkedMap(self._work(parts), len(parts), workers)
        self.pools.append(pool)
        self.segments += [(pool, task, part) for task, part in enumerate(parts)]

    def _work(self, parts: Sequence[Sequence[CacheEntry]]) -> Callable[[int], _Judged]:
        auditor = self.auditor
        ledger_path = auditor.ledger.path if auditor.ledger is not None else None
        own: list[Auditor] = []

        def work(index: int) -> _Judged:
            # Runs in a worker: its auditor is made at its first chunk, sharing what the
            # scan's had at the fork (the state cache with the ledger's seen states).
            if not own:
                reader = None if ledger_path is None else Ledger.open(
                    ledger_path, create=False, reader=True)
                own.append(Auditor(env=auditor.env, ledger=reader, options=auditor.options,
                                   cache=auditor.cache, observed=auditor.observed,
                                   hold_reconstructions=True, pid=auditor.pid))
            worker = own[0]
            # Only this chunk's: a chunk that failed half-way left its part behind.
            worker.attributions, worker._held = [], []
            before = worker.matched, worker.reconstructed, worker.reconstructed_now
            found = _judge_chunk(worker, parts[index])
            return _Judged(found, worker.attributions, worker._held,
                           worker.matched - before[0], worker.reconstructed - before[1],
                           worker.reconstructed_now - before[2])

        return work
