"""DeepJIT's key (DeepJIT itself, DeepGEMM 2.8+, DeepEP): what it covers, recomputed.

Source: deepseek-ai/DeepJIT, `runtime/runtime.hpp` (`Runtime::cache_key`), `utils/hash.hpp`
(`FNV1a`), `utils/parser.hpp` (`Parser`), `backend/cuda/backend.hpp` (`CompilerInfo`, the compile
command, meta.json). The key is an FNV-1a chain, each update prefixed with its length:

1. `Config::extra_signature`
2. the digest of the full `nvcc --version` text (the nvcc *path* is not hashed)
3. the compile flags joined by single spaces
4. the post-hook digest ("" without a post hook)
5. `Parser::parse_into_hash(source)`: the source, then recursively each header reached through a
   literal `#include <...>` line whose name starts with one of `include_prefixes`

Not covered, by design (DeepJIT's README says so): `NVCC_PREPEND_FLAGS`, `NVCC_APPEND_FLAGS`,
`CPATH`, the host compiler, every header outside the prefixes (CUTLASS, CuTe, CUDA, libstdc++),
`include_dirs` themselves. Header digests are cached by include name for the runtime's lifetime,
and the configuration is read once when the runtime is built.
"""

from __future__ import annotations

import copy
import functools
import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, Finding
from cacheaudit.policy import (
    ConfigurationChange,
    KeyCheck,
    KeyComponent,
    TrackedSet,
    read_header,
    read_input,
)
from cacheaudit.runtimes._deepseek import checks as family_checks
from cacheaudit.runtimes._deepseek.environment import custom_prefixes_in, resolve_jit_settings
from cacheaudit.runtimes._deepseek.policy import EnvFamilies, FamilyPolicy
from cacheaudit.runtimes._deepseek.recipe import build_directory_pid, split_mix
from cacheaudit.runtimes.deepjit.layout import meta_field, mistyped, prefix_roots

_MASK = (1 << 64) - 1
_PRIME_0 = 0x100000001B3
_PRIME_1 = 0x9E3779B97F4A7C15
_SEED_0 = 0xC6A4A7935BD1E995
_SEED_1 = 0xFF51AFD7ED558CCD


class FNV1a:
    """DeepJIT's `hash::FNV1a`: two 64-bit FNV-1a lanes, every update length-prefixed."""

    __slots__ = ("state_0", "state_1")

    def __init__(self) -> None:
        self.state_0 = _SEED_0
        self.state_1 = _SEED_1

    def update(self, data: str | bytes) -> FNV1a:
        raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
        s0, s1 = self.state_0, self.state_1
        for byte in len(raw).to_bytes(8, "little") + raw:
            s0 = ((s0 ^ byte) * _PRIME_0) & _MASK
            s1 = ((s1 ^ byte) * _PRIME_1) & _MASK
        self.state_0, self.state_1 = s0, s1
        return self

    def hexdigest(self) -> str:
        return f"{split_mix(self.state_0):016x}{split_mix(self.state_1):016x}"


def hex_digest(data: str | bytes) -> str:
    return FNV1a().update(data).hexdigest()


_DIRECTIVE = re.compile(r"^[ \t\f\v]*#[ \t\f\v]*include[^\n]*", re.MULTILINE)


class NonStandardInclude(ValueError):
    """DeepJIT's `DJ_PANIC("non-standard include: ...")`: the runtime refuses the source."""


_BLANKS = " \t\f\v"


def tracked_include(line: str, prefixes: Sequence[str]) -> str | None:
    """The include name a line contributes to the key, by `Parser::parse_include`'s rules."""
    line = line.lstrip(_BLANKS)
    if not line.startswith("#"):
        return None
    line = line[1:].lstrip(_BLANKS)
    if not line.startswith("include"):
        return None
    line = line[len("include"):].lstrip(_BLANKS)
    if not line or line[0] not in "<\"":
        return None
    closing = min((i for i in (line.find(">", 1), line.find('"', 1)) if i != -1), default=-1)
    if closing == -1:
        return None
    name = line[1:closing]
    if (line[0] != "<" or line[closing] != ">" or not name or name[0] in _BLANKS
            or name[-1] in _BLANKS):
        raise NonStandardInclude(f"non-standard include: {line[:closing + 1]}")
    return name if any(name.startswith(p) for p in prefixes) else None


