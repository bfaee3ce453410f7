"""FlashInfer's environment: its own `FLASHINFER_*` names and what its ninja build holds of the
generic variables.

FlashInfer rebuilds only when ninja sees a newer mtime or a changed command line
(jit-runtimes.md §6): a variable it writes onto the generated build.ninja is keyed, what nvcc or
the host compiler read from the environment is not.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, shells_out, variable

RUNTIME = "flashinfer"

ROWS: tuple[Variable | Reading, ...] = (
    *shells_out(RUNTIME),
    reads("CUDA_HOME", in_key=(RUNTIME,)),
    reads("CXX", in_key=(RUNTIME,)),

    # --- FlashInfer's own -------------------------------------------------------------------
    *(
        variable(name, category, description,
                 in_key=(RUNTIME,),
                 notes={RUNTIME: "on the generated build.ninja command line"},
                 source="jit-runtimes.md §6")
        for name, category, description in (
            ("FLASHINFER_NVCC", "compiler-choice", "the nvcc FlashInfer's ninja build runs"),
            ("FLASHINFER_EXTRA_CFLAGS", "compiler-flags", "extra host compiler flags"),
            ("FLASHINFER_EXTRA_CUDAFLAGS", "compiler-flags", "extra nvcc flags"),
            ("FLASHINFER_EXTRA_LDFLAGS", "compiler-flags", "extra linker flags"),
        )
    ),
    variable("FLASHINFER_CUDA_ARCH_LIST", "compiler-flags",
             "the architectures FlashInfer compiles for",
             in_key=(RUNTIME,),
             notes={RUNTIME: "part of the cache path (<sorted archs>/cached_ops)"},
             source="jit-runtimes.md §6"),
    variable("FLASHINFER_WORKSPACE_BASE", "cache-location",
             "parent of FlashInfer's .cache/flashinfer",
             not_in_key=(RUNTIME,), source="jit-runtimes.md §6"),
)
