"""The compile-affecting environment: one registry of variables, classified per runtime.

A JIT runtime's cache key covers some of the variables that change a compile and silently misses
the rest (DeepJIT's README names `NVCC_PREPEND_FLAGS`, `NVCC_APPEND_FLAGS`, `CPATH` and the host
compiler; torch's ninja never sees `CPATH`). To report such an *implicit input* (CA201/CA202) the
audit needs to know, for each variable and runtime, whether the runtime keys it. This module is
that table, kept like ccache's config.cpp keeps its keys: explicit rows, defaults in one place,
each row citing where its classification comes from. Nothing here is guessed: where the
references are silent the status is UNKNOWN.

It is also the allowlist of what cacheaudit stores: `compile_environment` returns only registry
variables, never `HOME`, `USER` or a cloud credential, and every value it returns (or that
`resolve_jit_setting` returns) goes through `redact`, because an allowlisted variable can still
carry a secret (a Redis URL with a password in `TRITON_REMOTE_CACHE_BACKEND`, a token pasted into
`CPATH` by mistake).

References (under the project's shared/reference/): deepseek-jit.md (DeepGEMM, DeepEP, DeepJIT),
jit-runtimes.md (torch, Triton, CuPy, FlashInfer, NVRTC, cuda.core), platform-notes.md (what was
measured), anchors-ccache-envsnap.md (ccache's and sccache's environment lists, vLLM's secret
filter). Where a row needed more than those, the upstream source file and function is named.

Stdlib only, and cheap to import: the shim calls `compile_environment` once per compile.
"""

from __future__ import annotations

import enum
import functools
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal, NamedTuple

from cacheaudit.exceptions import UsageError

__all__ = [
    "CATEGORIES",
    "FLAVOURS",
    "FLAVOUR_NAMES",
    "JIT_PREFIXES",
    "JIT_SUFFIXES",
    "REDACTED",
    "RUNTIMES",
    "VARIABLES",
    "VARIANTS",
    "EnvVarsError",
    "JitRule",
    "JitSuffix",
    "KeyStatus",
    "ResolvedSetting",
    "Variable",
    "affects_output",
    "classify",
    "compile_environment",
    "is_implicit_input",
    "iter_variables",
    "jit_prefixes_in",
    "looks_secret_name",
    "looks_secret_value",
    "lookup",
    "parse_jit_bool",
    "parse_jit_int",
    "redact",
    "resolve_jit_setting",
    "resolve_jit_settings",
    "selects_compiler",
]


# --------------------------------------------------------------------------------------------
# Vocabulary
# --------------------------------------------------------------------------------------------

RUNTIMES: tuple[str, ...] = (
    "deepjit",     # deepseek-ai/DeepJIT, and DeepGEMM 2.8+ (prefix DG) / DeepEP-Ascend (EP) on it
    "deepgemm",    # DeepGEMM up to 2.6: the C++ JIT (csrc/jit/) and the older Python JIT
    "deepep",      # DeepEP EPv2 csrc/jit/ (a near-copy of DeepGEMM's C++ JIT), Hybrid-EP
    "torch-ext",   # torch.utils.cpp_extension load/load_inline
    "triton",
    "nvrtc",       # NVRTC through cuda-python (cuda.bindings.nvrtc)
    "cuda-core",   # cuda.core Program with its persistent program cache
    "cupy",
    "flashinfer",
    "shim",        # a plain compiler invocation seen by the shim, no runtime known
)
_RUNTIME_SET = frozenset(RUNTIMES)

# A status key may name a runtime variant as "runtime:variant" where the references give the
# variant a different answer. classify() looks up "runtime:variant" first, then "runtime".
VARIANTS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "deepjit": ("cuda", "rocm", "ascend"),      # DeepJIT backends (include/deep_jit/backend/*)
    "deepgemm": ("nvrtc", "python"),            # DG_JIT_USE_NVRTC=1; the 2025-02..07 Python JIT
    "cupy": ("nvrtc", "nvcc"),                  # compile_with_cache(backend=...)
})

CATEGORIES: tuple[str, ...] = (
    "include-path",         # adds directories to the header search
    "compiler-flags",       # adds or changes compiler/assembler options
    "compiler-choice",      # picks the compiler binary (or NVCC vs NVRTC)
    "toolkit",              # locates a toolkit, its headers and tools
    "toolchain-behaviour",  # read by gcc/ld themselves (ccache keys them)
    "locale",               # language of compiler diagnostics (ccache keys them)
    "jit-config",           # a runtime setting not covered by a finer category
    "cache-location",       # where the cache lives; changes no binary
    "cache-control",        # bypasses or disables a cache layer; changes no binary
    "build-tracking",       # changes what the build system tracks, not the binary
    "build-parallelism",    # number of compile jobs
    "build-only",           # read while building the runtime itself, not at JIT time
    "launch-config",        # read at kernel launch, not at compile
    "triton-invalidating",  # Triton's CACHE_INVALIDATING_ENV_VARS: in its key when set
    "print-only",           # prints or dumps extra files; changes no binary
)

# Categories whose variables cannot change a compiled binary, only where it lives, whether it is
# looked up, what is printed, or how many jobs run.
_NO_OUTPUT_CATEGORIES = frozenset({
    "cache-location", "cache-control", "build-tracking", "build-parallelism", "build-only",
    "launch-config", "print-only", "locale",
})


class KeyStatus(str, enum.Enum):
    """Whether a variable's value enters a runtime's cache key."""

    IN_KEY = "in-key"
    NOT_IN_KEY = "not-in-key"
    UNKNOWN = "unknown"


IN = KeyStatus.IN_KEY
OUT = KeyStatus.NOT_IN_KEY
UNK = KeyStatus.UNKNOWN


class EnvVarsError(UsageError, ValueError):
    """A runtime, flavour or prefix this module does not know: one line, no traceback."""


def _check_runtime(runtime: str) -> None:
    if runtime not in _RUNTIME_SET:
        raise EnvVarsError(f"unknown runtime {runtime!r}; expected one of {', '.join(RUNTIMES)}")


def _frozen_map(data: Mapping[str, object] | None) -> Mapping:
    return MappingProxyType(dict(data or {}))


@dataclass(frozen=True)
class Variable:
    """One compile-affecting environment variable and what each runtime does with it.

    `status` maps a runtime id (or "runtime:variant") to its KeyStatus. A runtime that is not
    listed is UNKNOWN: the references do not say that it reads the variable, which for another
    runtime's family (a Triton knob seen by DeepGEMM) usually means it is never read, but we do
    not claim so. `ignored_by` lists runtimes (or variants) known not to read it at all (NVRTC
    ignores `CPATH`); for them the variable is trivially not in the key and changes nothing.
    `affects_output` is False where no value can change a compiled binary (cache roots, prints).
    `notes` qualify a status per runtime ("only its `--version` text is keyed").
    """

    name: str
    category: str
    description: str
    status: Mapping[str, KeyStatus] = field(default_factory=dict)
    ignored_by: frozenset[str] = frozenset()
    notes: Mapping[str, str] = field(default_factory=dict)
    affects_output: bool = True
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _frozen_map(self.status))
        object.__setattr__(self, "notes", _frozen_map(self.notes))
        object.__setattr__(self, "ignored_by", frozenset(self.ignored_by))

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def runtimes(self) -> frozenset[str]:
        """The runtimes the registry says read this variable (in any variant)."""
        return frozenset(key.split(":", 1)[0] for key in self.status)

    def status_for(self, runtime: str, variant: str | None = None) -> KeyStatus:
        keys = [f"{runtime}:{variant}", runtime] if variant else [runtime]
        for key in keys:
            if key in self.status:
                return self.status[key]
            if key in self.ignored_by:
                return OUT
        return UNK

    def ignored(self, runtime: str, variant: str | None = None) -> bool:
        if variant and f"{runtime}:{variant}" in self.status:
            return False
        return (variant is not None and f"{runtime}:{variant}" in self.ignored_by) or (
            runtime in self.ignored_by
        )

    def note_for(self, runtime: str, variant: str | None = None) -> str:
        if variant and f"{runtime}:{variant}" in self.notes:
            return self.notes[f"{runtime}:{variant}"]
        return self.notes.get(runtime, "")


def _var(
    name: str,
    category: str,
    description: str,
    *,
    in_key: Iterable[str] = (),
    not_in_key: Iterable[str] = (),
    unknown: Iterable[str] = (),
    ignored_by: Iterable[str] = (),
    notes: Mapping[str, str] | None = None,
    affects_output: bool | None = None,
    source: str = "",
) -> Variable:
    status: dict[str, KeyStatus] = {}
    for keys, value in ((in_key, IN), (not_in_key, OUT), (unknown, UNK)):
        for key in keys:
            if key in status:
                raise AssertionError(f"{name}: {key} classified twice")
            if key.split(":", 1)[0] not in _RUNTIME_SET:
                raise AssertionError(f"{name}: unknown runtime {key}")
            status[key] = value
    for key in ignored_by:
        if key.split(":", 1)[0] not in _RUNTIME_SET:
            raise AssertionError(f"{name}: unknown runtime {key}")
    if affects_output is None:
        affects_output = category not in _NO_OUTPUT_CATEGORIES
    return Variable(name, category, description, status, frozenset(ignored_by), notes or {},
                    affects_output, source)


