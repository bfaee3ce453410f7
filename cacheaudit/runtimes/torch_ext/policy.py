"""torch.utils.cpp_extension's key: what it covers, and ninja's decision rerun to check it.

Source: torch 2.13 `torch/utils/cpp_extension.py` (`_jit_compile`, `_write_ninja_file`,
`_run_ninja_build`) and `torch/utils/_cpp_extension_versioner.py` (`ExtensionVersioner`).
torch keys a build twice, and neither key is a digest on disk:

1. In one process, `JIT_EXTENSION_VERSIONER.bump_version_if_changed` hashes the source files'
   contents, extra_cflags, extra_cuda_cflags, extra_ldflags, extra_include_paths, the build
   directory, with_cuda, with_sycl, is_python_module and is_standalone. Unchanged: ninja is not
   even run (a memory hit). Headers, the environment and the compiler are not in it.
2. Across processes (and after a version bump), ninja decides: an output is rebuilt when its
   command line differs from the one in .ninja_log, or when an input is newer than it. Its inputs
   are the sources and the headers `-MMD` listed into .ninja_deps: headers reached through
   `-isystem` (torch's own, Python's, any the user adds) or C/CPLUS_INCLUDE_PATH are not among
   them, and the environment (CPATH, ...) and the compiler behind the name `c++` never are.

So "the key" of an entry here is the pair (build.ninja's commands, ninja's mtime verdict): the
commands are digested into the entry's key; the verdict is asked of ninja itself (`ninja -n`),
which is the recomputation: a tracked file that changed while ninja still says "no work to do"
(an edit that kept an older mtime: `cp -p`, `tar x`, `git stash` within the same second) is a
tracked input the key did not see (CA103).
"""

from __future__ import annotations

from collections.abc import Sequence

from cacheaudit.findings import file_evidence, make_finding
from cacheaudit.model import CompileRecord, Finding
from cacheaudit.runtimes._ninja.policy import NinjaPolicy

OBSERVER = "adapter:torch_ext"
TRACKED_HOW = ("ninja's deps log (-MMD: no -isystem or C/CPLUS_INCLUDE_PATH header) plus the "
               "sources; build.ninja's commands")


class TorchExtPolicy(NinjaPolicy):
    """torch's two keys (the module docstring); ninja's half is `NinjaPolicy`'s."""

    runtime = "torch-ext"
    tracked_how = TRACKED_HOW

    def record_findings(self, record: CompileRecord,
                        history: Sequence[CompileRecord]) -> list[Finding]:
        """CA106 from the records of one process: a memory hit (torch's versioner skipped ninja)
        that found a tracked file changed since the process's ninja run for the same build
        directory. Each changed file is reported once, at the first hit that shows it.

        The entry audit of a scan finds the same staleness from the entry (a tracked file that
        differs now, and a memory hit after its mtime); both name the same file and the same
        memory-hit record, so a report that merges the two keys them by (code, subject,
        record). Only this check sees a header edited and restored in between, or one whose
        build directory is gone; only the scan sees a process that never recorded a hit.
        """
        if record.event != "memory-hit" or record.runtime != self.runtime or not record.entry:
            return []
        baseline: CompileRecord | None = None
        earlier_hits: list[CompileRecord] = []
        for previous in history:
            # Only the adapter's records carry the tracked files' states (the shim's link record
            # of the same library, once a scan attributes it, carries objects).
            if previous.entry != record.entry or previous.observer != OBSERVER:
                continue
            if previous.event in ("compile", "disk-hit"):
                baseline, earlier_hits = previous, []
            elif previous.event == "memory-hit":
                earlier_hits.append(previous)
        if baseline is None:
            return []
        then = {s.path: s for s in baseline.sources}
        if baseline.graph is not None:
            then.update((f.path, f.state) for f in baseline.graph.files)
        tracked = set(baseline.tracked or ())
        reported = {s.path: s.digest for hit in earlier_hits for s in hit.sources}
        findings = []
        for now in record.sources:
            old = then.get(now.path)
            if old is None or (tracked and now.path not in tracked) or old.same_content(now):
                continue
            if now.path in reported and reported[now.path] == now.digest:
                continue  # an earlier hit of this run already showed this change
            findings.append(make_finding(
                "CA106", subject=now.path, record=record,
                message=f"torch's in-process versioner served {record.kernel} from memory "
                        f"(pid {record.pid}) after this header changed; ninja would rebuild it "
                        f"in a new process, but the versioner never looks at headers",
                recorded=file_evidence(old), current=file_evidence(now),
                how="states of ninja's tracked files recorded by the adapter at the process's "
                    "ninja run and at this memory hit"))
        return findings


POLICIES = {"torch-ext": TorchExtPolicy()}
