"""DeepGEMM's key up to 2.6 (the C++ JIT), and DeepEP's near-copy of it: what it covers.

Source: deepseek-ai/DeepGEMM `csrc/jit/compiler.hpp` (`Compiler::build`),
`csrc/jit/include_parser.hpp` (`IncludeParser`), `csrc/jit/kernel_runtime.hpp`
(`LaunchRuntime::generate`), `csrc/utils/hash.hpp` (`get_hex_digest`), at v2.6.1.

The entry directory is `kernel.<name>.<get_hex_digest(name$$signature$$flags$$code)>`, where
`signature` is `NVCC<major>.<minor>` (the nvcc path and patch version are not in it), `flags` the
one flag string (with `-I<library include>`), and `code` the generated source, whose first line
`// Includes' hash value: <h>` carries the digest of the headers reached through
`#include <deep_gemm...>` (name prefix without a slash), resolved only in the library's include
directory. That include hash is a per-kernel-class static computed once per process, and header
digests are cached per path for the process lifetime.

DeepEP (`csrc/jit/`, EPv2) is the same design with the prefix `deep_ep` (7 characters, no slash)
and `EP_JIT_*` settings; its flags add `-I<nccl>/include`, so NCCL's path is keyed, its headers not.

Not covered: CUTLASS/CuTe, CUDA and host headers, CPATH, NVCC_*_FLAGS, the host compiler, the nvcc
patch version. Later revisions also fold a digest of the whole library include tree into the
include hash; an entry built that way does not match the 2.6.1 recipe, which the recomputation
reports instead of guessing.

Older entries in the same layout follow other recipes (the tracked set follows their own
rules); the Python JIT's is recomputed by `python_jit.py`, the pre-7f2a703 C++ JIT's is not:

- the Python JIT (`kernel.<name>.<md5[:12]>`, deep_gemm/jit/compiler.py, 2025-02 to 2025-07):
  at 8dfa329 the md5 of `name$$get_deep_gemm_version()$$signature$$flags$$enable_sass_opt$$code`,
  where `get_deep_gemm_version()` hashes the top-level `include/deep_gemm/*.cuh` files and
  `jit/interleave_ffma.py`, nothing else, and `signature` is the compiler's
  (`NVCCCompiler.signature()`: `{nvcc path}+{(major, minor)}`; `nvrtc+(major, minor)` under
  NVRTC). The first commit, a6d97a1, hashed the same parts in another order, with the compiler
  as the (path, version) pair `get_nvcc_compiler()` returned then;
- the C++ JIT before 7f2a703 (no include-hash line in kernel.cu):
  `name$$get_library_version()$$signature$$flags$$code`, the library version hashing every
  `.cuh` under `include/deep_gemm`.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

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
from cacheaudit.runtimes._deepseek.environment import FLAVOUR_NAMES
from cacheaudit.runtimes._deepseek.policy import EnvFamilies, FamilyPolicy
from cacheaudit.runtimes._deepseek.recipe import build_directory_pid, split_mix
from cacheaudit.runtimes.deepgemm import python_jit, rebuild
from cacheaudit.runtimes.deepgemm.layout import INCLUDE_HASH_PREFIX, NVRTC, PYTHON_HASH_LEN

_MASK = (1 << 64) - 1
_PRIME = 0x100000001B3
_SEEDS = (0xC6A4A7935BD1E995, 0x9E3779B97F4A7C15)
_INCLUDE = re.compile(r'#\s*include\s*[<"][^>"]+[>"]')
_HASH_LINE = INCLUDE_HASH_PREFIX.decode()
_RELEASE = re.compile(r"release (\d+)\.(\d+)")
_FIRST_VERSION = re.compile(r"(\d+)\.(\d+)")

NVRTC_NOTE = ("built by NVRTC (DG_JIT_USE_NVRTC=1: the entry holds kernel.cubin and no "
              "kernel.cu): the code NVRTC compiled in memory is nowhere on disk, so a scan can "
              "neither recompute the key nor find the headers it read; the DeepGEMM adapter "
              "records such builds in-process (cacheaudit run / the pytest plugin)")
PRE_INCLUDE_HASH_NOTE = ("kernel.cu has no include-hash line: built by DeepGEMM before 7f2a703, "
                         "whose key held get_library_version() (every .cuh under "
                         "include/deep_gemm) instead; not recomputed")


def hex_digest(data: str | bytes) -> str:
    """DeepGEMM's `get_hex_digest`: two seeded FNV-1a-64 passes, no length prefix, split-mixed."""
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    lanes = []
    for seed in _SEEDS:
        state = seed
        for byte in raw:
            state = ((state ^ byte) * _PRIME) & _MASK
        lanes.append(split_mix(state))
    return f"{lanes[0]:016x}{lanes[1]:016x}"