# --------------------------------------------------------------------------------------------
# The registry of exact names
# --------------------------------------------------------------------------------------------

# Runtimes that shell out to a compiler driver (nvcc, g++, hipcc) and whose key, as the
# references enumerate it, holds no environment variable: whatever the driver reads from the
# environment is outside their key. deepseek-jit.md §1-§4 spell out each key's parts (DeepJIT:
# `Runtime::cache_key()`; DeepGEMM/DeepEP: `name$$signature$$flags$$code`); torch-ext and
# FlashInfer key on ninja's command line plus depfile mtimes (jit-runtimes.md §1, §6); the shim
# has no key at all, so nothing is in it.
_DRIVER = ("deepjit", "deepgemm", "deepep", "torch-ext", "flashinfer", "shim")
_NINJA = ("torch-ext", "flashinfer")

_HOST_VIA_VERSION = "only the `nvcc --version` text it leads to is keyed, not the path"

_EXACT_ROWS: tuple[Variable, ...] = (
    # --- header search path ------------------------------------------------------------------
    # DeepJIT README: CPATH "not discovered automatically"; the ROCm CompilerInfo::get_hash
    # (backend/rocm/backend.hpp) keys CPATH, CPLUS_INCLUDE_PATH, C_INCLUDE_PATH. torch:
    # jit-runtimes.md §1 "Also untracked", measured stale in platform-notes.md (I2). NVRTC:
    # platform-notes.md §2 "NVRTC ignores CPATH / CPLUS_INCLUDE_PATH".
    _var("CPATH", "include-path",
         "gcc/nvcc/hipcc search these directories for #include (after -I): a different header "
         "can be picked up without any argv change",
         in_key=("deepjit:rocm",),
         not_in_key=(*_DRIVER, "cupy:nvcc"),
         ignored_by=("nvrtc", "cuda-core", "cupy:nvrtc", "deepgemm:nvrtc"),
         notes={"deepjit": "the CUDA backend does not key it; the ROCm backend does",
                "nvrtc": "NVRTC ignores CPATH (platform-notes.md §2)",
                "cuda-core": "cuda.core compiles C++ through NVRTC, which ignores CPATH"},
         source="deepseek-jit.md §2, §4; jit-runtimes.md §1, §6; platform-notes.md §2-§4"),
    _var("CPLUS_INCLUDE_PATH", "include-path",
         "like CPATH, for C++ (and so CUDA) translation units only",
         in_key=("deepjit:rocm",),
         not_in_key=(*_DRIVER, "cupy:nvcc"),
         ignored_by=("nvrtc", "cuda-core", "cupy:nvrtc", "deepgemm:nvrtc"),
         notes={"deepjit": "the CUDA backend does not key it; the ROCm backend does",
                "nvrtc": "NVRTC ignores CPLUS_INCLUDE_PATH (platform-notes.md §2)"},
         source="deepseek-jit.md §4 (clear_external_jit_environment); jit-runtimes.md §1"),
    _var("C_INCLUDE_PATH", "include-path",
         "like CPATH, for C translation units only (host .c sources, launcher stubs)",
         in_key=("deepjit:rocm",),
         not_in_key=_DRIVER,
         notes={"deepjit": "the CUDA backend does not key it; the ROCm backend does"},
         source="deepseek-jit.md §4; jit-runtimes.md §1; ccache manifest key"),
    _var("OBJC_INCLUDE_PATH", "include-path",
         "like CPATH, for Objective-C; ccache keys it in direct mode",
         not_in_key=("shim",),
         source="anchors-ccache-envsnap.md A1 (direct-mode manifest key)"),
    _var("OBJCPLUS_INCLUDE_PATH", "include-path",
         "like CPATH, for Objective-C++; ccache keys it in direct mode",
         not_in_key=("shim",),
         source="anchors-ccache-envsnap.md A1 (direct-mode manifest key)"),

    # --- nvcc's own environment --------------------------------------------------------------
    # DeepJIT README names both; sccache folds them into the argv (src/compiler/nvcc.rs);
    # platform-notes.md §3 measured the PTX change with exit 0 and no message.
    _var("NVCC_PREPEND_FLAGS", "compiler-flags",
         "nvcc inserts these options before the command line's own: a silent -D, -I or -arch",
         not_in_key=(*_DRIVER, "cupy:nvcc"),
         ignored_by=("deepgemm:nvrtc", "cupy:nvrtc"),
         source="deepseek-jit.md §4; jit-runtimes.md §1; platform-notes.md §3"),
    _var("NVCC_APPEND_FLAGS", "compiler-flags",
         "nvcc appends these options after the command line's own: a silent -D, -I or -arch",
         not_in_key=(*_DRIVER, "cupy:nvcc"),
         ignored_by=("deepgemm:nvrtc", "cupy:nvrtc"),
         source="deepseek-jit.md §4; jit-runtimes.md §1; platform-notes.md §3"),
    _var("NVCC_CCBIN", "compiler-choice",
         "nvcc's host compiler when no -ccbin is given: the host half of every .cu",
         not_in_key=(*_DRIVER,),
         ignored_by=("deepgemm:nvrtc",),
         notes={"torch-ext": "torch passes -ccbin $CC when CC is set, which overrides it"},
         source="deepseek-jit.md §4 (README 'host-compiler selection', "
                "clear_external_jit_environment); ccache hash_nvcc_host_compiler"),
    _var("CUDAHOSTCXX", "compiler-choice",
         "the CUDA host compiler for CMake-driven builds; DeepJIT's tests clear it as an "
         "untracked input",
         not_in_key=("deepjit",),
         source="deepseek-jit.md §4 (clear_external_jit_environment)"),

    # --- CUDA toolkit location -----------------------------------------------------------------
    _var("CUDA_HOME", "toolkit",
         "which CUDA toolkit (nvcc, headers, cuobjdump) a runtime uses",
         in_key=("torch-ext", "flashinfer", "deepgemm:nvrtc", "deepgemm:python"),
         not_in_key=("deepjit", "deepgemm"),
         unknown=("deepep",),
         notes={"deepjit": _HOST_VIA_VERSION + " (CUDA::find_cuda_toolkit)",
                "deepgemm": "only the NVCC major.minor of <CUDA_HOME>/bin/nvcc is keyed",
                "deepgemm:nvrtc": "-I<cuda_home>/include is in the keyed flags",
                "deepgemm:python": "the default nvcc path (keyed) is under it",
                "deepep": "deep_ep/__init__.py:find_cuda_home reads it; the reference gives "
                          "no key verdict",
                "torch-ext": "the nvcc path on build.ninja's command line comes from it"},
         source="deepseek-jit.md §1, §2, §3, §4; jit-runtimes.md §1, §6; torch "
                "cpp_extension._find_cuda_home"),
    _var("CUDA_PATH", "toolkit",
         "second choice after CUDA_HOME for the CUDA toolkit; CuPy's -I<CUDA include>",
         in_key=("torch-ext", "cupy", "deepgemm:nvrtc", "deepgemm:python"),
         not_in_key=("deepjit", "deepgemm"),
         unknown=("deepep",),
         notes={"deepjit": _HOST_VIA_VERSION + " (used when CUDA_HOME is unset)",
                "deepgemm": "used when CUDA_HOME is unset; only NVCC major.minor is keyed",
                "cupy": "the -I<CUDA include> option it yields is part of the keyed options",
                "torch-ext": "used when CUDA_HOME is unset (cpp_extension._find_cuda_home)"},
         source="deepseek-jit.md §2, §4; jit-runtimes.md §4; torch "
                "cpp_extension._find_cuda_home"),
    _var("CUDA_INC_PATH", "toolkit",
         "torch adds it as an include directory on the extension's command line",
         in_key=("torch-ext",),
         source="jit-runtimes.md §1 (build.ninja command line); torch cpp_extension"),

    # --- compiler choice -----------------------------------------------------------------------
    _var("CC", "compiler-choice",
         "the C compiler: torch passes it to nvcc as -ccbin; Triton compiles launcher stubs "
         "with it",
         in_key=("torch-ext",),
         not_in_key=("triton",),
         notes={"torch-ext": "on build.ninja's command line as -ccbin",
                "triton": "jit-runtimes.md §2: CC is not in the key"},
         source="jit-runtimes.md §1, §2"),
    _var("CXX", "compiler-choice",
         "the C++ compiler a ninja-driven extension build runs",
         in_key=_NINJA,
         notes={"torch-ext": "on build.ninja's command line; the binary behind the name is not"},
         source="jit-runtimes.md §1, §6"),
    _var("PATH", "compiler-choice",
         "decides what a bare compiler name (nvcc, c++, gcc, hipcc) resolves to, and the host "
         "compiler nvcc runs when no -ccbin is given",
         not_in_key=(*_DRIVER,),
         notes={"deepjit": "`which nvcc` when CUDA_HOME/CUDA_PATH are unset; "
                           + _HOST_VIA_VERSION,
                "deepjit:rocm": "resolves hipcc; the resolved hipcc path is keyed",
                "deepgemm": "`which nvcc` in _find_cuda_home; only NVCC major.minor is keyed",
                "torch-ext": "the bare `c++` on the command line and `which nvcc`",
                "shim": "ccache hashes the host compiler nvcc finds on PATH"},
         source="deepseek-jit.md §2, §4; anchors-ccache-envsnap.md A1"),
    _var("COMPILER_PATH", "toolchain-behaviour",
         "gcc searches it for its subprograms (cc1plus, as, collect2)",
         not_in_key=_DRIVER,
         source="anchors-ccache-envsnap.md A1 (ccache hashes it always)"),
    _var("GCC_EXEC_PREFIX", "toolchain-behaviour",
         "gcc's prefix for finding its own subprograms: another cc1plus, another binary",
         not_in_key=_DRIVER,
         source="anchors-ccache-envsnap.md A1 (ccache hashes it always)"),
    _var("GCC_COMPARE_DEBUG", "toolchain-behaviour",
         "makes gcc recompile with -fcompare-debug and compare",
         not_in_key=_DRIVER,
         source="anchors-ccache-envsnap.md A1 (ccache hashes it always)"),
    _var("SOURCE_DATE_EPOCH", "toolchain-behaviour",
         "fixes __DATE__/__TIME__ in gcc: changes a binary that uses temporal macros",
         not_in_key=_DRIVER,
         source="anchors-ccache-envsnap.md A1 (ccache hashes it with temporal macros)"),
    *(
        _var(name, "locale",
             "language of compiler diagnostics; ccache keys it unless sloppiness=locale",
             not_in_key=_DRIVER,
             source="anchors-ccache-envsnap.md A1 (ccache hash_common_info)")
        for name in ("LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES")
    ),

    # --- ROCm: keyed by DeepJIT's ROCm CompilerInfo::get_hash (backend/rocm/backend.hpp) ----
    *(
        _var(name, category, description,
             in_key=("deepjit",),
             not_in_key=("shim",),
             notes={"deepjit": "ROCm backend only: keyed by CompilerInfo::get_hash"},
             source="deepseek-jit.md §4; DeepJIT backend/rocm/backend.hpp get_compiler_info")
        for name, category, description in (
            ("HIPCC_COMPILE_FLAGS_APPEND", "compiler-flags",
             "hipcc appends these options to every compile"),
            ("HIPCC_LINK_FLAGS_APPEND", "compiler-flags",
             "hipcc appends these options to every link"),
            ("HIP_CLANG_PATH", "compiler-choice", "the clang that hipcc drives"),
            ("HIP_DEVICE_LIB_PATH", "toolkit",
             "the device bitcode libraries linked into every kernel (sccache hashes them)"),
            ("HIP_PATH", "toolkit", "the HIP installation hipcc uses"),
            ("ROCM_PATH", "toolkit", "the ROCm installation (hipcc, device libraries)"),
        )
    ),
    _var("ROCM_HOME", "toolkit",
         "first choice for the ROCm installation DeepJIT takes hipcc from",
         in_key=("deepjit:rocm",),
         ignored_by=("deepjit",),
         notes={"deepjit": "read by the ROCm backend only (CUDA::find_cuda_toolkit and the "
                           "Ascend backend never look at it)",
                "deepjit:rocm": "not in the keyed environment list, but the hipcc path it "
                                "leads to is keyed (unless JIT_HIPCC_COMPILER is set)"},
         source="DeepJIT backend/rocm/backend.hpp find_rocm_toolkit; "
                "backend/cuda/backend.hpp find_cuda_toolkit"),

    # --- torch.utils.cpp_extension ----------------------------------------------------------
    _var("TORCH_CUDA_ARCH_LIST", "compiler-flags",
         "the -gencode list of an extension build",
         in_key=("torch-ext",),
         notes={"torch-ext": "on build.ninja's command line"},
         source="jit-runtimes.md §1"),
    _var("PYTORCH_NVCC", "compiler-choice",
         "replaces the nvcc torch runs (a ccache wrapper, say)",
         in_key=("torch-ext",),
         notes={"torch-ext": "on build.ninja's command line; the binary behind it is not"},
         source="jit-runtimes.md §1; torch cpp_extension._write_ninja_file"),
    _var("TORCH_EXTENSIONS_DIR", "cache-location",
         "replaces the root of torch's extension build directories",
         not_in_key=("torch-ext",),
         source="jit-runtimes.md §1"),
    _var("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES", "build-tracking",
         "=1 drops nvcc's dependency output, so ninja stops seeing header edits in .cu sources",
         in_key=("torch-ext",),
         notes={"torch-ext": "it changes the nvcc command line, so toggling it rebuilds; "
                             "while set, header edits go unseen"},
         source="jit-runtimes.md §1; platform-notes.md §4"),
    _var("TORCH_NO_COMPILER_WRAPPER", "compiler-choice",
         "set: torch stops putting ccache/sccache (when on PATH) in front of the compiler",
         in_key=("torch-ext",),
         notes={"torch-ext": "it changes build.ninja's command line, so toggling it rebuilds"},
         source="torch 2.13 cpp_extension._wrap_compiler"),
    _var("MAX_JOBS", "build-parallelism",
         "number of parallel ninja jobs for an extension build",
         not_in_key=("torch-ext",),
         source="torch cpp_extension._get_num_workers"),
    _var("XDG_CACHE_HOME", "cache-location",
         "the user cache root: torch's default extensions root and cuda.core's program cache",
         not_in_key=("torch-ext", "cuda-core"),
         source="jit-runtimes.md §1 (<user cache>), §7 ($XDG_CACHE_HOME/cuda-python)"),

    # --- Triton (besides CACHE_INVALIDATING_ENV_VARS, added below) ---------------------------
    _var("TRITON_CACHE_DIR", "cache-location", "Triton's kernel cache root",
         not_in_key=("triton",), source="jit-runtimes.md §2"),
    _var("TRITON_HOME", "cache-location", "parent of Triton's default cache, dump, override dirs",
         not_in_key=("triton",), source="jit-runtimes.md §2; triton knobs.cache.home_dir"),
    _var("TRITON_DUMP_DIR", "cache-location", "where TRITON_KERNEL_DUMP writes IR",
         not_in_key=("triton",), source="jit-runtimes.md §2 (knobs.cache)"),
    _var("TRITON_OVERRIDE_DIR", "jit-config",
         "where TRITON_KERNEL_OVERRIDE reads replacement IR from",
         not_in_key=("triton",),
         notes={"triton": "compile() computes the key before the override is applied"},
         source="jit-runtimes.md §2 (knobs.cache); triton compiler.compile"),
    _var("TRITON_KERNEL_OVERRIDE", "jit-config",
         "replaces compiled stages with files from TRITON_OVERRIDE_DIR",
         not_in_key=("triton",),
         notes={"triton": "the key is computed before the override is applied"},
         source="triton compiler/compiler.py compile (knobs.compilation.override)"),
    _var("TRITON_KERNEL_DUMP", "print-only", "dumps each stage's IR to TRITON_DUMP_DIR",
         not_in_key=("triton",), source="triton knobs.compilation.dump_ir"),
    _var("TRITON_STORE_BINARY_ONLY", "cache-control",
         "stores only the cubin and json in a cache entry",
         not_in_key=("triton",), source="jit-runtimes.md §2"),
    _var("TRITON_ALWAYS_COMPILE", "cache-control",
         "=1 bypasses disk hits (not the in-memory device cache)",
         not_in_key=("triton",), source="jit-runtimes.md §2"),
    _var("TRITON_CACHE_MANAGER", "cache-location", "a CacheManager subclass (module:Class)",
         not_in_key=("triton",), source="jit-runtimes.md §2"),
    _var("TRITON_REMOTE_CACHE_BACKEND", "cache-location",
         "a RemoteCacheBackend subclass (Redis); its configuration may carry credentials",
         not_in_key=("triton",), source="jit-runtimes.md §2"),
    _var("TRITON_REDIS_HOST", "cache-location", "host of Triton's Redis remote cache",
         not_in_key=("triton",), source="triton knobs.RedisKnobs"),
    _var("TRITON_REDIS_PORT", "cache-location", "port of Triton's Redis remote cache",
         not_in_key=("triton",), source="triton knobs.RedisKnobs"),
    _var("TRITON_REDIS_KEY_FORMAT", "cache-location", "key layout in Triton's Redis cache",
         not_in_key=("triton",), source="triton knobs.RedisKnobs"),
    _var("TRITON_PTXAS_PATH", "compiler-choice",
         "the ptxas Triton assembles PTX with for targets below sm_90",
         not_in_key=("triton",),
         notes={"triton": "only the `ptxas --version` output is keyed (CUDABackend.hash)"},
         source="jit-runtimes.md §2"),
    _var("TRITON_PTXAS_BLACKWELL_PATH", "compiler-choice",
         "the ptxas Triton uses for sm_90 and newer targets (Triton 3.9 get_ptxas)",
         not_in_key=("triton",),
         notes={"triton": "only the ptxas version is keyed (CUDABackend.hash)"},
         source="triton knobs.env_nvidia_tool; backends/nvidia/compiler.py get_ptxas"),
    _var("PTXAS_OPTIONS", "compiler-flags", "extra ptxas options for every Triton kernel",
         in_key=("triton",),
         notes={"triton": "CUDAOptions.ptx_options, part of options.hash(); read once, when "
                          "triton is imported"},
         source="jit-runtimes.md §2"),
    _var("TRITON_LIBDEVICE_PATH", "toolkit", "the libdevice bitcode Triton links",
         in_key=("triton",),
         notes={"triton": "extern_libs are keyed by file content, not path"},
         source="jit-runtimes.md §2; triton backends/nvidia/compiler.py CUDAOptions.hash"),
    _var("TRITON_DEBUG", "compiler-flags", "compiles @jit kernels with debug checks",
         in_key=("triton",),
         notes={"triton": "becomes options.debug in JITFunction.run; read once at import"},
         source="triton runtime/jit.py JITFunction.run (knobs.runtime.debug)"),

    # --- CuPy (CUPY_CACHE_KEY is no environment variable: a build-time C macro, see report) --
    _var("CUPY_CACHE_DIR", "cache-location", "CuPy's kernel cache root",
         not_in_key=("cupy",), source="jit-runtimes.md §4"),
    _var("CUPY_CACHE_IN_MEMORY", "cache-control", "=1 keeps CuPy's cache in memory only",
         not_in_key=("cupy",), source="jit-runtimes.md §4"),
    _var("CUPY_CACHE_SAVE_CUDA_SOURCE", "print-only", "=1 saves <sha1>.cubin.cu beside each entry",
         not_in_key=("cupy",), source="jit-runtimes.md §4"),
    _var("CUPY_DISABLE_JITIFY_CACHE", "cache-control", "=1 resets CuPy's Jitify header cache",
         not_in_key=("cupy",), source="jit-runtimes.md §4 (PR #7934)"),
    _var("CUPY_CUDA_COMPILE_WITH_DEBUG", "compiler-flags",
         "adds --device-debug --generate-line-info to every CuPy compile",
         in_key=("cupy",),
         notes={"cupy": "the options it adds are part of the keyed options tuple"},
         source="cupy cuda/compiler.py _compile_with_cache_cuda"),
    _var("CUPY_COMPILE_WITH_PTX", "compiler-flags", "CuPy compiles to PTX instead of cubin",
         unknown=("cupy",), source="jit-runtimes.md §4 (named, not classified)"),
    _var("CUPY_NVRTC_USE_PCH", "compiler-flags", "CuPy asks NVRTC for precompiled headers",
         unknown=("cupy",), source="jit-runtimes.md §4 (named, not classified)"),

    # --- FlashInfer ---------------------------------------------------------------------------
    *(
        _var(name, category, description,
             in_key=("flashinfer",),
             notes={"flashinfer": "on the generated build.ninja command line"},
             source="jit-runtimes.md §6")
        for name, category, description in (
            ("FLASHINFER_NVCC", "compiler-choice", "the nvcc FlashInfer's ninja build runs"),
            ("FLASHINFER_EXTRA_CFLAGS", "compiler-flags", "extra host compiler flags"),
            ("FLASHINFER_EXTRA_CUDAFLAGS", "compiler-flags", "extra nvcc flags"),
            ("FLASHINFER_EXTRA_LDFLAGS", "compiler-flags", "extra linker flags"),
        )
    ),
    _var("FLASHINFER_CUDA_ARCH_LIST", "compiler-flags",
         "the architectures FlashInfer compiles for",
         in_key=("flashinfer",),
         notes={"flashinfer": "part of the cache path (<sorted archs>/cached_ops)"},
         source="jit-runtimes.md §6"),
    _var("FLASHINFER_WORKSPACE_BASE", "cache-location", "parent of FlashInfer's .cache/flashinfer",
         not_in_key=("flashinfer",), source="jit-runtimes.md §6"),

    # --- DeepEP ---------------------------------------------------------------------------------
    _var("EP_NCCL_ROOT_DIR", "include-path",
         "NCCL root DeepEP passes as -I{nccl_root}/include (persisted by setup.py)",
         in_key=("deepep",),
         notes={"deepep": "the path is keyed; NCCL header content is not"},
         source="deepseek-jit.md §3 (find_pkgs.py:find_nccl_root)"),
    _var("NCCL_DIR", "include-path", "NCCL root when EP_NCCL_ROOT_DIR is unset",
         in_key=("deepep",),
         notes={"deepep": "the path is keyed; NCCL header content is not"},
         source="deepseek-jit.md §3 (find_pkgs.py:find_nccl_root)"),
    _var("EP_GIN_GDAKI_DEBUG", "compiler-flags",
         "adds -DNCCL_DEVICE_GIN_GDAKI_ENABLE_DEBUG=1 to DeepEP kernels",
         in_key=("deepep",), source="deepseek-jit.md §3"),
    _var("EP_NUM_TOPK_IDX_BITS", "compiler-flags",
         "adds -DEP_NUM_TOPK_IDX_BITS= to DeepEP kernels (persisted by setup.py)",
         in_key=("deepep",), source="deepseek-jit.md §3"),
    _var("HYBRID_EP_CACHE_DIR", "cache-location",
         "Hybrid-EP's .so cache root; every .so there is dlopen'ed at startup",
         not_in_key=("deepep",),
         notes={"deepep": "Hybrid-EP keys only template and config integers"},
         source="deepseek-jit.md §3 (Hybrid-EP)"),

    # --- DeepGEMM names outside the <PREFIX>_JIT_<SUFFIX> table --------------------------------
    _var("DG_PRINT_CONFIGS", "print-only", "prints the chosen GEMM configurations",
         not_in_key=("deepgemm", "deepgemm:python"), source="deepseek-jit.md §1, §2"),
    _var("DG_JIT_USE_RUNTIME_API", "build-only",
         "a macro while building DeepGEMM's extension: use the cudart library API (and run "
         "cuobjdump -symbols at each load); not read when kernels are JIT-compiled",
         ignored_by=("deepgemm",), source="deepseek-jit.md §2 (build-only variables)"),
)