class _Parser:
    """`Parser` with a fresh cache: what a new runtime object would compute from disk now."""

    def __init__(self, include_dirs: Sequence[str], prefixes: Sequence[str]) -> None:
        self.include_dirs = list(include_dirs)
        self.prefixes = list(prefixes)
        self.digests: dict[str, str] = {}
        self.resolved: dict[str, str] = {}
        self._visiting: set[str] = set()

    def names_in(self, code: str) -> list[str]:
        # Only lines that can be include directives are looked at; the rules are
        # `tracked_include`'s, applied to exactly the lines the runtime would act on.
        return [name for match in _DIRECTIVE.finditer(code)
                if (name := tracked_include(match.group(0), self.prefixes)) is not None]

    def resolve(self, name: str) -> str:
        for directory in self.include_dirs:
            candidate = os.path.join(directory, name)
            if os.path.exists(candidate):
                return candidate
        raise FileNotFoundError(f"tracked include <{name}> is in none of the include dirs")

    def header_digest(self, name: str) -> str:
        if name in self.digests:
            return self.digests[name]
        if name in self._visiting:
            raise NonStandardInclude(f"circular include may occur: {name}")
        self._visiting.add(name)
        try:
            path = self.resolve(name)
            digest = self.parse_into_hash(read_header(path))
        finally:
            self._visiting.discard(name)
        self.resolved[name] = os.path.realpath(path)
        self.digests[name] = digest
        return digest

    def parse_into_hash(self, code: str) -> str:
        hasher = FNV1a().update(code)
        for name in self.names_in(code):
            hasher.update(self.header_digest(name))
        return hasher.hexdigest()

    def walk(self, code: str) -> None:
        """Resolve every tracked header reachable from `code` without hashing anything."""
        self.walk_names(self.names_in(code))

    def walk_names(self, names: Iterable[str]) -> None:
        """`walk` of a source whose tracked include names are `names`."""
        for name in names:
            if name in self.resolved or name in self._visiting:
                continue
            self._visiting.add(name)
            try:
                path = self.resolve(name)
                self.resolved[name] = os.path.realpath(path)
                self.walk(read_header(path))
            finally:
                self._visiting.discard(name)


def _config(entry: CacheEntry) -> dict[str, Any]:
    config = entry.meta.get("config")
    return config if isinstance(config, dict) else {}


_PARSER_FIELDS = ("config.include_dirs", "config.include_prefixes")
_KEY_FIELDS = (*_PARSER_FIELDS, "config.extra_signature", "compiler_info.version", "command",
               "compiler_options")


def _mistyped(entry: CacheEntry, fields: Sequence[str]) -> str | None:
    """Why meta.json's recipe fields cannot be used as DeepJIT's, or None. A value DeepJIT
    cannot have written is no recipe: fed to the parser it would crash the scan or compute
    another key (a string of prefixes read as one prefix per character)."""
    bad = [why for name in fields if (why := mistyped(entry.meta, name)) is not None]
    if not bad:
        return None
    return f"meta.json has {'; '.join(bad)}: not what DeepJIT writes, so it cannot be used"


def _source_name(entry: CacheEntry) -> str:
    return os.path.basename(entry.source.path) if entry.source is not None else "the source"


def _read_source(entry: CacheEntry) -> tuple[str | None, str]:
    """(the entry's source as text, "") or (None, why it cannot be had, naming the file)."""
    source = entry.source
    if source is None:
        return None, "the entry has no source file"
    name = _source_name(entry)
    if not source.exists:
        return None, f"{name} is missing"
    if source.digest is None and source.error:
        return None, f"{name} cannot be read: {source.error}"
    try:
        return read_input(source.path), ""
    except OSError as exc:
        return None, f"{name} cannot be read: {type(exc).__name__}: {exc.strerror or exc}"


def _post_hook(entry: CacheEntry) -> str:
    """The post hook meta.json's compiler options name ("" for none)."""
    options = entry.meta.get("compiler_options")
    hook = options.get("post_hook") if isinstance(options, dict) else None
    return hook if isinstance(hook, str) else ""


