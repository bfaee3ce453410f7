"""The rebuild oracle: compile an entry again, away from its cache, and compare the bytes.

A scan judges an entry from evidence (what the compile read, what is on disk now); some of it is
inference (an entry built before recording, a variable set that no key covers). The oracle turns
such a verdict into a proof: for each entry it takes the compile that built it (the scan's
`Auditor` ties them), runs that command again in a private temporary directory, and compares
the fresh binary with the cached one.

- equal: proven fresh; equal once the build directories embedded in both are masked (a host
  object's debug information names them): proven fresh, and said so;
- different: a second build in another private directory; if the two fresh builds differ
  from each other the build is not deterministic (CA404), else the entry is stale (CA403),
  unless the runtime's key for the inputs as they are now is another entry's and no live
  process keeps the old one (`superseded`: no new process is served it);
- the compiler runs and fails: a fresh compile cannot rebuild the cached binary any more (a
  dependency deleted), also CA403 (`fails`), with the compiler's first error line.

The question is "would a fresh compile now give the cached binary?", so the rebuild runs under
the CURRENT environment, as a fresh compile now would see it; the verdict names the
compile-affecting variables (`envvars.compile_environment`) whose values differ from the
recorded ones, which is how an environment change after the build is proven.

What runs (docs/security.md): the command is the record's argv with the source and output
paths moved into the private directory (the entry's own source copied there), include
directories as recorded, the current environment (for an entry without a record: the layout's
own command, `Policy.dependency_command`). Never the program a cache or ledger names: the
compiler is the one the user's configuration resolves (`Policy.compiler_variables`, else the
kind's usual place or its name on PATH), of a known kind; a command whose options pick
programs (`-ccbin`, `-B`, `-fplugin`, ...) runs only from a record this user sealed
(`cacheaudit.seal`). Sources are regular files of bounded size (`refuse_inputs`); each compile
has a timeout and its own process group, killed with the oracle (`cacheaudit.audit.rebuilding`);
every temporary directory is removed, Ctrl-C included. A record this user did not seal (another
user's ledger, a command changed after it was written) runs only with `yes`.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, replace

import xxhash

from cacheaudit import compilers, envvars, scratch, seal
from cacheaudit.audit.checks.rebuild import (
    failed_finding,
    masked,
    nondeterministic_finding,
    sample,
    settle,
    stale_finding,
    suspects,
    unverified_finding,
)
from cacheaudit.audit.context import live_process
from cacheaudit.audit.execution import (
    checked_options,
    named_kind,
    refuse_inputs,
    resolve_compiler,
)
from cacheaudit.audit.rebuilding import BINARY_LIMIT, Processes, Rebuild, build
from cacheaudit.audit.scan import Auditor, ScanResult, entry_at, policy_of
from cacheaudit.digest import StateCache, read_file
from cacheaudit.exceptions import CacheAuditError, ExitCode, UsageError
from cacheaudit.ledger import Ledger
from cacheaudit.model import CacheEntry, CompileRecord, Finding
from cacheaudit.runtimes import layouts
from cacheaudit.shim import strip_masquerade_dirs
from cacheaudit.switches import DISABLE_VARIABLE

Say = Callable[[str], None]

class UntrustedCommands(CacheAuditError):
    """Commands from records this user did not seal, and no `--yes`."""

    exit_code = ExitCode.UNTRUSTED


@dataclass(frozen=True)
class VerifyOptions:
    sample: int | None = None
    """Verify this many entries, chosen by `seed` (the same seed gives the same entries)."""
    seed: int = 0
    jobs: int | None = None
    """Compiles at once; at most the cores present (`os.cpu_count()`)."""
    timeout: float = 300.0
    """Seconds one compile may take."""
    dry_run: bool = False
    yes: bool = False
    """Run commands from records this user did not seal."""


@dataclass
class Verdict:
    entry: CacheEntry
    outcome: str
    """identical, identical-but-paths, stale, fails, superseded, non-deterministic,
    unverified."""
    findings: list[Finding] = field(default_factory=list)
    note: str = ""
    rebuild: Rebuild | None = None


OUTCOMES = ("identical", "identical-but-paths", "stale", "fails", "superseded",
            "non-deterministic", "unverified")


@dataclass
class VerifyResult:
    entries: list[CacheEntry]
    """The entries verified (the sample, when sampled)."""
    total: int
    """How many entries there were to choose from."""
    verdicts: list[Verdict]
    seed: int | None = None
    """The seed of the sample; None when every entry was taken."""
    planned: list[Rebuild] = field(default_factory=list)
    """The compiles to run (or, with dry_run, that would run)."""

    @property
    def findings(self) -> list[Finding]:
        return [f for v in self.verdicts for f in v.findings]

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for verdict in self.verdicts:
            counts[verdict.outcome] = counts.get(verdict.outcome, 0) + 1
        return counts

    def summary(self) -> str:
        counts = self.counts()
        parts = [f"{counts[o]} {o}" for o in OUTCOMES if counts.get(o)]
        sampled = (f" (a sample of {len(self.entries)} of {self.total}, seed {self.seed})"
                   if self.seed is not None else "")
        return (f"{len(self.entries)} entr{'y' if len(self.entries) == 1 else 'ies'} "
                f"rebuilt{sampled}: {', '.join(parts) or 'nothing to verify'}")


# ------------------------------------------------------------------------------ entries


def entries_of(targets: Sequence[str], env: Mapping[str, str],
               cache: StateCache) -> list[CacheEntry]:
    """The entries named (an entry directory or a file in it), every entry of the roots named,
    or with no target every entry of the default roots."""
    from cacheaudit.audit.scan import discover

    found: dict[str, CacheEntry] = {}
    if not targets:
        for layout, root in discover([], env):
            found.update((e.path, e) for e in layout.read(root, cache)
                         if isinstance(e, CacheEntry))
        return sorted(found.values(), key=lambda e: e.path)
    for target in targets:
        path = os.path.abspath(os.path.expanduser(target))
        if not os.path.exists(path):
            raise UsageError(f"{target}: no such file or directory")
        roots = [layout for layout in layouts() if layout.is_root(path)]
        if roots:
            for layout in roots:
                found.update((e.path, e) for e in layout.read(path, cache)
                             if isinstance(e, CacheEntry))
            continue
        entry = entry_at(path, cache)
        if entry is None:
            raise UsageError(f"{target}: neither a cache root nor inside a cache entry of any "
                             "known runtime")
        found[entry.path] = entry
    return sorted(found.values(), key=lambda e: e.path)


# ------------------------------------------------------------------------------ planning


def _environment(env: Mapping[str, str]) -> dict[str, str]:
    """The environment of a rebuild: the current one, as a fresh compile now sees it; never
    through cacheaudit's shim, never recorded."""
    child = dict(env)
    child["PATH"] = strip_masquerade_dirs(child.get("PATH", os.defpath))
    child[DISABLE_VARIABLE] = "1"
    return child