# Triton's CACHE_INVALIDATING_ENV_VARS: the union of include/triton/Tools/Sys/GetEnv.h in the
# triton 3.9.0 wheel and GetEnv.hpp at the indexed triton-lang/triton revision (older names that
# 3.9.0 dropped are kept: a cache built by the older Triton keyed them). Set ones enter the key
# through get_cache_invalidating_env_vars() (jit-runtimes.md §2, python/triton/runtime/cache.py
# get_cache_key). Not in the in-memory device_caches key (PR #8350).
_TRITON_INVALIDATING: tuple[str, ...] = (
    "ALLOW_LHS_TMEM_LAYOUT_CONVERSION", "AMDGCN_ENABLE_DUMP", "AMDGCN_USE_BUFFER_ATOMICS",
    "AMDGCN_USE_BUFFER_OPS", "DISABLE_FAST_REDUCTION", "DISABLE_LLVM_OPT", "DISABLE_MMA_V3",
    "DISABLE_MMA_V5", "DISABLE_PTXAS_OPT", "ENABLE_MMA_V5_ATT_PIPELINE", "LLVM_ENABLE_TIMING",
    "LLVM_EXTRACT_DI_LOCAL_VARIABLES", "LLVM_IR_ENABLE_DUMP", "LLVM_PASS_PLUGIN_PATH",
    "MLIR_DISABLE_MULTITHREADING", "MLIR_DUMP_PATH", "MLIR_ENABLE_DIAGNOSTICS",
    "MLIR_ENABLE_DUMP", "MLIR_ENABLE_TIMING", "NVPTX_ENABLE_DUMP",
    "STORE_TMEM_TO_GLOBAL_BYPASS_SMEM", "TRITON_CONSAN_INIT_ALLOCATIONS",
    "TRITON_DEFAULT_FP_FUSION", "TRITON_DISABLE_LINE_INFO",
    "TRITON_DISABLE_RESHAPE_ENCODING_INFERENCE", "TRITON_DUMP_MIR", "TRITON_ENABLE_ASAN",
    "TRITON_ENABLE_EXPERIMENTAL_CONSAN", "TRITON_ENABLE_LLVM_DEBUG", "TRITON_F32_DEFAULT",
    "TRITON_FORCE_DISABLE_FP_FUSION", "TRITON_HIP_GLOBAL_PREFETCH", "TRITON_HIP_LOCAL_PREFETCH",
    "TRITON_HIP_USE_ASYNC_COPY", "TRITON_HIP_USE_BLOCK_PINGPONG",
    "TRITON_HIP_USE_COEXEC_SCHEDULER", "TRITON_HIP_USE_EXPERT_SCHEDULING",
    "TRITON_HIP_USE_IN_THREAD_TRANSPOSE", "TRITON_LLVM_DEBUG_ONLY",
    "TRITON_OVERRIDE_ARCH", "TRITON_PARTITION_SCHEDULING_DUMP_DATA_ONLY",
    "TRITON_PARTITION_SCHEDULING_DUMP_LOOP_ONLY",
    "TRITON_PARTITION_SCHEDULING_ENABLE_DUMP_DOT", "TRITON_PLUGIN_PATHS",
    "TRITON_PLUGIN_VERSION_CHECK", "USE_IR_LOC", "WARP_SPECIALIZE_ATTENTION_FLAG",
)

