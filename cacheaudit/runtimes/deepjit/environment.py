"""DeepJIT's environment: what its key holds of the generic variables, per backend, and the
`<PREFIX>_JIT_*` family it reads (shared with DeepGEMM and DeepEP).

DeepJIT's key (`Runtime::cache_key()`, deepseek-jit.md §4) holds the source, the keyed flags and
the compiler's `--version` text: on CUDA no environment variable. Its README names
`NVCC_PREPEND_FLAGS`, `NVCC_APPEND_FLAGS`, `CPATH` and the host compiler as "not discovered
automatically". The ROCm backend's `CompilerInfo::get_hash` (backend/rocm/backend.hpp) keys a
list of variables: the include paths and what hipcc reads.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, shells_out, variable
from cacheaudit.runtimes._deepseek.environment import JIT_FAMILY

RUNTIME = "deepjit"

_HOST_VIA_VERSION = "only the `nvcc --version` text it leads to is keyed, not the path"
_INCLUDE_NOTE = {RUNTIME: "the CUDA backend does not key it; the ROCm backend does"}

ROWS: tuple[Variable | Reading, ...] = (
    *shells_out(RUNTIME),
    # DeepJIT README: CPATH "not discovered automatically"; the ROCm CompilerInfo::get_hash
    # (backend/rocm/backend.hpp) keys CPATH, CPLUS_INCLUDE_PATH, C_INCLUDE_PATH.
    reads("CPATH", in_key=("deepjit:rocm",), notes=_INCLUDE_NOTE),
    reads("CPLUS_INCLUDE_PATH", in_key=("deepjit:rocm",), notes=_INCLUDE_NOTE),
    reads("C_INCLUDE_PATH", in_key=("deepjit:rocm",), notes=_INCLUDE_NOTE),
    # deepseek-jit.md §4 (clear_external_jit_environment): DeepJIT's tests clear it as untracked.
    reads("CUDAHOSTCXX", not_in_key=(RUNTIME,),
          description="; DeepJIT's tests clear it as an untracked input"),
    reads("CUDA_HOME", not_in_key=(RUNTIME,),
          notes={RUNTIME: _HOST_VIA_VERSION + " (CUDA::find_cuda_toolkit)"}),
    reads("CUDA_PATH", not_in_key=(RUNTIME,),
          notes={RUNTIME: _HOST_VIA_VERSION + " (used when CUDA_HOME is unset)"}),
    reads("PATH",
          notes={RUNTIME: "`which nvcc` when CUDA_HOME/CUDA_PATH are unset; "
                          + _HOST_VIA_VERSION,
                 "deepjit:rocm": "resolves hipcc; the resolved hipcc path is keyed"}),

    # --- ROCm: keyed by DeepJIT's ROCm CompilerInfo::get_hash (backend/rocm/backend.hpp) ----
    *(
        reads(name, in_key=(RUNTIME,),
              notes={RUNTIME: "ROCm backend only: keyed by CompilerInfo::get_hash"},
              source="DeepJIT backend/rocm/backend.hpp get_compiler_info")
        for name in ("HIPCC_COMPILE_FLAGS_APPEND", "HIPCC_LINK_FLAGS_APPEND", "HIP_CLANG_PATH",
                     "HIP_DEVICE_LIB_PATH", "HIP_PATH", "ROCM_PATH")
    ),
    variable("ROCM_HOME", "toolkit",
             "first choice for the ROCm installation DeepJIT takes hipcc from",
             in_key=("deepjit:rocm",),
             ignored_by=(RUNTIME,),
             notes={RUNTIME: "read by the ROCm backend only (CUDA::find_cuda_toolkit and the "
                             "Ascend backend never look at it)",
                    "deepjit:rocm": "not in the keyed environment list, but the hipcc path it "
                                    "leads to is keyed (unless JIT_HIPCC_COMPILER is set)"},
             source="DeepJIT backend/rocm/backend.hpp find_rocm_toolkit; "
                    "backend/cuda/backend.hpp find_cuda_toolkit"),
)

FAMILIES = (JIT_FAMILY,)
