"""What a DeepGEMM 2.x (C++ JIT) entry built without recording was compiled with: the library
include tree, the compiler and the flag string, found from the disk and the audit's environment.

Source: deepseek-ai/DeepGEMM v2.6.1 `csrc/jit/compiler.hpp` (`NVCCCompiler`, `Compiler::build`)
and `deep_gemm/__init__.py` (`_C.init(library_root_path, cuda_home)`): the include directory is
the installed package's `deep_gemm/include` (CuTe and CUTLASS are copied into it at install),
and the compile is `cd <root>/tmp && <nvcc> <dir>/kernel.cu -cubin -o <dir>/kernel.cubin <flags>`
with the one `-I<include>` inside `<flags>`. The entry records none of it; what it keeps is the
include hash of the tracked `<deep_gemm/...>` headers (first line of kernel.cu) and its key, so
a candidate tree and flag string are confirmed by recomputing them, never assumed.

The trees come from the user (`--include-dir`, `include-dirs` in [tool.cacheaudit]) and from
every copy of the package on the audit's PYTHONPATH and sys.path (`PathFinder.find_spec` per
path item: found, not imported), so that the tree that built an entry is told apart from the
one cacheaudit's own interpreter would import.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.machinery import PathFinder

from cacheaudit.shim import strip_masquerade_dirs
from cacheaudit.switches import is_masquerade_dir

# Fixed parts of NVCCCompiler's flags (v2.6.1), and of the reference runtime's g++ stand-in.
NVCC_HEAD = "--diag-suppress=39,161,174,177,186,940 --ptxas-options=--register-usage-level=10"
NVCC_TAIL = ("--compiler-options=-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi "
             "-O3 --expt-relaxed-constexpr --expt-extended-lambda")
NVCC_VERBOSE = "--ptxas-options=--verbose,--warn-on-local-memory-usage"
NVCC_LINEINFO = "-Xcompiler -rdynamic -lineinfo"
GXX_TAIL = "-fPIC -O3 -fconcepts -Wno-deprecated-declarations -Wno-abi"
# get_arch() of the devices DeepGEMM supports, most common first (the entry does not say).
ARCHES = ("90a", "100a", "100f", "103a", "90", "100", "120a", "89", "80")


def installed_packages(package: str, env: Mapping[str, str]) -> list[str]:
    """The directory of every copy of `package` on the audit's PYTHONPATH, then on sys.path,
    in that order and each once: looked up per path item, never imported."""
    items = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    items += [p for p in sys.path if p]
    found: dict[str, str] = {}
    for item in dict.fromkeys(items):
        try:
            spec = PathFinder.find_spec(package, [item])
        except (ImportError, OSError, ValueError):
            continue
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.setdefault(os.path.realpath(location), location)
    return list(found.values())


def include_trees(package: str, named: Sequence[str], env: Mapping[str, str]) -> list[str]:
    """Candidate include directories (each holding `<package>/`): the user's first (given as
    the include directory or as the package directory above it), then the installed copies'."""
    trees: dict[str, str] = {}
    for directory in named:
        for candidate in (directory, os.path.join(directory, "include")):
            if os.path.isdir(os.path.join(candidate, package)):
                trees.setdefault(os.path.realpath(candidate), candidate)
                break
    for location in installed_packages(package, env):
        include = os.path.join(location, "include")
        if os.path.isdir(os.path.join(include, package)):
            trees.setdefault(os.path.realpath(include), include)
    return list(trees.values())


def configured_compiler(kind: str, env: Mapping[str, str], prefix: str) -> str | None:
    """The compiler DeepGEMM would run under `env`: `<P>_JIT_NVCC_COMPILER`, else
    `<CUDA_HOME>/bin/nvcc` (nvcc) or g++ on PATH (the stand-in). A compiler shim in a
    masquerade directory is followed to the real one, which the dependency pass runs."""
    configured = env.get(f"{prefix}_JIT_NVCC_COMPILER", "")
    path_value = strip_masquerade_dirs(env.get("PATH", os.defpath))
    if configured and is_masquerade_dir(os.path.dirname(configured)):
        return shutil.which(os.path.basename(configured), path=path_value)
    if configured:
        return configured
    if kind == "nvcc":
        for home in (env.get("CUDA_HOME"), env.get("CUDA_PATH")):
            if home and os.path.exists(os.path.join(home, "bin", "nvcc")):
                return os.path.join(home, "bin", "nvcc")
        return shutil.which("nvcc", path=path_value)
    return shutil.which("g++", path=path_value)


def _flag(env: Mapping[str, str], prefix: str, suffix: str) -> int:
    text = env.get(f"{prefix}_JIT_{suffix}", "").strip()
    try:
        return int(text) if text else 0
    except ValueError:
        return 0


def flag_strings(kind: str, include: str, env: Mapping[str, str], prefix: str) -> list[str]:
    """Flag strings NVCCCompiler (or the stand-in) builds, the one the audit's environment
    gives first, then the other settings' combinations: the key tells which was used."""
    standard = _flag(env, prefix, "CPP_STANDARD") or 20
    verbose = bool(_flag(env, prefix, "DEBUG") or _flag(env, prefix, "PTXAS_VERBOSE")
                   or _flag(env, prefix, "PTXAS_CHECK"))
    lineinfo = bool(_flag(env, prefix, "WITH_LINEINFO"))
    settings = [(standard, verbose, lineinfo)]
    settings += [(s, v, li) for s in dict.fromkeys((standard, 20, 17)) for v in (False, True)
                 for li in (False, True) if (s, v, li) != settings[0]]
    strings = []
    for std, verb, line in settings:
        if kind == "nvcc":
            head = " ".join([f"-std=c++{std}", NVCC_HEAD] + [NVCC_VERBOSE] * verb
                            + [NVCC_LINEINFO] * line)
            strings += [f"{head} -I{include} --gpu-architecture=sm_{arch} {NVCC_TAIL}"
                        for arch in ARCHES]
        else:
            head = " ".join([f"-std=c++{std}"] + ["-Wall"] * verb + ["-rdynamic -g"] * line)
            strings.append(f"{head} -I{include} {GXX_TAIL}")
    return strings


def command(kind: str, compiler: str, entry_dir: str, binary: str, flags: str) -> list[str]:
    """The compile's argv, with the entry directory standing for the build directory it was
    renamed from (DeepGEMM names both files by absolute path)."""
    source = os.path.join(entry_dir, "kernel.cu")
    output = os.path.join(entry_dir, binary)
    if kind == "nvcc":
        return [compiler, source, "-cubin", "-o", output, *flags.split(" ")]
    return [compiler, "-x", "c++", source, "-shared", "-o", output, *flags.split(" ")]


def matching_flags(candidates: Sequence[str], key_of: Callable[[str], str],
                   key: str) -> str | None:
    """The first flag string whose recomputed key is the entry's."""
    return next((flags for flags in candidates if key_of(flags) == key), None)
