"""torch.utils.cpp_extension's environment: what build.ninja's command line holds of the generic
variables, and torch's own `TORCH_*`/`PYTORCH_*` names.

torch keys an extension on ninja's command line plus the depfiles' mtimes (jit-runtimes.md §1):
whatever nvcc or g++ read from the environment is outside it (measured stale for `CPATH`,
platform-notes.md I2), while a variable torch writes onto the command line (`CC` as `-ccbin`,
`TORCH_CUDA_ARCH_LIST` as `-gencode`) rebuilds when it changes.
"""

from __future__ import annotations

from cacheaudit.envvars import Reading, Variable, reads, shells_out, variable

RUNTIME = "torch-ext"

_FIND_CUDA_HOME = "torch cpp_extension._find_cuda_home"

ROWS: tuple[Variable | Reading, ...] = (
    *shells_out(RUNTIME),
    reads("NVCC_CCBIN",
          notes={RUNTIME: "torch passes -ccbin $CC when CC is set, which overrides it"}),
    reads("CUDA_HOME", in_key=(RUNTIME,),
          notes={RUNTIME: "the nvcc path on build.ninja's command line comes from it"},
          source=_FIND_CUDA_HOME),
    reads("CUDA_PATH", in_key=(RUNTIME,),
          notes={RUNTIME: "used when CUDA_HOME is unset (cpp_extension._find_cuda_home)"},
          source=_FIND_CUDA_HOME),
    reads("CC", in_key=(RUNTIME,),
          notes={RUNTIME: "on build.ninja's command line as -ccbin"},
          description=": torch passes it to nvcc as -ccbin"),
    reads("CXX", in_key=(RUNTIME,),
          notes={RUNTIME: "on build.ninja's command line; the binary behind the name is not"}),
    reads("PATH", notes={RUNTIME: "the bare `c++` on the command line and `which nvcc`"}),
    reads("XDG_CACHE_HOME", not_in_key=(RUNTIME,),
          description=": torch's default extensions root"),

    # --- torch.utils.cpp_extension's own ----------------------------------------------------
    variable("CUDA_INC_PATH", "toolkit",
             "torch adds it as an include directory on the extension's command line",
             in_key=(RUNTIME,),
             source="jit-runtimes.md §1 (build.ninja command line); torch cpp_extension"),
    variable("TORCH_CUDA_ARCH_LIST", "compiler-flags",
             "the -gencode list of an extension build",
             in_key=(RUNTIME,),
             notes={RUNTIME: "on build.ninja's command line"},
             source="jit-runtimes.md §1"),
    variable("PYTORCH_NVCC", "compiler-choice",
             "replaces the nvcc torch runs (a ccache wrapper, say)",
             in_key=(RUNTIME,),
             notes={RUNTIME: "on build.ninja's command line; the binary behind it is not"},
             source="jit-runtimes.md §1; torch cpp_extension._write_ninja_file"),
    variable("TORCH_EXTENSIONS_DIR", "cache-location",
             "replaces the root of torch's extension build directories",
             not_in_key=(RUNTIME,),
             source="jit-runtimes.md §1"),
    variable("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES", "build-tracking",
             "=1 drops nvcc's dependency output, so ninja stops seeing header edits in .cu "
             "sources",
             in_key=(RUNTIME,),
             notes={RUNTIME: "it changes the nvcc command line, so toggling it rebuilds; "
                             "while set, header edits go unseen"},
             source="jit-runtimes.md §1; platform-notes.md §4"),
    variable("TORCH_NO_COMPILER_WRAPPER", "compiler-choice",
             "set: torch stops putting ccache/sccache (when on PATH) in front of the compiler",
             in_key=(RUNTIME,),
             notes={RUNTIME: "it changes build.ninja's command line, so toggling it rebuilds"},
             source="torch 2.13 cpp_extension._wrap_compiler"),
    variable("MAX_JOBS", "build-parallelism",
             "number of parallel ninja jobs for an extension build",
             not_in_key=(RUNTIME,),
             source="torch cpp_extension._get_num_workers"),
)
