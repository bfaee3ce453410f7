"""The compile-affecting environment: registry classifications, prefix resolution, redaction.

What a user relies on: that the registry says what the references say (a wrong "in-key" hides a
stale hit), that `DG_JIT_X` / `DJ_JIT_X` resolve as DeepJIT resolves them, and that nothing
secret survives into what the shim stores or a snapshot shows.
"""

from __future__ import annotations

import random
import string
from types import MappingProxyType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheaudit import envvars
from cacheaudit.envvars import (
    REDACTED,
    RUNTIMES,
    VARIABLES,
    EnvVarsError,
    KeyStatus,
    affects_output,
    classify,
    compile_environment,
    is_implicit_input,
    iter_variables,
    looks_secret_name,
    looks_secret_value,
    lookup,
    redact,
)
from cacheaudit.runtimes._deepseek.environment import (
    FLAVOURS,
    JIT_PREFIXES,
    JIT_SUFFIXES,
    jit_prefixes_in,
    parse_jit_bool,
    parse_jit_int,
    resolve_jit_setting,
    resolve_jit_settings,
)

IN = KeyStatus.IN_KEY
OUT = KeyStatus.NOT_IN_KEY
UNK = KeyStatus.UNKNOWN


# ---------------------------------------------------------------------------------------------
# Vocabulary
# ---------------------------------------------------------------------------------------------

def test_runtimes_are_the_project_ids() -> None:
    assert RUNTIMES == ("deepjit", "deepgemm", "deepep", "torch-ext", "triton", "nvrtc",
                        "cuda-core", "cupy", "flashinfer", "inductor", "shim")
    assert JIT_PREFIXES == ("DG", "EP", "DJ")
    assert KeyStatus.IN_KEY.value == "in-key"
    assert KeyStatus.NOT_IN_KEY.value == "not-in-key"
    assert KeyStatus.UNKNOWN.value == "unknown"
    assert KeyStatus("in-key") is IN


def test_every_row_is_well_formed() -> None:
    for variable in iter_variables():
        assert variable.category in envvars.CATEGORIES, variable.name
        assert variable.description, variable.name
        assert variable.source, variable.name
        for key in (*variable.status, *variable.ignored_by, *variable.notes):
            assert key.split(":", 1)[0] in RUNTIMES, (variable.name, key)


REQUIRED = (
    "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "CUDAHOSTCXX", "CUDA_HOME", "CUDA_PATH", "CUDA_INC_PATH",
    "CC", "CXX", "PATH", "COMPILER_PATH", "GCC_EXEC_PREFIX", "GCC_COMPARE_DEBUG",
    "SOURCE_DATE_EPOCH", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TORCH_CUDA_ARCH_LIST",
    "TORCH_EXTENSIONS_DIR", "PYTORCH_NVCC", "TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES",
    "MAX_JOBS", "TRITON_CACHE_DIR", "TRITON_HOME", "TRITON_PTXAS_PATH", "TRITON_ALWAYS_COMPILE",
    "TRITON_CACHE_MANAGER", "TRITON_REMOTE_CACHE_BACKEND", "PTXAS_OPTIONS", "MLIR_ENABLE_DUMP",
    "LLVM_IR_ENABLE_DUMP", "DISABLE_LLVM_OPT", "DISABLE_PTXAS_OPT", "TRITON_DEFAULT_FP_FUSION",
    "TRITON_DISABLE_LINE_INFO", "TRITON_OVERRIDE_ARCH", "TRITON_ENABLE_ASAN", "CUPY_CACHE_DIR",
    "FLASHINFER_NVCC", "FLASHINFER_EXTRA_CFLAGS", "FLASHINFER_EXTRA_CUDAFLAGS",
    "FLASHINFER_EXTRA_LDFLAGS", "FLASHINFER_CUDA_ARCH_LIST", "FLASHINFER_WORKSPACE_BASE",
    "HIPCC_COMPILE_FLAGS_APPEND", "HIPCC_LINK_FLAGS_APPEND", "HIP_CLANG_PATH",
    "HIP_DEVICE_LIB_PATH", "HIP_PATH", "ROCM_PATH", "NCCL_DIR", "EP_NCCL_ROOT_DIR",
    "EP_GIN_GDAKI_DEBUG", "EP_NUM_TOPK_IDX_BITS", "DG_JIT_USE_RUNTIME_API",
)


@pytest.mark.parametrize("name", REQUIRED)
def test_registry_has_variable(name: str) -> None:
    variable = lookup(name)
    assert variable is not None
    assert variable.name == name


@pytest.mark.parametrize("suffix", [
    "JIT_CACHE_DIR", "JIT_DEBUG", "JIT_NVCC_COMPILER", "JIT_CPP_STANDARD", "JIT_PTXAS_VERBOSE",
    "JIT_PTXAS_CHECK", "JIT_CHECK_NO_SPILLS", "JIT_CHECK_NO_LOCAL_MEMORY", "JIT_WITH_LINEINFO",
    "JIT_DUMP_ASM", "JIT_DUMP_PTX", "JIT_DUMP_SASS", "JIT_PRINT_COMPILER_COMMAND",
    "JIT_PRINT_LOAD_TIME", "JIT_USE_NVRTC", "JIT_DISABLE_FFMA_INTERLEAVE", "JIT_DISABLE_CACHE",
    "JIT_BARRIER_TIMEOUT_SECONDS", "JIT_HIPCC_COMPILER",
])
def test_suffix_table_has_suffix(suffix: str) -> None:
    assert suffix in JIT_SUFFIXES
    variable = lookup(f"DG_{suffix}")
    assert variable is not None and variable.name == f"DG_{suffix}"


# ---------------------------------------------------------------------------------------------
# Classification, table-driven from the references
# ---------------------------------------------------------------------------------------------

