"""Policies: what each runtime's cache key covers, and a recomputation of that key where possible.

A policy turns "the runtime keys on X" from an assumption into a check: it computes the tracked set
by the runtime's own rules (DeepJIT's prefix parser, DeepGEMM's include regex) and, where the
entry carries enough, recomputes the runtime's digest from the files on disk now. The audit then
compares: a tracked file that changed must change the key (else CA103), an untracked one that
changed never does (CA101).

A runtime package's `policy.py` subclasses `Policy` and exposes `POLICY`; the registry
(`cacheaudit.runtimes`) finds it through the runtime's spec. Runtimes that share a recipe share a
module (DeepEP's spec names DeepGEMM's policy module).
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from cacheaudit.digest import is_settled, read_file
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, Finding


@dataclass(frozen=True)
class KeyComponent:
    """One labelled part of a runtime's key, in the order the runtime hashes it."""

    label: str
    value: str
    digest: str | None = None


@dataclass(frozen=True)
class TrackedSet:
    """The inputs a runtime's key covers for one entry, found by the runtime's own rules."""

    paths: frozenset[str]
    names: Mapping[str, str] = field(default_factory=dict)
    error: str | None = None
    """Why the rules could not be followed to the end: `paths` is then a part of the tracked
    set at most, and a file outside it may be tracked or not (`known` is False)."""
    how: str = ""

    @property
    def known(self) -> bool:
        """Whether `paths` is the whole tracked set: a file outside it is untracked."""
        return self.error is None


@dataclass(frozen=True)
class KeyCheck:
    """The runtime's key recomputed from the entry and the files on disk now."""

    recomputed: str | None
    components: tuple[KeyComponent, ...] = ()
    note: str = ""

    def matches(self, key: str | None) -> bool | None:
        if self.recomputed is None or key is None:
            return None
        return self.recomputed == key


@dataclass(frozen=True)
class ConfigurationChange:
    """One setting a runtime read when it was constructed and that differs in a later compile
    of the same process (CA204): the runtime went on with the first value."""

    setting: str
    """The variable or setting that changed, as the finding's subject."""
    recorded: str
    """Its value at construction, in words (where it came from and what it was)."""
    current: str
    """Its value for the later compile, in words."""
    how: str = ""
    """How the policy knows which settings the runtime read."""


