"""Triton's key: what it covers, what it misses, and its parts recomputed.

Source: triton 3.9.0, `compiler/compiler.py` (`compile`), `runtime/cache.py` (`get_cache_key`,
`triton_key`, `_base32`), `runtime/jit.py` (`JITCallable.cache_key`, `JITFunction.run`,
`compute_cache_key`), `backends/nvidia/compiler.py` (`CUDAOptions.hash`, `CUDABackend.hash`,
`get_ptxas`, `get_ptxas_version`, `file_hash`), `knobs.py`, and `include/triton/Tools/Sys/GetEnv.h`
(`CACHE_INVALIDATING_ENV_VARS`). The disk key is

    sha256(f"{triton_key()}-{src.hash()}-{backend.hash()}-{options.hash()}-{sorted(env)}")

1. `triton_key()`: `__version__` plus sha256 of `runtime/cache.py`, every module under
   `compiler/`, `backends/` and `language/`, and `libtriton.so` (lru_cached per process).
2. `src.hash()`: the @jit function's `cache_key` (its source text, the `cache_key` of every @jit
   or constexpr function it calls, the global `tl.constexpr` values it reads, its starting line)
   with the signature, attributes and constexpr values.
3. `backend.hash()`: the whole stdout of `<ptxas> --version` and the arch. The ptxas is
   `TRITON_PTXAS_PATH` (arch < 90) or `TRITON_PTXAS_BLACKWELL_PATH` (arch >= 90), else the one
   bundled in `backends/nvidia/bin`; the version text is lru_cached per arch for the process.
4. `options.hash()`: every `CUDAOptions` field as `name-value` joined by "_", with `extern_libs`
   (libdevice) replaced by the sha256 of each file's content (`file_hash`, lru_cached per path
   for the process). `ptx_options` comes from `PTXAS_OPTIONS`, read once when the backend module
   is imported; `enable_fp_fusion` from `TRITON_DEFAULT_FP_FUSION` and
   `TRITON_FORCE_DISABLE_FP_FUSION`.
5. `get_cache_invalidating_env_vars()`: those of `CACHE_INVALIDATING_ENV_VARS` that are set and
   non-empty, with boolean-looking values normalised ("1", "true", "on" -> "true"; "0",
   "false", "off" -> "false", case-insensitive; anything else kept as written).

Not covered: the ptxas binary (only its `--version` text), `TRITON_PTXAS_PATH` itself, `CC` (the
native modules `runtime/build.py` builds into the same cache, `cuda_utils` in 3.9.0, are keyed on
their C source, flags and platform, not the compiler), the headers they include, and anything in
the process that is not @jit code or a constexpr global. The in-memory layer
(`JITFunction.device_caches`, keyed by `compute_cache_key(specialization, call options)`) leaves
out the environment altogether: a cache-invalidating variable changed inside a process is served
from memory (triton PR #8350; PR #8342 folded only knob-sourced ConSan state into it).

`triton_key()` and `src.hash()` cannot be computed from an entry: the entry holds the TTIR
(`<name>.source`), not the Python source. The adapter records every part at compile time, after
checking that they compose the entry's own hash, so that this policy can recompute the key with
the files and the ptxas on disk now.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cacheaudit import children, compilers
from cacheaudit.digest import read_file
from cacheaudit.evidence import ContentEvidence, Evidence, VariableEvidence
from cacheaudit.findings import file_evidence, make_finding
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, Finding
from cacheaudit.policy import KeyCheck, KeyComponent, Policy, TrackedSet
from cacheaudit.runtimes.triton import environment

# The entry directories' names (the layout reads them; the adapter and tests ask the recipe).
from cacheaudit.runtimes.triton.layout import base32_name, key_from_name  # noqa: F401

RUNTIME = "triton"

INVALIDATING: tuple[str, ...] = tuple(sorted(environment.INVALIDATING))
"""Triton's CACHE_INVALIDATING_ENV_VARS as the registry knows them (3.9.0 and older names)."""

_TRUE = frozenset({"1", "true", "on"})
_FALSE = frozenset({"0", "false", "off"})

_MEMORY_HOW = ("observed in the process: JITFunction.run served this kernel from "
               "device_caches, whose key (compute_cache_key: argument specialisation and call "
               "options) leaves out the environment (triton PR #8350)")


