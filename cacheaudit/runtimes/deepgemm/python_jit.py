"""DeepGEMM's Python JIT key (`deep_gemm/jit/compiler.py`, 2025-02 to 2025-07), recomputed from
an entry and the disk now, and the nvcc argv that built it.

Source: deepseek-ai/DeepGEMM at 8dfa329 (`Compiler.build`, `NVCCCompiler`) and a6d97a1 (`build`),
as fixtures/deepgemm_python replicates them:

- 8dfa329: `md5("{name}$${version}$${nvcc path}+{(major, minor)}$${flags}$${sass}$${code}")[:12]`,
  `flags` the str() of the Python list, with `-I<package>/jit/../include` in it; the command is
  `[nvcc, <entry>/kernel.cu, -o, <tmp cubin>, *flags]`.
- a6d97a1: `md5("{name}$${version}$${code}$${(nvcc path, 'M.m')}$${flags}$${sass}")[:12]`, the
  include directory outside `flags`: `[nvcc, <entry>/kernel.cu, -o, <tmp so>, *flags, -I...]`.

`version` is `get_deep_gemm_version()`: md5 over the top-level `include/deep_gemm/*.cuh` (sorted)
and `jit/interleave_ffma.py`. `sass` is whether the FFMA interleave ran (nvcc <= 12.8 and not
disabled). None of it is in the entry: the include tree, the nvcc and the settings are found from
the audit's environment and confirmed by recomputing the key, never assumed.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from cacheaudit.policy import read_input

RELEASES = ("8dfa329", "a6d97a1")
_RELEASE_LINE = re.compile(r"release (\d+)\.(\d+)")
_CXX_8DFA329 = "-fPIC,-O3,-fconcepts,-Wno-deprecated-declarations,-Wno-abi"
_CXX_A6D97A1 = "-fPIC,-O3,-Wno-deprecated-declarations,-Wno-abi"


@dataclass(frozen=True)
class Build:
    """One way the runtime could have built an entry, and the key it gives."""

    release: str
    tree: str
    """The include directory (holding deep_gemm/) whose headers were hashed."""
    nvcc: str
    nvcc_version: tuple[int, int]
    flags: tuple[str, ...]
    include: str
    """The include directory as the runtime spelled it in the command."""
    key: str
    version: str


def md5_12(text: str) -> str:
    return hashlib.md5(text.encode("utf-8", "surrogateescape")).hexdigest()[:12]


def deep_gemm_version(tree: str) -> str:
    """`get_deep_gemm_version()` for the package whose include directory is `tree`. Raises
    OSError when a part of it cannot be read."""
    digest = hashlib.md5()
    top = os.path.join(tree, "deep_gemm")
    for name in sorted(os.listdir(top)):
        if name.endswith(".cuh"):
            with open(os.path.join(top, name), "rb") as handle:
                digest.update(handle.read())
    with open(interleave_ffma_path(tree), "rb") as handle:
        digest.update(handle.read())
    return digest.hexdigest()[:12]


def interleave_ffma_path(tree: str) -> str:
    # `os.path.realpath(__file__)`'s directory: the package's jit/, symlinks resolved.
    return os.path.join(os.path.realpath(os.path.dirname(tree)), "jit", "interleave_ffma.py")


def include_spellings(tree: str) -> list[str]:
    """`<package>/jit/../include` as the runtime's `os.path.abspath(__file__)` gives it: the
    package directory as imported (the PYTHONPATH item's spelling), or with symlinks resolved."""
    spellings = []
    for package in dict.fromkeys((os.path.abspath(os.path.dirname(tree)),
                                  os.path.realpath(os.path.dirname(tree)))):
        spellings.append(os.path.join(package, "jit", "..", "include"))
    return spellings


def torch_cuda_home(env: Mapping[str, str]) -> str | None:
    """torch's `_find_cuda_home()` under `env`: CUDA_HOME, CUDA_PATH, `which nvcc`'s toolkit,
    /usr/local/cuda."""
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home is None:
        nvcc = shutil.which("nvcc", path=env.get("PATH", os.defpath))
        if nvcc is not None:
            home = os.path.dirname(os.path.dirname(nvcc))
        elif os.path.exists("/usr/local/cuda"):
            home = "/usr/local/cuda"
    return home


def configured_nvcc(release: str, env: Mapping[str, str]) -> list[str]:
    """`get_nvcc_compiler()`'s candidates under `env`, in its order: the setting when it names
    an existing file, then `<CUDA_HOME>/bin/nvcc`."""
    setting = "DG_NVCC_COMPILER" if release == "a6d97a1" else "DG_JIT_NVCC_COMPILER"
    paths = [env[setting]] if env.get(setting) else []
    paths.append(os.path.join(str(torch_cuda_home(env)), "bin", "nvcc"))
    return [p for p in paths if os.path.exists(p)][:1]


def nvcc_version(version_text: str) -> tuple[int, int] | None:
    match = _RELEASE_LINE.search(version_text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _setting(env: Mapping[str, str], name: str, default: int) -> int:
    try:
        return int(env.get(name, "") or default)
    except ValueError:
        return default


def _flag_lists(release: str, include: str, env: Mapping[str, str]
                ) -> Iterator[tuple[list[str], bool]]:
    """(flags, sass setting disabled) candidates: the audit's settings first, then the others."""
    if release == "a6d97a1":
        verbose_now = "DG_PTXAS_VERBOSE" in env
        disabled_now = bool(_setting(env, "DG_DISABLE_FFMA_INTERLEAVE", 0))
        for verbose, disabled in itertools.product((verbose_now, not verbose_now),
                                                   (disabled_now, not disabled_now)):
            yield ["-std=c++17", "-shared", "-O3", "--expt-relaxed-constexpr",
                   "--expt-extended-lambda", "-gencode=arch=compute_90a,code=sm_90a",
                   "--ptxas-options=--register-usage-level=10" + (",--verbose" * verbose),
                   "--diag-suppress=177,174,940",
                   f"--compiler-options={_CXX_A6D97A1}"], disabled
        return
    standard_now = _setting(env, "DG_JIT_OVERRIDE_CPP_STANDARD", 20)
    verbose_now = "DG_JIT_PTXAS_VERBOSE" in env
    disabled_now = bool(_setting(env, "DG_JIT_DISABLE_FFMA_INTERLEAVE", 0))
    for standard, verbose, disabled in itertools.product(
            dict.fromkeys((standard_now, 20, 17)), (verbose_now, not verbose_now),
            (disabled_now, not disabled_now)):
        yield [f"-std=c++{standard}",
               "--ptxas-options=--register-usage-level=10" + (",--verbose" * verbose),
               "--diag-suppress=39,161,174,177,186,940", f"-I{include}",
               "-gencode=arch=compute_90a,code=sm_90a", "-cubin", "-O3",
               "--expt-relaxed-constexpr", "--expt-extended-lambda",
               f"--compiler-options={_CXX_8DFA329}"], disabled


def key_of(release: str, name: str, version: str, nvcc: str, nvcc_release: tuple[int, int],
           flags: Sequence[str], sass: bool, code: str) -> str:
    """The entry's 12 hex digits as the release computes them."""
    if release == "a6d97a1":
        compiler = (nvcc, f"{nvcc_release[0]}.{nvcc_release[1]}")
        return md5_12(f"{name}$${version}$${code}$${compiler}$${list(flags)}$${sass}")
    return md5_12(f"{name}$${version}$${nvcc}+{nvcc_release}$${list(flags)}$${sass}$${code}")


def _sass(release: str, nvcc_release: tuple[int, int], disabled: bool) -> bool:
    if release == "a6d97a1":  # a string comparison of "M.m" with "12.8", as the release did
        return f"{nvcc_release[0]}.{nvcc_release[1]}" <= "12.8" and not disabled
    return nvcc_release <= (12, 8) and not disabled


def candidates(name: str, code: str, trees: Sequence[str],
               compilers: Sequence[tuple[str, tuple[int, int]]],
               env: Mapping[str, str]) -> Iterator[Build]:
    """Every build the candidate trees, compilers and settings give, the audit's own first."""
    for tree in trees:
        try:
            version = deep_gemm_version(tree)
        except OSError:
            continue
        for release in RELEASES:
            for nvcc, nvcc_release in compilers:
                for include in include_spellings(tree):
                    for flags, disabled in _flag_lists(release, include, env):
                        sass = _sass(release, nvcc_release, disabled)
                        yield Build(release, tree, nvcc, nvcc_release, tuple(flags), include,
                                    key_of(release, name, version, nvcc, nvcc_release, flags,
                                           sass, code), version)
                    if release == "a6d97a1":
                        break


def matching(entry_key: str, name: str, source_path: str, trees: Sequence[str],
             compilers: Sequence[tuple[str, tuple[int, int]]], env: Mapping[str, str]
             ) -> tuple[Build | None, Build | None]:
    """(the build whose key is the entry's, the first build tried): None for the first when
    nothing could be tried. Raises OSError when kernel.cu cannot be read."""
    code = read_input(source_path)
    first = None
    for build in candidates(name, code, trees, compilers, env):
        first = first or build
        if build.key == entry_key:
            return build, first
    return None, first


def command(build: Build, entry_dir: str) -> list[str]:
    """The nvcc argv the release ran, the entry's binary standing for the temporary output
    (nvcc wrote to tmp/, the runtime moved it)."""
    source = os.path.join(entry_dir, "kernel.cu")
    if build.release == "a6d97a1":
        return [build.nvcc, source, "-o", os.path.join(entry_dir, "kernel.so"), *build.flags,
                f"-I{build.include}"]
    return [build.nvcc, source, "-o", os.path.join(entry_dir, "kernel.cubin"), *build.flags]