_TRITON_ROWS: tuple[Variable, ...] = tuple(
    _var(name, "triton-invalidating",
         "listed in Triton's CACHE_INVALIDATING_ENV_VARS: changes lowering, so it is keyed "
         "when set",
         in_key=("triton",),
         notes={"triton": "in the disk key when set; not in the in-memory device_caches key"},
         source="jit-runtimes.md §2; triton include/triton/Tools/Sys/GetEnv.hpp")
    for name in _TRITON_INVALIDATING
)


# --------------------------------------------------------------------------------------------
# The <PREFIX>_JIT_<SUFFIX> family
# --------------------------------------------------------------------------------------------

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
_FLAVOUR_RUNTIME: Mapping[str, tuple[str, str | None]] = MappingProxyType({
    "deepjit": ("deepjit", None),
    "deepgemm": ("deepgemm", None),
    "deepgemm-python": ("deepgemm", "python"),
    "deepep": ("deepep", None),
})
_FLAVOUR_PREFIX: Mapping[str, str] = MappingProxyType({
    "deepgemm": "DG", "deepgemm-python": "DG", "deepep": "EP",
})
# Which runtimes read a family prefix at all (DJ_ is only DeepJIT's global fallback).
_PREFIX_RUNTIMES: Mapping[str, tuple[str, ...]] = MappingProxyType({
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

    def rule(self, flavour: str) -> JitRule | None:
        return {
            "deepjit": self.deepjit,
            "deepgemm": self.deepgemm,
            "deepgemm-python": self.deepgemm_python,
            "deepep": self.deepep,
        }[flavour]

    def applies_to(self, prefix: str) -> bool:
        return not self.only_prefixes or prefix in self.only_prefixes


_DJ_SRC = "deepseek-jit.md §4; DeepJIT backend/cuda/options.hpp CompilerOptions::default_options"
_DG_SRC = "deepseek-jit.md §2 (54e2261)"
_PY_SRC = "deepseek-jit.md §1 (8dfa329)"
_EP_SRC = "deepseek-jit.md §3"


def _rule(default: str | None, status: KeyStatus, read_at: ReadAt | None = None,
          note: str = "", *, changes_binary: bool = True, **variants: KeyStatus) -> JitRule:
    return JitRule(default, status, read_at, note, MappingProxyType(variants), changes_binary)


_SUFFIX_ROWS: tuple[JitSuffix, ...] = (
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
        source=f"{_DJ_SRC}; {_DG_SRC}; {_PY_SRC}; {_EP_SRC}"),
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
        source=f"{_DJ_SRC}; {_DG_SRC}; {_PY_SRC}; {_EP_SRC}"),
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
        source=f"{_DJ_SRC}; {_DG_SRC}; {_PY_SRC}; {_EP_SRC}"),
    JitSuffix(
        "JIT_CPP_STANDARD", "compiler-flags", "int", "the -std=c++N of every kernel",
        deepjit=_rule("20", IN, "construction"),
        deepgemm=_rule("20", IN, "construction", "setup.py may persist a default"),
        deepgemm_python=NOT_READ,
        deepep=_rule("20", IN),
        source=f"{_DJ_SRC}; {_DG_SRC}; {_EP_SRC}"),
    JitSuffix(
        "JIT_OVERRIDE_CPP_STANDARD", "compiler-flags", "int",
        "the C++ standard of the Python JIT (renamed JIT_CPP_STANDARD in the C++ JIT)",
        deepgemm_python=_rule("20", IN, None, "via the keyed flags"),
        legacy_names=("DG_NVCC_OVERRIDE_CPP_STANDARD",),
        only_prefixes=("DG",),
        source=_PY_SRC),
    JitSuffix(
        "JIT_PTXAS_VERBOSE", "compiler-flags", "bool", "adds --ptxas-options=--verbose",
        deepjit=_rule("0", IN, "construction", "CUDA backend"),
        deepgemm=_rule("0", IN, "construction"),
        deepgemm_python=_rule(None, IN, None, "only checked for presence; appends ,--verbose"),
        deepep=_rule("0", IN),
        legacy_names=("DG_PTXAS_VERBOSE",),
        source=f"{_DJ_SRC}; {_DG_SRC}; {_PY_SRC}; {_EP_SRC}"),
    JitSuffix(
        "JIT_PTXAS_CHECK", "compiler-flags", "bool",
        "DeepGEMM: adds ptxas warnings; DeepEP: a post-compile regex check only",
        deepjit=NOT_READ,
        deepgemm=_rule("0", IN, "construction",
                       "adds --ptxas-options=--verbose,--warn-on-local-memory-usage"),
        deepep=_rule("0", OUT, None, "only a post-compile regex check over ptxas's output: no "
                     "flag, so neither the key nor the binary changes", changes_binary=False),
        source=f"{_DG_SRC}; {_EP_SRC}; DeepJIT options.hpp does not read it"),
    JitSuffix(
        "JIT_CHECK_NO_SPILLS", "compiler-flags", "bool",
        "adds --ptxas-options=--warn-on-spills and fails on spills",
        deepjit=_rule("0", IN, "construction", rocm=IN),
        deepgemm=NOT_READ,
        source=f"{_DJ_SRC}; deepseek-jit.md §2 (new in DeepGEMM 2.8)"),
    JitSuffix(
        "JIT_CHECK_NO_LOCAL_MEMORY", "compiler-flags", "bool",
        "adds --ptxas-options=--warn-on-local-memory-usage and fails on local memory",
        deepjit=_rule("0", IN, "construction", rocm=IN),
        deepgemm=NOT_READ,
        source=f"{_DJ_SRC}; deepseek-jit.md §2 (new in DeepGEMM 2.8)"),
    JitSuffix(
        "JIT_WITH_LINEINFO", "compiler-flags", "bool", "adds line information to the binary",
        deepjit=_rule("0", IN, "construction", rocm=IN),
        deepgemm=_rule("0", IN, "construction", "adds -Xcompiler -rdynamic -lineinfo"),
        deepep=_rule("0", IN),
        source=f"{_DJ_SRC}; {_DG_SRC}; {_EP_SRC}"),
    JitSuffix(
        "JIT_DUMP_ASM", "print-only", "bool",
        "dumps PTX and SASS (CUDA) or LLVM IR and ISA (ROCm) on a miss",
        deepjit=_rule("0", OUT, "construction",
                      "CUDA: dump_ptx/dump_sass are excluded from the key; ROCm: "
                      "dump_llvm_ir/dump_isa are keyed", rocm=IN),
        deepgemm=_rule("0", OUT, "call"),
        deepep=_rule("0", OUT),
        source=f"{_DJ_SRC}; DeepJIT backend/rocm/options.hpp update_hash; {_DG_SRC}; {_EP_SRC}"),
    JitSuffix(
        "JIT_DUMP_PTX", "print-only", "bool", "writes kernel.ptx on a miss",
        deepjit=_rule("0", OUT, "construction"),
        deepgemm=_rule("0", OUT, "call"),
        deepep=_rule("0", OUT),
        source=f"{_DJ_SRC}; {_DG_SRC}; {_EP_SRC}"),
    JitSuffix(
        "JIT_DUMP_SASS", "print-only", "bool", "writes kernel.sass on a miss (cuobjdump)",
        deepjit=_rule("0", OUT, "construction"),
        deepgemm=_rule("0", OUT, "call"),
        deepep=_rule("0", OUT),
        source=f"{_DJ_SRC}; {_DG_SRC}; {_EP_SRC}"),
    JitSuffix(
        "JIT_PRINT_COMPILER_COMMAND", "print-only", "bool",
        "prints the compiler command (a usable signal of a miss)",
        deepjit=_rule("0", OUT, "call"),
        deepgemm=_rule("0", OUT, "call", "setup.py may persist a default"),
        deepgemm_python=_rule("0", OUT),
        deepep=_rule("0", OUT),
        legacy_names=("DG_JIT_PRINT_NVCC_COMMAND",),
        source=f"{_DJ_SRC}; {_DG_SRC}; {_PY_SRC}; {_EP_SRC}"),
    JitSuffix(
        "JIT_PRINT_LOAD_TIME", "print-only", "bool", "prints each kernel load (a hit signal)",
        deepjit=_rule("0", OUT, "call"),
        deepgemm=_rule("0", OUT, "call"),
        source=f"{_DJ_SRC}; {_DG_SRC}"),
    JitSuffix(
        "JIT_PRINT_REG_REUSE", "print-only", "bool", "prints FFMA register reuse",
        deepgemm_python=_rule("0", OUT),
        legacy_names=("DG_PRINT_REG_REUSE",),
        only_prefixes=("DG",),
        source=_PY_SRC),
    JitSuffix(
        "JIT_USE_NVRTC", "compiler-choice", "bool", "compiles with NVRTC instead of nvcc",
        deepjit=NOT_READ,
        deepgemm=_rule("0", IN, "construction"),
        deepgemm_python=_rule("0", IN),
        deepep=NOT_READ,
        only_prefixes=("DG",),
        source=f"{_DG_SRC}; {_PY_SRC}; deepseek-jit.md §2 (2.8: 'NVRTC is gone'), §3"),
    JitSuffix(
        "JIT_DISABLE_FFMA_INTERLEAVE", "jit-config", "bool",
        "turns off the post-compile FFMA interleave rewrite of the cubin",
        deepgemm_python=_rule("0", IN, None, "feeds enable_sass_opt"),
        legacy_names=("DG_DISABLE_FFMA_INTERLEAVE",),
        only_prefixes=("DG",),
        source=_PY_SRC),
    JitSuffix(
        "JIT_DISABLE_CACHE", "cache-control", "bool",
        "skips the disk lookup only; the in-memory cache still serves",
        deepgemm_python=_rule("0", OUT),
        only_prefixes=("DG",),
        source=_PY_SRC),
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
        source="deepseek-jit.md §4; DeepJIT backend/rocm/backend.hpp find_rocm_toolkit"),
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