def drift(record: CompileRecord | None, env: Mapping[str, str]) -> list[str]:
    """The compile-affecting variables whose value in `env` differs from the record's, each as
    `NAME (recorded V, now W)`, values redacted as the shim stores them; nothing for an entry
    without an observed compile (its environment at the build is unknown)."""
    if record is None or record.reconstructed:
        return []
    now = envvars.compile_environment(env)
    changed = []
    for name in sorted(set(now) | set(record.env)):
        then, current = record.env.get(name), now.get(name)
        if then != current and name != DISABLE_VARIABLE:
            changed.append(f"{name} (recorded {_shown(then)}, now {_shown(current)})")
    return changed


def _shown(value: str | None) -> str:
    return "unset" if value is None else shlex.quote(value)


def plan(entry: CacheEntry, record: CompileRecord | None, env: Mapping[str, str],
         trust: Callable[[CompileRecord], str | None]) -> Rebuild | str:
    """The rebuild of one entry, or why there can be none."""
    if entry.binary is None or not entry.binary.exists:
        return "the entry has no binary to compare with"
    if entry.source is None or not entry.source.exists:
        return "the entry keeps no source to compile"
    notes: list[str] = []
    needs_yes = None
    tied = record
    if record is not None and not record.reconstructed and record.argv:
        if record.redacted_argv:
            return _redacted_refusal(record)
        invoked = record.compiler.invoked if record.compiler else record.observer.split(":")[-1]
        args, cwd = list(record.argv), record.cwd
        origin = f"the recorded compile {record.record_id[:12]}"
        needs_yes = trust(record)
    else:
        policy, _ = policy_of(entry)
        command = policy.dependency_command(entry) if policy else None
        if not command or not command[0]:
            if record is not None and not record.reconstructed:
                return (f"its recorded compile ({record.observer}) keeps no command line to run "
                        "again")
            why = policy.reconstruction_problem(entry) if policy else None
            return (f"no recorded compile, and the layout gives no command: "
                    f"{why or 'the runtime writes none into its entries'}")
        invoked, args, cwd = command[0][0], list(command[0][1:]), command[1]
        origin = ("the layout's command (the entry predates recording), under the current "
                  "environment")
        record = None
    compiler, how = resolve_compiler(entry, invoked, env)
    if compiler is None:
        return how
    notes.append(f"compiler {compiler} (from {how})")
    # Parsed as the kind that built the entry: what the configuration resolves is of that kind.
    kind = named_kind(invoked)
    if record is None or needs_yes is not None:
        # Data this user did not write (a cache's command, an unsealed record): its options
        # pass the allowlist for a compile, response files expanded, before anything runs.
        checked = checked_options(kind, args, cwd if os.path.isdir(cwd) else entry.path, env,
                                  "compile")
        if checked.args is None:
            return f"an option of the command is refused: {checked.refused}: not run"
        args = checked.args
    parsed = compilers.parse_command(kind, args)
    source_name = os.path.basename(entry.source.path)
    sources = [os.path.normpath(os.path.join(cwd, s)) for s in parsed.sources]
    built = [s for s in sources if os.path.basename(s) == source_name]
    if not built:
        return f"the command compiles no {source_name}"
    build_dir = os.path.dirname(built[0])
    binary_name = os.path.basename(entry.binary.path)
    outputs = [os.path.normpath(os.path.join(cwd, o))
               for o in compilers.output_paths(kind, parsed, cwd)]
    output = next((o for o in outputs if os.path.basename(o) == binary_name), None)
    if output is None or not output.startswith(build_dir + os.sep):
        return f"the command writes no {binary_name} beside its source"
    outside = next((o for o in outputs if not o.startswith(build_dir + os.sep)), None)
    if outside is not None:
        return f"the command also writes {outside}, outside its build directory: not run"
    child_env = _environment(env)
    changes = drift(record, env)
    if changes:
        notes.append("the environment differs from the recorded one in " + "; ".join(changes))
    # What the compiler reads from the entry must be fit to be read.
    refused = refuse_inputs(entry, parsed, cwd if os.path.isdir(cwd) else entry.path)
    if refused is not None:
        return f"{refused[1]}: not compiled"
    if not os.path.isdir(cwd) and not (cwd + os.sep).startswith(build_dir + os.sep):
        return f"the compile's working directory {cwd} is gone"
    changed = [f"{k}={shlex.quote(v)}" for k, v in sorted(child_env.items())
               if env.get(k) != v and k != DISABLE_VARIABLE and k != "PATH"]
    unset = [f"-u {k}" for k in sorted(envvars.compile_environment(env)) if k not in child_env]
    return Rebuild(entry=entry, compiler=compiler, args=args, cwd=cwd, build_dir=build_dir,
                   output=output, kind=kind, env=child_env, origin=origin, notes=notes,
                   needs_yes=needs_yes, env_changes=" ".join(unset + changed), record=tied,
                   drift=changes)


