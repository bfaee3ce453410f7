"""cuda.core's program-cache key: what it covers, recomputed; and the headers it does not see.

The key's recipe, and the key recomputed from a compile record's `key_inputs`, are in `keys.py`
(the adapter describes the inputs with the same module).

Covered: the source text, the flags, the NVRTC major.minor, the program name. Not covered: any
file. The key refuses (ValueError) `include_path`, `pre_include`, `pch`, `use_pch`, `pch_dir` and a
name with a directory unless the caller passes `extra_digest`, and then trusts that digest
(NVIDIA/cuda-python PR #2555: `extra_digest=0`, or any constant, passes the guard). With a bare
name (the default "default_program" included) NVRTC resolves a quoted `#include` against the
process's working directory, and nothing guards that (the review finding of PR #1912; the
feature request for header-aware keys is #1785): an edit to that header is served stale, which
was reproduced here (platform-notes.md §2, jit-runtimes.md §9). The NVRTC patch version
(13.0.48 vs 13.0.88) and the process's working directory are not in the key either.

The tracked set therefore holds files only when `extra_digest` is a `cacheaudit.headers`
fingerprint (whose files and recipe are known, so the key can be recomputed from the headers on
disk now); a caller's own digest cannot be verified (CA501).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cacheaudit.findings import file_evidence, make_finding
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, Finding
from cacheaudit.policy import KeyCheck, KeyComponent, Policy, TrackedSet
from cacheaudit.runtimes.cuda_core.keys import (
    FROM_CALLER,
    FROM_HEADERS,
    KEY_RECIPE,
    KeyRecipeError,
    entry_name,
    fingerprint_files,
    recompute_key,
    recorded_key_inputs,
)

__all__ = ["POLICIES", "CudaCorePolicy", "KeyRecipeError", "recompute_key"]


class CudaCorePolicy(Policy):
    runtime = "cuda-core"
    # The key takes the caller's extra_digest afresh at every compile: a live process keeps no
    # header digest of its own. A caller that reuses an old fingerprint is caught by
    # record_findings (CA106), not inferred from the process table.
    caches_header_digests = False

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        inputs = recorded_key_inputs(record)
        if not inputs:
            return TrackedSet(frozenset(), error=(
                "what the key covered was not observed: the compile was recorded without "
                "cacheaudit's key observer (the cuda.core adapter)"), how=KEY_RECIPE)
        source = inputs.get("extra_digest_source")
        if source == FROM_HEADERS:
            files = fingerprint_files(inputs)
            return TrackedSet(frozenset(files), how=(
                f"{KEY_RECIPE}; extra_digest is the cacheaudit.headers fingerprint over "
                f"{len(files)} header(s)"))
        if source == FROM_CALLER:
            graph = record.graph.paths if record is not None and record.graph else ()
            return TrackedSet(frozenset(graph), error=(
                f"extra_digest was computed by the caller, not by cacheaudit.headers: whether it "
                f"covers the {len(graph)} header(s) the compile read cannot be verified"),
                how=KEY_RECIPE)
        how = f"{KEY_RECIPE}; no extra_digest: no file the compile read is in the key"
        if inputs.get("unguarded"):
            how += (" (a program name without a directory: NVRTC read quoted includes from the "
                    "working directory, which cuda.core's guard does not cover)")
        return TrackedSet(frozenset(), how=how)

    def key_components(self, entry: CacheEntry | None, record: CompileRecord | None
                       ) -> tuple[list[KeyComponent], bytes | None, str]:
        """The labelled parts and the key as cuda.core would compute it now."""
        inputs = recorded_key_inputs(record)
        if not inputs:
            return [], None, "no recorded key inputs"
        extra: bytes | None = None
        digest_note = "none"
        if inputs.get("extra_digest") is not None:
            if inputs.get("extra_digest_source") == FROM_HEADERS:
                from cacheaudit.runtimes.cuda_core.headers import digest_now

                fingerprint = inputs.get("fingerprint") or {}
                extra = digest_now(fingerprint_files(inputs), fingerprint.get("missing") or ())
                digest_note = (f"cacheaudit.headers fingerprint over "
                               f"{len(fingerprint_files(inputs))} header(s), recomputed now")
            else:
                return [], None, ("extra_digest came from the caller: its recipe is unknown, so "
                                  "the key cannot be recomputed from the headers now")
        try:
            key = recompute_key(inputs, extra)
        except KeyRecipeError as exc:
            return [], None, str(exc)
        components = [
            KeyComponent("schema", str(inputs.get("schema"))),
            KeyComponent("nvrtc version", str(inputs.get("nvrtc_version"))),
            KeyComponent("code type / target", f"{inputs.get('code_type')} -> "
                                               f"{inputs.get('target_type')}"),
            KeyComponent("code", f"{inputs.get('code_size')} bytes",
                         str(inputs.get("code_sha256"))),
            KeyComponent("options", " ".join(inputs.get("option_bytes") or [])),
            KeyComponent("name expressions", ", ".join(inputs.get("name_expressions") or [])
                         or "(none)"),
            KeyComponent("options.name", str(inputs.get("name"))),
            KeyComponent("extra_digest", digest_note, extra.hex() if extra else None),
        ]
        return components, key, ""

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        components, key, note = self.key_components(entry, record)
        if key is None:
            return KeyCheck(None, tuple(components), note)
        # A FileStreamProgramCache entry is named by sha256 of the key; other layouts keep none.
        recomputed = entry_name(key) if entry.layout == "cuda_core" else key.hex()
        return KeyCheck(recomputed, tuple(components))

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        # Only NVRTC's major.minor is keyed; a patch release behind the same version is not.
        return recorded.version_line != current.version_line

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        return None  # the cache keeps no source: nothing to re-run

    def record_findings(self, record: CompileRecord,
                        history: Sequence[CompileRecord]) -> list[Finding]:
        """What records show on their own (the entry audit judges FileStream entries on disk):

        - a hit served after a file it was built from changed (checked by the adapter against the
          hit's time): CA106 when the file was covered by a cacheaudit.headers `extra_digest` the
          caller kept passing after the change; CA101 for an in-memory hit after an untracked
          header (working directory) changed;
        - a compile cuda.core's guard missed (bare name, quoted include, no extra_digest): CA501
          when what it read could not be recorded; for an in-memory cache, CA102 for the files
          it read from the working directory (an edit would go unseen in that process).
        """
        if record.runtime != "cuda-core":
            return []
        findings: list[Finding] = []
        inputs = recorded_key_inputs(record)
        for change in record.extra.get("changed_before_hit") or []:
            path = str(change.get("path"))
            recorded = file_evidence(change.get("recorded") or {})
            current = file_evidence(change.get("current") or {})
            if change.get("kind") == "extra-digest":
                findings.append(make_finding(
                    "CA106", subject=path, record=record,
                    message=("this header changed before the hit, but the extra_digest passed "
                             "with the key was computed before the change: cuda.core's key did "
                             "not move and the old binary was served"),
                    recorded=recorded, current=current,
                    how=("cacheaudit.headers fingerprint state against the file when the hit "
                         "was served (its change predates the hit)")))
            elif record.event == "memory-hit":
                findings.append(make_finding(
                    "CA101", subject=path, record=record,
                    message=("the in-memory program cache served a binary built before this "
                             "header changed: the key does not cover it"
                             + (" (a quoted include read from the working directory)"
                                if inputs.get("unguarded") else "")),
                    recorded=recorded, current=current,
                    how=("content hash at the compile, in this process, against the file "
                         "when the hit was served (its change predates the hit)")))
        if record.event != "compile" or not inputs.get("unguarded"):
            return findings
        if record.graph is None:
            why = "; ".join(n for n in record.notes if "could not" in n) or "no trace recorded"
            findings.append(make_finding(
                "CA501", subject=str(record.kernel or record.key), record=record,
                message=("cuda.core keyed this compile without any header, and what it read "
                         f"from the working directory could not be recorded: {why}"),
                how="adapter record: bare program name, quoted #include, no extra_digest"))
        elif record.entry is None:
            working = record.extra.get("from_working_directory") or []
            untracked = [f.path for f in record.graph.files]
            if untracked:
                findings.append(make_finding(
                    "CA102", subject=f"{len(untracked)} untracked header(s)", record=record,
                    message=(f"the compile read {', '.join(untracked[:5])} (from the working "
                             f"directory: {len(working)}); cuda.core's key covers none of "
                             "them, so an edit is served stale for the life of this cache"),
                    how=("NVRTC's --fdevice-time-trace of the same source and options; "
                         "no extra_digest")))
        return findings


POLICIES = {"cuda-core": CudaCorePolicy()}