# ------------------------------------------------------------------------------ the key recipe


def normalise_env_value(value: str) -> str | None:
    """The value Triton's C++ `get_cache_invalidating_env_vars` reports for a setting: None when
    empty (not reported), boolean-looking values folded to "true"/"false", else as written.
    Measured against triton 3.9.0 with "1", "ON", "Off", "False", "yes", "y", "2", " 1"."""
    if value == "":
        return None
    folded = value.lower()
    if folded in _TRUE:
        return "true"
    if folded in _FALSE:
        return "false"
    return value


def invalidating_env(env: Mapping[str, str]) -> dict[str, str]:
    """The cache-invalidating part of `env` as Triton would put it into the key."""
    found: dict[str, str] = {}
    for name in INVALIDATING:
        value = env.get(name)
        if value is not None and (normalised := normalise_env_value(value)) is not None:
            found[name] = normalised
    return found


def env_key_part(env: Mapping[str, str]) -> str:
    """`str(sorted(env_vars.items()))`, the last part of `get_cache_key`."""
    return str(sorted(env.items()))


def build_env(metadata: Mapping[str, Any]) -> dict[str, str]:
    """The cache-invalidating values a compile ran under, from its metadata: `compile` spreads
    them into the metadata dict (`**env_vars`), and every other field is lower case."""
    return {name: str(value) for name, value in metadata.items()
            if isinstance(name, str) and name.isupper()}


@functools.lru_cache(maxsize=256)
def _file_sha256(path: str, size: int, mtime_ns: int, ino: int) -> str:
    return hashlib.sha256(read_file(path)).hexdigest()


def file_sha256(path: str) -> str:
    """sha256 of a file's content (Triton's `file_hash`), memoised while its stat is unchanged."""
    st = os.stat(path)
    return _file_sha256(path, st.st_size, st.st_mtime_ns, st.st_ino)


def options_hash(items: Iterable[Sequence[str]], extern_libs: Iterable[Sequence[str]],
                 digests: Mapping[str, str] | None = None) -> str:
    """`CUDAOptions.hash()` from the option fields as text (`[name, str(value)]`, extern_libs
    left out) and the extern libraries (`[name, path]`), whose content is hashed now unless
    `digests` (path -> sha256) says otherwise."""
    digests = digests or {}
    libs = tuple((str(name), digests.get(str(path)) or file_sha256(str(path)))
                 for name, path in sorted((str(n), str(p)) for n, p in extern_libs))
    fields = {str(name): str(text) for name, text in items}
    fields["extern_libs"] = str(libs)
    key = "_".join(f"{name}-{text}" for name, text in sorted(fields.items()))
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def compose_key(triton_key: str, src: str, backend: str, options: str, env_part: str) -> str:
    """`compile`'s hash: sha256 of `get_cache_key`'s string."""
    text = f"{triton_key}-{src}-{backend}-{options}-{env_part}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=32)
def _ptxas_version(path: str, size: int, mtime_ns: int, ino: int) -> str | None:
    try:
        done = children.run([path, "--version"], timeout=30, env=os.environ)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0 or done.timed_out:
        return None
    return done.stdout.decode("utf-8", "replace")


def ptxas_version_text(path: str) -> str | None:
    """The stdout of `<path> --version`, as `get_ptxas_version` keys it; None if it cannot run."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return _ptxas_version(path, st.st_size, st.st_mtime_ns, st.st_ino)


# ------------------------------------------------------------------------------ the policy


def _extern_libs(entry: CacheEntry, record: CompileRecord | None) -> list[tuple[str, str]]:
    parts = _key_parts(record)
    libs = parts.get("extern_libs") if parts else entry.meta.get("extern_libs")
    if not isinstance(libs, (list, tuple)):
        return []  # Triton writes a list of [name, path] pairs; anything else names no file
    found = []
    for item in libs:
        if isinstance(item, (list, tuple)) and len(item) == 2:
            found.append((str(item[0]), str(item[1])))
    return found


def _key_parts(record: CompileRecord | None) -> dict[str, Any] | None:
    if record is None:
        return None
    parts = record.extra.get("key_parts")
    return parts if isinstance(parts, dict) and parts.get("verified") else None


PTXAS_SETTINGS = ("TRITON_PTXAS_BLACKWELL_PATH", "TRITON_PTXAS_PATH")
"""The variables through which a user names the ptxas Triton runs (sm_90 and up, below)."""


def _configured_ptxas(path: str, env: Mapping[str, str]) -> bool:
    """Whether one of the user's ptxas settings names `path` (the same file)."""
    for variable in PTXAS_SETTINGS:
        value = env.get(variable)
        if value:
            try:
                if os.path.samefile(value, path):
                    return True
            except OSError:
                continue
    return False