def _redacted_refusal(record: CompileRecord) -> str:
    """Why a command stored with credentials redacted (`CompileRecord.redacted_argv`) is not
    run: it is not the command that built the entry, so its binary proves nothing."""
    words = [record.argv[i] for i in record.redacted_argv if 0 <= i < len(record.argv)]
    return (f"its recorded compile {record.record_id[:12]} was stored with {len(words)} "
            f"argument(s) redacted ({', '.join(shlex.quote(w) for w in words[:3])}): a "
            "redacted argument cannot be rebuilt (record the compile again with "
            "CACHEAUDIT_REDACT_ARGV=0 to verify it)")


def judge(rebuild: Rebuild, parent: str, processes: Processes, timeout: float) -> Verdict:
    """Build once; when the binaries differ, build again to tell stale from non-deterministic."""
    entry = rebuild.entry
    assert entry.binary is not None
    try:
        cached = read_file(entry.binary.path, BINARY_LIMIT)
    except OSError as exc:
        return _unverified(entry, f"the cached binary cannot be read ({exc.strerror or exc})",
                           rebuild)
    under = rebuild.under()
    how = f"{rebuild.origin}, run again in a private directory {under}: {rebuild.shown()}"
    first = build(rebuild, parent, processes, timeout)
    if first.failed is not None:
        return _different(rebuild, "fails", failed_finding(entry, first.failed, how))
    if first.binary is None:
        return _unverified(entry, first.problem, rebuild)
    if first.binary == cached:
        return Verdict(entry, "identical", rebuild=rebuild,
                       note=f"a fresh compile gives the cached binary byte for byte ({under})")
    if (written := _compiler_wrote(rebuild, cached)) is not None and \
            xxhash.xxh3_128_hexdigest(first.binary) == written:
        return Verdict(entry, "identical", rebuild=rebuild, note=(
            f"the cached binary was rewritten after its compile (the compiler wrote xxh3 "
            f"{written}; a post hook, say): a fresh compile gives what the compiler wrote then, "
            f"byte for byte ({under})"))
    known = [first.directory, rebuild.build_dir, entry.path]
    if masked(first.binary, known, entry.root) == masked(cached, known, entry.root):
        return Verdict(entry, "identical-but-paths", rebuild=rebuild, note=(
            "a fresh compile differs from the cached binary only where it embeds its build "
            f"directory ({rebuild.build_dir} in the cached one): not stale ({under})"))
    # Where the compiler can map its build directory back to the recorded one, the remaining
    # builds do: a binary whose debug information orders its strings by path then compares.
    map_back = rebuild.kind in ("gcc", "clang")
    if map_back:
        first = build(rebuild, parent, processes, timeout, map_back)
        if first.binary is None:
            return _unverified(entry, first.problem, rebuild)
        if first.binary == cached:
            return Verdict(entry, "identical-but-paths", rebuild=rebuild, note=(
                "a fresh compile differs from the cached binary only where it names its build "
                f"directory: with {rebuild.build_dir} written there (-ffile-prefix-map), as the "
                f"original compile had it, the bytes are the same: not stale ({under})"))
        how += f" (with -ffile-prefix-map=<private dir>={rebuild.build_dir})"
    second = build(rebuild, parent, processes, timeout, map_back)
    if second.binary is None:
        return _unverified(entry, f"the second compile: {second.problem}", rebuild)
    known += [first.directory, second.directory]
    if masked(first.binary, known, entry.root) != masked(second.binary, known, entry.root):
        return Verdict(entry, "non-deterministic", rebuild=rebuild,
                       findings=[nondeterministic_finding(entry, first.binary, second.binary,
                                                          how)])
    return _different(rebuild, "stale", stale_finding(entry, cached, first.binary, how))