# (name, runtime, variant, expected, where the reference says so)
CLASSIFICATIONS = [
    # DeepJIT README: NVCC_PREPEND/APPEND_FLAGS, CPATH, host compiler "not discovered".
    ("CPATH", "deepjit", None, OUT, "deepseek-jit §4 README"),
    ("CPATH", "deepjit", "cuda", OUT, "deepseek-jit §4 README"),
    ("CPATH", "deepjit", "rocm", IN, "deepseek-jit §4 ROCm CompilerInfo::get_hash"),
    ("CPLUS_INCLUDE_PATH", "deepjit", "rocm", IN, "deepseek-jit §4"),
    ("C_INCLUDE_PATH", "deepjit", "rocm", IN, "deepseek-jit §4"),
    ("CPATH", "deepgemm", None, OUT, "deepseek-jit §2 'anything found through CPATH'"),
    ("CPATH", "torch-ext", None, OUT, "jit-runtimes §1, platform-notes I2"),
    ("CPATH", "flashinfer", None, OUT, "jit-runtimes §6 'same env gaps as torch'"),
    ("CPATH", "shim", None, OUT, "brief"),
    ("CPATH", "triton", None, UNK, "silent"),
    ("NVCC_PREPEND_FLAGS", "deepjit", None, OUT, "deepseek-jit §4"),
    ("NVCC_APPEND_FLAGS", "deepjit", None, OUT, "deepseek-jit §4"),
    ("NVCC_APPEND_FLAGS", "torch-ext", None, OUT, "jit-runtimes §1"),
    ("NVCC_APPEND_FLAGS", "shim", None, OUT, "sccache folds it into argv"),
    ("NVCC_CCBIN", "deepjit", None, OUT, "deepseek-jit §4 clear_external_jit_environment"),
    ("CUDAHOSTCXX", "deepjit", None, OUT, "deepseek-jit §4 clear_external_jit_environment"),
    ("CUDA_HOME", "deepjit", None, OUT, "only nvcc --version is keyed"),
    ("CUDA_HOME", "torch-ext", None, IN, "nvcc path on build.ninja command line"),
    ("CUDA_HOME", "flashinfer", None, IN, "jit-runtimes §6"),
    ("CUDA_HOME", "deepgemm", "nvrtc", IN, "deepseek-jit §2 -I<cuda_home>/include"),
    ("CUDA_HOME", "deepep", None, UNK, "deepseek-jit §3 table says '—'"),
    ("CUDA_PATH", "cupy", None, IN, "jit-runtimes §4 -I<CUDA include> in options"),
    ("CUDA_INC_PATH", "torch-ext", None, IN, "jit-runtimes §1"),
    ("CC", "torch-ext", None, IN, "jit-runtimes §1 (-ccbin)"),
    ("CC", "triton", None, OUT, "jit-runtimes §2 'Not in the key: ... CC'"),
    ("CXX", "torch-ext", None, IN, "jit-runtimes §1"),
    ("CXX", "flashinfer", None, IN, "jit-runtimes §6"),
    ("PATH", "deepjit", None, OUT, "which nvcc"),
    ("PATH", "shim", None, OUT, "ccache hashes the host compiler found on PATH"),
    ("COMPILER_PATH", "shim", None, OUT, "ccache A1"),
    ("GCC_EXEC_PREFIX", "shim", None, OUT, "ccache A1"),
    ("GCC_COMPARE_DEBUG", "shim", None, OUT, "ccache A1"),
    ("SOURCE_DATE_EPOCH", "shim", None, OUT, "ccache A1"),
    ("LANG", "shim", None, OUT, "ccache A1"),
    ("LC_ALL", "shim", None, OUT, "ccache A1"),
    ("TORCH_CUDA_ARCH_LIST", "torch-ext", None, IN, "jit-runtimes §1"),
    ("PYTORCH_NVCC", "torch-ext", None, IN, "jit-runtimes §1"),
    ("TORCH_EXTENSIONS_DIR", "torch-ext", None, OUT, "cache location"),
    ("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES", "torch-ext", None, IN, "changes argv"),
    ("MAX_JOBS", "torch-ext", None, OUT, "ninja -j"),
    ("MLIR_ENABLE_DUMP", "triton", None, IN, "GetEnv.hpp CACHE_INVALIDATING_ENV_VARS"),
    ("TRITON_DEFAULT_FP_FUSION", "triton", None, IN, "GetEnv.hpp, platform-notes §5"),
    ("TRITON_OVERRIDE_ARCH", "triton", None, IN, "GetEnv.hpp"),
    ("DISABLE_PTXAS_OPT", "triton", None, IN, "GetEnv.hpp"),
    ("TRITON_PTXAS_PATH", "triton", None, OUT, "jit-runtimes §2 only ptxas version"),
    ("PTXAS_OPTIONS", "triton", None, IN, "jit-runtimes §2 options.hash()"),
    ("TRITON_CACHE_DIR", "triton", None, OUT, "cache location"),
    ("TRITON_ALWAYS_COMPILE", "triton", None, OUT, "bypasses disk hits"),
    ("TRITON_REMOTE_CACHE_BACKEND", "triton", None, OUT, "cache location"),
    ("CUPY_CACHE_DIR", "cupy", None, OUT, "cache location"),
    ("FLASHINFER_NVCC", "flashinfer", None, IN, "jit-runtimes §6"),
    ("FLASHINFER_EXTRA_CUDAFLAGS", "flashinfer", None, IN, "jit-runtimes §6"),
    ("FLASHINFER_CUDA_ARCH_LIST", "flashinfer", None, IN, "part of the cache path"),
    ("FLASHINFER_WORKSPACE_BASE", "flashinfer", None, OUT, "cache location"),
    ("HIPCC_COMPILE_FLAGS_APPEND", "deepjit", None, IN, "ROCm get_hash"),
    ("ROCM_PATH", "deepjit", None, IN, "ROCm get_hash"),
    ("HIP_DEVICE_LIB_PATH", "deepjit", None, IN, "ROCm get_hash"),
    ("EP_NCCL_ROOT_DIR", "deepep", None, IN, "deepseek-jit §3 'path only'"),
    ("NCCL_DIR", "deepep", None, IN, "deepseek-jit §3 'path only'"),
    ("EP_GIN_GDAKI_DEBUG", "deepep", None, IN, "deepseek-jit §3"),
    ("EP_NUM_TOPK_IDX_BITS", "deepep", None, IN, "deepseek-jit §3"),
    # The <PREFIX>_JIT_* family.
    ("DG_JIT_DEBUG", "deepjit", None, IN, "deepseek-jit §4"),
    ("DJ_JIT_DEBUG", "deepjit", None, IN, "deepseek-jit §4"),
    ("DG_JIT_DEBUG", "deepgemm", None, IN, "deepseek-jit §2: DG_JIT_DEBUG changes the key"),
    ("DG_JIT_DEBUG", "deepgemm", "python", OUT, "deepseek-jit §1: printing only"),
    ("EP_JIT_DEBUG", "deepep", None, IN, "deepseek-jit §3"),
    ("DG_JIT_CACHE_DIR", "deepjit", None, OUT, "deepseek-jit §4"),
    ("DG_JIT_CACHE_DIR", "deepgemm", None, OUT, "deepseek-jit §2"),
    ("DG_JIT_NVCC_COMPILER", "deepjit", None, OUT, "only via --version"),
    ("DG_JIT_NVCC_COMPILER", "deepgemm", None, OUT, "only major.minor"),
    ("DG_JIT_NVCC_COMPILER", "deepgemm", "python", IN, "deepseek-jit §1 path is in the key"),
    ("DG_JIT_CPP_STANDARD", "deepjit", None, IN, "deepseek-jit §4"),
    ("DG_JIT_CPP_STANDARD", "deepgemm", None, IN, "deepseek-jit §2"),
    ("EP_JIT_CPP_STANDARD", "deepep", None, IN, "deepseek-jit §3"),
    ("DG_JIT_PTXAS_VERBOSE", "deepjit", None, IN, "deepseek-jit §4"),
    ("DG_JIT_PTXAS_CHECK", "deepgemm", None, IN, "deepseek-jit §2"),
    ("EP_JIT_PTXAS_CHECK", "deepep", None, OUT, "deepseek-jit §3 post-compile check only"),
    ("DG_JIT_CHECK_NO_SPILLS", "deepjit", None, IN, "deepseek-jit §4"),
    ("DG_JIT_CHECK_NO_LOCAL_MEMORY", "deepjit", None, IN, "deepseek-jit §4"),
    ("DG_JIT_WITH_LINEINFO", "deepjit", None, IN, "deepseek-jit §4"),
    ("DG_JIT_WITH_LINEINFO", "deepgemm", None, IN, "deepseek-jit §2"),
    ("DG_JIT_DUMP_PTX", "deepjit", None, OUT, "deepseek-jit §4"),
    ("DG_JIT_DUMP_SASS", "deepgemm", None, OUT, "deepseek-jit §2"),
    ("DG_JIT_DUMP_ASM", "deepjit", "rocm", IN, "DeepJIT rocm/options.hpp update_hash"),
    ("DG_JIT_PRINT_COMPILER_COMMAND", "deepjit", None, OUT, "deepseek-jit §4"),
    ("DG_JIT_PRINT_LOAD_TIME", "deepgemm", None, OUT, "deepseek-jit §2"),
    ("EP_JIT_PRINT_COMPILER_COMMAND", "deepep", None, OUT, "deepseek-jit §3"),
    ("DG_JIT_USE_NVRTC", "deepgemm", None, IN, "deepseek-jit §2"),
    ("DG_JIT_USE_NVRTC", "deepgemm", "python", IN, "deepseek-jit §1"),
    ("DG_JIT_DISABLE_FFMA_INTERLEAVE", "deepgemm", "python", IN, "deepseek-jit §1"),
    ("DG_JIT_DISABLE_CACHE", "deepgemm", "python", OUT, "deepseek-jit §1"),
    ("DG_JIT_BARRIER_TIMEOUT_SECONDS", "deepjit", None, IN, "deepseek-jit §2 (2.8) -D flag"),
    ("DG_JIT_HIPCC_COMPILER", "deepjit", None, IN, "ROCm: hipcc path and version keyed"),
    ("ROCM_HOME", "deepjit", None, OUT, "the CUDA backend never reads it"),
    ("ROCM_HOME", "deepjit", "rocm", IN, "ROCm: the hipcc path it leads to is keyed"),
    ("DG_CACHE_DIR", "deepgemm", "python", OUT, "pre-rename name"),
    ("DG_JIT_FOO_BAR", "deepjit", None, UNK, "unknown suffix"),
    ("DG_JIT_FOO_BAR", "deepgemm", None, UNK, "unknown suffix"),
    # Inductor's two layers: the FX graph key misses the ISA cap, the C++ layer's command line
    # holds its flags (variant "cpp"); the C++ layer keys no header path all the same.
    ("ATEN_CPU_CAPABILITY", "inductor", None, OUT, "torch 2.13.0 cpu_vec_isa.py:661, FX key"),
    ("ATEN_CPU_CAPABILITY", "inductor", "cpp", IN, "torch 2.13.0 codecache.py:3752-3765"),
    ("CPATH", "inductor", "cpp", OUT, "torch 2.13.0 cpp_builder.py:2418, no header on it"),
    # Not a registry variable at all.
    ("HOME", "deepjit", None, UNK, "not compile-affecting by itself"),
]