JIT_SUFFIXES: Mapping[str, JitSuffix] = MappingProxyType({s.suffix: s for s in _SUFFIX_ROWS})
_LEGACY_NAME_SUFFIX: Mapping[str, str] = MappingProxyType({
    name: s.suffix for s in _SUFFIX_ROWS for name in s.legacy_names
})

_FAMILY_FLAVOURS: Mapping[str, tuple[tuple[str, str], ...]] = MappingProxyType({
    # prefix -> ((flavour, status key), ...)
    "DG": (("deepjit", "deepjit"), ("deepgemm", "deepgemm"),
           ("deepgemm-python", "deepgemm:python")),
    "EP": (("deepjit", "deepjit"), ("deepep", "deepep")),
    "DJ": (("deepjit", "deepjit"),),
})


def _family_variable(prefix: str, spec: JitSuffix) -> Variable:
    status: dict[str, KeyStatus] = {}
    notes: dict[str, str] = {}
    ignored: set[str] = set()
    # One name serves every flavour of its prefix: it changes no binary only when no flavour
    # that reads it can change one with it.
    reading: list[JitRule] = []
    if spec.applies_to(prefix):
        for flavour, key in _FAMILY_FLAVOURS[prefix]:
            rule = spec.rule(flavour)
            if rule is None:
                continue
            if rule is NOT_READ:
                ignored.add(key)
                continue
            reading.append(rule)
            status[key] = rule.status
            for variant, value in rule.variants.items():
                status[f"{key}:{variant}"] = value
            if rule.note:
                notes[key] = rule.note
    if prefix == "DJ":
        # DeepGEMM <= 2.6 and DeepEP's EPv2 JIT read only their own prefix: no DJ_ fallback.
        ignored.update(("deepgemm", "deepep"))
    return Variable(f"{prefix}_{spec.suffix}", spec.category, spec.description, status,
                    frozenset(ignored), notes, spec.category not in _NO_OUTPUT_CATEGORIES
                    and (not reading or any(rule.changes_binary for rule in reading)),
                    spec.source)