def _post_hook_digest(entry: CacheEntry, hook: str) -> tuple[str | None, str]:
    """`CompilerOptions::get_post_hook_hash`: the FNV-1a of the hook's path as configured and
    of the file's bytes, the file found under the Python library root
    (`Config::get_python_path`); (None, why) when it cannot be read."""
    root = _config(entry).get("python_library_root")
    if not isinstance(root, str) or not root:
        return None, "meta.json has no python_library_root to find the post hook under"
    path = os.path.join(root, hook)
    try:
        content = read_input(path)
    except OSError as exc:
        return None, f"the post hook {path} cannot be read: {exc.strerror or exc}"
    return FNV1a().update(hook).update(content).hexdigest(), ""


def options_flags(options: dict[str, Any]) -> list[str] | None:
    """`CompilerOptions::get_flags` (backend/cuda/options.hpp) from the options meta.json holds:
    the flag list the key hashes, whatever command the backend built from it."""
    try:
        flags = [f"--gpu-architecture=sm_{options['arch']}", f"-O{options['optimize_level']}",
                 f"--compiler-options=-O{options['optimize_level']}"]
        if options.get("use_fast_math"):
            flags.append("--use_fast_math")
        if options.get("ptxas_verbose"):
            flags.append("--ptxas-options=--verbose")
        flags.append("--ptxas-options=--register-usage-level="
                     f"{options['ptxas_register_usage_level']}")
        if options.get("check_no_spills"):
            flags.append("--ptxas-options=--warn-on-spills")
        if options.get("check_no_local_memory"):
            flags.append("--ptxas-options=--warn-on-local-memory-usage")
        if options.get("with_line_info"):
            flags.append("--generate-line-info")
        for name in ("nvcc_flags", "extra_nvcc_flags"):
            extra = options.get(name) or []
            if not isinstance(extra, list):
                raise TypeError(f"{name} is not a list")  # a string would split into chars
            flags += [str(f) for f in extra]
    except (KeyError, TypeError):
        return None
    return flags


_OUTPUT_OPTIONS = ("--output-file", "-o")
_INCLUDE_OPTIONS = ("--include-path", "-I")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


def command_words(command: str) -> tuple[list[str] | None, str]:
    """meta.json's `command` as the argv it ran, and which form it has ((None, why) when the
    text cannot be split).

    Two forms, told apart by the text. DeepJIT up to e5bdee2 (`backend/cuda/backend.hpp`)
    writes `str::join(args)`: the words with single spaces, unquoted, so splitting on spaces
    gives them back, empty words included (an empty flag still enters the key). Since 24eb539
    every word is in single quotes (a quote inside spelt `'\\''`), as the ROCm backend's
    `command_string` always did, behind `NAME=value` assignments there (`HIP_PLATFORM=amd`):
    a POSIX shell's split gives the words back, the assignments are dropped. Only the quoted
    form holds a single quote, since an unquoted one would have broken DeepJIT's own shell line.
    """
    if "'" not in command:
        return command.split(" "), "space-joined (DeepJIT up to e5bdee2)"
    try:
        words = shlex.split(command, posix=True)
    except ValueError as exc:
        return None, f"its shell quoting is unbalanced ({exc})"
    while words and _ASSIGNMENT.match(words[0]):
        words.pop(0)
    return words, "shell-quoted (DeepJIT since 24eb539)"


def command_flags(command: str, include_dirs: Sequence[str]) -> list[str] | None:
    """The flags part of DeepJIT's compile command: between the output file and the trailing
    include-path pairs (`backend.hpp` joins `[nvcc, src, --cubin, --output-file, cubin, *flags,
    (--include-path, dir)*]`, with single spaces or word by word quoted: `command_words`)."""
    tokens, _form = command_words(command)
    if tokens is None:
        return None
    output = next((i for i, t in enumerate(tokens) if t in _OUTPUT_OPTIONS), None)
    if output is None:
        return None
    end = len(tokens) - 2 * len(include_dirs)
    tail = tokens[end:]
    if end < output + 2 or any(tail[2 * i] not in _INCLUDE_OPTIONS or tail[2 * i + 1] != d
                               for i, d in enumerate(include_dirs)):
        return None
    return tokens[output + 2:end]


