"""Checks of an entry's inputs against the disk now (CA101-CA106).

Every file the compile read is compared with the file now: an untracked one that changed is a
stale hit (CA101), an unchanged one a future one (CA102), a vanished one CA104. A tracked one that
changed must move the key: the policy's recomputation tells (CA103 when it does not), and a live
runtime process that hashed the header before it changed keeps the old key (CA106). A header that
now comes earlier in the include search path shadows the one used (CA105).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from cacheaudit import compilers
from cacheaudit.audit.context import AuditContext, FileChange, live_process
from cacheaudit.digest import normalise_path
from cacheaudit.evidence import PathEvidence, TimeEvidence, ValueEvidence
from cacheaudit.findings import PROVE_HINT, file_evidence, make_finding, ns_text
from cacheaudit.model import CacheEntry, CompileRecord, FileState, Finding, IncludeGraph
from cacheaudit.policy import Policy, TrackedSet

UNKNOWN_HOW = ("timestamps: the entry predates recording and its inputs come from a dependency "
               "pass run after the build; this file's mtime or ctime is later than the binary, "
               "so its content at build time is unknown (inferred, not proven by content)")


def content_unknown(record: CompileRecord, entry: CacheEntry, state: FileState) -> bool:
    """Whether the recorded content of an input is not what the compiler read: a
    reconstruction that found the file changed after the build stored no digest for it (and
    one stored before that rule kept today's content under a later mtime or ctime)."""
    if not record.reconstructed:
        return False
    if state.path in record.unknown_at_build:
        return True
    built = entry.built_ns
    return built is not None and state.exists and max(state.mtime_ns, state.ctime_ns) > built


def input_findings(context: AuditContext, entry: CacheEntry, record: CompileRecord,
                   policy: Policy, tracked: TrackedSet) -> list[Finding]:
    """CA101, CA102, CA104 for untracked inputs; CA103, CA106 (and CA501 where the key cannot
    be recomputed) for tracked ones; CA501 for a changed input when the tracked set is unknown
    or the input's content at build time is."""
    findings: list[Finding] = []
    graph = record.graph
    if graph is None:
        return findings
    changes = context.changes(graph)
    inferred = record.reconstructed
    if inferred:
        # Unknown build-time content is reported on every scan, changed since or not: only a
        # rebuild can say whether the binary holds what is there now.
        listed = {old.path for old, _new in changes}
        changes = changes + [(f.state, f.state) for f in graph.files
                             if f.path not in listed and content_unknown(record, entry, f.state)]
    changed_tracked: list[FileChange] = []
    unknown_tracked: list[FileChange] = []
    seen: set[str] = set()
    for old, new in changes:
        if old.path in seen:
            continue
        seen.add(old.path)
        unknown = content_unknown(record, entry, old)
        if not new.exists:
            findings.append(make_finding(
                "CA104", subject=old.path, entry=entry, record=record, inferred=inferred,
                message="a file the compiler read is gone: the next compile of this kernel "
                        "reads something else, while the cached binary still holds it",
                recorded=file_evidence(old), current=file_evidence(new),
                how="stat of the recorded path" + (" (the include graph was reconstructed "
                                                   "after the build)" if inferred else "")))
        elif old.path in tracked.paths:
            # A tracked file's change is the key's business: recomputing the key tells whether
            # the runtime would see it.
            (unknown_tracked if unknown else changed_tracked).append((old, new))
        elif unknown:
            findings.append(make_finding(
                "CA501", subject=old.path, entry=entry, record=record, inferred=True,
                message=f"this input changed after the binary was written "
                        f"({ns_text(entry.built_ns)}) and the compile was not recorded: what "
                        f"the compiler read is unknown, so whether a hit serves a stale binary "
                        f"is unverified{_untracked_words(tracked)}; a rebuild compared with the "
                        f"binary tells",
                recorded=TimeEvidence("binary written", entry.built_ns or 0),
                current=TimeEvidence("mtime", new.mtime_ns if new.exists else old.mtime_ns),
                how=UNKNOWN_HOW, hint=PROVE_HINT))
        elif not tracked.known:
            findings.append(make_finding(
                "CA501", subject=old.path, entry=entry, record=record, inferred=inferred,
                message=f"this input changed since the build, and whether the key covers it "
                        f"is unknown ({tracked.error}): a hit may serve a stale binary or the "
                        f"runtime may have missed; unverified",
                recorded=file_evidence(old), current=file_evidence(new),
                how=f"content hash against the record; the tracked set could not be computed "
                    f"({tracked.how})"))
        else:
            last_hit = entry.committed_ns if entry.committed_ns and (
                entry.committed_ns > new.mtime_ns) else None
            served = (f"; the runtime has hit the entry since ({ns_text(last_hit)})"
                      if last_hit else "")
            how = "content hash (xxh3-128) of the recorded file against the file now"
            if inferred:
                how = ("content hash (xxh3-128) of the file as a scan found it after the build "
                       "(unchanged since the build by its mtime and ctime) against the file "
                       "now; the include graph was reconstructed by a dependency pass "
                       "(inferred)")
            findings.append(make_finding(
                "CA101", subject=old.path, entry=entry, record=record, inferred=inferred,
                message=f"untracked dependency changed since the build, key unchanged: a "
                        f"hit serves a binary built from the old content{served}",
                recorded=file_evidence(old), current=file_evidence(new), how=how))
    findings += tracked_change_findings(context, entry, record, policy, changed_tracked,
                                        unknown_tracked)
    if not tracked.known:
        return findings  # which files are untracked is what cannot be said
    count, top = context.untracked(graph, tracked.paths | seen,
                                   trees=_search(context, record),
                                   system=_system(context, record))
    if count:
        findings.append(make_finding(
            "CA102", subject=f"{count} untracked dependenc{'y' if count == 1 else 'ies'}",
            entry=entry, record=record, inferred=inferred,
            message=f"the compiler read {count} file{'' if count == 1 else 's'} the key does "
                    f"not cover, unchanged so far; an edit to any of them would go unseen "
                    f"({top})",
            how=f"include graph ({graph.method}{', reconstructed' if inferred else ''}) minus "
                f"the tracked set ({tracked.how})"))
    return findings


def _untracked_words(tracked: TrackedSet) -> str:
    if tracked.known:
        return " (the key does not cover it)"
    return f" (and whether the key covers it is unknown: {tracked.error})"


def tracked_change_findings(context: AuditContext, entry: CacheEntry, record: CompileRecord,
                            policy: Policy, changes: list[FileChange],
                            unknown: Sequence[FileChange] = ()) -> list[Finding]:
    """What a changed tracked input means: the key recomputed from the disk now either moved
    (nothing to say), or did not (CA103), or a live process keeps the old key (CA106).

    `unknown` are tracked inputs whose content at build time is unknown (changed after an
    unrecorded build): the key alone can speak for them. Recomputed equal, their content now
    is what the key covered then; different, the runtime misses; not recomputable, CA501."""
    findings: list[Finding] = []
    if not changes and not unknown and not context.options.verify_keys:
        return findings
    check = policy.check_key(entry, record, env=context.env)
    matches = check.matches(entry.key)
    for old, new in unknown:
        if matches is None:
            findings.append(make_finding(
                "CA501", subject=old.path, entry=entry, record=record, inferred=True,
                message=f"a tracked input changed after the binary was written "
                        f"({ns_text(entry.built_ns)}) and the compile was not recorded; the "
                        f"key cannot be recomputed to tell whether the runtime sees it"
                        f"{': ' + check.note if check.note else ''}",
                recorded=TimeEvidence("binary written", entry.built_ns or 0),
                current=file_evidence(new), how=UNKNOWN_HOW))
    if not changes:
        if matches is False and not unknown:
            findings.append(make_finding(
                "CA501", subject=entry.path, entry=entry, record=record,
                message="the key recomputed from unchanged inputs differs from the entry's: "
                        "this runtime version keys differently from the policy, so claims "
                        "about its tracked set are unverified",
                recorded=ValueEvidence("key", entry.key),
                current=ValueEvidence("key", check.recomputed), how="key recomputation"))
        return findings
    proven = memory_hits_after(context, entry, changes)
    live = live_process(record, policy) if policy.caches_header_digests else None
    inferred = record.reconstructed
    for old, new in changes:
        if old.path in proven:
            findings.append(proven[old.path])
        elif matches is True:
            findings.append(make_finding(
                "CA103", subject=old.path, entry=entry, record=record, inferred=inferred,
                message="a tracked input changed but the key recomputed from it did not: the "
                        "runtime would serve the old binary",
                recorded=file_evidence(old), current=file_evidence(new),
                how=f"key recomputation ({entry.key}) with the file as it is now"
                    + ("; the recorded content is the file as a scan found it after the build, "
                       "unchanged since the build by its mtime and ctime (inferred)"
                       if inferred else "")))
        elif live is not None:
            pid, process_how = live
            findings.append(make_finding(
                "CA106", subject=old.path, entry=entry, record=record,
                message=f"a tracked header changed after the runtime in process {pid} "
                        f"hashed it; that process caches header digests for its lifetime and "
                        f"keeps computing the old key",
                recorded=file_evidence(old), current=file_evidence(new),
                how=f"content hash; {process_how} (inferred from the process table)",
                inferred=True))
        elif matches is None and check.note:
            findings.append(make_finding(
                "CA501", subject=old.path, entry=entry, record=record, inferred=inferred,
                message=f"a tracked input changed and the key cannot be recomputed to "
                        f"confirm the runtime sees it: {check.note}",
                recorded=file_evidence(old), current=file_evidence(new),
                how="key recomputation"))
    return findings


def memory_hits_after(context: AuditContext, entry: CacheEntry, changes: list[FileChange]
                      ) -> dict[str, Finding]:
    """CA106 proven: an in-process observer saw a memory hit after a tracked file changed."""
    proven: dict[str, Finding] = {}
    for hit in context.lookups_for(entry):
        if hit.event != "memory-hit":
            continue
        for old, new in changes:
            if hit.started_ns > new.mtime_ns and old.path not in proven:
                proven[old.path] = make_finding(
                    "CA106", subject=old.path, entry=entry, record=hit,
                    message=f"the runtime served this kernel from memory at "
                            f"{ns_text(hit.started_ns)} (pid {hit.pid}), after this tracked "
                            f"header changed: its in-process header digests were stale",
                    recorded=file_evidence(old), current=file_evidence(new),
                    how="memory hit observed in the runtime's process after the file's mtime")
    return proven


# ------------------------------------------------------------------------------ search paths


_SYSTEM_TREES = ("/usr/include", "/usr/local/include", "/usr/lib/gcc", "/usr/lib64/gcc",
                 "/usr/libexec/gcc", "/usr/lib/clang", "/usr/lib64/clang", "/usr/lib/llvm",
                 "/usr/local/cuda", "/opt/rocm")
"""Where compilers keep their own headers: the C library's, the compiler's (libstdc++, its
intrinsics), the CUDA toolkit's default place. A user edits a CUTLASS checkout, not these."""


def system_directories(record: CompileRecord) -> tuple[str, ...]:
    """The compiler's own include trees for `record`: the usual system places, and the CUDA
    toolkit the compile used (the nvcc's `<home>/bin/nvcc` and the record's CUDA_HOME or
    CUDA_PATH), whose `include/` and `targets/` hold the toolkit's headers."""
    homes: list[str] = []
    compiler = record.compiler
    if compiler is not None and compiler.kind == "nvcc":
        for path in (compiler.resolved, compiler.path):
            if path and os.path.basename(os.path.dirname(path)) == "bin":
                homes.append(os.path.dirname(os.path.dirname(path)))
    homes += [record.env[name] for name in ("CUDA_HOME", "CUDA_PATH") if record.env.get(name)]
    toolkit = [os.path.join(normalise_path(home, record.cwd or "/"), part)
               for home in homes for part in ("include", "targets")]
    return tuple(dict.fromkeys((*_SYSTEM_TREES, *toolkit)))


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


def find_shadows(graph: IncludeGraph, directories: Sequence[str],
                 started_ns: int) -> list[tuple[str, str]]:
    """(header used, header now earlier in the search path) for each graph file that a file
    created or changed since the compile started now shadows."""
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


def _search(context: AuditContext, record: CompileRecord) -> tuple[str, ...]:
    """`search_directories`, once per scan for each command line: thousands of entries share
    one, and each directory costs a realpath."""
    key = (record.compiler.kind if record.compiler else None,
           tuple(t.text for t in record.effective_argv), record.cwd,
           tuple(record.env.get(n) for n in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")))
    found = context.memos.search.get(key)
    if found is None:
        found = context.memos.search[key] = tuple(search_directories(record))
    return found


def _system(context: AuditContext, record: CompileRecord) -> tuple[str, ...]:
    """`system_directories`, once per scan for each compiler and toolkit."""
    compiler = record.compiler
    key = (compiler.kind, compiler.resolved, compiler.path) if compiler else None, (
        record.cwd, record.env.get("CUDA_HOME"), record.env.get("CUDA_PATH"))
    found = context.memos.system.get(key)
    if found is None:
        found = context.memos.system[key] = system_directories(record)
    return found


def _shadows(context: AuditContext, record: CompileRecord, graph: IncludeGraph
             ) -> list[tuple[str, str]]:
    memos = context.memos
    directories = _search(context, record)
    memo_key = (graph.digest, directories)
    if memo_key not in memos.shadows:
        memos.shadows[memo_key] = find_shadows(graph, directories, record.started_ns)
    return memos.shadows[memo_key]


def shadow_findings(context: AuditContext, entry: CacheEntry, record: CompileRecord,
                    policy: Policy, tracked: TrackedSet) -> list[Finding]:
    """CA105 for an untracked header now shadowed; CA106 for a tracked one, when the runtime
    that hashed it by name still runs."""
    if record.graph is None:
        return []
    findings: list[Finding] = []
    live: tuple[int, str] | None = None
    looked = not policy.caches_header_digests
    for original, shadow in _shadows(context, record, record.graph):
        if os.path.realpath(shadow) not in tracked.paths:
            findings.append(make_finding(
                "CA105", subject=original, entry=entry, record=record,
                message=f"{shadow} now comes earlier in the include search path than the "
                        f"header the compiler used: a new compile reads it, the cached "
                        f"binary does not",
                recorded=PathEvidence(original), current=PathEvidence(shadow),
                how="search path rebuilt from the recorded -I/-isystem/CPATH, checked on "
                    "disk now"))
            continue
        # The runtime's own parser finds the shadow first and hashes it: a new runtime
        # computes another key and misses. Only a runtime that hashed the old header by
        # name and still runs goes on with the old key.
        if not looked:
            live, looked = live_process(record, policy), True
        if live is not None:
            pid, process_how = live
            findings.append(make_finding(
                "CA106", subject=original, entry=entry, record=record, inferred=True,
                message=f"{shadow} now shadows this tracked header in the runtime's own "
                        f"search order, after the runtime in process {pid} hashed the "
                        f"header by name; that process keeps computing the old key",
                recorded=PathEvidence(original), current=PathEvidence(shadow),
                how=f"the tracked set resolved now ({tracked.how}); {process_how} "
                    f"(inferred from the process table)"))
    return findings