@pytest.mark.parametrize(("name", "runtime", "variant", "expected", "why"), CLASSIFICATIONS,
                         ids=[f"{c[0]}-{c[1]}{':' + c[2] if c[2] else ''}"
                              for c in CLASSIFICATIONS])
def test_classification(name: str, runtime: str, variant: str | None, expected: KeyStatus,
                        why: str) -> None:
    assert classify(name, runtime, variant) is expected, why


def test_nvrtc_ignores_cpath() -> None:
    # platform-notes.md §2: "NVRTC ignores CPATH / CPLUS_INCLUDE_PATH".
    cpath = lookup("CPATH")
    assert cpath is not None
    assert "nvrtc" in cpath.ignored_by
    assert "ignores" in cpath.note_for("nvrtc")
    assert affects_output("CPATH", "nvrtc") is False
    assert not is_implicit_input("CPATH", "nvrtc")
    assert affects_output("CPLUS_INCLUDE_PATH", "nvrtc") is False
    # DeepGEMM <= 2.6 under DG_JIT_USE_NVRTC=1 compiles with NVRTC too.
    assert affects_output("CPATH", "deepgemm", "nvrtc") is False
    assert affects_output("CPATH", "deepgemm") is True


def test_implicit_inputs_are_the_documented_gaps() -> None:
    # DESIGN.md: NVCC_PREPEND_FLAGS, NVCC_APPEND_FLAGS, CPATH and the host compiler change the
    # binary but not DeepJIT's key.
    for name in ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "CPATH", "NVCC_CCBIN"):
        assert is_implicit_input(name, "deepjit"), name
    assert not is_implicit_input("CPATH", "deepjit", "rocm")  # the ROCm backend keys it
    assert not is_implicit_input("DG_JIT_DEBUG", "deepjit")  # keyed
    assert not is_implicit_input("DG_JIT_CACHE_DIR", "deepjit")  # changes no binary
    assert not is_implicit_input("DG_JIT_PRINT_COMPILER_COMMAND", "deepjit")
    assert is_implicit_input("CPATH", "torch-ext")
    assert not is_implicit_input("TORCH_CUDA_ARCH_LIST", "torch-ext")
    assert affects_output("TRITON_CACHE_DIR", "triton") is False
    assert affects_output("MLIR_ENABLE_DUMP", "shim") is None  # unknown, not "no"


