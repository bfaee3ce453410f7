"""Policies: what each runtime's cache key covers, and a recomputation of that key where possible.

A policy turns "the runtime keys on X" from an assumption into a check: it computes the tracked set
by the runtime's own rules (DeepJIT's prefix parser, DeepGEMM's include regex) and, where the
entry carries enough, recomputes the runtime's digest from the files on disk now. The audit then
compares: a tracked file that changed must change the key (else CA103), an untracked one that
changed never does (CA101).

Adding a runtime: a module here with a `POLICIES` mapping (runtime -> object satisfying
`Policy`), and one line in `_MODULES`. Runtimes that share a recipe share a module.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from cacheaudit.digest import is_settled, read_file
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, Finding

_MODULES = {"deepjit": "deepjit", "deepgemm": "deepgemm", "deepep": "deepgemm",
            "torch-ext": "torch_ext", "triton": "triton", "nvrtc": "nvrtc",
            "cuda-core": "cuda_core", "cupy": "cupy"}


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
    how: str = ""


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


class EnvFamilies(NamedTuple):
    """The `<PREFIX>_JIT_*` families one entry's runtime reads, and the evidence for them."""

    prefixes: tuple[str, ...]
    """Empty when nothing says which of the policy's families the runtime read."""
    how: str


class Policy(Protocol):
    runtime: str
    env_prefixes: tuple[str, ...]
    """The `<PREFIX>_JIT_*` families this runtime reads (for CA203, CA204)."""
    flavour: str | None = None
    """How it reads them: an `envvars.FLAVOURS` name; required with `env_prefixes`, None for a
    runtime that reads no such family."""
    # Optional: `caches_header_digests = False` for runtimes whose process does not keep a
    # header's digest from one lookup to the next (the audit then never infers CA106 from a
    # live process alone).
    # Optional, with `env_prefixes`: `env_families(entry, env) -> EnvFamilies`, which of them
    # the runtime that built `entry` reads, judged from the entry and `env` (the environment it
    # was configured from); the audit takes every one of `env_prefixes` without it.
    # Optional: `compiling_process(record) -> int | None`, the pid of the runtime process that
    # asked for a compile, from what the runtime itself put in the record; without it the
    # audit knows a record's process only where the run is that process (the bare shim).

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        """Which files the entry's key covers, resolved against the disk now."""
        ...

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        """Recompute the entry's key from the files on disk now (and the recorded compile, where
        the entry alone does not carry the recipe); `recomputed` None when something the recipe
        needs is missing (the note says what). `env` is the environment the audit judges
        against (the process's own when None), for recipes that look anything up in it."""
        ...

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        """Whether this compiler change alters the runtime's key (so a hit is impossible)."""
        ...

    def record_findings(self, record: CompileRecord,
                        history: Sequence[CompileRecord]) -> list[Finding]:
        """Findings a runtime's records carry on their own, with or without a cache entry on
        disk (NVRTC's in-process PCH reuse, torch's in-process versioner), judged against the
        earlier records of the same run (`history`, oldest first). Optional: the audit treats a
        policy without it as having none."""
        ...

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        """(argv, cwd) that compiles the entry's source as the runtime did, for a dependency pass
        over an entry built before recording started; None when the entry does not say."""
        ...


@functools.cache
def policy_for(runtime: str) -> Policy:
    module = _MODULES.get(runtime)
    if module is None:
        raise KeyError(f"no policy for runtime {runtime!r}")
    loaded = importlib.import_module(f"cacheaudit.policies.{module}")
    return loaded.POLICIES[runtime]  # type: ignore[attr-defined, no-any-return]


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


_MASK_64 = (1 << 64) - 1


def split_mix(value: int) -> int:
    """SplitMix64's finaliser, which DeepJIT's `FNV1a` and DeepGEMM's `get_hex_digest` both apply
    to each 64-bit lane before printing it."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return value ^ (value >> 31)


# `get_uuid()` of DeepJIT (utils/uuid.hpp) and DeepGEMM (csrc/utils/system.hpp), which DeepEP
# copies: "<pid>-<8 hex>-<8 hex>-<8 hex>", the runtime's own pid first.
_BUILD_DIRECTORY = re.compile(r"([0-9]+)-[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{8}")


def build_directory_pid(record: CompileRecord) -> int | None:
    """The pid of the runtime that ran this compile, from the name of its build directory
    `<root>/tmp/<pid>-<hex>-<hex>-<hex>/`: DeepJIT compiles in it (`cd <dir> && nvcc ...`),
    DeepGEMM and DeepEP name its `kernel.cu` and binary on the command line. The runtime named
    the directory after its own process, so the pid survives the shell and the shim between
    them; None when neither the working directory nor an argument lies in such a directory."""
    candidates = [record.cwd] + [os.path.dirname(t) for t in record.argv if t.startswith("/")]
    for directory in candidates:
        match = _BUILD_DIRECTORY.fullmatch(os.path.basename(directory))
        if match is not None and os.path.basename(os.path.dirname(directory)) == "tmp":
            return int(match.group(1))
    return None
