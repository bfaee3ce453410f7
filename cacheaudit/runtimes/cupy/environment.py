"""CuPy's environment: its own `CUPY_*` names and what its key holds of the generic variables
under each backend (`compile_with_cache(backend=...)`: "nvrtc" or "nvcc").

CuPy keys its options tuple, the source and the backend's version (jit-runtimes.md §4): an
option a variable adds (`-I<CUDA include>` from `CUDA_PATH`) is keyed; what nvcc reads from the
environment is not, and NVRTC reads neither `CPATH` nor nvcc's variables.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, variable

RUNTIME = "cupy"

ROWS: tuple[Variable | Reading, ...] = (
    *(reads(name, not_in_key=("cupy:nvcc",), ignored_by=("cupy:nvrtc",))
      for name in ("CPATH", "CPLUS_INCLUDE_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")),
    reads("CUDA_PATH", in_key=(RUNTIME,),
          notes={RUNTIME: "the -I<CUDA include> option it yields is part of the keyed options"},
          description="; CuPy's -I<CUDA include>"),

    # --- CuPy (CUPY_CACHE_KEY is no environment variable: a build-time C macro, see report) --
    variable("CUPY_CACHE_DIR", "cache-location", "CuPy's kernel cache root",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §4"),
    variable("CUPY_CACHE_IN_MEMORY", "cache-control", "=1 keeps CuPy's cache in memory only",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §4"),
    variable("CUPY_CACHE_SAVE_CUDA_SOURCE", "print-only",
             "=1 saves <sha1>.cubin.cu beside each entry",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §4"),
    variable("CUPY_DISABLE_JITIFY_CACHE", "cache-control", "=1 resets CuPy's Jitify header cache",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §4 (PR #7934)"),
    variable("CUPY_CUDA_COMPILE_WITH_DEBUG", "compiler-flags",
             "adds --device-debug --generate-line-info to every CuPy compile",
             in_key=(RUNTIME,),
             notes={RUNTIME: "the options it adds are part of the keyed options tuple"},
             source="cupy cuda/compiler.py _compile_with_cache_cuda"),
    variable("CUPY_COMPILE_WITH_PTX", "compiler-flags", "CuPy compiles to PTX instead of cubin",
             unknown=(RUNTIME,), source="jit-runtimes.md §4 (named, not classified)"),
    variable("CUPY_NVRTC_USE_PCH", "compiler-flags", "CuPy asks NVRTC for precompiled headers",
             unknown=(RUNTIME,), source="jit-runtimes.md §4 (named, not classified)"),
)