def test_checks_and_inspection_tools_are_no_implicit_inputs() -> None:
    # deepseek-jit.md §3: EP_JIT_PTXAS_CHECK is only a post-compile regex check; DeepGEMM's
    # DG_JIT_PTXAS_CHECK adds ptxas flags (keyed). §4 / DeepJIT backend/rocm/backend.hpp: the
    # LLVM tools inspect a finished ROCm binary, ROCM_HOME is the ROCm backend's only.
    assert affects_output("EP_JIT_PTXAS_CHECK", "deepep") is False
    assert not is_implicit_input("EP_JIT_PTXAS_CHECK", "deepep")
    assert affects_output("DG_JIT_PTXAS_CHECK", "deepgemm") is True
    for name in ("DG_JIT_LLVM_OBJDUMP", "EP_JIT_LLVM_READOBJ", "DJ_JIT_LLVM_OBJDUMP",
                 "ROCM_HOME"):
        assert affects_output(name, "deepjit") is False, name
        assert not is_implicit_input(name, "deepjit"), name
    assert affects_output("ROCM_HOME", "deepjit", "rocm") is True


def test_dj_names_are_not_read_by_legacy_runtimes() -> None:
    variable = lookup("DJ_JIT_DEBUG")
    assert variable is not None
    assert variable.runtimes == frozenset({"deepjit"})
    assert variable.ignored("deepgemm") and variable.ignored("deepep")
    assert affects_output("DJ_JIT_DEBUG", "deepgemm") is False


def test_unknown_family_suffix_is_kept_as_unknown_jit_config() -> None:
    variable = lookup("DG_JIT_FOO_BAR")
    assert variable is not None
    assert variable.category == "jit-config"
    assert variable.status_for("deepjit") is UNK
    assert "deepgemm" in variable.runtimes
    # A prefix a library built on DeepJIT chose: its known settings are DeepJIT's alone (issue
    # 12, case 5); an unknown suffix under it says nothing of DeepJIT.
    custom = lookup("XY_JIT_DEBUG")
    assert custom is not None and custom.runtimes == frozenset({"deepjit"})
    assert lookup("XY_JIT_FOO_BAR") is None
    assert lookup("DG_JIT_") is None
    assert lookup("DG_SOMETHING") is None


def test_dg_jit_use_runtime_api_is_build_only_not_family() -> None:
    variable = lookup("DG_JIT_USE_RUNTIME_API")
    assert variable is not None
    assert variable.category == "build-only"
    assert affects_output("DG_JIT_USE_RUNTIME_API", "deepgemm") is False


def test_bad_runtime_is_a_clear_error() -> None:
    with pytest.raises(EnvVarsError, match="unknown runtime 'bogus'"):
        envvars.check_runtime("bogus")
    with pytest.raises(ValueError, match="unknown runtime"):
        compile_environment({}, "bogus")


def test_registry_names_do_not_look_secret() -> None:
    for variable in iter_variables():
        assert not looks_secret_name(variable.name), variable.name


# ---------------------------------------------------------------------------------------------
# Prefix resolution (DeepJIT utils/env.hpp)
# ---------------------------------------------------------------------------------------------

def test_prefixed_wins_and_shadows_fallback() -> None:
    env = {"DG_JIT_DEBUG": "1", "DJ_JIT_DEBUG": "0"}
    setting = resolve_jit_setting("DG", "JIT_DEBUG", env)
    assert (setting.name, setting.value, setting.origin) == ("DG_JIT_DEBUG", "1", "prefixed")
    assert setting.parsed is True
    assert setting.ignored == ("DJ_JIT_DEBUG",)
    assert setting.status is IN and setting.read_at == "construction"
    assert setting.runtime == "deepjit"


def test_only_dj_set_is_a_fallback() -> None:
    setting = resolve_jit_setting("DG", "JIT_CACHE_DIR", {"DJ_JIT_CACHE_DIR": "/cache/a:/b"})
    assert setting.origin == "fallback" and setting.is_fallback
    assert setting.name == "DJ_JIT_CACHE_DIR"
    assert setting.value == "/cache/a:/b"
    assert setting.variable == "DG_JIT_CACHE_DIR"
    assert setting.default == "$HOME/.dj"


def test_neither_set_is_the_default() -> None:
    setting = resolve_jit_setting("EP", "JIT_CPP_STANDARD", {"HOME": "/h"})
    assert setting.origin == "default" and setting.name is None
    assert setting.value == "20" and setting.parsed == 20
    assert setting.status is IN


def test_empty_prefixed_value_still_wins() -> None:
    # Env::get_with_prefix tests getenv() != nullptr: "" is set, and a bool panics on it.
    setting = resolve_jit_setting("DG", "JIT_DEBUG", {"DG_JIT_DEBUG": "", "DJ_JIT_DEBUG": "1"})
    assert setting.origin == "prefixed"
    assert setting.parsed is None and setting.error is not None


def test_suffix_without_jit_head_and_lowercase_prefix() -> None:
    setting = resolve_jit_setting("dg", "debug", {"DG_JIT_DEBUG": "yes"})
    assert setting.suffix == "JIT_DEBUG" and setting.parsed is True


def test_legacy_deepgemm_has_no_fallback_and_its_own_defaults() -> None:
    env = {"DJ_JIT_CACHE_DIR": "/dj", "DG_CACHE_DIR": "/old"}
    setting = resolve_jit_setting("DG", "JIT_CACHE_DIR", env, flavour="deepgemm")
    assert setting.origin == "default"
    assert setting.value == "$HOME/.deep_gemm"
    assert set(setting.ignored) == {"DJ_JIT_CACHE_DIR", "DG_CACHE_DIR"}
    deepep = resolve_jit_setting("EP", "JIT_CACHE_DIR", {"DJ_JIT_CACHE_DIR": "/dj"},
                                 flavour="deepep")
    assert deepep.origin == "default" and deepep.value == "$HOME/.deep_ep"
    assert deepep.ignored == ("DJ_JIT_CACHE_DIR",)


def test_legacy_flavour_requires_its_prefix() -> None:
    with pytest.raises(EnvVarsError, match="DG_"):
        resolve_jit_setting("EP", "JIT_DEBUG", {}, flavour="deepgemm")
    with pytest.raises(EnvVarsError, match="unknown flavour"):
        resolve_jit_setting("DG", "JIT_DEBUG", {}, flavour="nope")