def _legacy_variable(name: str) -> Variable:
    spec = JIT_SUFFIXES[_LEGACY_NAME_SUFFIX[name]]
    rule = spec.deepgemm_python
    status = {"deepgemm:python": rule.status} if rule and rule is not NOT_READ else {}
    return Variable(
        name, spec.category,
        f"DeepGEMM name before the 2025-05-07 rename (bfe983c) of DG_{spec.suffix}: "
        f"{spec.description}",
        status, frozenset({"deepgemm", "deepjit"}),
        {"deepgemm:python": "read only by Python JIT revisions before bfe983c (2025-05-07); "
                            "later DeepGEMM ignores it (sglang #6073)"},
        spec.category not in _NO_OUTPUT_CATEGORIES, _PY_SRC)


VARIABLES: Mapping[str, Variable] = MappingProxyType({
    v.name: v
    for v in (
        *_EXACT_ROWS,
        *_TRITON_ROWS,
        *(_legacy_variable(name) for name in _LEGACY_NAME_SUFFIX),
    )
})
"""Every registry variable with an exact name; `<PREFIX>_JIT_*` names are resolved by lookup()."""

_EXACT: dict[str, Variable] = dict(VARIABLES)  # a plain dict for the per-compile hot loop

if len(VARIABLES) != len(_EXACT_ROWS) + len(_TRITON_ROWS) + len(_LEGACY_NAME_SUFFIX):
    raise AssertionError("duplicate name in the envvars registry")

_PREFIX_SET = frozenset(JIT_PREFIXES)


_FAMILY_HEADS = frozenset(f"{p}_JIT_" for p in JIT_PREFIXES)
_FAMILY_HEAD_LEN = 7  # len("DG_JIT_"): every known prefix has two letters
if {len(head) for head in _FAMILY_HEADS} != {_FAMILY_HEAD_LEN}:
    raise AssertionError("JIT_PREFIXES must all have the same length")


def _family_parts(name: str) -> tuple[str, str] | None:
    """`DG_JIT_DEBUG` -> ("DG", "JIT_DEBUG"); None when not a family name. No regex: hot path."""
    if len(name) > _FAMILY_HEAD_LEN and name[:_FAMILY_HEAD_LEN] in _FAMILY_HEADS:
        return name[:2], name[3:]
    return None


@functools.lru_cache(maxsize=1024)
def lookup(name: str) -> Variable | None:
    """The registry's entry for `name`, or None when cacheaudit does not track it.

    A `<PREFIX>_JIT_<SUFFIX>` name with a suffix outside the table still belongs to the family
    (a new DeepJIT setting, a typo the user wants to see): it comes back UNKNOWN for the
    prefix's runtimes, category "jit-config".
    """
    exact = VARIABLES.get(name)
    if exact is not None:
        return exact
    parts = _family_parts(name)
    if parts is None:
        return None
    prefix, suffix = parts
    spec = JIT_SUFFIXES.get(suffix)
    if spec is not None:
        return _family_variable(prefix, spec)
    return Variable(
        name, "jit-config",
        f"a {prefix}_JIT_* setting cacheaudit's table does not know: effect and key status "
        "unknown (DeepJIT panics on values it cannot parse, ignores names it does not read)",
        {rt: UNK for rt in _PREFIX_RUNTIMES[prefix]}, frozenset(), {}, True,
        "deepseek-jit.md §4 (utils/env.hpp lookup order)")


def iter_variables() -> Iterator[Variable]:
    """Every registry variable, the prefix family expanded for each known prefix: for docs."""
    yield from VARIABLES.values()
    for prefix in JIT_PREFIXES:
        for spec in _SUFFIX_ROWS:
            name = f"{prefix}_{spec.suffix}"
            if name not in VARIABLES:
                variable = lookup(name)
                if variable is not None and (variable.status or variable.ignored_by):
                    yield variable


def classify(name: str, runtime: str, variant: str | None = None) -> KeyStatus:
    """Whether `runtime` (optionally a variant such as "rocm") keys `name`; UNKNOWN if unsaid."""
    _check_runtime(runtime)
    variable = lookup(name)
    if variable is None:
        return UNK
    return variable.status_for(runtime, variant)


def affects_output(name: str, runtime: str, variant: str | None = None) -> bool | None:
    """Whether a change of `name` can change what `runtime` compiles (None: unknown)."""
    _check_runtime(runtime)
    variable = lookup(name)
    if variable is None:
        return None
    if variable.ignored(runtime, variant):
        return False
    if not variable.affects_output:
        return False
    return None if variable.status_for(runtime, variant) is UNK else True


# Variables that pick the compiler binary (or the toolkit it comes from). Their drift is judged
# through what they select: the audit compares the compilers' identities (CA301, CA302), since
# a shell that lacks DG_JIT_NVCC_COMPILER is no evidence of another compiler. Narrower than the
# "compiler-choice" category, which also holds switches such as JIT_USE_NVRTC.
_SELECTS_COMPILER = frozenset({"PATH", "CC", "CXX", "NVCC_CCBIN", "CUDAHOSTCXX", "CUDA_HOME",
                               "CUDA_PATH", "PYTORCH_NVCC", "FLASHINFER_NVCC"})
_SELECTS_COMPILER_SUFFIXES = ("_JIT_NVCC_COMPILER", "_JIT_HIPCC_COMPILER", "_NVCC_COMPILER")


def selects_compiler(name: str) -> bool:
    """Whether `name` picks the compiler binary itself, whose identity is judged instead."""
    return name in _SELECTS_COMPILER or name.endswith(_SELECTS_COMPILER_SUFFIXES)