class TritonPolicy(Policy):
    runtime = RUNTIME
    """Triton has no `<PREFIX>_JIT_*` family, so CA203/CA204 never apply."""

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        """The files Triton's key reads by content: the extern libraries (libdevice). The @jit
        source is keyed as text held by the process, not as a file, so it is no tracked file;
        ptxas is keyed by its version text (see `compiler_change_in_key`)."""
        libs = _extern_libs(entry, record)
        names = {name: os.path.realpath(path) for name, path in libs}
        return TrackedSet(frozenset(names.values()), names,
                          how="CUDAOptions.hash(): extern_libs by sha256 of their content "
                              "(backends/nvidia/compiler.py)")

    def key_components(self, entry: CacheEntry, record: CompileRecord | None,
                       env: Mapping[str, str] | None = None
                       ) -> tuple[list[KeyComponent], str | None, str]:
        parts = _key_parts(record)
        if parts is None:
            note = ("Triton's key needs triton_key() and the @jit source hash, which an entry does "
                    "not hold; the triton adapter records them at compile time, and no verified "
                    "recording of this entry's compile was found")
            return self._partial_components(entry), None, note
        components = [KeyComponent("triton_key() (recorded: triton sources and libtriton)",
                                   str(parts.get("triton_version", "?")),
                                   hashlib.sha256(str(parts["triton_key"]).encode()).hexdigest())]
        components.append(KeyComponent("src.hash() (recorded: @jit source, signature, constexprs)",
                                       str(record.kernel if record else entry.kernel),
                                       str(parts["src"])))
        notes: list[str] = []
        backend = str(parts["backend"])
        ptxas = record.compiler.path if record is not None and record.compiler else None
        # A path from a ledger runs only when the user's settings name it anyway, or for a
        # record this user sealed, still the same binary.
        now_env = os.environ if env is None else env
        distrust = (compilers.recorded_distrust(record, now_env)
                    if ptxas and record is not None and not _configured_ptxas(ptxas, now_env)
                    else None)
        version = ptxas_version_text(ptxas) if ptxas and distrust is None else None
        if parts.get("mock_ptx_version") is not None:
            notes.append("TRITON_MOCK_PTX_VERSION stood in for ptxas --version; backend part "
                         "taken as recorded")
        elif distrust is not None:
            notes.append(f"ptxas {ptxas} is not run ({distrust}); backend part taken as "
                         "recorded")
        elif version is None:
            notes.append(f"ptxas {ptxas or '(unknown)'} cannot run now; backend part taken as "
                         "recorded")
        else:
            backend = f"{version}-{parts['arch']}"
        components.append(KeyComponent("backend.hash() (ptxas --version + arch)",
                                       f"{ptxas} arch {parts['arch']}",
                                       hashlib.sha256(backend.encode()).hexdigest()))
        try:
            options = options_hash(parts["options_items"], parts["extern_libs"])
        except OSError as exc:
            return components, None, f"an extern library cannot be read now: {exc}"
        components.append(KeyComponent("options.hash() (extern_libs by content now)",
                                       ", ".join(p for _, p in parts["extern_libs"]), options))
        env = dict(parts["env"])
        components.append(KeyComponent("cache-invalidating environment (as compiled)",
                                       env_key_part(env)))
        key = compose_key(str(parts["triton_key"]), str(parts["src"]), backend, options,
                          env_key_part(env))
        return components, key, "; ".join(notes)

    def _partial_components(self, entry: CacheEntry) -> list[KeyComponent]:
        env = build_env(entry.meta)
        components = [KeyComponent("cache-invalidating environment (as compiled)",
                                   env_key_part(env))]
        for name, path in _extern_libs(entry, None):
            try:
                digest = file_sha256(path)
            except OSError:
                digest = None
            components.append(KeyComponent(f"extern lib {name}", path, digest))
        return components

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        """The key with the extern libraries and the ptxas as they are now, the recorded
        triton_key() and @jit source hash, and the environment the entry was compiled under
        (a different environment now only means a different key, a miss, not a stale hit).
        `env` is the environment a lookup would run under (the audit's, else this process's)."""
        components, key, note = self.key_components(entry, record, env)
        now = invalidating_env(os.environ if env is None else env)
        if now != build_env(entry.meta):
            components.append(KeyComponent("cache-invalidating environment (now: a lookup now "
                                           "computes another key)", env_key_part(now)))
        return KeyCheck(key, tuple(components), note)

    def compiler_variables(self, entry: CacheEntry, env: Mapping[str, str]) -> tuple[str, ...]:
        """The ptxas settings: a recorded ptxas they name is the user's choice, which a scan
        may ask its `--version` (docs/security.md)."""
        return PTXAS_SETTINGS

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        """`CUDABackend.hash()` keys the whole `ptxas --version` stdout; the binary's bytes and
        its path are not keyed. (cacheaudit's version text is stdout then stderr; ptxas prints
        its version to stdout, so the two agree.)"""
        return recorded.version_text.strip() != current.version_text.strip()

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        # A Triton compile is not a command line: it runs inside the Python process.
        return None

    def record_findings(self, record: CompileRecord,
                        history: Sequence[CompileRecord]) -> list[Finding]:
        """CA202 for a memory hit that the adapter saw served under another cache-invalidating
        environment than its compile's; CA106 for a compile keyed with an extern library's
        content hash that this process memoised before the file changed."""
        if record.runtime != RUNTIME:
            return []
        findings: list[Finding] = []
        if record.event == "memory-hit":
            findings += _memory_drift(record)
        elif record.event == "compile" and record.graph is not None:
            findings += _memoised_extern_libs(record, history)
        return findings