def test_status_follows_flavour() -> None:
    env = {"DG_JIT_DEBUG": "1"}
    assert resolve_jit_setting("DG", "JIT_DEBUG", env, flavour="deepgemm").status is IN
    assert resolve_jit_setting("DG", "JIT_DEBUG", env, flavour="deepgemm-python").status is OUT
    ptxas = resolve_jit_setting("EP", "JIT_PTXAS_CHECK", {}, flavour="deepep")
    assert ptxas.status is OUT
    asm = resolve_jit_setting("DG", "JIT_DUMP_ASM", {}, backend="rocm")
    assert asm.status is IN
    assert resolve_jit_setting("DG", "JIT_DUMP_ASM", {}).status is OUT
    printing = resolve_jit_setting("DG", "JIT_PRINT_LOAD_TIME", {})
    assert printing.read_at == "call"


def test_resolve_all_lists_flavour_suffixes_then_unknown_set_ones() -> None:
    env = {"DG_JIT_DEBUG": "1", "DG_JIT_SOMETHING_NEW": "x", "DJ_JIT_OTHER": "y"}
    settings_ = resolve_jit_settings("DG", env)
    suffixes = [s.suffix for s in settings_]
    assert suffixes[:3] == ["JIT_CACHE_DIR", "JIT_DEBUG", "JIT_NVCC_COMPILER"]
    assert "JIT_USE_NVRTC" not in suffixes  # NVRTC is gone in DeepJIT
    assert "JIT_PTXAS_CHECK" not in suffixes
    assert suffixes[-2:] == ["JIT_OTHER", "JIT_SOMETHING_NEW"]
    other = settings_[-2]
    assert other.origin == "fallback" and other.status is UNK
    legacy = [s.suffix for s in resolve_jit_settings("DG", env, flavour="deepgemm")]
    assert "JIT_USE_NVRTC" in legacy and "JIT_CHECK_NO_SPILLS" not in legacy
    assert "JIT_OTHER" not in legacy  # DJ_ is not read by DeepGEMM <= 2.6
    ep = [s.suffix for s in resolve_jit_settings("EP", {}, flavour="deepep")]
    assert "JIT_USE_NVRTC" not in ep and "JIT_BARRIER_TIMEOUT_SECONDS" not in ep
    for flavour, prefix in (("deepjit", "DJ"), ("deepgemm-python", "DG")):
        assert resolve_jit_settings(prefix, {}, flavour=flavour)
    assert set(FLAVOURS) == {"deepjit", "deepgemm", "deepgemm-python", "deepep"}


def test_resolved_values_are_redacted() -> None:
    env = {"DG_JIT_NVCC_COMPILER": "https://bob:hunter2hunter2@example.com/nvcc",
           "DG_JIT_AUTH_TOKEN": "s3cr3t-value-123456"}
    text = repr(resolve_jit_settings("DG", env))
    assert "hunter2hunter2" not in text
    assert "s3cr3t-value-123456" not in text
    assert "example.com" in text


def test_jit_prefixes_in() -> None:
    assert jit_prefixes_in({"HOME": "/h"}) == []
    assert jit_prefixes_in({"DJ_JIT_DEBUG": "1", "DG_JIT_X": "1"}) == ["DG", "DJ"]
    assert jit_prefixes_in({"EP_NUM_TOPK_IDX_BITS": "32"}) == ["EP"]
    assert jit_prefixes_in({"DG_CACHE_DIR": "/old"}) == ["DG"]
    assert jit_prefixes_in({"DG_SKIP": "1", "EPSILON": "1"}) == []


@pytest.mark.parametrize(("text", "expected"), [
    ("1", True), ("0", False), ("true", True), ("TRUE", True), ("Yes", True), ("no", False),
    ("False", False), ("-3", True), ("42", True), ("00", False),
])
def test_parse_bool_like_deepjit(text: str, expected: bool) -> None:
    assert parse_jit_bool(text) == (expected, None)


@pytest.mark.parametrize("text", ["", "on", "off", "1.0", " 1", "+1", "y", "tru", "0x1",
                                  "99999999999999999999"])
def test_parse_bool_reports_invalid(text: str) -> None:
    value, error = parse_jit_bool(text)
    assert value is None
    assert error is not None and "DeepJIT panics" in error


def test_legacy_parsing_is_sscanf_like() -> None:
    assert parse_jit_bool("1abc", "deepgemm") == (True, None)
    value, error = parse_jit_bool("true", "deepgemm")
    assert value is None and error is not None and "undefined" in error
    assert parse_jit_int("20", "deepjit") == (20, None)
    assert parse_jit_int("2147483648", "deepjit", bits=32)[0] is None
    assert parse_jit_int("17", "deepgemm-python") == (17, None)


# ---------------------------------------------------------------------------------------------
# compile_environment: the allowlist
# ---------------------------------------------------------------------------------------------

def test_compile_environment_keeps_only_registry_variables() -> None:
    env = {
        "HOME": "/home/alice", "USER": "alice", "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIK7MDENG",
        "MY_TOKEN": "abcdef123456", "SSH_AUTH_SOCK": "/tmp/ssh-x/agent.1", "PWD": "/work",
        "CPATH": "/opt/inc", "NVCC_APPEND_FLAGS": "-DX=1 -O3", "DG_JIT_DEBUG": "1",
        "DJ_JIT_NEW_THING": "2", "TRITON_DEFAULT_FP_FUSION": "0", "PATH": "/usr/bin:/bin",
    }
    out = compile_environment(env)
    assert list(out) == sorted(["CPATH", "DG_JIT_DEBUG", "DJ_JIT_NEW_THING", "NVCC_APPEND_FLAGS",
                                "PATH", "TRITON_DEFAULT_FP_FUSION"])
    assert out["NVCC_APPEND_FLAGS"] == "-DX=1 -O3"
    for name in ("HOME", "USER", "AWS_SECRET_ACCESS_KEY", "MY_TOKEN", "SSH_AUTH_SOCK", "PWD"):
        assert name not in out
    assert "alice" not in str(out) and "wJalrXUtnFEMIK7MDENG" not in str(out)


def test_compile_environment_by_runtime() -> None:
    env = {"CPATH": "/opt/inc", "TRITON_CACHE_DIR": "/t", "DG_JIT_DEBUG": "1",
           "EP_JIT_DEBUG": "1", "TORCH_CUDA_ARCH_LIST": "9.0", "DG_CACHE_DIR": "/old"}
    assert set(compile_environment(env, "triton")) == {"TRITON_CACHE_DIR"}
    assert set(compile_environment(env, "deepgemm")) == {"CPATH", "DG_JIT_DEBUG",
                                                         "DG_CACHE_DIR"}
    assert set(compile_environment(env, "deepjit")) == {"CPATH", "DG_JIT_DEBUG", "EP_JIT_DEBUG"}
    assert set(compile_environment(env, "torch-ext")) == {"CPATH", "TORCH_CUDA_ARCH_LIST"}
    assert compile_environment({}, "shim") == {}