class NonStandardInclude(ValueError):
    """DeepGEMM's `DG_HOST_UNREACHABLE("Non-standard include: ...")`."""


def tracked_includes(code: str, prefix: str = "deep_gemm") -> list[str]:
    """`IncludeParser::get_includes`: the regex runs over the whole text, comments included."""
    names = []
    for match in _INCLUDE.finditer(code):
        text = match.group(0)
        if not (text.startswith("#include <") and text.endswith(">") and text[10] != " "
                and text[-2] != " "):
            raise NonStandardInclude(f"Non-standard include: {text}")
        name = text[10:-1]
        if name.startswith(prefix):
            names.append(name)
    return names


class _IncludeHasher:
    def __init__(self, include_dir: str, prefix: str) -> None:
        self.include_dir = include_dir
        self.prefix = prefix
        self.by_path: dict[str, str] = {}
        self._visiting: set[str] = set()

    def code_hash(self, code: str, exclude_code: bool = True) -> str:
        parts = "".join(self.path_hash(os.path.join(self.include_dir, name)) + "$"
                        for name in tracked_includes(code, self.prefix))
        if not exclude_code:
            parts += "#" + hex_digest(code)
        return hex_digest(parts)

    def path_hash(self, path: str) -> str:
        if path in self.by_path:
            return self.by_path[path]
        if path in self._visiting:
            raise NonStandardInclude(f"Circular include may occur: {path}")
        self._visiting.add(path)
        try:
            digest = self.code_hash(read_header(path), exclude_code=False)
        finally:
            self._visiting.discard(path)
        self.by_path[path] = digest
        return digest


def _source_name(entry: CacheEntry) -> str:
    return os.path.basename(entry.source.path) if entry.source is not None else "kernel.cu"


def _split_source(entry: CacheEntry) -> tuple[str, str] | str:
    """(include hash line value, generated code after it) of an entry's kernel.cu, read byte for
    byte; "" for the value when there is no such line. A str alone says why it cannot be had."""
    source = entry.source
    name = _source_name(entry)
    if source is None or not source.exists:
        return f"{name} is missing"
    if source.digest is None and source.error:
        return f"{name} cannot be read: {source.error}"
    try:
        text = read_input(source.path)
    except OSError as exc:
        return f"{name} cannot be read: {type(exc).__name__}: {exc.strerror or exc}"
    if not text.startswith(_HASH_LINE):
        return "", text
    first, _, rest = text.partition("\n")
    return first[len(_HASH_LINE):], rest


def _python_jit(entry: CacheEntry) -> bool:
    return entry.key is not None and len(entry.key) == PYTHON_HASH_LEN


def _nvrtc(entry: CacheEntry) -> bool:
    return _python_jit(entry) and entry.meta.get("compiler") == NVRTC


def _recorded_include(record: CompileRecord | None, package: str) -> str | None:
    """The `-I` of a compile that holds the package's header directory: the library include
    directory it compiled against (observed, or chosen when the entry was reconstructed)."""
    if record is not None:
        for text in _argv(record):
            if text.startswith("-I") and os.path.isdir(os.path.join(text[2:], package)):
                return text[2:]
    return None


def _argv(record: CompileRecord) -> list[str]:
    """The command line the runtime gave the compiler: the shim's tokens of origin "argv", or a
    reconstruction's argv (which has no effective command)."""
    if record.effective_argv:
        return [t.text for t in record.effective_argv if t.origin == "argv"]
    return list(record.argv)


