"""DeepGEMM's environment (up to 2.6, and its 2025 Python JIT): what its key holds of the generic
variables, its own `DG_*` names outside the `<PREFIX>_JIT_*` family, and that family.

The C++ JIT's key is `name$$signature$$flags$$code` plus the NVCC major.minor (deepseek-jit.md
§2): no environment variable. Under `DG_JIT_USE_NVRTC=1` (variant "nvrtc") it compiles with
NVRTC, which reads neither `CPATH` nor nvcc's environment, and keys `-I<cuda_home>/include`
among its flags. The Python JIT (variant "python", deepseek-jit.md §1) keys its nvcc's path.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, shells_out, variable
from cacheaudit.runtimes._deepseek.environment import JIT_FAMILY

RUNTIME = "deepgemm"

ROWS: tuple[Variable | Reading, ...] = (
    *shells_out(RUNTIME),
    # NVRTC ignores CPATH / CPLUS_INCLUDE_PATH (platform-notes.md §2) and nvcc's own variables.
    *(reads(name, ignored_by=("deepgemm:nvrtc",))
      for name in ("CPATH", "CPLUS_INCLUDE_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
                   "NVCC_CCBIN")),
    reads("CUDA_HOME",
          in_key=("deepgemm:nvrtc", "deepgemm:python"),
          not_in_key=(RUNTIME,),
          notes={RUNTIME: "only the NVCC major.minor of <CUDA_HOME>/bin/nvcc is keyed",
                 "deepgemm:nvrtc": "-I<cuda_home>/include is in the keyed flags",
                 "deepgemm:python": "the default nvcc path (keyed) is under it"}),
    reads("CUDA_PATH",
          in_key=("deepgemm:nvrtc", "deepgemm:python"),
          not_in_key=(RUNTIME,),
          notes={RUNTIME: "used when CUDA_HOME is unset; only NVCC major.minor is keyed"}),
    reads("PATH",
          notes={RUNTIME: "`which nvcc` in _find_cuda_home; only NVCC major.minor is keyed"}),

    # --- DeepGEMM names outside the <PREFIX>_JIT_<SUFFIX> table --------------------------------
    variable("DG_PRINT_CONFIGS", "print-only", "prints the chosen GEMM configurations",
             not_in_key=(RUNTIME, "deepgemm:python"), source="deepseek-jit.md §1, §2"),
    variable("DG_JIT_USE_RUNTIME_API", "build-only",
             "a macro while building DeepGEMM's extension: use the cudart library API (and run "
             "cuobjdump -symbols at each load); not read when kernels are JIT-compiled",
             ignored_by=(RUNTIME,), source="deepseek-jit.md §2 (build-only variables)"),
)

FAMILIES = (JIT_FAMILY,)