# The libraries built on DeepJIT, by the include prefix they configure: (env prefix, name).
# DeepGEMM 2.8 constructs `deep_jit::Config(root, "DG", ..., {"deep_gemm/"})`; DeepEP-Ascend
# reads EP_, and its include prefix is taken to be `deep_ep/` like DeepEP's own (`deep_ep`): the
# reference does not give it. The env prefix itself is not in meta.json (`Config::to_json`
# leaves it out).
_LIBRARIES = {"deep_gemm": ("DG", "DeepGEMM 2.8+"), "deep_ep": ("EP", "DeepEP-Ascend")}


@functools.lru_cache(maxsize=256)
def _real_directory(path: str) -> str:
    # Thousands of entries share a handful of roots: resolve each once.
    return os.path.realpath(path)


def _same_directory(first: str, second: str) -> bool:
    return _real_directory(first) == _real_directory(second)


class DeepJitPolicy(FamilyPolicy):
    runtime = "deepjit"
    env_prefixes = ("DG", "EP")
    flavour = "deepjit"
    reads_configuration_once = True  # `Config` is read when the runtime is built
    scan_family = family_checks.SCAN_FAMILY
    compiling_process = staticmethod(build_directory_pid)

    def configuration_changes(self, entry: CacheEntry, first_env: Mapping[str, str],
                              env: Mapping[str, str]) -> list[ConfigurationChange]:
        return family_checks.configuration_changes(self, entry, first_env, env)

    def environment_variant(self, entry: CacheEntry) -> str | None:
        """"rocm" for an entry DeepJIT's ROCm backend built (`kernel.hsaco`, or meta.json's
        `"backend": "ROCm"`): its `CompilerInfo::get_hash` (backend/rocm/backend.hpp) keys
        CPATH, CPLUS_INCLUDE_PATH, C_INCLUDE_PATH and the HIP variables, which the CUDA
        backend's key leaves out (environment.py, the `deepjit:rocm` statuses)."""
        backend = entry.meta.get("backend")
        binary = entry.binary.path if entry.binary is not None else ""
        if (isinstance(backend, str) and backend.lower() == "rocm") or binary.endswith(
                "/kernel.hsaco"):
            return "rocm"
        return None

    def scan_findings(self, entries: Sequence[CacheEntry],
                      env: Mapping[str, str]) -> list[Finding]:
        return family_checks.prefix_fallback_findings(entries, env)

    def env_families(self, entry: CacheEntry, env: Mapping[str, str]) -> EnvFamilies:
        """Which env prefix the runtime that built `entry` reads (DG_, EP_, or one a library
        chose: `<P>_JIT_*` set in `env`), by the strongest evidence there is: the library its
        include prefixes belong to (meta.json); else the cache root the entry lies in, when
        only some prefixes' `<P>_JIT_CACHE_DIR` in `env` lead there (a build goes to the first
        root); else the prefixes with a variable of their own set in `env`. None of them:
        nothing says, and the result is empty. (Include prefixes naming neither library do not
        rule DG_ or EP_ out: nothing stops a library from configuring either.)"""
        include_prefixes = _config(entry).get("include_prefixes")
        if isinstance(include_prefixes, list):
            libraries = {_LIBRARIES[library] for p in include_prefixes if isinstance(p, str)
                         and (library := p.split("/", 1)[0]) in _LIBRARIES}
            if libraries:
                named = " and ".join(f"{name}'s (env prefix {prefix})"
                                     for prefix, name in sorted(libraries))
                return EnvFamilies(tuple(sorted(prefix for prefix, _ in libraries)),
                                   f"meta.json's include prefixes "
                                   f"{_spoken(map(str, include_prefixes))} are {named}")
        candidates = (*self.env_prefixes, *custom_prefixes_in(env))
        root = os.path.dirname(os.path.dirname(entry.path))
        by_root = tuple(p for p in candidates
                        if (roots := prefix_roots(env, p)) and _same_directory(roots[0], root))
        # DG_ and EP_ both leading there set nothing apart (they share DJ_'s root when unset).
        if by_root and len(by_root) < len(candidates) and not (
                len(by_root) > 1 and set(self.env_prefixes) <= set(by_root)):
            return EnvFamilies(by_root, f"the entry was built in {root}, the cache root that "
                                        f"{' and '.join(p + '_JIT_CACHE_DIR' for p in by_root)} "
                                        f"named")
        pool = by_root or candidates
        # A value every family resolves to alike tells them apart no more than an unset one:
        # a cacheaudit session points each family's compiler setting at the same shim.
        settings = {p: {s.suffix: s for s in resolve_jit_settings(p, env)} for p in pool}
        in_use = tuple(p for p in pool if any(
            own.origin == "prefixed" and any(
                (other := settings[q].get(suffix)) is None or other.value != own.value
                for q in pool if q != p)
            for suffix, own in settings[p].items()))
        if in_use:
            return EnvFamilies(in_use, f"{' and '.join(p + '_JIT_*' for p in in_use)} "
                                       f"variables set in the runtime's environment give values "
                                       f"the other family does not share")
        return EnvFamilies((), "meta.json does not record the env prefix, the cache root does "
                               "not tell, and no DG_JIT_* or EP_JIT_* variable set in the "
                               "runtime's environment sets the two families apart")

    def key_remedy(self, entry: CacheEntry | None) -> str | None:
        """DeepJIT hashes `Config::extra_signature` first into every key, and its README says
        untracked inputs belong there; but the libraries built on it set it themselves
        (DeepGEMM 2.8: `"cutlass-" + CUTLASS_VERSION`) and give their users no way to add to
        it. Which one built the entry: its include prefixes (`env_families`); another library
        (DeepEP-Ascend), whose use of the signature is not known, gets the generic wording."""
        families = self.env_families(entry, {}).prefixes if entry is not None else ()
        if "DG" in families:
            return ("DeepGEMM sets DeepJIT's extra signature itself (its CUTLASS version) and "
                    "has no setting that adds {input} to its key: give each configuration of "
                    "{input} its own DG_JIT_CACHE_DIR")
        if families:
            return None  # DeepEP-Ascend: what it passes as the extra signature is not known
        return ("feed a digest of {input} into DeepJIT's extra signature (the `extra_signature` "
                "of `deep_jit::Config`, hashed first into every key)")

    def rewrites_binary(self, entry: CacheEntry) -> bool:
        # `CUDA::compile` runs `python <hook> <cubin>` after nvcc when the options carry a
        # post hook: the cubin on disk is the hook's, not the one nvcc wrote.
        return bool(_post_hook(entry))

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        paths = {entry.source.path} if entry.source is not None else set()
        name = _source_name(entry)
        reading = self._reading(entry)
        if reading.mistyped is not None:
            return TrackedSet(frozenset(paths), error=reading.mistyped,
                              how=f"DeepJIT's parser over {name}: no usable include_dirs and "
                                  "include_prefixes")
        how = f"DeepJIT's parser over {name}: {reading.how}"
        source, why = _read_source(entry)
        if source is None:
            return TrackedSet(frozenset(paths), error=why, how=how)
        if reading.absent is not None:
            return TrackedSet(frozenset(paths), error=reading.absent, how=how)
        parser = _Parser(reading.include_dirs, reading.prefixes)
        resolved, error = self._walked(parser, source)
        return TrackedSet(frozenset(paths | set(resolved.values())), dict(resolved), error=error,
                          how=how)

    _walks: dict[tuple[tuple[str, ...], tuple[str, ...], str],
                 tuple[tuple[str, str], ...] | None] | None = None
    """An audit's walks of tracked headers (`for_audit`): for include dirs, prefixes and an
    include name, the headers that name reaches (name, realpath) in the walk's order, None
    where its walk failed. The entries of one cache include the same few headers, and a new
    parser per entry walked the whole tree again for each. The module's own policy, used
    outside an audit, keeps nothing: headers may change between calls."""

    _readings: dict[int, tuple[dict[str, Any], _Reading]] | None = None
    """An audit's `_Reading`s by meta.json object (held, so that its id stays its own): the
    entries whose meta.json holds the same bytes share one object (`layout.read_meta`)."""

    def for_audit(self, env: Mapping[str, str], include_dirs: Sequence[str]) -> DeepJitPolicy:
        policy = copy.copy(self)
        policy._walks = {}
        policy._readings = {}
        return policy

    def _reading(self, entry: CacheEntry) -> _Reading:
        meta = entry.meta
        readings = self._readings
        if readings is not None and (kept := readings.get(id(meta))) is not None \
                and kept[0] is meta:
            return kept[1]
        reading = _read_parser_fields(entry)
        if readings is not None and len(readings) < _WALKS_KEPT:
            readings[id(meta)] = (meta, reading)
        return reading

    def _walked(self, parser: _Parser, source: str) -> tuple[dict[str, str], str | None]:
        """The tracked headers `parser` resolves from `source` (name -> realpath, in the walk's
        order), and why the walk stopped short (None: it did not). Within an audit each
        include name is walked once: a walk from a source is the walks of its include names
        one after the other, each without the names an earlier one reached (a finished walk
        holds everything below what it reached). Where any walk fails, the source is walked
        whole, as the runtime would, for what it reached before failing."""
        walks = self._walks
        if walks is None:
            return _walk(parser, source)
        directories, prefixes = tuple(parser.include_dirs), tuple(parser.prefixes)
        resolved: dict[str, str] = {}
        try:
            names = parser.names_in(source)
        except NonStandardInclude:
            return _walk(parser, source)
        for name in names:
            if name in resolved:
                continue
            key = (directories, prefixes, name)
            if key in walks:
                reached = walks[key]
            else:
                alone = _Parser(directories, prefixes)
                try:
                    alone.walk_names([name])
                    reached = tuple(alone.resolved.items())
                except (NonStandardInclude, FileNotFoundError, OSError):
                    reached = None
                if len(walks) < _WALKS_KEPT:
                    walks[key] = reached
            if reached is None:
                return _walk(parser, source)
            for reached_name, path in reached:
                resolved.setdefault(reached_name, path)
        return resolved, None

    def key_components(self, entry: CacheEntry) -> tuple[list[KeyComponent], str | None, str]:
        """The labelled parts of the key as a new runtime would compute them now."""
        name = _source_name(entry)
        backend = entry.meta.get("backend")
        other_source = entry.source is not None and name != "kernel.cu"
        if other_source or (isinstance(backend, str) and backend.upper() != "CUDA"):
            # ROCm's CompilerInfo hashes the hipcc path, its version and HIP/ROCm variables,
            # Ascend's its own toolchain: only the CUDA recipe is known here.
            which = f"{name}, backend {backend}" if isinstance(backend, str) else name
            return [], None, (f"an entry of another backend ({which}): only DeepJIT's CUDA key "
                              "recipe is recomputed")
        if (bad := _mistyped(entry, _KEY_FIELDS)) is not None:
            return [], None, bad
        config = _config(entry)
        info = entry.meta.get("compiler_info") or {}
        command = entry.meta.get("command")
        include_dirs = config.get("include_dirs") or []
        if not isinstance(info, dict) or "version" not in info or not isinstance(command, str):
            return [], None, "meta.json lacks compiler_info.version or command"
        options = entry.meta.get("compiler_options")
        flags = options_flags(options) if isinstance(options, dict) else None
        if flags is None:
            flags = command_flags(command, include_dirs)
        if flags is None:
            return [], None, "meta.json holds neither compiler options nor a command of " \
                             "DeepJIT's shape"
        source, why = _read_source(entry)
        if source is None:
            return [], None, why
        hook = _post_hook(entry)
        hook_digest = ""
        if hook:
            hook_digest, why = _post_hook_digest(entry, hook)
            if hook_digest is None:
                return [], None, why
        parser = _Parser(include_dirs, config.get("include_prefixes") or [])
        try:
            code_digest = parser.parse_into_hash(source)
        except (NonStandardInclude, FileNotFoundError, OSError) as exc:
            return [], None, f"the tracked headers cannot be hashed now: {exc}"
        extra = config.get("extra_signature", "")
        version = info["version"]
        nvcc = str(info.get("path") or "nvcc")
        telling = CompilerIdentity(invoked=nvcc, path=nvcc, resolved=nvcc, kind="nvcc",
                                   version_text=version, digest=None).version_line
        components = [
            KeyComponent("extra_signature", extra, hex_digest(extra)),
            KeyComponent("compiler version (nvcc --version)", telling, hex_digest(version)),
            KeyComponent("flags", " ".join(flags), hex_digest(" ".join(flags))),
            KeyComponent("post hook", hook or "(none)", hex_digest(hook_digest)),
            KeyComponent("source + tracked headers", f"{name} + {len(parser.digests)} tracked",
                         code_digest),
        ]
        components += [KeyComponent(f"  <{include}>", parser.resolved.get(include, "?"), digest)
                       for include, digest in parser.digests.items()]
        key = (FNV1a().update(extra).update(hex_digest(version)).update(" ".join(flags))
               .update(hook_digest).update(code_digest).hexdigest())
        return components, key, ""

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        # meta.json carries every part of the recipe; the recorded compile and the environment
        # add nothing.
        components, key, note = self.key_components(entry)
        return KeyCheck(key, tuple(components), note)

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        # CompilerInfo::get_hash hashes the whole `--version` text, nothing else.
        return recorded.version_text != current.version_text

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        command = entry.meta.get("command")
        if not isinstance(command, str) or entry.source is None:
            return None
        tokens, _form = command_words(command)
        if tokens is None:
            return None
        built_in = next((os.path.dirname(t) for t in tokens if t.endswith("/kernel.cu")), None)
        if built_in is None:
            return None
        # The build ran in <root>/tmp/<uuid>/, renamed into the entry afterwards.
        moved = [entry.path + t[len(built_in):] if t.startswith(built_in + "/") else t
                 for t in tokens]
        return moved, entry.path

    def reconstruction_problem(self, entry: CacheEntry) -> str | None:
        if entry.source is None:
            return "the entry holds no kernel.cu"
        command = entry.meta.get("command")
        if not isinstance(command, str):
            return "its meta.json records no compile command (meta.json missing or unreadable)"
        tokens, why = command_words(command)
        if tokens is None:
            return f"meta.json's compile command cannot be split into words: {why}"
        if not any(t.endswith("/kernel.cu") for t in tokens):
            return (f"meta.json's compile command ({why}) names no kernel.cu, so the build "
                    "directory it ran in is unknown")
        return None