def compiler_signature(compiler: CompilerIdentity) -> str | None:
    """The compiler part of the key: "NVCC<major>.<minor>" from nvcc's release line, or for the
    reference runtime's CPU stand-in (fixtures/minijit) "GXX<major>.<minor>", the first version
    number on the first line of `g++ --version`; None when the version text has neither."""
    if compiler.kind == "gcc":
        first_line = compiler.version_text.split("\n", 1)[0]
        match = _FIRST_VERSION.search(first_line)
        return f"GXX{match.group(1)}.{match.group(2)}" if match else None
    match = _RELEASE.search(compiler.version_text)
    return f"NVCC{match.group(1)}.{match.group(2)}" if match else None


def _nvrtc_release(compiler: CompilerIdentity) -> tuple[str, ...] | None:
    """NVRTC's (major, minor) from an identity's version text ("NVRTC 13.0 (nvrtcVersion)")."""
    match = _FIRST_VERSION.search(compiler.version_text) if compiler.kind == "nvrtc" else None
    return match.groups() if match else None


def _flags_and_signature(record: CompileRecord | None) -> tuple[str, str] | None:
    """The flag string and signature of the recorded compile: `cd tmp && nvcc <src> -cubin -o
    <cubin> <flags>` reaches the compiler as argv split on blanks, so the tokens after the output
    file, joined by single spaces, are the flag string."""
    if record is None or record.compiler is None:
        return None
    argv = _argv(record)
    if "-o" not in argv:
        return None
    signature = compiler_signature(record.compiler)
    if signature is None:
        return None
    return " ".join(argv[argv.index("-o") + 2:]), signature


def _python_jit_tracked(include_dir: str) -> dict[str, str]:
    """What `get_deep_gemm_version()` hashes: the top-level include/deep_gemm/*.cuh (os.listdir,
    not recursive) and jit/interleave_ffma.py beside the package's include directory."""
    names: dict[str, str] = {}
    top = os.path.join(include_dir, "deep_gemm")
    for name in sorted(os.listdir(top)):
        if name.endswith(".cuh"):
            names[f"deep_gemm/{name}"] = os.path.realpath(os.path.join(top, name))
    ffma = os.path.join(os.path.dirname(include_dir), "jit", "interleave_ffma.py")
    if os.path.isfile(ffma):
        names["jit/interleave_ffma.py"] = os.path.realpath(ffma)
    return names


def _library_version_tracked(include_dir: str) -> dict[str, str]:
    """What the C++ JIT's `get_library_version()` hashed before 7f2a703: every .cuh under
    include/deep_gemm, recursively (.h and .hpp left out)."""
    names: dict[str, str] = {}
    top = os.path.join(include_dir, "deep_gemm")
    if not os.path.isdir(top):
        raise FileNotFoundError(f"{top} is not a directory")
    for directory, dirs, files in os.walk(top):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".cuh"):
                path = os.path.join(directory, name)
                names[os.path.relpath(path, include_dir)] = os.path.realpath(path)
    return names


@dataclass(frozen=True)
class _PythonBuild:
    match: python_jit.Build | None
    """The build whose recomputed key is the entry's."""
    first: python_jit.Build | None
    """The first build tried (the audit's own settings), when none matches."""
    note: str


@dataclass
class _AuditMemo:
    """The per-audit answers of `DeepGemmPolicy` (see `_memo`)."""

    trees: list[str] | None = None
    hashers: dict[str, _IncludeHasher] = field(default_factory=dict)
    signatures: dict[str, str | None] = field(default_factory=dict)
    nvcc_releases: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    python_builds: dict[tuple[str, str | None], _PythonBuild] = field(default_factory=dict)