# ---------------------------------------------------------------------------------------------
# Redaction
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", [
    "GITHUB_TOKEN", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN",
    "OPENAI_API_KEY", "DB_PASSWORD", "MYSQL_PWD_PASSWD", "GOOGLE_APPLICATION_CREDENTIALS",
    "AZURE_CLIENT_SECRET", "SLACK_BOT_TOKEN", "GH_OAUTH", "AUTHORIZATION", "SESSION_ID",
    "SESSION", "COOKIE_JAR_COOKIE", "PRIVATE_KEY", "SSH_PRIVATE_KEY", "STRIPE_KEY", "api_key",
    "MY_TOKEN", "DG_JIT_AUTH_TOKEN", "NPM_AUTH", "PASSPHRASE", "SIGNING_KEY",
])
def test_secret_names(name: str) -> None:
    assert looks_secret_name(name)


@pytest.mark.parametrize("name", [
    "TORCH_CUDA_ARCH_LIST", "DG_JIT_PTXAS_CHECK", "TOKENIZERS_PARALLELISM", "GIT_AUTHOR_NAME",
    "PWD", "OLDPWD", "HOME", "PATH", "CUPY_CACHE_KEY", "TRITON_REDIS_KEY_FORMAT",
    "DG_JIT_USE_RUNTIME_API", "CUDA_VISIBLE_DEVICES", "KEYBOARD", "MONKEY_PATCH",
    "LLVM_PASS_PLUGIN_PATH", "PASSENGER", "NCCL_DEBUG", "TRITON_REMOTE_CACHE_BACKEND",
])
def test_harmless_names(name: str) -> None:
    assert not looks_secret_name(name)


@pytest.mark.parametrize("value", [
    "/usr/local/cuda-13.0/include:/opt/cutlass/include",
    "-DX=1 -O3",
    "0123456789abcdef0123456789abcdef",
    "d41d8cd98f00b204e9800998ecf8427e",
    "sm_90",
    "sm_100a",
    "9.0;10.0+PTX",
    "8.0 8.6 9.0+PTX",
    "--ptxas-options=--verbose,--warn-on-local-memory-usage",
    "-gencode=arch=compute_90,code=sm_90",
    "-I/opt/x -Xcompiler -fPIC -lineinfo -DNCCL_DEVICE_GIN_GDAKI_ENABLE_DEBUG=1",
    "mymodule.cache:RedisBackend",
    "https://pypi.org/simple/torch/",
    "/home/user/.cache/torch_extensions/py311_cpu",
    "$HOME/.dj",
    "/data/desk-top/sk-learn/hf_cache/task-queue",
    "20",
    "true",
    "gcc-12",
    "basic configuration",
])
def test_ordinary_values_are_kept(value: str) -> None:
    assert not looks_secret_value(value)
    assert redact("NVCC_APPEND_FLAGS", value) == value
    assert compile_environment({"CPATH": value}) == {"CPATH": value}


@pytest.mark.parametrize(("value", "expected"), [
    ("redis://:hunter2@cache.internal:6379/0", "redis://<redacted>@cache.internal:6379/0"),
    ("https://alice:pa@ss@example.com/x", "https://<redacted>@example.com/x"),
    ("https://ghp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa@github.com/o/r.git",
     "https://<redacted>@github.com/o/r.git"),
    ("https://host/x?token=abc123&page=2", "https://host/x?token=<redacted>&page=2"),
    ("https://host/x?key=AIzaSyD0000&page=2", "https://host/x?key=<redacted>&page=2"),
    ("Authorization: Bearer abc.def.ghi-123", "Authorization: Bearer <redacted>"),
    ("-DAPI_TOKEN=xyz987 -O3", "-DAPI_TOKEN=<redacted> -O3"),
    ("password=hunter2", "password=<redacted>"),
])
def test_redaction_keeps_structure(value: str, expected: str) -> None:
    assert looks_secret_value(value)
    assert redact("TRITON_REMOTE_CACHE_BACKEND", value) == expected


def test_redact_by_name_hides_whole_value() -> None:
    assert redact("MY_TOKEN", "/just/a/path") == REDACTED
    assert redact("MY_TOKEN", "") == ""


def test_pem_block_is_redacted() -> None:
    pem = ("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
           "AAAAAAAAAAEAAAAzAAAAC3NzaC1lZDI1NTE5\n-----END OPENSSH PRIVATE KEY-----")
    out = redact("CPATH", f"/opt/inc:{pem}:/usr/include")
    assert "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ" not in out
    assert out == f"/opt/inc:{REDACTED}:/usr/include"
    truncated = redact("CPATH", "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA7")
    assert "MIIEowIBAAKCAQEA7" not in truncated


# Realistic token shapes, each with its random body so that a partial leak is caught too.
_ALNUM = string.ascii_letters + string.digits
_B64URL = _ALNUM + "-_"
_UPPERNUM = string.ascii_uppercase + string.digits


def _body(size: int, alphabet: str = _ALNUM) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=size, max_size=size)


SECRET_TOKENS: st.SearchStrategy[str] = st.one_of(
    st.tuples(st.sampled_from("pousr"), _body(36)).map(lambda t: f"gh{t[0]}_{t[1]}"),
    st.tuples(_body(22), _body(59)).map(lambda t: f"github_pat_{t[0]}_{t[1]}"),
    _body(20, _B64URL).map(lambda b: f"glpat-{b}"),
    st.tuples(st.sampled_from("baprs"), _body(12, string.digits), _body(24)).map(
        lambda t: f"xox{t[0]}-{t[1]}-{t[2]}"),
    _body(48).map(lambda b: f"sk-{b}"),
    _body(80, _B64URL).map(lambda b: f"sk-proj-{b}"),
    _body(90, _B64URL).map(lambda b: f"sk-ant-api03-{b}"),
    st.tuples(st.sampled_from(["AKIA", "ASIA"]), _body(16, _UPPERNUM)).map("".join),
    _body(34).map(lambda b: f"hf_{b}"),
    st.tuples(_body(20, _B64URL), _body(40, _B64URL), _body(43, _B64URL)).map(
        lambda t: f"eyJ{t[0]}.eyJ{t[1]}.{t[2]}"),
)

