"""NVRTC (through cuda-python's `cuda.bindings.nvrtc`): no cache, no key, two record-level checks.

NVRTC compiles what it is handed and keeps nothing between calls except one thing: with `--pch`
(automatic precompiled headers) it keeps the PCHs it made in a per-process registry and uses them
again for a later program with the same header prefix and command line, without looking at the
headers again. Measured with NVRTC 13.0.88 (and 13.5.37): after an edit of the header, in-memory
or on disk, the same process keeps getting the binary of the old header, and the log says
`using precompiled header file "..."`. Callers that cache NVRTC's output (cuda.core, CuPy)
compute their own keys; their policies judge those.

So there is no entry to key, and this policy's work is `record_findings`, over the records the
NVRTC adapter writes (runtimes/nvrtc/adapter.py; what a record says of a PCH: pch.py):

- CA106 when a compile reused a PCH and a header the PCH stands for differs between the record of
  the compile that created the PCH (its include graph, captured right after that compile) and the
  state the adapter captured when the PCH was reused. Proven when the reusing compile's own trace
  tells which headers the PCH held (`coverage` "exact"); inferred (marked so) when the PCH's
  header set is taken as the creating compile's whole graph.
- CA501 when a successful compile has no include graph: the trace could not be taken (the record
  says why).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cacheaudit.evidence import Evidence, FileEvidence
from cacheaudit.findings import make_finding
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, FileState, Finding
from cacheaudit.policy import KeyCheck, Policy, TrackedSet

_NOTHING_KEYED = ("NVRTC keeps no cache and computes no key: nothing it compiles is keyed by "
                  "NVRTC itself; a caller's cache (cuda.core, CuPy) is judged by its own policy")


def _pch(record: CompileRecord) -> Mapping[str, Any] | None:
    pch = record.extra.get("pch") if record.extra else None
    return pch if isinstance(pch, Mapping) else None


def _short(digest: str | None) -> str:
    return digest[:16] if digest else "(missing)"


class NvrtcPolicy(Policy):
    runtime = "nvrtc"
    """NVRTC reads no `<PREFIX>_JIT_*` family (nor CPATH: platform-notes.md §2)."""

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        return TrackedSet(frozenset(), how=_NOTHING_KEYED)

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        return KeyCheck(None, note=_NOTHING_KEYED)

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        # No key: a new libnvrtc changes no key, and there is no hit for it to make stale.
        return False

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        return None

    def record_findings(self, record: CompileRecord,
                        history: Sequence[CompileRecord]) -> list[Finding]:
        findings: list[Finding] = []
        pch = _pch(record)
        if pch is not None and pch.get("event") == "reused":
            findings += self._stale_pch(record, pch, history)
        if record.succeeded and record.graph is None and record.observer.startswith("adapter:"):
            reason = str(record.graph_problem or "no trace was taken")
            findings.append(make_finding(
                "CA501", subject=record.kernel or "(unknown NVRTC program)", record=record,
                message=f"the headers NVRTC read for {record.kernel or 'this program'} are "
                        f"unknown: {reason}",
                recorded=None, current=None,
                how="the NVRTC adapter's record of this compile carries no include graph"))
        return findings

    def _stale_pch(self, record: CompileRecord, pch: Mapping[str, Any],
                   history: Sequence[CompileRecord]) -> list[Finding]:
        now = {}
        for data in pch.get("headers") or ():
            if isinstance(data, Mapping) and "path" in data:
                state = FileState.from_dict(data)
                now[state.path] = state
        creator = self._creator(pch, history)
        file = pch.get("file") or pch.get("file_assumed") or "(unnamed PCH)"
        inferred = pch.get("coverage") != "exact" or not pch.get("file")
        coverage = str(pch.get("coverage_how") or "")
        findings = []
        if creator is not None and creator.graph is not None:
            recorded = {f.path: f.state for f in creator.graph.files}
            for path, current in now.items():
                before = recorded.get(path)
                if before is None or before.same_content(current):
                    continue
                findings.append(self._finding(
                    record, path, before.digest, current.digest if current.exists else None,
                    file, inferred,
                    how=f"{pch.get('how', 'NVRTC reused the PCH')}; the header's state in the "
                        f"record of compile {creator.record_id}, which created the PCH, against "
                        f"its state when this compile reused it; headers compared: {coverage}"))
            return findings
        # The creating record is not among those audited (another test's, or lost): the
        # adapter compared both states itself, in the process, when the PCH was reused.
        for change in pch.get("changed") or ():
            if isinstance(change, Mapping) and change.get("path"):
                findings.append(self._finding(
                    record, str(change["path"]), change.get("recorded"), change.get("current"),
                    file, inferred,
                    how=f"{pch.get('how', 'NVRTC reused the PCH')}; compared in the process by "
                        f"the NVRTC adapter against the states recorded by compile "
                        f"{pch.get('created_by') or '(unknown)'} (not among the records "
                        f"audited); headers compared: {coverage}"))
        return findings

    @staticmethod
    def _creator(pch: Mapping[str, Any],
                 history: Sequence[CompileRecord]) -> CompileRecord | None:
        created_by = pch.get("created_by")
        file = pch.get("file")
        for earlier in reversed(history):
            if created_by and earlier.record_id == created_by:
                return earlier
        if created_by:
            return None
        for earlier in reversed(history):
            other = _pch(earlier)
            if other is not None and other.get("event") == "created" and file \
                    and other.get("file") == file:
                return earlier
        return None

    @staticmethod
    def _finding(record: CompileRecord, path: str, recorded: str | None, current: str | None,
                 file: str, inferred: bool, how: str) -> Finding:
        kernel = record.kernel or "a program"
        return make_finding(
            "CA106", subject=path, record=record, inferred=inferred,
            message=f"NVRTC compiled {kernel} from the precompiled header {file}, made before "
                    f"{path} changed: the binary holds the old header (xxh3 "
                    f"{_short(recorded)} then, {_short(current)} now)",
            recorded=recorded, current=current, how=how,
            evidence=Evidence(*(None if digest is None else FileEvidence(path, True, digest=digest)
                                for digest in (recorded, current))))


POLICIES = {"nvrtc": NvrtcPolicy()}