def _compiler_wrote(rebuild: Rebuild, cached: bytes) -> str | None:
    """The digest of the binary the recorded compile wrote, when the cached one is not it (the
    runtime rewrote it afterwards); None when they agree or the record does not say."""
    if rebuild.record is None or rebuild.record.reconstructed:
        return None
    written = next((o.digest for o in rebuild.record.outputs
                    if o.path == rebuild.output and o.digest), None)
    if written is None or written == xxhash.xxh3_128_hexdigest(cached):
        return None
    return written


def _different(rebuild: Rebuild, outcome: str, finding: Finding) -> Verdict:
    """A fresh compile does not give the cached binary (it differs, or fails): CA403, unless the
    runtime's key for the inputs as they are now is another entry's and no process that
    computed the old key still runs: then no new process is served this binary."""
    entry = rebuild.entry
    moved, unknown = _key_moved(rebuild)
    if moved is None:
        if unknown:
            finding = replace(finding, message=(
                f"{finding.message}; whether the runtime's key still leads to this entry is "
                f"unknown (the key cannot be recomputed: {unknown})"))
        return Verdict(entry, outcome, rebuild=rebuild, findings=[finding], note=finding.message)
    return Verdict(entry, "superseded", rebuild=rebuild, note=(
        f"{finding.message}; but the runtime's key for the inputs as they are now is {moved}, "
        f"not this entry's {entry.key}: a new process misses it and compiles, so nothing is "
        "served this binary"))