class Policy:
    """What one runtime's key covers. A runtime package subclasses this in its `policy.py`; every
    member but `runtime` and `tracked` has a default that holds for a runtime that keys nothing
    beyond what `tracked` returns, as coverage.py's plugin base documents its no-op hooks."""

    runtime: str = ""

    caches_header_digests: bool = True
    """Whether the runtime's process keeps a header's digest from one lookup to the next (so a
    live process that hashed a header before it changed is CA106). False for runtimes that hash
    afresh on every lookup: the audit then never infers CA106 from a live process alone."""

    reads_configuration_once: bool = False
    """Whether the runtime reads its settings once, when it is constructed, and keeps them for
    its lifetime (DeepJIT's `Config`, for example). When True, the audit finds the first compile
    of each record's runtime process and asks `configuration_changes` what differs (CA204)."""

    looks_up_compiler_by_name: bool = False
    """Whether the runtime runs its compiler by the bare name it was given (`g++`), which the
    OS looks up on PATH again in every process, while its key holds only that name. When True,
    the audit judges the compiler the user's configuration resolves now for that name
    (`audit.execution.resolve_compiler`: the policy's `compiler_variables`, then PATH; the
    one rule for what an audit may run) against the recorded identity (CA301), so that another
    binary earlier on PATH is seen. Default False: the recorded compiler's own path is judged
    (a runtime that runs the compiler by a path, or keys the binary)."""

    scan_family: str = ""
    """Policies with the same non-empty `scan_family` judge the scan's environment together (the
    DeepSeek runtimes share their `<PREFIX>_JIT_*` settings): the audit calls `scan_findings`
    once per family, on its first policy, with the entries of all its runtimes, so that a
    setting they share is reported once. Empty: the runtime is a family of its own."""

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        """Which files the entry's key covers, resolved against the disk now."""
        raise NotImplementedError

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        """Recompute the entry's key from the files on disk now (and the recorded compile, where
        the entry alone does not carry the recipe); `recomputed` None when something the recipe
        needs is missing (the note says what). `env` is the environment the audit judges
        against (the process's own when None), for recipes that look anything up in it.
        Default: the recipe is not reproducible."""
        return KeyCheck(None, note=f"{self.runtime}'s key is not recomputed")

    def environment_variant(self, entry: CacheEntry) -> str | None:
        """Which of the runtime's declared variants (its spec's `variants`, the
        "runtime:variant" statuses of its environment rows) classes the variables for `entry`,
        for a runtime whose entry kinds have keys of their own that hold different variables
        (a layer whose key holds a setting beside one whose key does not): the environment
        checks (CA201, CA202) ask the registry with it, and a variable without a status for
        that variant falls back to the runtime's. Default: None, the runtime's own statuses
        for every entry."""
        return None

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        """Whether this compiler change alters the runtime's key (so a hit is impossible).
        Default: no compiler property is keyed."""
        return False

    def record_findings(self, record: CompileRecord,
                        history: Sequence[CompileRecord]) -> list[Finding]:
        """Findings a runtime's records carry on their own, with or without a cache entry on
        disk (NVRTC's in-process PCH reuse, torch's in-process versioner), judged against the
        earlier records of the same run (`history`, oldest first). Default: none."""
        return []

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        """(argv, cwd) that compiles the entry's source as the runtime did, for a dependency pass
        over an entry built before recording started; None (the default) when the entry does
        not say."""
        return None

    def reconstruction_problem(self, entry: CacheEntry) -> str | None:
        """Why `entry`'s inputs cannot be reconstructed, in words a user can act on, when
        `dependency_command` gives none ("meta.json names no kernel.cu"). Default: None, for
        which the finding says the runtime's entries hold no compile command."""
        return None

    def compiler_variables(self, entry: CacheEntry, env: Mapping[str, str]) -> tuple[str, ...]:
        """The variables through which the user names the compiler that builds `entry`, in the
        order the runtime reads them under `env`: the rebuild oracle runs the compiler the
        user's configuration resolves, never one a cache or a ledger names. Default: the
        compiler settings of the runtime's spec."""
        from cacheaudit.spec import spec

        declared = spec(self.runtime)
        return tuple(s.name for s in declared.compiler_settings) if declared else ()

    def configuration_changes(self, entry: CacheEntry, first_env: Mapping[str, str],
                              env: Mapping[str, str]) -> list[ConfigurationChange]:
        """The settings a runtime constructed under `first_env` (the environment of its
        process's first compile) read then and that `env` (a later compile's) gives another
        value; the runtime kept the first one. Asked only when `reads_configuration_once`.
        Default: none."""
        return []

    def scan_findings(self, entries: Sequence[CacheEntry],
                      env: Mapping[str, str]) -> list[Finding]:
        """Findings about the scan's environment `env` for these scanned `entries` (this
        runtime's, or those of every runtime of its `scan_family`), once per scan rather than
        once per entry: how a setting the runtime reads resolves now. Default: none."""
        return []

    def rewrites_binary(self, entry: CacheEntry) -> bool:
        """Whether the runtime rewrites the entry's binary after the compiler wrote it (a post
        hook, an assembler pass over the cubin), so that the binary's digest cannot confirm
        which recorded compile built the entry: the audit then ties it by its source and cache
        root alone (docs/design.md, "Tying an entry to its compile"). Default: no, the entry
        holds the compiler's own output."""
        return False

    def for_audit(self, env: Mapping[str, str], include_dirs: Sequence[str]) -> Policy:
        """This policy as an audit under `env` uses it, with the include trees the user named
        (`--include-dir`, `include-dirs` in [tool.cacheaudit]): a runtime that compiles against
        an installed package's headers and writes no command into its entries finds them
        there, or on the audit's PYTHONPATH. Asked once per audit and runtime. Default: the
        policy itself, which depends on neither."""
        return self

    def key_remedy(self, entry: CacheEntry | None) -> str | None:
        """How a user gets an input the key misses into this runtime's key, for `entry` (None:
        the runtime in general), as the clause a hint offers (CA101, CA102, CA201), with
        `{input}` for what is to be covered ("feed a digest of {input} into ..."); or, for a
        runtime that offers no way, what to do instead. Default: None, the generic wording
        (`findings.DEFAULT_KEY_REMEDY`), which names no runtime's mechanism: a hint never
        offers one runtime's remedy for another."""
        return None

    def compiling_process(self, record: CompileRecord) -> int | None:
        """The pid of the runtime process that asked for a compile, from what the runtime itself
        put in the record. Default: unknown (the audit then knows a record's process only where
        the run is that process, or the shim recorded it)."""
        return None


def read_input(path: str) -> str:
    """A file a runtime hashes into its key, byte for byte as the runtime reads it, as text.

    DeepJIT's `Parser` and DeepGEMM's `IncludeParser` read with `std::ifstream` and
    `istreambuf_iterator`, which on POSIX translate nothing: a header saved with CRLF line ends
    is hashed with its carriage returns (the reference runtime, fixtures/minijit, reads "rb" for
    the same reason). Python's text mode would drop them and recompute another digest; this
    decoding is lossless (encoding the text with ("utf-8", "surrogateescape") gives back exactly
    the bytes), so what is hashed is what was read. Raises OSError; never waits on a FIFO.
    """
    return read_file(path).decode("utf-8", "surrogateescape")


_HEADERS: dict[str, tuple[tuple[int, int, int, int], str]] = {}
_HEADERS_KEPT = 4096


def read_header(path: str) -> str:
    """`read_input` for a header that thousands of entries include (a scan of a DeepGEMM cache
    walks the same library headers for every kernel): kept for this process while its stat is
    unchanged, and only once settled (digest's "too new" rule: a rewrite within the timestamp
    granularity could leave every stat field equal)."""
    st = os.stat(path)
    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    known = _HEADERS.get(path)
    if known is not None and known[0] == key:
        return known[1]
    text = read_input(path)
    if stat.S_ISREG(st.st_mode) and is_settled(st, time.time_ns()):
        if len(_HEADERS) >= _HEADERS_KEPT:
            _HEADERS.clear()
        _HEADERS[path] = (key, text)
    return text
