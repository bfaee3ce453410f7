"""The key of a runtime whose cache is a ninja build directory, and ninja's decision rerun.

torch.utils.cpp_extension and FlashInfer's JIT both leave the decision to rebuild to ninja run in
the entry's directory: an output is rebuilt when its command line differs from the one in
.ninja_log or an input is newer than it. The inputs are the sources and the headers the
compiler's depfile listed into .ninja_deps; the environment and the compiler behind a name are
never among them, and contents are never compared. So "the key" of such an entry is the pair
(build.ninja's commands, ninja's mtime verdict): the commands are digested into the entry's key
by the runtime's layout; the verdict is asked of ninja itself (`ninja -n`), which is the
recomputation. A tracked file that changed while ninja still says "no work to do" (an edit that
kept an older mtime: `cp -p`, `tar x`, a reinstall) is a tracked input the key did not see
(CA103).

`NinjaPolicy` holds what the two share; each runtime's policy says what its tracked set misses
(`tracked_how`) and adds its own hooks.
"""

from __future__ import annotations

import os
import shlex
import shutil
from collections.abc import Mapping

from cacheaudit import seal
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity
from cacheaudit.policy import KeyCheck, KeyComponent, Policy, TrackedSet


class NinjaPolicy(Policy):
    """A Policy for entries that are ninja build directories (build.ninja, .ninja_deps)."""

    flavour: str | None = None  # no <PREFIX>_JIT_* family
    tracked_how: str = "ninja's deps log plus the sources; build.ninja's commands"
    """How the tracked set is made, in the words a finding shows."""
    compile_rules: tuple[str, ...] = ("compile", "cuda_compile")
    """The rules whose edges compile one source (the first is the dependency command)."""

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        """The record's tracked set (what ninja's deps log held right after that build), else
        the deps log and build.ninja in the entry now."""
        if record is not None and record.tracked is not None:
            return TrackedSet(frozenset(record.tracked), how=self.tracked_how)
        from cacheaudit.graph import NinjaDepsLogError
        from cacheaudit.runtimes._ninja.build import (
            BUILD_FILE,
            NinjaSyntaxError,
            read_build_file,
            read_deps_log,
            tracked_paths,
        )

        try:
            build = read_build_file(os.path.join(entry.path, BUILD_FILE))
            deps = read_deps_log(entry.path)
        except (OSError, NinjaSyntaxError, NinjaDepsLogError) as exc:
            sources = {entry.source.path} if entry.source is not None else set()
            return TrackedSet(frozenset(sources), error=str(exc), how=self.tracked_how)
        return TrackedSet(tracked_paths(build, deps), how=self.tracked_how + " (read now)")

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        """The key as ninja would see it now: build.ninja's commands (the entry's key) and ninja's
        verdict. "No work to do" recomputes the same key (a hit would be served); work to do
        recomputes another (the next build rebuilds). ninja runs in `env` (the audit's
        environment, else this process's), with the recorded build's PATH."""
        from cacheaudit.runtimes._ninja.build import ninja_dry_run

        if entry.key is None:
            return KeyCheck(None, note="build.ninja cannot be read")
        # The ninja the build ran (both runtimes run `ninja` from PATH): another version may not
        # read its logs (ninja 1.11 starts over on a 1.12+ build log) and would claim a rebuild.
        # A PATH from a ledger picks which ninja runs: taken only from a record this user sealed.
        run_env = dict(os.environ if env is None else env)
        if record is not None and record.env.get("PATH") and seal.check(
                record, seal.user_key(run_env, create=False)).trusted:
            run_env["PATH"] = record.env["PATH"]
        ninja = shutil.which("ninja", path=run_env.get("PATH", ""))
        if ninja is None:
            return KeyCheck(None, note="ninja is not on PATH: its decision cannot be asked")
        dry = ninja_dry_run(entry.path, run_env)
        commands = KeyComponent("build.ninja commands", f"{len(entry.meta.get('commands', []))} "
                                f"edges", entry.key)
        if dry.work is None:
            return KeyCheck(None, (commands,), note=dry.error or "ninja -n failed")
        if not dry.work:
            verdict = KeyComponent(f"ninja's decision ({ninja} -n)", "no work to do")
            return KeyCheck(entry.key, (commands, verdict))
        reasons = "; ".join(dry.explain[:5]) or f"{len(dry.commands)} commands to run"
        verdict = KeyComponent(f"ninja's decision ({ninja} -n)", f"would rebuild: {reasons}")
        return KeyCheck(f"{entry.key}+rebuild", (commands, verdict))

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        # build.ninja holds the compiler's name or path, so naming another one rebuilds; the
        # binary behind an unchanged name and its version are in no part of the key, and the
        # audit compares exactly that: the identity behind the recorded path.
        return False

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        """The first compile edge of build.ninja, with the compiler resolved on PATH (ninja runs
        it through the shell, in the build directory)."""
        from cacheaudit.runtimes._ninja.build import strip_wrapper

        for command in entry.meta.get("commands", []):
            if command.get("rule") not in self.compile_rules:
                continue
            try:
                tokens, _ = strip_wrapper(shlex.split(command.get("command", "")))
            except ValueError:
                return None
            if not tokens:
                return None
            found = tokens[0] if "/" in tokens[0] else shutil.which(tokens[0])
            return [found or tokens[0], *tokens[1:]], entry.path
        return None