def is_implicit_input(name: str, runtime: str, variant: str | None = None) -> bool:
    """True when `name` changes `runtime`'s binary but not its key: the CA201/CA202 subject."""
    return (classify(name, runtime, variant) is OUT
            and affects_output(name, runtime, variant) is True)


# --------------------------------------------------------------------------------------------
# Prefix resolution (DeepJIT utils/env.hpp; legacy flavours read only their own prefix)
# --------------------------------------------------------------------------------------------

SettingOrigin = Literal["prefixed", "fallback", "default"]


@dataclass(frozen=True)
class ResolvedSetting:
    """Where one `<PREFIX>_JIT_*` setting got its value, and what the runtime makes of it.

    `name` is the variable that supplied the value (None for the default); `value` is that
    variable's value, redacted, or the documented default. `parsed` is the typed value as the
    flavour would read it, `error` says why it cannot (DeepJIT panics on such a value; DeepGEMM
    <= 2.6 reads garbage). `ignored` names variables that are set but do not apply: a DJ_
    fallback shadowed by the prefixed name, a DJ_ name under a flavour without fallback, a
    pre-rename DeepGEMM name.
    """

    prefix: str
    suffix: str
    flavour: str
    name: str | None
    value: str | None
    origin: SettingOrigin
    default: str | None
    parsed: bool | int | str | None = None
    error: str | None = None
    status: KeyStatus = UNK
    read_at: ReadAt | None = None
    ignored: tuple[str, ...] = ()
    note: str = ""

    @property
    def variable(self) -> str:
        """The prefixed name the user would set."""
        return f"{self.prefix}_{self.suffix}"

    @property
    def is_fallback(self) -> bool:
        return self.origin == "fallback"

    @property
    def runtime(self) -> str:
        """The runtime id (RUNTIMES) this flavour belongs to."""
        return _FLAVOUR_RUNTIME[self.flavour][0]


_INT_RE = re.compile(r"-?[0-9]+")
_SSCANF_INT_RE = re.compile(r"\s*[-+]?[0-9]+")


def parse_jit_int(text: str, flavour: str = "deepjit",
                  bits: int = 64) -> tuple[int | None, str | None]:
    """An integer setting as the flavour reads it: (value, None) or (None, why it is invalid).

    DeepJIT (`parse_integer`, std::from_chars) takes the whole string: an optional '-' and
    digits, no '+', no blanks, in range, or it panics. DeepGEMM <= 2.6 uses sscanf("%d"), which
    takes a leading integer and ignores the rest, and leaves an uninitialised int (undefined
    result) when there is none. The Python JIT uses int().
    """
    if flavour == "deepjit":
        if not _INT_RE.fullmatch(text):
            return None, f"not an integer: {text!r} (DeepJIT panics: 'invalid value')"
        value = int(text)
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        if not low <= value <= high:
            return None, f"out of range: {text!r} (DeepJIT panics: 'invalid value')"
        return value, None
    if flavour == "deepgemm-python":
        try:
            return int(text), None
        except ValueError:
            return None, f"not an integer: {text!r} (the Python JIT raises ValueError)"
    match = _SSCANF_INT_RE.match(text)
    if match is None:
        return None, (f"not an integer: {text!r} (DeepGEMM <= 2.6 reads it with sscanf into "
                      "an uninitialised int: the effect is undefined)")
    return int(match.group()), None


def parse_jit_bool(text: str, flavour: str = "deepjit") -> tuple[bool | None, str | None]:
    """A boolean setting as the flavour reads it: (value, None) or (None, why it is invalid).

    DeepJIT (`get_env<bool>`): true/yes/false/no in any case, else a whole-string integer,
    non-zero is true; anything else panics, which a user wants to know before the run does.
    Legacy flavours read an integer (see parse_jit_int).
    """
    if flavour == "deepjit":
        lowered = text.lower()
        if lowered in ("true", "yes"):
            return True, None
        if lowered in ("false", "no"):
            return False, None
    value, error = parse_jit_int(text, flavour)
    return (None, error) if value is None else (value != 0, None)


def _parse_typed(kind: str, text: str, flavour: str) -> tuple[bool | int | str | None, str | None]:
    if kind == "bool":
        return parse_jit_bool(text, flavour)
    if kind == "int":
        return parse_jit_int(text, flavour, bits=32)
    return text, None


def _check_flavour(prefix: str, flavour: str) -> None:
    if flavour not in _FLAVOUR_RUNTIME:
        raise EnvVarsError(f"unknown flavour {flavour!r}; expected one of {', '.join(FLAVOURS)}")
    if not prefix or not prefix.replace("_", "").isalnum() or not prefix.isupper():
        raise EnvVarsError(f"invalid prefix {prefix!r}: an upper-case name such as DG, EP, DJ")
    required = _FLAVOUR_PREFIX.get(flavour)
    if required is not None and prefix != required:
        raise EnvVarsError(f"flavour {flavour!r} reads only the {required}_ prefix, not {prefix}_")


def _normalise_suffix(suffix: str) -> str:
    suffix = suffix.strip().upper()
    return suffix if suffix.startswith("JIT_") else f"JIT_{suffix}"


def resolve_jit_setting(prefix: str, suffix: str, env: Mapping[str, str], *,
                        flavour: str = "deepjit", backend: str | None = None) -> ResolvedSetting:
    """Which variable supplies `<prefix>_<suffix>` under `flavour`, and with what value.

    DeepJIT (`Env::get`, utils/env.hpp): `<PREFIX>_<SUFFIX>` if set (even to ""), else
    `DJ_<SUFFIX>`, else the default; DJ is the global prefix, never a runtime's own. DeepGEMM
    <= 2.6 and DeepEP's EPv2 JIT read only their own prefix, with their own defaults. `suffix`
    may be given with or without its "JIT_" head; `backend` ("rocm", "ascend") picks a DeepJIT
    backend's key status where it differs from CUDA's.
    """
    prefix = prefix.strip().upper()
    _check_flavour(prefix, flavour)
    suffix = _normalise_suffix(suffix)
    spec = JIT_SUFFIXES.get(suffix)
    rule = spec.rule(flavour) if spec is not None and spec.applies_to(prefix) else None
    kind: str = spec.kind if spec is not None else "str"

    own = f"{prefix}_{suffix}"
    fallback = f"DJ_{suffix}" if flavour == "deepjit" and prefix != "DJ" else None
    ignored: list[str] = []
    name: str | None
    origin: SettingOrigin
    if own in env:
        name, origin = own, "prefixed"
        if fallback is not None and fallback in env:
            ignored.append(fallback)
    elif fallback is not None and fallback in env:
        name, origin = fallback, "fallback"
    else:
        name, origin = None, "default"
    if flavour != "deepjit" and f"DJ_{suffix}" in env:
        ignored.append(f"DJ_{suffix}")
    if prefix == "DG":
        ignored.extend(old for old in (spec.legacy_names if spec else ()) if old in env)

    default = rule.default if rule is not None and rule is not NOT_READ else None
    parsed: bool | int | str | None = None
    error: str | None = None
    if name is not None:
        raw = env[name]
        value: str | None = redact(name, raw)
        if kind in ("bool", "int"):
            parsed, error = _parse_typed(kind, raw, flavour)
        else:
            parsed = value
    else:
        value = default
        if default is not None and kind in ("bool", "int"):
            parsed, _ = _parse_typed(kind, default, flavour)
        elif default is not None:
            parsed = default

    if rule is NOT_READ:
        status, read_at, note = OUT, None, f"not read by the {flavour} flavour"
    elif rule is not None:
        status = rule.variants.get(backend, rule.status) if backend else rule.status
        read_at, note = rule.read_at, rule.note
    elif spec is None:
        status, read_at, note = UNK, None, "suffix not in cacheaudit's table"
    elif not spec.applies_to(prefix):
        status, read_at, note = UNK, None, f"a setting of {', '.join(spec.only_prefixes)} only"
    else:
        status, read_at, note = UNK, None, f"the references do not say how {flavour} reads it"
    return ResolvedSetting(prefix, suffix, flavour, name, value, origin, default, parsed, error,
                           status, read_at, tuple(ignored), note)


def resolve_jit_settings(prefix: str, env: Mapping[str, str], *, flavour: str = "deepjit",
                         backend: str | None = None) -> list[ResolvedSetting]:
    """Every setting the flavour reads for `prefix`, in table order, then unknown ones that are set.

    An unknown `<PREFIX>_JIT_*` (or, for DeepJIT, `DJ_JIT_*`) that is set comes last, UNKNOWN:
    the snapshot should show a misspelt variable rather than hide it.
    """
    prefix = prefix.strip().upper()
    _check_flavour(prefix, flavour)
    out: list[ResolvedSetting] = []
    for spec in _SUFFIX_ROWS:
        rule = spec.rule(flavour)
        if rule is None or rule is NOT_READ or not spec.applies_to(prefix):
            continue
        out.append(resolve_jit_setting(prefix, spec.suffix, env, flavour=flavour,
                                       backend=backend))
    heads = [prefix] + (["DJ"] if flavour == "deepjit" and prefix != "DJ" else [])
    unknown = sorted({
        parts[1]
        for name in env
        if (parts := _family_parts(name)) is not None and parts[0] in heads
        and parts[1] not in JIT_SUFFIXES
    })
    out.extend(resolve_jit_setting(prefix, suffix, env, flavour=flavour, backend=backend)
               for suffix in unknown)
    return out