class DeepGemmPolicy(FamilyPolicy):
    reads_configuration_once = True  # the JIT's settings are read once per process
    scan_family = family_checks.SCAN_FAMILY

    def __init__(self, runtime: str, prefix: str, env_prefix: str) -> None:
        self.runtime = runtime
        self.prefix = prefix
        self.env_prefixes = (env_prefix,)
        self.flavour: str | None = runtime  # "deepgemm", "deepep": FLAVOURS names
        # Since 7f2a703 the build directory is `<root>/tmp/<get_uuid()>`, named after the pid.
        self.compiling_process = build_directory_pid
        self.audit_env: Mapping[str, str] | None = None
        self.include_dirs: tuple[str, ...] = ()
        self._audit_memo: _AuditMemo | None = None

    def for_audit(self, env: Mapping[str, str], include_dirs: Sequence[str]) -> DeepGemmPolicy:
        # The include tree of an unrecorded entry is looked for on the audit's PYTHONPATH and
        # among the trees the user named.
        policy = copy.copy(self)
        policy.audit_env = env
        policy.include_dirs = tuple(include_dirs)
        policy._audit_memo = _AuditMemo()
        return policy

    def _memo(self) -> _AuditMemo:
        """What this audit's entries share (the include trees, header digests, compiler
        signatures, the Python JIT's matching builds), computed once per audit. The module's
        own policy, used outside an audit, keeps nothing: headers may change between calls."""
        return self._audit_memo if self._audit_memo is not None else _AuditMemo()

    # ------------------------------------------------------------ the library include tree

    def _env(self) -> Mapping[str, str]:
        return self.audit_env if self.audit_env is not None else os.environ

    def _trees(self) -> list[str]:
        memo = self._memo()
        if memo.trees is None:
            memo.trees = rebuild.include_trees(self.prefix, self.include_dirs, self._env())
        return memo.trees

    def _hasher(self, tree: str) -> _IncludeHasher:
        hashers = self._memo().hashers
        if tree not in hashers:
            hashers[tree] = _IncludeHasher(tree, self.prefix)
        return hashers[tree]

    def _include_hash(self, tree: str, generated: str) -> str | None:
        try:
            return self._hasher(tree).code_hash(generated)
        except (NonStandardInclude, OSError):
            return None

    def _edited_since_build(self, entry: CacheEntry, tree: str, generated: str) -> bool:
        """Whether a tracked header under `tree` changed after the entry's binary was written:
        the tree then explains an include hash that no longer matches (DeepGEMM misses)."""
        built = entry.built_ns
        if built is None:
            return False
        names: set[str] = set()
        pending = [generated]
        try:
            while pending:
                for include in tracked_includes(pending.pop(), self.prefix):
                    if include in names:
                        continue
                    names.add(include)
                    path = os.path.join(tree, include)
                    st = os.stat(path)
                    if max(st.st_mtime_ns, st.st_ctime_ns) > built:
                        return True
                    pending.append(read_header(path))
        except (NonStandardInclude, OSError):
            return False
        return False

    def _tree_for(self, entry: CacheEntry) -> str | None:
        """The include tree that built an unrecorded entry: the first candidate whose include
        hash is the one kernel.cu records, else one whose tracked headers changed since the
        build, else (nothing says which) the first; None when there is none."""
        trees = self._trees()
        split = _split_source(entry)
        if not trees or isinstance(split, str) or not split[0]:
            return trees[0] if trees else None
        recorded, generated = split
        for tree in trees:
            if self._include_hash(tree, generated) == recorded:
                return tree
        return next((t for t in trees if self._edited_since_build(entry, t, generated)),
                    trees[0])

    def _include_dir(self, entry: CacheEntry, record: CompileRecord | None) -> str | None:
        if _python_jit(entry):
            found = self._python_build(entry, record)
            if found.match is not None:
                return found.match.tree
        return _recorded_include(record, self.prefix) or self._tree_for(entry)

    # ------------------------------------------------------------ the Python JIT's key

    def _nvcc_release(self, path: str) -> tuple[int, int] | None:
        releases = self._memo().nvcc_releases
        if path not in releases:
            from cacheaudit import compilers

            identity = compilers.identify(path, env=self._env())
            releases[path] = (python_jit.nvcc_version(identity.version_text)
                                         if identity.error is None else None)
        return releases[path]

    def _python_build(self, entry: CacheEntry, record: CompileRecord | None) -> _PythonBuild:
        """How the Python JIT built `entry`: the include tree, the nvcc and the settings whose
        recomputed key is the entry's, tried from the recorded compile (when there is one) and
        the audit's environment (DG_JIT_NVCC_COMPILER / DG_NVCC_COMPILER, else torch's
        CUDA_HOME's nvcc; the trees as for the C++ JIT)."""
        memo = (entry.path, record.record_id if record is not None else None)
        builds = self._memo().python_builds
        if memo in builds:
            return builds[memo]
        env = self._env()
        trees = [t for t in [_recorded_include(record, self.prefix)] if t] + self._trees()
        paths: list[str] = []
        # A recorded nvcc is asked its --version only for a record this user sealed, still the
        # same binary (`compilers.recorded_distrust`); else only the configuration's.
        if record is not None and record.compiler is not None:
            from cacheaudit import compilers as compiler_module

            if compiler_module.recorded_distrust(record, env) is None:
                paths += [p for p in (record.compiler.invoked, record.compiler.path)
                          if p and os.path.isabs(p)]
        for release in python_jit.RELEASES:
            paths += python_jit.configured_nvcc(release, env)
        compilers = [(p, v) for p in dict.fromkeys(paths) if (v := self._nvcc_release(p))]
        found = _PythonBuild(None, None, "")
        if entry.source is None or not entry.source.exists:
            found = _PythonBuild(None, None, NVRTC_NOTE if _nvrtc(entry) else
                                 f"{_source_name(entry)} is missing")
        elif not trees:
            found = _PythonBuild(None, None, f"no {self.prefix} include tree found (none on "
                                 "PYTHONPATH or sys.path, none named with --include-dir)")
        elif not compilers:
            found = _PythonBuild(None, None, "no nvcc found as the runtime looks for it "
                                 "(DG_JIT_NVCC_COMPILER, else <CUDA_HOME>/bin/nvcc)")
        else:
            try:
                match, first = python_jit.matching(entry.key or "", entry.kernel,
                                                   entry.source.path, trees, compilers, env)
                note = "" if match else (
                    f"no include tree, nvcc and settings tried gives the entry's key (trees "
                    f"{', '.join(trees)}; nvcc {', '.join(p for p, _ in compilers)})")
                found = _PythonBuild(match, first, note)
            except OSError as exc:
                found = _PythonBuild(None, None, f"{_source_name(entry)} cannot be read: {exc}")
        builds[memo] = found
        return found

    def _python_key(self, entry: CacheEntry, record: CompileRecord | None) -> KeyCheck:
        components = [KeyComponent("name", entry.kernel, None)]
        found = self._python_build(entry, record)
        build = found.match or found.first
        if build is None:
            return KeyCheck(None, tuple(components), found.note)
        sass = "FFMA interleave" + ("" if build.nvcc_version <= (12, 8) else " (off: nvcc > 12.8)")
        components += [KeyComponent("get_deep_gemm_version()", build.tree, build.version),
                       KeyComponent("compiler", f"{build.nvcc}+{build.nvcc_version}", None),
                       KeyComponent("flags", " ".join(build.flags), None),
                       KeyComponent("release", build.release, sass)]
        return KeyCheck(build.key, tuple(components), found.note)

    def _tree_problem(self, entry: CacheEntry, tree: str) -> str | None:
        """Why `tree` is not known to be the one that built the entry: its include hash is
        not kernel.cu's and none of its tracked headers changed since the build."""
        split = _split_source(entry)
        if isinstance(split, str) or not split[0]:
            return None
        recorded, generated = split
        if (self._include_hash(tree, generated) == recorded
                or self._edited_since_build(entry, tree, generated)):
            return None
        seen = ", ".join(f"{t} gives {self._include_hash(t, generated) or 'no hash'}"
                         for t in dict.fromkeys([tree, *self._trees()]))
        return (f"the include hash in kernel.cu ({recorded}) matches none of the "
                f"{self.prefix} include trees found ({seen}), and none of their tracked "
                f"headers changed since the build: another {self.prefix} built this entry; "
                f"name its include tree with --include-dir")

    def env_families(self, entry: CacheEntry, env: Mapping[str, str]) -> EnvFamilies:
        prefix = self.env_prefixes[0]
        return EnvFamilies(self.env_prefixes,
                           f"{FLAVOUR_NAMES[self.runtime]} reads only {prefix}_ variables")

    def configuration_changes(self, entry: CacheEntry, first_env: Mapping[str, str],
                              env: Mapping[str, str]) -> list[ConfigurationChange]:
        return family_checks.configuration_changes(self, entry, first_env, env)

    def scan_findings(self, entries: Sequence[CacheEntry],
                      env: Mapping[str, str]) -> list[Finding]:
        return family_checks.prefix_fallback_findings(entries, env)

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        include_dir = self._include_dir(entry, record)
        name = _source_name(entry)
        how = (f"{self.runtime}'s include regex over {name}: <{self.prefix}...> in the library "
               f"include dir")
        paths = {entry.source.path} if entry.source is not None else set()
        if _nvrtc(entry):
            return TrackedSet(frozenset(), error=NVRTC_NOTE, how="the Python JIT's NVRTC mode")
        split = _split_source(entry)
        if isinstance(split, str):
            return TrackedSet(frozenset(paths), error=split, how=how)
        if include_dir is None:
            return TrackedSet(frozenset(paths), error="the library include directory is unknown "
                              f"(no recorded compile, no {self.prefix} on PYTHONPATH or "
                              "sys.path, none named with --include-dir)", how=how)
        if (record is None or record.reconstructed) and not _python_jit(entry):
            problem = self._tree_problem(entry, include_dir)
            if problem is not None:
                return TrackedSet(frozenset(paths), error=problem, how=how)
        legacy = None
        if _python_jit(entry):
            legacy = (_python_jit_tracked, "the Python JIT's get_deep_gemm_version(): the "
                      "top-level include/deep_gemm/*.cuh and jit/interleave_ffma.py")
        elif not split[0] and self.prefix == "deep_gemm":
            legacy = (_library_version_tracked, "the C++ JIT's get_library_version() before "
                      "7f2a703: every .cuh under include/deep_gemm")
        if legacy is not None:
            collect, legacy_how = legacy
            try:
                names = collect(include_dir)
            except OSError as exc:
                return TrackedSet(frozenset(paths), error=str(exc), how=legacy_how)
            return TrackedSet(frozenset(paths | set(names.values())), names, how=legacy_how)
        names = {}
        pending = [split[1]]
        try:
            while pending:
                for include in tracked_includes(pending.pop(), self.prefix):
                    path = os.path.join(include_dir, include)
                    if include in names:
                        continue
                    names[include] = os.path.realpath(path)
                    pending.append(read_header(path))
        except (NonStandardInclude, OSError) as exc:
            return TrackedSet(frozenset(paths | set(names.values())), names, str(exc), how)
        return TrackedSet(frozenset(paths | set(names.values())), names, how=how)

    def rewrites_binary(self, entry: CacheEntry) -> bool:
        # The Python JIT interleaves FFMA instructions in the cubin after nvcc exits
        # (jit/interleave_ffma.py, its default up to nvcc 12.8), so its entries may hold
        # another binary than the one nvcc wrote; the C++ JIT publishes nvcc's cubin as is.
        return _python_jit(entry)

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        # The entry holds only kernel.cu and the binary; the recorded compile supplies the flags,
        # the signature and the library include directory.
        components = [KeyComponent("name", entry.kernel, None)]
        if _python_jit(entry):
            return self._python_key(entry, record)
        split = _split_source(entry)
        if isinstance(split, str):
            return KeyCheck(None, tuple(components), split)
        recorded_hash, generated = split
        if not recorded_hash:
            return KeyCheck(None, tuple(components), PRE_INCLUDE_HASH_NOTE)
        include_dir = self._include_dir(entry, record)
        if include_dir is None:
            return KeyCheck(None, tuple(components), "the library include directory is unknown")
        try:
            include_hash = self._hasher(include_dir).code_hash(generated)
        except (NonStandardInclude, OSError) as exc:
            return KeyCheck(None, tuple(components), f"the tracked headers cannot be hashed: {exc}")
        components.append(KeyComponent("include hash (recorded in kernel.cu)", recorded_hash,
                                       include_hash))
        shape = _flags_and_signature(record)
        if shape is None:
            return KeyCheck(None, tuple(components),
                            "flags and signature are not in the entry; no recorded compile")
        flags, signature = shape
        code = f"{_HASH_LINE}{include_hash}\n{generated}"
        components += [KeyComponent("signature", signature, None),
                       KeyComponent("flags", flags, hex_digest(flags)),
                       KeyComponent("code", f"kernel.cu ({len(code)} bytes)", hex_digest(code))]
        return KeyCheck(hex_digest(f"{entry.kernel}$${signature}$${flags}$${code}"),
                        tuple(components))

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        # Only the signature ("NVCC<major>.<minor>", or the stand-in's "GXX<major>.<minor>")
        # enters the key: a patch release or another binary of the same release at the same
        # path does not. The Python JIT's NVRTC mode keys "nvrtc+(major, minor)"; a libnvrtc a
        # scan cannot identify (it is a library, loaded in-process) is no evidence of drift.
        if recorded.kind == "nvrtc":
            now = _nvrtc_release(current)
            return now is None or now != _nvrtc_release(recorded)
        return compiler_signature(recorded) != compiler_signature(current)

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        # DeepGEMM writes no command into the entry: the include tree, the compiler and the
        # flags are found from the audit's environment, and confirmed by the include hash and
        # the key where they can be (rebuild.py).
        if entry.source is None or entry.binary is None:
            return None
        if _python_jit(entry):
            found = self._python_build(entry, None)
            build = found.match or found.first
            if build is None:
                return None
            return python_jit.command(build, entry.path), entry.path
        binary = os.path.basename(entry.binary.path)
        kind = "nvcc" if binary.endswith(".cubin") else "gxx"
        tree = self._tree_for(entry)
        compiler = rebuild.configured_compiler(kind, self._env(), self.env_prefixes[0])
        if tree is None or compiler is None:
            return None
        candidates = rebuild.flag_strings(kind, tree, self._env(), self.env_prefixes[0])
        signature = self._signature(compiler)
        try:
            code = read_input(entry.source.path)
        except OSError:
            code = None
        flags = candidates[0]
        if signature is not None and code is not None and entry.key:
            flags = rebuild.matching_flags(
                candidates, lambda f: hex_digest(f"{entry.kernel}$${signature}$${f}$${code}"),
                entry.key) or flags
        return rebuild.command(kind, compiler, entry.path, binary, flags), entry.path

    def reconstruction_problem(self, entry: CacheEntry) -> str | None:
        if _nvrtc(entry):
            return NVRTC_NOTE
        if entry.source is None or entry.binary is None:
            return "the entry holds no kernel.cu or no binary"
        if _python_jit(entry):
            return ("no deep_gemm package whose headers, nvcc and settings give this entry's "
                    "key was found (name its tree with --include-dir or include-dirs in "
                    "[tool.cacheaudit], and its nvcc with DG_JIT_NVCC_COMPILER)")
        kind = "nvcc" if entry.binary.path.endswith(".cubin") else "gxx"
        if self._tree_for(entry) is None:
            return ("the deep_gemm include tree that built it was not found on PYTHONPATH "
                    "(name it with --include-dir or include-dirs in [tool.cacheaudit])")
        if rebuild.configured_compiler(kind, self._env(), self.env_prefixes[0]) is None:
            return (f"no {kind} to rebuild it with: set {self.env_prefixes[0]}_JIT_NVCC_COMPILER "
                    "or CUDA_HOME")
        return None

    def _signature(self, compiler: str) -> str | None:
        signatures = self._memo().signatures
        if compiler not in signatures:
            from cacheaudit import compilers

            identity = compilers.identify(compiler, env=self._env())
            signatures[compiler] = (compiler_signature(identity) if identity.error is None
                                          else None)
        return signatures[compiler]


POLICIES = {"deepgemm": DeepGemmPolicy("deepgemm", "deep_gemm", "DG"),
            "deepep": DeepGemmPolicy("deepep", "deep_ep", "EP")}
