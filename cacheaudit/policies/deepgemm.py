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
"""

from __future__ import annotations

import importlib.util
import os
import re

from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity
from cacheaudit.policies import KeyCheck, KeyComponent, TrackedSet

_MASK = (1 << 64) - 1
_PRIME = 0x100000001B3
_SEEDS = (0xC6A4A7935BD1E995, 0x9E3779B97F4A7C15)
_INCLUDE = re.compile(r'#\s*include\s*[<"][^>"]+[>"]')
_HASH_LINE = "// Includes' hash value: "
_RELEASE = re.compile(r"release (\d+)\.(\d+)")


def _split_mix(value: int) -> int:
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK
    return value ^ (value >> 31)


def hex_digest(data: str) -> str:
    """DeepGEMM's `get_hex_digest`: two seeded FNV-1a-64 passes, no length prefix, split-mixed."""
    raw = data.encode("utf-8", "surrogateescape")
    lanes = []
    for seed in _SEEDS:
        state = seed
        for byte in raw:
            state = ((state ^ byte) * _PRIME) & _MASK
        lanes.append(_split_mix(state))
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
            with open(path, encoding="utf-8", errors="surrogateescape") as handle:
                digest = self.code_hash(handle.read(), exclude_code=False)
        finally:
            self._visiting.discard(path)
        self.by_path[path] = digest
        return digest


def _split_source(entry: CacheEntry) -> tuple[str, str] | None:
    """(include hash line value, generated code after it) of an entry's kernel.cu."""
    if entry.source is None or not entry.source.exists:
        return None
    try:
        with open(entry.source.path, encoding="utf-8", errors="surrogateescape") as handle:
            text = handle.read()
    except OSError:
        return None
    if not text.startswith(_HASH_LINE):
        return "", text
    first, _, rest = text.partition("\n")
    return first[len(_HASH_LINE):], rest


def _library_include(record: CompileRecord | None, package: str) -> str | None:
    """The library's include directory: the `-I` of the recorded compile that holds the
    package's header directory, else the installed package's (found, not imported)."""
    if record is not None:
        for token in record.effective_argv:
            if token.text.startswith("-I") and os.path.isdir(os.path.join(token.text[2:],
                                                                          package)):
                return token.text[2:]
    spec = importlib.util.find_spec(package)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            include = os.path.join(location, "include")
            if os.path.isdir(include):
                return include
    return None


def _flags_and_signature(record: CompileRecord | None) -> tuple[str, str] | None:
    """The flag string and signature of the recorded compile: `cd tmp && nvcc <src> -cubin -o
    <cubin> <flags>` reaches the compiler as argv split on blanks, so the tokens after the output
    file, joined by single spaces, are the flag string."""
    if record is None or record.compiler is None:
        return None
    argv = [t.text for t in record.effective_argv if t.origin == "argv"]
    if "-o" not in argv:
        return None
    flags = " ".join(argv[argv.index("-o") + 2:])
    if record.compiler.kind == "gcc":
        # The reference runtime's CPU stand-in (fixtures/minijit) signs with "GXX<major>.<minor>",
        # the first version number on the first line of `g++ --version`.
        first_line = record.compiler.version_text.split("\n", 1)[0]
        match = re.search(r"(\d+)\.(\d+)", first_line)
        return (flags, f"GXX{match.group(1)}.{match.group(2)}") if match else None
    match = _RELEASE.search(record.compiler.version_text)
    if match is None:
        return None
    return flags, f"NVCC{match.group(1)}.{match.group(2)}"


class DeepGemmPolicy:
    def __init__(self, runtime: str, prefix: str, env_prefix: str) -> None:
        self.runtime = runtime
        self.prefix = prefix
        self.env_prefixes = (env_prefix,)
        self.flavour = runtime

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        include_dir = _library_include(record, self.prefix)
        how = (f"{self.runtime}'s include regex over kernel.cu: <{self.prefix}...> in the library "
               f"include dir")
        paths = {entry.source.path} if entry.source is not None else set()
        split = _split_source(entry)
        if split is None:
            return TrackedSet(frozenset(paths), error="kernel.cu is missing", how=how)
        if include_dir is None:
            return TrackedSet(frozenset(paths), error="the library include directory is unknown "
                              f"(no recorded compile, {self.prefix} not installed)", how=how)
        names: dict[str, str] = {}
        pending = [split[1]]
        try:
            while pending:
                for name in tracked_includes(pending.pop(), self.prefix):
                    path = os.path.join(include_dir, name)
                    if name in names:
                        continue
                    names[name] = os.path.realpath(path)
                    with open(path, encoding="utf-8", errors="surrogateescape") as handle:
                        pending.append(handle.read())
        except (NonStandardInclude, OSError) as exc:
            return TrackedSet(frozenset(paths | set(names.values())), names, str(exc), how)
        return TrackedSet(frozenset(paths | set(names.values())), names, how=how)

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None) -> KeyCheck:
        # The entry holds only kernel.cu and the binary; the recorded compile supplies the flags,
        # the signature and the library include directory.
        split = _split_source(entry)
        include_dir = _library_include(record, self.prefix)
        if split is None:
            return KeyCheck(None, note="kernel.cu is missing")
        recorded_hash, generated = split
        components = [KeyComponent("name", entry.kernel, None)]
        if include_dir is None:
            return KeyCheck(None, tuple(components), "the library include directory is unknown")
        try:
            include_hash = _IncludeHasher(include_dir, self.prefix).code_hash(generated)
        except (NonStandardInclude, OSError) as exc:
            return KeyCheck(None, tuple(components), f"the tracked headers cannot be hashed: {exc}")
        components.append(KeyComponent("include hash (recorded in kernel.cu)", recorded_hash,
                                       include_hash))
        shape = _flags_and_signature(record)
        if shape is None:
            return KeyCheck(None, tuple(components),
                            "flags and signature are not in the entry; no recorded compile")
        flags, signature = shape
        code = f"{_HASH_LINE}{include_hash}\n{generated}" if recorded_hash else generated
        components += [KeyComponent("signature", signature, None),
                       KeyComponent("flags", flags, hex_digest(flags)),
                       KeyComponent("code", f"kernel.cu ({len(code)} bytes)", hex_digest(code))]
        return KeyCheck(hex_digest(f"{entry.kernel}$${signature}$${flags}$${code}"),
                        tuple(components))

    def compiler_change_in_key(self, recorded: CompilerIdentity,
                               current: CompilerIdentity) -> bool:
        # Only "NVCC<major>.<minor>" enters the key: a patch release or another binary of the
        # same release at the same path does not.
        old = _RELEASE.search(recorded.version_text)
        new = _RELEASE.search(current.version_text)
        return (old and old.groups()) != (new and new.groups())

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        # DeepGEMM writes no command into the entry, and without a recorded compile the flags
        # (arch, C++ standard, include directory) are unknown.
        return None


POLICIES = {"deepgemm": DeepGemmPolicy("deepgemm", "deep_gemm", "DG"),
            "deepep": DeepGemmPolicy("deepep", "deep_ep", "EP")}