def jit_prefixes_in(env: Mapping[str, str]) -> list[str]:
    """The family prefixes (DG, EP, DJ) with any registry variable of theirs set, in that order.

    Counts `<PREFIX>_JIT_*` names and exact registry names of the prefix (DG_CACHE_DIR,
    EP_NUM_TOPK_IDX_BITS), so a DeepGEMM configured only with pre-rename names is still seen.
    """
    found: set[str] = set()
    for name in env:
        parts = _family_parts(name)
        if parts is not None:
            found.add(parts[0])
            continue
        head = name.partition("_")[0]
        if head in _PREFIX_SET and name in VARIABLES:
            found.add(head)
    return [p for p in JIT_PREFIXES if p in found]


# --------------------------------------------------------------------------------------------
# The per-compile subset
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=len(RUNTIMES))
def _names_read_by(runtime: str) -> frozenset[str]:
    return frozenset(v.name for v in VARIABLES.values() if runtime in v.runtimes)


def compile_environment(env: Mapping[str, str], runtime: str | None = None) -> dict[str, str]:
    """The registry variables set in `env`, sorted by name, values redacted: what the shim stores.

    `runtime` narrows the subset to variables the registry says that runtime reads (its status
    lists it, or it is a family prefix the runtime reads). When unsure, pass None: an extra
    variable costs bytes, a missing one loses evidence. One dict lookup per variable in `env`;
    the redaction regex runs only on the few values kept.
    """
    exact: Mapping[str, object] = _EXACT
    heads: frozenset[str] = _FAMILY_HEADS
    if runtime is not None:
        _check_runtime(runtime)
        exact = dict.fromkeys(_names_read_by(runtime))
        heads = frozenset(f"{p}_JIT_" for p, rts in _PREFIX_RUNTIMES.items() if runtime in rts)
    head_len = _FAMILY_HEAD_LEN
    kept: list[tuple[str, str]] = []
    for name, value in env.items():
        # Inlined _family_parts: this loop runs over every variable of every compile.
        if name in exact or (len(name) > head_len and name[:head_len] in heads):
            kept.append((name, redact(name, value)))
    kept.sort()
    return dict(kept)


# --------------------------------------------------------------------------------------------
# Redaction
# --------------------------------------------------------------------------------------------

REDACTED = "<redacted>"

# Name words: a name part equal to or ending in one of these (MY_TOKEN, GH_OAUTH, DBPASSWORD),
# unlike vLLM's substring filter (secret/token/api/access/password), which would also catch
# DG_JIT_USE_RUNTIME_API and TOKENIZERS_PARALLELISM.
_SECRET_WORD_SUFFIXES = (
    "TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "CREDENTIAL", "CREDENTIALS", "AUTH",
    "COOKIE", "APIKEY", "ACCESSKEY", "PRIVATEKEY", "SECRETKEY",
)
_SECRET_WORDS = frozenset({
    "SECRETS", "PASSWORDS", "CREDS", "AUTHORIZATION", "SESSION", "SESSIONID",
    "COOKIES", "JWT", "BEARER", "PAT", "OTP",
})
# KEY is a secret word unless the neighbouring part says it is a cache/lookup key or a setting
# about keys (CUPY_CACHE_KEY, TRITON_REDIS_KEY_FORMAT).
_HARMLESS_BEFORE_KEY = frozenset({
    "CACHE", "HASH", "SORT", "PRIMARY", "FOREIGN", "PARTITION", "INDEX", "LOOKUP", "MAP",
    "SHARD", "ROUTING", "GROUP", "DEDUP", "PUBLIC", "HOT", "COMPOSITE",
})
_HARMLESS_AFTER_KEY = frozenset({
    "FORMAT", "PREFIX", "SUFFIX", "LENGTH", "LEN", "SIZE", "BITS", "NAME", "SEP", "SEPARATOR",
    "COLUMN", "FIELD", "TYPE", "ALGORITHM", "ALG",
})
_NAME_SPLIT_RE = re.compile(r"[^A-Z0-9]+")


@functools.lru_cache(maxsize=4096)
def looks_secret_name(name: str) -> bool:
    """Whether a variable's name says its value is a credential (TOKEN, SECRET, API_KEY, ...).

    Works on name parts, so TORCH_CUDA_ARCH_LIST, DG_JIT_PTXAS_CHECK, TOKENIZERS_PARALLELISM,
    GIT_AUTHOR_NAME and PWD stay visible while GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY,
    OPENAI_API_KEY, DB_PASSWORD and GH_OAUTH do not.
    """
    parts = [p for p in _NAME_SPLIT_RE.split(name.upper()) if p]
    for i, part in enumerate(parts):
        if part in _SECRET_WORDS or part.endswith(_SECRET_WORD_SUFFIXES):
            return True
        if part in ("KEY", "KEYS"):
            before = parts[i - 1] if i > 0 else ""
            after = parts[i + 1] if i + 1 < len(parts) else ""
            if before not in _HARMLESS_BEFORE_KEY and after not in _HARMLESS_AFTER_KEY:
                return True
    return False


# A `name=value` pair is secret when the name ends in one of these (API_TOKEN=, X-Amz-Signature=,
# password=): only the value is replaced, so the pattern anchors on the word, not the name's head
# (a lazy scan from the head was quadratic on long PATH-like values).
_KV_NAMES = (
    r"password|passwd|passphrase|token|secret|api[_-]?key|access[_-]?key|private[_-]?key"
    r"|secret[_-]?key|signature|credentials?|auth|sig"
)
_SECRET_VALUE_PATTERN = (
    r"""
      (?P<pem>-----BEGIN[ A-Z0-9]*-----.*?(?:-----END[ A-Z0-9]*-----|\Z))
    | (?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#\s]+)@
    | (?P<authword>\b(?i:bearer|basic)\s+)(?P<authval>[A-Za-z0-9._~+/=-]{8,})
    | (?P<kvkey>(?:(?i:""" + _KV_NAMES + r""")|(?<=[?&;])(?i:key|code))=)
      (?P<kvval>[^&\s#;,'"]+)
    | (?P<tok>
          gh[pousr]_[A-Za-z0-9]{20,}
        | github_pat_[A-Za-z0-9_]{20,}
        | glpat-[A-Za-z0-9_-]{20,}
        | xox[baprs]-[A-Za-z0-9-]{10,}
        | (?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{32,}
        | (?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])
        | (?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}
        | eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*
      )
    """
)


@functools.lru_cache(maxsize=1)
def _secret_value_re() -> re.Pattern[str]:
    # Compiled on first use: ~2 ms that a shim process which stores no value need not pay.
    return re.compile(_SECRET_VALUE_PATTERN, re.VERBOSE | re.DOTALL)


def _replace_secret(match: re.Match[str]) -> str:
    if match.group("scheme") is not None:
        return f"{match.group('scheme')}{REDACTED}@"
    if match.group("authword") is not None:
        word, credential = match.group("authword"), match.group("authval")
        if word[:5].lower() == "basic" and credential.isalpha() and credential.islower():
            return match.group()  # "basic configuration": prose, not a base64 credential
        return f"{word}{REDACTED}"
    if match.group("kvkey") is not None:
        return f"{match.group('kvkey')}{REDACTED}"
    return REDACTED


# Every alternative of the pattern needs one of these literals (or "bearer"/"basic" in any
# case). Checking them with `in` runs at C speed; the regex, which tries each alternative at each
# position, then runs only on the rare value that has one (PATH: ~60 us -> ~2 us).
_SECRET_TRIGGERS = (
    "=", "://", "-----BEGIN", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "glpat-",
    "xox", "sk-", "AKIA", "ASIA", "hf_", "eyJ",
)


def _may_hold_secret(value: str) -> bool:
    for trigger in _SECRET_TRIGGERS:
        if trigger in value:
            return True
    lowered = value.lower()
    return "bearer" in lowered or "basic" in lowered


def _redact_value(value: str) -> str:
    if not _may_hold_secret(value):
        return value
    return _secret_value_re().sub(_replace_secret, value)


def looks_secret_value(value: str) -> bool:
    """Whether a value carries a credential of a recognisable shape.

    URLs with user:password@, `Bearer ...`, `password=`/`token=` pairs, GitHub/GitLab/Slack/
    OpenAI-style/AWS/Hugging Face tokens, JWTs and PEM blocks; not paths, flag strings such as
    `-DX=1 -O3`, or 32-hex cache digests.
    """
    return _may_hold_secret(value) and _redact_value(value) != value


def redact(name: str, value: str) -> str:
    """`value` with its secret parts replaced by "<redacted>"; all of it if `name` looks secret.

    A URL keeps its scheme and host and loses only its credentials, so a snapshot still shows
    which remote cache was configured.
    """
    if looks_secret_name(name):
        return REDACTED if value else value
    return _redact_value(value)