def _memory_drift(record: CompileRecord) -> list[Finding]:
    drift = record.extra.get("env_drift")
    if not isinstance(drift, dict):
        return []
    findings = []
    for name, values in sorted(drift.items()):
        built, now = (values[0], values[1]) if isinstance(values, list) and len(values) == 2 \
            else (None, None)
        findings.append(make_finding(
            "CA202", subject=name, record=record,
            message=f"Triton served {record.kernel} from its in-memory cache (pid {record.pid}) "
                    f"after {name} changed: the disk key covers {name}, the in-memory key does "
                    f"not, so the kernel running is the one compiled under the old value",
            recorded=VariableEvidence(name, built), current=VariableEvidence(name, now),
            how=_MEMORY_HOW))
    return findings


def _memoised_extern_libs(record: CompileRecord, history: Sequence[CompileRecord]
                          ) -> list[Finding]:
    """Triton's `file_hash` is an lru_cache: within one process, an extern library is hashed the
    first time and never again. A compile that read other content than an earlier record of the
    same run saw at the same path was keyed with the first content's hash."""
    assert record.graph is not None
    first: dict[str, tuple[str | None, CompileRecord]] = {}
    for earlier in history:
        if earlier.runtime != RUNTIME or earlier.graph is None or earlier.pid != record.pid:
            continue
        for graph_file in earlier.graph.files:
            first.setdefault(graph_file.path, (graph_file.state.digest, earlier))
    findings = []
    for graph_file in record.graph.files:
        seen = first.get(graph_file.path)
        if seen is None or seen[0] is None or graph_file.state.digest in (None, seen[0]):
            continue
        findings.append(make_finding(
            "CA106", subject=graph_file.path, record=record,
            message=f"{os.path.basename(graph_file.path)} changed after Triton hashed it in this "
                    f"process (pid {record.pid}): file_hash keeps the first hash for the "
                    f"process's life, so this compile's key names the old content while the "
                    f"binary links the new",
            recorded=f"xxh3 {seen[0]} (compile of {seen[1].kernel})",
            current=f"xxh3 {graph_file.state.digest}",
            how="content hashes of the extern library at two compiles of one process "
                "(backends/nvidia/compiler.py file_hash is functools.lru_cache)",
            evidence=Evidence(ContentEvidence(f"compile of {seen[1].kernel}", seen[0]),
                              file_evidence(graph_file.state))))
    return findings


POLICIES = {RUNTIME: TritonPolicy()}