def _key_moved(rebuild: Rebuild) -> tuple[str | None, str]:
    """(the key the runtime computes now, when it differs from the entry's and no live process
    keeps computing the old one, else None; why the key cannot be recomputed, else "")."""
    entry = rebuild.entry
    policy, _ = policy_of(entry)
    if policy is None or entry.key is None:
        return None, "no policy knows the entry's key" if policy is None else "no key"
    try:
        check = policy.check_key(entry, rebuild.record, env=rebuild.env)
    except Exception as exc:  # noqa: BLE001 - a key not recomputed leaves the proof as it is
        return None, f"{type(exc).__name__}: {exc}"
    matches = check.matches(entry.key)
    if matches is None:
        return None, check.note or "the runtime's recipe is not reproducible"
    if matches:
        return None, ""
    if rebuild.record is not None and policy.caches_header_digests and \
            live_process(rebuild.record, policy) is not None:
        return None, ""  # that process still computes the old key (CA106): it is served this
    return check.recomputed, ""


def _unverified(entry: CacheEntry, why: str, rebuild: Rebuild | None = None) -> Verdict:
    return Verdict(entry, "unverified", rebuild=rebuild, note=why, findings=[unverified_finding(
        entry, why, rebuild.origin if rebuild else "the rebuild oracle's plan for the entry")])


# ------------------------------------------------------------------------------ the oracle


def ledger_trust(ledger: Ledger | None, env: Mapping[str, str]
                 ) -> Callable[[CompileRecord], str | None]:
    """Why a record's command needs --yes, or None: another user's ledger file, or a record
    whose seal this user's secret does not confirm."""
    owner = None
    if ledger is not None and ledger.path and os.path.exists(ledger.path):
        uid = os.stat(ledger.path).st_uid
        if uid != os.geteuid():
            owner = f"the ledger {ledger.path} belongs to another user (uid {uid})"
    key = seal.user_key(env, create=False)

    def trust(record: CompileRecord) -> str | None:
        if owner is not None:
            return owner
        checked = seal.check(record, key, env)
        return None if checked.trusted else f"record {record.record_id[:12]}: {checked.reason}"

    return trust


