"""The `<PREFIX>_JIT_<SUFFIX>` table: every setting DeepJIT, DeepGEMM and DeepEP read by suffix,
with how each flavour reads it (default, key status, when it is read) and the names it had
before DeepGEMM's rename.

One table of data, with the types its rows are made of. The family that turns it into registry
variables, the resolution of a setting under an environment and the parsing rules are in
`cacheaudit.runtimes._deepseek.environment`.

References (under the project's shared/reference/): deepseek-jit.md §1 (DeepGEMM's Python JIT),
§2 (DeepGEMM's C++ JIT), §3 (DeepEP), §4 (DeepJIT); where a row needed more, the upstream
source file and function is named.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, NamedTuple

from cacheaudit.envvars import IN, OUT, KeyStatus

JIT_PREFIXES: tuple[str, ...] = ("DG", "EP", "DJ")

# How a runtime reads the family. "deepjit": DeepJIT's utils/env.hpp Env (prefix, then DJ_, then
# default; any prefix but DJ may be configured). "deepgemm": DeepGEMM <= 2.6 C++ JIT (getenv of
# DG_ only). "deepgemm-python": DeepGEMM's 2025-02..07 Python JIT. "deepep": DeepEP's EPv2 JIT
# (getenv of EP_ only).
Flavour = Literal["deepjit", "deepgemm", "deepgemm-python", "deepep"]
FLAVOURS: tuple[str, ...] = ("deepjit", "deepgemm", "deepgemm-python", "deepep")
# What each flavour is, in the words a finding uses.
FLAVOUR_NAMES: Mapping[str, str] = MappingProxyType({
    "deepjit": "DeepJIT",
    "deepgemm": "DeepGEMM <= 2.6",
    "deepgemm-python": "DeepGEMM's Python JIT",
    "deepep": "DeepEP's EPv2 JIT",
})

# flavour -> (runtime, variant) for status look-ups, and the prefix a legacy flavour requires.
FLAVOUR_RUNTIME: Mapping[str, tuple[str, str | None]] = MappingProxyType({
    "deepjit": ("deepjit", None),
    "deepgemm": ("deepgemm", None),
    "deepgemm-python": ("deepgemm", "python"),
    "deepep": ("deepep", None),
})
FLAVOUR_PREFIX: Mapping[str, str] = MappingProxyType({
    "deepgemm": "DG", "deepgemm-python": "DG", "deepep": "EP",
})
# Which runtimes read a family prefix at all (DJ_ is only DeepJIT's global fallback).
PREFIX_RUNTIMES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "DG": ("deepjit", "deepgemm"),
    "EP": ("deepjit", "deepep"),
    "DJ": ("deepjit",),
})

ReadAt = Literal["construction", "call"]


class JitRule(NamedTuple):
    """How one flavour reads one suffix: its default, key status and when it is read.

    `read_at` is "construction" when the value is snapshotted (DeepJIT: when the Runtime is
    constructed; DeepGEMM <= 2.6: when the lazy compiler object is created at the first compile),
    "call" when re-read at each compile or load, None when the reference does not say.
    `variants` overrides `status` for a backend ("rocm"). `changes_binary` is False where this
    flavour reads the setting but no value of it can change a compiled binary, whatever the
    suffix's category says (DeepEP's `EP_JIT_PTXAS_CHECK` only checks ptxas's output after the
    compile). A NamedTuple, not a dataclass: the table is built at import, in every shim process.
    """

    default: str | None
    status: KeyStatus
    read_at: ReadAt | None = None
    note: str = ""
    variants: Mapping[str, KeyStatus] = MappingProxyType({})
    changes_binary: bool = True


NOT_READ = JitRule(None, OUT, None, "not read by this flavour")
"""Sentinel rule: the reference says this flavour does not read the suffix."""

JitKind = Literal["bool", "int", "str", "path", "path-list"]


class JitSuffix(NamedTuple):
    """One `<PREFIX>_<SUFFIX>` setting, with a rule per flavour (None: the reference is silent)."""

    suffix: str
    category: str
    kind: JitKind
    description: str
    deepjit: JitRule | None = None
    deepgemm: JitRule | None = None
    deepgemm_python: JitRule | None = None
    deepep: JitRule | None = None
    legacy_names: tuple[str, ...] = ()
    only_prefixes: tuple[str, ...] = ()
    source: str = ""
    compiler: str | None = None
    """The compiler kind the setting names ("nvcc", "hipcc"): it picks the compiler binary,
    whose identity the audit judges instead of the variable (CA301, CA302)."""

    def rule(self, flavour: str) -> JitRule | None:
        return {
            "deepjit": self.deepjit,
            "deepgemm": self.deepgemm,
            "deepgemm-python": self.deepgemm_python,
            "deepep": self.deepep,
        }[flavour]

    def applies_to(self, prefix: str) -> bool:
        return not self.only_prefixes or prefix in self.only_prefixes


DJ_SRC = "deepseek-jit.md §4; DeepJIT backend/cuda/options.hpp CompilerOptions::default_options"
DG_SRC = "deepseek-jit.md §2 (54e2261)"
PY_SRC = "deepseek-jit.md §1 (8dfa329)"
EP_SRC = "deepseek-jit.md §3"


def _rule(default: str | None, status: KeyStatus, read_at: ReadAt | None = None,
          note: str = "", *, changes_binary: bool = True, **variants: KeyStatus) -> JitRule:
    return JitRule(default, status, read_at, note, MappingProxyType(variants), changes_binary)


SUFFIX_ROWS: tuple[JitSuffix, ...] = (
    JitSuffix(
        "JIT_CACHE_DIR", "cache-location", "path-list", "the JIT cache root",
        deepjit=_rule("$HOME/.dj", OUT, "construction",
                      "colon-separated roots: lookups search all, writes go to the first"),
        deepgemm=_rule("$HOME/.deep_gemm", OUT, "construction",
                       "relative .deep_gemm when HOME is unset; setup.py may persist a default "
                       "into deep_gemm/envs.py, injected at import"),
        deepgemm_python=_rule("~/.deep_gemm", OUT),
        deepep=_rule("$HOME/.deep_ep", OUT, None, "setup.py may persist a default"),
        legacy_names=("DG_CACHE_DIR",),
        source=f"{DJ_SRC}; {DG_SRC}; {PY_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_DEBUG", "compiler-flags", "bool",
        "debug mode: ptxas verbose and line info (so a different binary), plus prints",
        deepjit=_rule("0", IN, "construction",
                      "turns on ptxas verbose and line info; its prints are re-read at each "
                      "compile and load"),
        deepgemm=_rule("0", IN, "construction",
                       "adds --ptxas-options=--verbose,--warn-on-local-memory-usage"),
        deepgemm_python=_rule("0", OUT, None, "printing only"),
        deepep=_rule("0", IN, None, "adds ptxas --verbose and -lineinfo"),
        source=f"{DJ_SRC}; {DG_SRC}; {PY_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_NVCC_COMPILER", "compiler-choice", "path", "the nvcc the runtime runs",
        deepjit=_rule("<cuda_home>/bin/nvcc", OUT, "construction",
                      "only its `--version` text is keyed, not the path "
                      "(CUDA CompilerInfo::get_hash); an empty value means the default"),
        deepgemm=_rule("<cuda_home>/bin/nvcc", OUT, "construction",
                       "only the NVCC major.minor is keyed"),
        deepgemm_python=_rule("torch.utils.cpp_extension.CUDA_HOME/bin/nvcc", IN, None,
                              "path and (major, minor) are keyed (NVCCCompiler.signature)"),
        deepep=_rule(None, OUT, None, "only via its version"),
        legacy_names=("DG_NVCC_COMPILER",),
        source=f"{DJ_SRC}; {DG_SRC}; {PY_SRC}; {EP_SRC}",
        compiler="nvcc"),
    JitSuffix(
        "JIT_CPP_STANDARD", "compiler-flags", "int", "the -std=c++N of every kernel",
        deepjit=_rule("20", IN, "construction"),
        deepgemm=_rule("20", IN, "construction", "setup.py may persist a default"),
        deepgemm_python=NOT_READ,
        deepep=_rule("20", IN),
        source=f"{DJ_SRC}; {DG_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_OVERRIDE_CPP_STANDARD", "compiler-flags", "int",
        "the C++ standard of the Python JIT (renamed JIT_CPP_STANDARD in the C++ JIT)",
        deepgemm_python=_rule("20", IN, None, "via the keyed flags"),
        legacy_names=("DG_NVCC_OVERRIDE_CPP_STANDARD",),
        only_prefixes=("DG",),
        source=PY_SRC),
    JitSuffix(
        "JIT_PTXAS_VERBOSE", "compiler-flags", "bool", "adds --ptxas-options=--verbose",
        deepjit=_rule("0", IN, "construction", "CUDA backend"),
        deepgemm=_rule("0", IN, "construction"),
        deepgemm_python=_rule(None, IN, None, "only checked for presence; appends ,--verbose"),
        deepep=_rule("0", IN),
        legacy_names=("DG_PTXAS_VERBOSE",),
        source=f"{DJ_SRC}; {DG_SRC}; {PY_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_PTXAS_CHECK", "compiler-flags", "bool",
        "DeepGEMM: adds ptxas warnings; DeepEP: a post-compile regex check only",
        deepjit=NOT_READ,
        deepgemm=_rule("0", IN, "construction",
                       "adds --ptxas-options=--verbose,--warn-on-local-memory-usage"),
        deepep=_rule("0", OUT, None, "only a post-compile regex check over ptxas's output: no "
                     "flag, so neither the key nor the binary changes", changes_binary=False),
        source=f"{DG_SRC}; {EP_SRC}; DeepJIT options.hpp does not read it"),
    JitSuffix(
        "JIT_CHECK_NO_SPILLS", "compiler-flags", "bool",
        "adds --ptxas-options=--warn-on-spills and fails on spills",
        deepjit=_rule("0", IN, "construction", rocm=IN),
        deepgemm=NOT_READ,
        source=f"{DJ_SRC}; deepseek-jit.md §2 (new in DeepGEMM 2.8)"),
    JitSuffix(
        "JIT_CHECK_NO_LOCAL_MEMORY", "compiler-flags", "bool",
        "adds --ptxas-options=--warn-on-local-memory-usage and fails on local memory",
        deepjit=_rule("0", IN, "construction", rocm=IN),
        deepgemm=NOT_READ,
        source=f"{DJ_SRC}; deepseek-jit.md §2 (new in DeepGEMM 2.8)"),
    JitSuffix(
        "JIT_WITH_LINEINFO", "compiler-flags", "bool", "adds line information to the binary",
        deepjit=_rule("0", IN, "construction", rocm=IN),
        deepgemm=_rule("0", IN, "construction", "adds -Xcompiler -rdynamic -lineinfo"),
        deepep=_rule("0", IN),
        source=f"{DJ_SRC}; {DG_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_DUMP_ASM", "print-only", "bool",
        "dumps PTX and SASS (CUDA) or LLVM IR and ISA (ROCm) on a miss",
        deepjit=_rule("0", OUT, "construction",
                      "CUDA: dump_ptx/dump_sass are excluded from the key; ROCm: "
                      "dump_llvm_ir/dump_isa are keyed", rocm=IN),
        deepgemm=_rule("0", OUT, "call"),
        deepep=_rule("0", OUT),
        source=f"{DJ_SRC}; DeepJIT backend/rocm/options.hpp update_hash; {DG_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_DUMP_PTX", "print-only", "bool", "writes kernel.ptx on a miss",
        deepjit=_rule("0", OUT, "construction"),
        deepgemm=_rule("0", OUT, "call"),
        deepep=_rule("0", OUT),
        source=f"{DJ_SRC}; {DG_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_DUMP_SASS", "print-only", "bool", "writes kernel.sass on a miss (cuobjdump)",
        deepjit=_rule("0", OUT, "construction"),
        deepgemm=_rule("0", OUT, "call"),
        deepep=_rule("0", OUT),
        source=f"{DJ_SRC}; {DG_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_PRINT_COMPILER_COMMAND", "print-only", "bool",
        "prints the compiler command (a usable signal of a miss)",
        deepjit=_rule("0", OUT, "call"),
        deepgemm=_rule("0", OUT, "call", "setup.py may persist a default"),
        deepgemm_python=_rule("0", OUT),
        deepep=_rule("0", OUT),
        legacy_names=("DG_JIT_PRINT_NVCC_COMMAND",),
        source=f"{DJ_SRC}; {DG_SRC}; {PY_SRC}; {EP_SRC}"),
    JitSuffix(
        "JIT_PRINT_LOAD_TIME", "print-only", "bool", "prints each kernel load (a hit signal)",
        deepjit=_rule("0", OUT, "call"),
        deepgemm=_rule("0", OUT, "call"),
        source=f"{DJ_SRC}; {DG_SRC}"),
    JitSuffix(
        "JIT_PRINT_REG_REUSE", "print-only", "bool", "prints FFMA register reuse",
        deepgemm_python=_rule("0", OUT),
        legacy_names=("DG_PRINT_REG_REUSE",),
        only_prefixes=("DG",),
        source=PY_SRC),
    JitSuffix(
        "JIT_USE_NVRTC", "compiler-choice", "bool", "compiles with NVRTC instead of nvcc",
        deepjit=NOT_READ,
        deepgemm=_rule("0", IN, "construction"),
        deepgemm_python=_rule("0", IN),
        deepep=NOT_READ,
        only_prefixes=("DG",),
        source=f"{DG_SRC}; {PY_SRC}; deepseek-jit.md §2 (2.8: 'NVRTC is gone'), §3"),
    JitSuffix(
        "JIT_DISABLE_FFMA_INTERLEAVE", "jit-config", "bool",
        "turns off the post-compile FFMA interleave rewrite of the cubin",
        deepgemm_python=_rule("0", IN, None, "feeds enable_sass_opt"),
        legacy_names=("DG_DISABLE_FFMA_INTERLEAVE",),
        only_prefixes=("DG",),
        source=PY_SRC),
    JitSuffix(
        "JIT_DISABLE_CACHE", "cache-control", "bool",
        "skips the disk lookup only; the in-memory cache still serves",
        deepgemm_python=_rule("0", OUT),
        only_prefixes=("DG",),
        source=PY_SRC),
    JitSuffix(
        "JIT_BARRIER_TIMEOUT_SECONDS", "compiler-flags", "int",
        "DeepGEMM 2.8: adds a -D flag with the barrier timeout",
        deepjit=_rule(None, IN, None, "DeepGEMM 2.8+ only"),
        only_prefixes=("DG",),
        source="deepseek-jit.md §2 (DeepGEMM 2.8.0)"),
    JitSuffix(
        "JIT_HIPCC_COMPILER", "compiler-choice", "path", "the hipcc DeepJIT's ROCm backend runs",
        deepjit=_rule("$ROCM_HOME|$ROCM_PATH|$HIP_PATH/bin/hipcc", IN, "construction",
                      "ROCm backend: the hipcc path and full version are keyed"),
        source="deepseek-jit.md §4; DeepJIT backend/rocm/backend.hpp find_rocm_toolkit",
        compiler="hipcc"),
    JitSuffix(
        "JIT_HIPCC_VERBOSE", "compiler-flags", "bool", "adds -v to hipcc (ROCm)",
        deepjit=_rule("0", IN, "construction", "ROCm backend: the flag is keyed"),
        source="DeepJIT backend/rocm/options.hpp"),
    JitSuffix(
        "JIT_DUMP_LLVM_IR", "print-only", "bool", "writes kernel.ll on a miss (ROCm)",
        deepjit=_rule("0", IN, "construction", "ROCm backend: keyed so a hit cannot skip it"),
        source="DeepJIT backend/rocm/options.hpp update_hash"),
    JitSuffix(
        "JIT_DUMP_ISA", "print-only", "bool", "writes kernel.isa on a miss (ROCm)",
        deepjit=_rule("0", IN, "construction", "ROCm backend: keyed so a hit cannot skip it"),
        source="DeepJIT backend/rocm/options.hpp update_hash"),
    JitSuffix(
        "JIT_LLVM_OBJDUMP", "toolkit", "path", "llvm-objdump for ROCm ISA dumps",
        deepjit=_rule(None, OUT, "construction",
                      "ROCm backend: disassembles the finished kernel.hsaco into kernel.isa; the "
                      "CUDA backend never reads it", changes_binary=False),
        source="DeepJIT backend/rocm/backend.hpp find_rocm_toolkit, ROCm::compile"),
    JitSuffix(
        "JIT_LLVM_READOBJ", "toolkit", "path", "llvm-readobj for ROCm spill checks",
        deepjit=_rule(None, OUT, "construction",
                      "ROCm backend: reads the finished kernel.hsaco's notes for the spill and "
                      "private-memory checks; the CUDA backend never reads it",
                      changes_binary=False),
        source="DeepJIT backend/rocm/backend.hpp find_rocm_toolkit, ROCm::compile"),
    JitSuffix(
        "JIT_KERNEL_DEBUG_INFO", "compiler-flags", "bool", "adds -g debug info (Ascend)",
        deepjit=_rule("0", IN, "construction", "Ascend backend: the flags are keyed"),
        source="DeepJIT backend/ascend/options.hpp"),
    JitSuffix(
        "JIT_LAUNCH_TIMEOUT", "launch-config", "int", "kernel launch timeout in seconds (Ascend)",
        deepjit=_rule("300", OUT, "construction"),
        source="DeepJIT backend/ascend/options.hpp LaunchOptions"),
)

JIT_SUFFIXES: Mapping[str, JitSuffix] = MappingProxyType({s.suffix: s for s in SUFFIX_ROWS})
LEGACY_NAME_SUFFIX: Mapping[str, str] = MappingProxyType({
    name: s.suffix for s in SUFFIX_ROWS for name in s.legacy_names
})

