"""FlashInfer's environment: its own `FLASHINFER_*` names and what its ninja build holds of the
generic variables.

FlashInfer rebuilds only when ninja sees a newer mtime or a changed command line
(jit-runtimes.md §6; flashinfer-python 0.7.4 jit/core.py:577-640): a variable it writes onto the
generated build.ninja is keyed (as text: the binary a path names is not), what nvcc or the host
compiler read from the environment is not. Sources are that wheel's files and lines.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, shells_out, variable

RUNTIME = "flashinfer"
ON_THE_COMMAND = {RUNTIME: "on the generated build.ninja command line, as text"}

ROWS: tuple[Variable | Reading, ...] = (
    *shells_out(RUNTIME),
    reads("CUDA_HOME", in_key=(RUNTIME,),
          notes={RUNTIME: "build.ninja's cuda_home, as text: a symlink retargeted to another "
                          "toolkit keeps it"},
          source="jit/cpp_ext.py:47-64, 297"),
    reads("CUDA_PATH", in_key=(RUNTIME,),
          notes={RUNTIME: "build.ninja's cuda_home when CUDA_HOME is unset"},
          source="jit/cpp_ext.py:49"),
    reads("CXX", in_key=(RUNTIME,), notes={RUNTIME: "build.ninja's cxx (default c++)"},
          source="jit/cpp_ext.py:288"),
    reads("CC", in_key=(RUNTIME,), notes={RUNTIME: "nvcc's -ccbin on the cuda_cflags line"},
          source="jit/cpp_ext.py:207-209"),

    # --- FlashInfer's own -------------------------------------------------------------------
    *(
        variable(name, category, description, in_key=(RUNTIME,), notes=ON_THE_COMMAND,
                 source=source)
        for name, category, description, source in (
            ("FLASHINFER_NVCC", "compiler-choice", "the nvcc FlashInfer's ninja build runs",
             "jit/cpp_ext.py:289"),
            ("FLASHINFER_CXX_LAUNCHER", "compiler-choice",
             "a launcher put before the host compiler (ccache, sccache)", "jit/cpp_ext.py:291"),
            ("FLASHINFER_NVCC_LAUNCHER", "compiler-choice",
             "a launcher put before nvcc (ccache, sccache)", "jit/cpp_ext.py:292"),
            ("FLASHINFER_EXTRA_CFLAGS", "compiler-flags", "extra host compiler flags",
             "jit/cpp_ext.py:194-196"),
            ("FLASHINFER_EXTRA_CUDAFLAGS", "compiler-flags", "extra nvcc flags",
             "jit/cpp_ext.py:245-247"),
            ("FLASHINFER_EXTRA_LDFLAGS", "compiler-flags", "extra linker flags",
             "jit/cpp_ext.py:281-283"),
            ("FLASHINFER_NVCC_THREADS", "compiler-flags", "nvcc's --threads",
             "jit/cpp_ext.py:94-112"),
            ("FLASHINFER_JIT_DEBUG", "compiler-flags", "-O0 -g device debug flags when 1",
             "jit/core.py:761-801"),
            ("FLASHINFER_JIT_VERBOSE", "compiler-flags",
             "debug flags when 1 and FLASHINFER_JIT_DEBUG is unset; ninja's output shown",
             "jit/core.py:761-764, 626-627"),
            ("FLASHINFER_JIT_LINEINFO", "compiler-flags", "-lineinfo when 1",
             "jit/core.py:808-809"),
        )
    ),
    variable("FLASHINFER_CUDA_ARCH_LIST", "compiler-flags",
             "the architectures FlashInfer compiles for",
             in_key=(RUNTIME,),
             notes={RUNTIME: "the -gencode flags, and part of the cache path (<sorted archs>/"
                             "cached_ops)"},
             source="jit/env.py:382-396"),
    variable("FLASHINFER_WORKSPACE_BASE", "cache-location",
             "parent of FlashInfer's .cache/flashinfer", not_in_key=(RUNTIME,),
             source="jit/env.py:66-70"),
    variable("FLASHINFER_JIT_BUILD_LOG", "print-only",
             "a JSON line per build (toolchain, name, seconds, pid, time), ninja no-ops included",
             not_in_key=(RUNTIME,), source="jit/core.py:111-138"),
    variable("FLASHINFER_DISABLE_JIT", "cache-control",
             "refuse to build: only AOT modules load", not_in_key=(RUNTIME,),
             source="jit/core.py:383-390, 619-625"),
)