class _Reading(NamedTuple):
    """What meta.json tells DeepJIT's parser, with what is wrong with it."""

    mistyped: str | None
    """Why the parser fields cannot be used (`_mistyped`), or None."""
    include_dirs: list[str]
    prefixes: list[str]
    how: str
    """How the parser finds the tracked headers, after "DeepJIT's parser over <source>: "."""
    absent: str | None
    """Why the tracked set is unknown: a parser field meta.json lacks, or None."""


def _read_parser_fields(entry: CacheEntry) -> _Reading:
    if (bad := _mistyped(entry, _PARSER_FIELDS)) is not None:
        return _Reading(bad, [], [], "", None)
    config = _config(entry)
    include_dirs = list(config.get("include_dirs") or [])
    prefixes = list(config.get("include_prefixes") or [])
    how = (f"the literal #include <...> lines {_spoken_prefixes([str(p) for p in prefixes])},"
           f" looked up in {_spoken(map(str, include_dirs)) or 'no include directory'}")
    missing = [field for field in _PARSER_FIELDS if not meta_field(entry.meta, field)[0]]
    # Without the prefixes nothing says which headers the key covers: an empty list would
    # call every header untracked.
    absent = (f"meta.json lacks {' and '.join(missing)}: which headers the key covers is "
              "unknown") if missing else None
    return _Reading(None, include_dirs, prefixes, how, absent)


def _walk(parser: _Parser, source: str) -> tuple[dict[str, str], str | None]:
    try:
        parser.walk(source)
    except (NonStandardInclude, FileNotFoundError, OSError) as exc:
        return dict(parser.resolved), str(exc)
    return dict(parser.resolved), None


_WALKS_KEPT = 65_536
"""Include names whose walks an audit keeps: a bound that no real cache nears (a DeepGEMM
cache includes a few dozen), against a cache made to exhaust memory."""

POLICIES = {"deepjit": DeepJitPolicy()}



def _spoken(items: Iterable[str], conjunction: str = "and") -> str:
    """`a`, `a and b`, `a, b and c`: a list as a sentence says it (not a Python repr)."""
    listed = list(items)
    if len(listed) < 2:
        return "".join(listed)
    return f"{', '.join(listed[:-1])} {conjunction} {listed[-1]}"


def _spoken_prefixes(prefixes: Sequence[str]) -> str:
    if not prefixes:
        return "(none: no include prefix is given)"
    return f"that start with {_spoken(prefixes, 'or')}"