CONTEXTS = (
    "{s}",
    "https://user:{s}@cache.example.com:6379/0",
    "redis://:{s}@redis.internal:6379",
    "https://{s}@github.com/org/repo.git",
    "https://host/api/v1?token={s}&page=2",
    "https://bucket.s3.amazonaws.com/k?X-Amz-Signature={s}",
    "-DAPI_KEY={s} -O3",
    "-O3 --header=Authorization: Bearer {s}",
    "/home/user/{s}/include",
    "/opt/include:/tmp/{s}:/usr/include",
    "-I/opt/{s}/include -DX=1",
    "password={s}",
    "mymod:Backend?secret={s}",
)
REGISTRY_CARRIERS = ("CPATH", "NVCC_APPEND_FLAGS", "TRITON_REMOTE_CACHE_BACKEND",
                     "DG_JIT_CACHE_DIR", "FLASHINFER_EXTRA_CUDAFLAGS")


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(secret=SECRET_TOKENS, context=st.sampled_from(CONTEXTS),
       carrier=st.sampled_from(REGISTRY_CARRIERS))
def test_no_realistic_secret_survives(secret: str, context: str, carrier: str) -> None:
    value = context.format(s=secret)
    tail = secret[-16:]
    assert looks_secret_value(value)
    redacted = redact(carrier, value)
    assert secret not in redacted and tail not in redacted
    out = str(compile_environment({carrier: value, "HOME": "/h"}))
    assert secret not in out and tail not in out
    resolved = repr(resolve_jit_settings("DG", {"DG_JIT_CACHE_DIR": value,
                                                "DJ_JIT_NVCC_COMPILER": value}))
    # A generated tail can spell part of a setting's own name (`IT_PTXAS_VERBOSE`): only a tail
    # that the settings do not print anyway counts as leaked.
    printed_anyway = repr(resolve_jit_settings("DG", {}))
    assert secret not in resolved
    assert tail not in resolved or tail in printed_anyway


_PATH_SEGMENT = st.text(string.ascii_lowercase + string.digits + "._-", min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(st.lists(_PATH_SEGMENT, min_size=1, max_size=6), min_size=1,
                         max_size=4),
       digest=_body(32, "0123456789abcdef"))
def test_ordinary_paths_and_digests_survive(segments: list[list[str]], digest: str) -> None:
    value = ":".join("/" + "/".join(parts) for parts in segments)
    assert redact("CPATH", value) == value
    assert redact("DG_JIT_CACHE_DIR", f"{value}/{digest}") == f"{value}/{digest}"


SECRET_NAMES_50 = (
    "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "AWS_SESSION_TOKEN", "GITHUB_TOKEN",
    "GH_TOKEN", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "ANTHROPIC_API_KEY",
    "WANDB_API_KEY", "NPM_TOKEN", "PYPI_PASSWORD", "DOCKER_PASSWORD", "SLACK_BOT_TOKEN",
    "GOOGLE_APPLICATION_CREDENTIALS", "AZURE_CLIENT_SECRET", "DATABASE_PASSWORD",
    "REDIS_PASSWORD", "SENTRY_AUTH_TOKEN", "CODECOV_TOKEN", "GITLAB_PRIVATE_TOKEN",
    "TWINE_PASSWORD", "CI_JOB_TOKEN", "VAULT_TOKEN", "CONSUL_HTTP_TOKEN",
    "MLFLOW_TRACKING_PASSWORD", "KAGGLE_KEY", "STRIPE_SECRET_KEY", "SENDGRID_API_KEY",
    "DATADOG_API_KEY", "JWT_SECRET",
    "SESSION_SECRET", "COOKIE_SECRET", "OAUTH_CLIENT_SECRET", "SSH_PRIVATE_KEY", "GPG_PASSPHRASE",
    "NGC_API_KEY", "TRITON_REDIS_PASSWORD", "DG_JIT_AUTH_TOKEN", "EP_JIT_SECRET",
    "DJ_JIT_API_KEY", "MY_TOKEN", "SERVICE_AUTH", "APP_SESSION", "X_API_KEY", "BASIC_AUTH",
    "PROXY_PASSWORD", "LDAP_BIND_PASSWD", "ENCRYPTION_KEY", "MASTER_KEY",
)


def test_fifty_secret_variables_leave_no_trace() -> None:
    assert len(set(SECRET_NAMES_50)) == 50
    rng = random.Random(20260901)
    env = {name: "".join(rng.choice(_ALNUM) for _ in range(24)) for name in SECRET_NAMES_50}
    for name in SECRET_NAMES_50:
        assert looks_secret_name(name), name
    env.update({"CPATH": "/opt/inc", "DG_JIT_DEBUG": "1", "HOME": "/home/alice"})
    outputs = [
        str(compile_environment(env)),
        *(str(compile_environment(env, runtime)) for runtime in RUNTIMES),
        *(repr(resolve_jit_settings(p, env)) for p in JIT_PREFIXES),
        repr(resolve_jit_settings("DG", env, flavour="deepgemm")),
        repr(resolve_jit_settings("EP", env, flavour="deepep")),
    ]
    for name in SECRET_NAMES_50:
        for text in outputs:
            assert env[name] not in text, name
    stored = compile_environment(env)
    assert stored["CPATH"] == "/opt/inc" and stored["DG_JIT_DEBUG"] == "1"
    assert stored["DG_JIT_AUTH_TOKEN"] == REDACTED  # a family name, kept but hidden


def test_exact_registry_has_no_duplicates_and_is_read_only() -> None:
    assert len(VARIABLES) == len(set(VARIABLES))
    with pytest.raises(TypeError):
        VARIABLES["X"] = VARIABLES["CPATH"]  # type: ignore[index]
    cpath = VARIABLES["CPATH"]
    with pytest.raises(TypeError):
        cpath.status["nvrtc"] = IN  # type: ignore[index]
    assert hash(cpath) == hash(lookup("CPATH"))


def test_every_policy_flavour_is_a_known_flavour_or_none() -> None:
    from cacheaudit import runtimes
    from cacheaudit.runtimes._deepseek.environment import FLAVOURS
    from cacheaudit.runtimes._deepseek.policy import FamilyPolicy

    for runtime in [s.name for s in runtimes.specs() if s.policy is not None]:
        policy = runtimes.policy_for(runtime)
        if not isinstance(policy, FamilyPolicy):
            continue  # reads no <PREFIX>_JIT_* family
        if policy.env_prefixes:
            assert policy.flavour in FLAVOURS, runtime
        else:
            assert policy.flavour is None, runtime


# ---------------------------------------------------------------------------------------------
# The registry is assembled from the runtimes' declarations
# ---------------------------------------------------------------------------------------------