def verify(entries: Sequence[CacheEntry], env: Mapping[str, str], *,
           ledger: Ledger | None = None, options: VerifyOptions | None = None,
           say: Say | None = None) -> VerifyResult:
    """Rebuild `entries` (or a sample of them) and judge each; `say` hears the commands to be
    run and the progress. Raises UntrustedCommands before running anything when a command
    comes from a record this user did not seal and `options.yes` is not set."""
    options = options or VerifyOptions()
    say = say or (lambda _line: None)
    chosen = sample(entries, options.sample, options.seed)
    result = VerifyResult(entries=chosen, total=len(entries), verdicts=[],
                          seed=options.seed if options.sample is not None
                          and options.sample < len(entries) else None)
    if result.seed is not None:
        say(f"sampled {len(chosen)} of {len(entries)} entries (seed {options.seed}): "
            + ", ".join(os.path.basename(e.path) for e in chosen))
    auditor = Auditor(env=env, ledger=ledger, full_records=True)
    auditor.load(chosen)
    trust = ledger_trust(ledger, env)
    rebuilds: list[Rebuild] = []
    for entry in chosen:
        planned = plan(entry, auditor.record_for(entry), env, trust)
        if isinstance(planned, str):
            result.verdicts.append(_unverified(entry, planned))
        else:
            rebuilds.append(planned)
    result.planned = rebuilds
    if options.dry_run:
        return result
    untrusted = [r for r in rebuilds if r.needs_yes]
    if untrusted and not options.yes:
        raise UntrustedCommands(
            f"{len(untrusted)} of the commands to run come from records whose seal does not "
            f"check out here ({untrusted[0].needs_yes}): read them with --dry-run, then run "
            "again with --yes to run them")
    for rebuild in rebuilds:
        say(f"will run for {rebuild.entry.path}: {rebuild.shown()}  # {rebuild.origin}; "
            + "; ".join(rebuild.notes))
    result.verdicts += _run_all(rebuilds, options, say)
    result.verdicts.sort(key=lambda v: v.entry.path)
    return result


def _run_all(rebuilds: Sequence[Rebuild], options: VerifyOptions, say: Say) -> list[Verdict]:
    if not rebuilds:
        return []
    cores = os.cpu_count() or 1
    workers = max(1, min(options.jobs or cores, cores, len(rebuilds)))
    processes = Processes()
    parent = scratch.make_directory("verify")
    verdicts: list[Verdict] = []
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cacheaudit-verify")
    try:
        futures = {pool.submit(judge, r, parent, processes, options.timeout): r
                   for r in rebuilds}
        for done, future in enumerate(as_completed(futures), 1):
            rebuild = futures[future]
            try:
                verdict = future.result()
            except Exception as exc:  # noqa: BLE001 - one entry's failure is its own verdict
                verdict = _unverified(rebuild.entry, f"{type(exc).__name__}: {exc}", rebuild)
            verdicts.append(verdict)
            say(f"[{done}/{len(rebuilds)}] {rebuild.entry.path}: {verdict.outcome}"
                + (f" ({verdict.note})" if verdict.outcome == "unverified" else ""))
    finally:
        processes.kill_all()
        pool.shutdown(wait=True, cancel_futures=True)
        scratch.remove(parent)
    return verdicts


# ------------------------------------------------------------------------------ scan --verify


def verify_scan(result: ScanResult, env: Mapping[str, str], *, ledger: Ledger | None = None,
                options: VerifyOptions | None = None, say: Say | None = None
                ) -> tuple[ScanResult, VerifyResult]:
    """`scan --verify`: the oracle on the scan's suspects. A proven-fresh entry loses its
    inferred findings and CA501 and its other findings say it was proven; a proven-stale one
    gains CA403 (a non-deterministic one CA404); scan-wide findings say what was proven."""
    verified = verify(suspects(result), env, ledger=ledger, options=options, say=say)
    proofs = {v.entry.path: (v.outcome, v.note) for v in verified.verdicts}
    findings = settle(result.findings, proofs) + verified.findings
    return replace(result, findings=findings), verified