def test_unknown_runtime_is_unknown_not_a_crash() -> None:
    # An entry of a runtime this installation does not declare is unverified, not a crash of
    # the whole scan.
    assert classify("CPATH", "bogus") is UNK
    assert affects_output("CPATH", "bogus") is None
    assert affects_output("TRITON_CACHE_DIR", "bogus") is False  # no value changes a binary
    assert not is_implicit_input("CPATH", "bogus")


def test_a_declared_runtime_joins_the_registry() -> None:
    from cacheaudit.envvars import Declaration, Family, Registry, reads, variable

    class ToyFamily(Family):
        heads = MappingProxyType({"TOY_JIT_": ("toy",)})

        def variable(self, name: str):  # type: ignore[no-untyped-def]
            return envvars.Variable(name, "jit-config", "a toy setting", {"toy": IN},
                                    source="toy")

        def selects_compiler(self, name: str) -> bool:
            return name == "TOY_JIT_CC"

    toy = Declaration(
        "toy", variants=("fast",),
        rows=(reads("CPATH", in_key=("toy:fast",), not_in_key=("toy",),
                    notes={"toy": "toy note"}, description=", toy too", source="toy.md"),
              variable("TOY_CACHE", "cache-location", "toy cache root", not_in_key=("toy",),
                       source="toy.md")),
        families=(ToyFamily(),), compiler_settings=("TOY_NVCC",))
    registry = Registry([toy])
    assert registry.runtimes == ("toy", "shim")
    assert registry.is_implicit_input("CPATH", "toy")
    assert registry.classify("CPATH", "toy", "fast") is IN
    cpath = registry.lookup("CPATH")
    assert cpath is not None and cpath.note_for("toy") == "toy note"
    assert cpath.description.endswith(", toy too") and cpath.source.endswith("; toy.md")
    assert registry.affects_output("TOY_CACHE", "toy") is False
    assert registry.classify("TOY_JIT_X", "toy") is IN
    assert registry.selects_compiler("TOY_NVCC") and registry.selects_compiler("TOY_JIT_CC")
    assert registry.selects_compiler("PATH") and not registry.selects_compiler("TOY_CACHE")
    assert set(registry.compile_environment({"TOY_JIT_X": "1", "TOY_CACHE": "/c", "HOME": "/h",
                                             "TRITON_CACHE_DIR": "/t"})) == {"TOY_CACHE",
                                                                             "TOY_JIT_X"}
    # A declaration names only its own runtime and variants.
    with pytest.raises(EnvVarsError, match="not the declaring runtime"):
        Registry([Declaration("toy", rows=(reads("CPATH", not_in_key=("other",)),))])
    with pytest.raises(EnvVarsError, match="no variant"):
        Registry([Declaration("toy", rows=(reads("CPATH", not_in_key=("toy:slow",)),))])
    with pytest.raises(EnvVarsError, match="defined by nobody"):
        Registry([Declaration("toy", rows=(reads("NOT_A_ROW", not_in_key=("toy",)),))])


def test_compiler_settings_come_from_the_specs() -> None:
    from cacheaudit import runtimes

    for declared in runtimes.specs():
        for setting in declared.compiler_settings:
            assert envvars.selects_compiler(setting.name), setting.name


# ------------------------------------------------------------------ the shim's table of names


def _write_table(path: str) -> None:
    """A fresh process builds the registry and writes its table (this one has built it)."""
    import subprocess
    import sys

    code = ("import sys\nfrom cacheaudit.envvars.kept import kept_environment\n"
            "kept_environment({}, sys.argv[1])\n")
    subprocess.run([sys.executable, "-c", code, path], check=True, timeout=60)


def test_kept_environment_from_the_table_is_the_registrys_answer(tmp_path) -> None:
    import subprocess
    import sys

    from cacheaudit.envvars.kept import _read, kept_environment

    table = str(tmp_path / "ledger.db.environment.json")
    _write_table(table)
    assert _read(table) is not None, f"{table}: the table written by a fresh process is valid"
    code = ("import sys\nfrom cacheaudit.envvars.kept import kept_environment\n"
            "kept_environment({'CPATH': '/x'}, sys.argv[1])\n"
            "print(sorted(m for m in sys.modules if m.startswith('cacheaudit.runtimes')))\n"
            "print(sorted(m for m in sys.modules if m.startswith('cacheaudit.envvars.')))\n")
    loaded, envvars_loaded = subprocess.run(
        [sys.executable, "-c", code, table], check=True, timeout=60, capture_output=True,
        text=True).stdout.strip().splitlines()
    assert loaded == "[]", f"{table}: a process with the table still loaded {loaded}"
    # Nor the registry's machinery: the shim and an in-process record need the table alone.
    assert envvars_loaded == "['cacheaudit.envvars.kept', 'cacheaudit.envvars.redaction']", \
        f"{table}: a process with the table loaded {envvars_loaded}"
    envs = [
        {},
        {"CPATH": "/opt/inc", "HOME": "/root", "NVCC_PREPEND_FLAGS": "-O3", "PATH": "/bin"},
        {"DG_JIT_CACHE_DIR": "/c", "DG_JIT_": "head alone", "AWS_SECRET_ACCESS_KEY": "x",
         "CUDA_HOME": "/usr/local/cuda", "TRITON_CACHE_DIR": "/t"},
        # A family name outside the heads (DeepJIT's <P>_JIT_*), and one it does not claim.
        {"MYLIB_JIT_NVCC_COMPILER": "/usr/bin/nvcc", "NOT_JIT_": "x", "LANG": "C"},
        {"NVCC_APPEND_FLAGS": "--token=hunter2", "CCACHE_DIR": "/cc", "TORCH_EXTENSIONS_DIR": "/e"},
    ]
    for env in envs:
        assert kept_environment(env, table) == envvars.compile_environment(env), \
            f"kept variables of {sorted(env)}: the table and the registry differ"


def test_kept_environment_table_is_ignored_when_stale_or_not_private(tmp_path) -> None:
    import json
    import os

    from cacheaudit.envvars.kept import _read

    table = str(tmp_path / "ledger.db.environment.json")
    _write_table(table)
    with open(table, encoding="utf-8") as handle:
        data = json.load(handle)
    first = next(iter(data["sources"]))
    stale = dict(data, sources={**data["sources"], first: [0, 0]})
    with open(table, "w", encoding="utf-8") as handle:
        json.dump(stale, handle)
    assert _read(table) is None, f"{table}: a source file changed since, the table is stale"
    with open(table, "w", encoding="utf-8") as handle:
        json.dump(data, handle)
    assert _read(table) is not None, f"{table}: rewritten as built, valid again"
    os.chmod(table, 0o622)
    assert _read(table) is None, f"{table}: writable by others, never read"
