"""The generic rows: variables that compilers and toolkits read whatever runtime runs them.

Each row gives the variable's category, what it does, and the reference behind that; the only
key status it carries is the shim's (a plain compile, no runtime known: nothing is in a key it
does not have). What a runtime does with a generic variable (keys it, ignores it, reads it only
in one variant) is that runtime's declaration, in its package's `environment` module; the
registry merges both.

References (under the project's shared/reference/): deepseek-jit.md, jit-runtimes.md,
platform-notes.md (what was measured), anchors-ccache-envsnap.md (ccache's and sccache's
environment lists). A runtime whose status needs another citation adds it to the row's source.
"""

from __future__ import annotations

from cacheaudit.envvars.vocabulary import SHIM, Reading, Variable, reads, variable

SHELLS_OUT: tuple[str, ...] = (
    "CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN", "PATH", "COMPILER_PATH", "GCC_EXEC_PREFIX", "GCC_COMPARE_DEBUG",
    "SOURCE_DATE_EPOCH", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES",
)
"""What a compiler driver (nvcc, g++, hipcc) reads from the environment and a command line does
not show: outside the key of every runtime that shells out to one and whose key, as the
references enumerate it, holds no environment variable."""


def shells_out(runtime: str) -> tuple[Reading, ...]:
    """`runtime` runs a compiler driver and keys none of what the driver reads (SHELLS_OUT).

    A runtime declares this when its references spell out every part of its key and no
    environment variable is among them (a key of source, flags and the compiler's version; a
    ninja command line plus depfile mtimes). Its own exceptions (a backend that keys `CPATH`)
    are further readings of the same names.
    """
    return tuple(reads(name, not_in_key=(runtime,)) for name in SHELLS_OUT)


SELECTS_COMPILER: frozenset[str] = frozenset({
    "PATH", "CC", "CXX", "NVCC_CCBIN", "CUDAHOSTCXX", "CUDA_HOME", "CUDA_PATH",
})
"""Generic variables that pick the compiler binary (or the toolkit it comes from). Their drift
is judged through what they select: the audit compares the compilers' identities (CA301,
CA302), since a shell that lacks a compiler setting is no evidence of another compiler. Narrower
than the "compiler-choice" category, which also holds switches between compilers. Runtimes add
their compiler settings (their specs' `compiler_settings`, their families' compiler names)."""

GENERIC_ROWS: tuple[Variable, ...] = (
    # --- header search path ------------------------------------------------------------------
    variable("CPATH", "include-path",
             "gcc/nvcc/hipcc search these directories for #include (after -I): a different "
             "header can be picked up without any argv change",
             not_in_key=(SHIM,),
             source="deepseek-jit.md §2, §4; jit-runtimes.md §1, §6; platform-notes.md §2-§4"),
    variable("CPLUS_INCLUDE_PATH", "include-path",
             "like CPATH, for C++ (and so CUDA) translation units only",
             not_in_key=(SHIM,),
             source="deepseek-jit.md §4 (clear_external_jit_environment); jit-runtimes.md §1"),
    variable("C_INCLUDE_PATH", "include-path",
             "like CPATH, for C translation units only (host .c sources, launcher stubs)",
             not_in_key=(SHIM,),
             source="deepseek-jit.md §4; jit-runtimes.md §1; ccache manifest key"),
    variable("OBJC_INCLUDE_PATH", "include-path",
             "like CPATH, for Objective-C; ccache keys it in direct mode",
             not_in_key=(SHIM,),
             source="anchors-ccache-envsnap.md A1 (direct-mode manifest key)"),
    variable("OBJCPLUS_INCLUDE_PATH", "include-path",
             "like CPATH, for Objective-C++; ccache keys it in direct mode",
             not_in_key=(SHIM,),
             source="anchors-ccache-envsnap.md A1 (direct-mode manifest key)"),

    # --- nvcc's own environment --------------------------------------------------------------
    # sccache folds both into the argv (src/compiler/nvcc.rs); platform-notes.md §3 measured
    # the PTX change with exit 0 and no message.
    variable("NVCC_PREPEND_FLAGS", "compiler-flags",
             "nvcc inserts these options before the command line's own: a silent -D, -I or "
             "-arch",
             not_in_key=(SHIM,),
             source="deepseek-jit.md §4; jit-runtimes.md §1; platform-notes.md §3"),
    variable("NVCC_APPEND_FLAGS", "compiler-flags",
             "nvcc appends these options after the command line's own: a silent -D, -I or "
             "-arch",
             not_in_key=(SHIM,),
             source="deepseek-jit.md §4; jit-runtimes.md §1; platform-notes.md §3"),
    variable("NVCC_CCBIN", "compiler-choice",
             "nvcc's host compiler when no -ccbin is given: the host half of every .cu",
             not_in_key=(SHIM,),
             source="deepseek-jit.md §4 (README 'host-compiler selection', "
                    "clear_external_jit_environment); ccache hash_nvcc_host_compiler"),
    variable("CUDAHOSTCXX", "compiler-choice",
             "the CUDA host compiler for CMake-driven builds",
             source="deepseek-jit.md §4 (clear_external_jit_environment)"),

    # --- CUDA toolkit location -----------------------------------------------------------------
    variable("CUDA_HOME", "toolkit",
             "which CUDA toolkit (nvcc, headers, cuobjdump) a runtime uses",
             source="deepseek-jit.md §1, §2, §3, §4; jit-runtimes.md §1, §6"),
    variable("CUDA_PATH", "toolkit",
             "second choice after CUDA_HOME for the CUDA toolkit",
             source="deepseek-jit.md §2, §4; jit-runtimes.md §4"),

    # --- compiler choice -----------------------------------------------------------------------
    variable("CC", "compiler-choice", "the C compiler", source="jit-runtimes.md §1, §2"),
    variable("CXX", "compiler-choice",
             "the C++ compiler a ninja-driven extension build runs",
             source="jit-runtimes.md §1, §6"),
    variable("PATH", "compiler-choice",
             "decides what a bare compiler name (nvcc, c++, gcc, hipcc) resolves to, and the "
             "host compiler nvcc runs when no -ccbin is given",
             not_in_key=(SHIM,),
             notes={SHIM: "ccache hashes the host compiler nvcc finds on PATH"},
             source="deepseek-jit.md §2, §4; anchors-ccache-envsnap.md A1"),
    variable("COMPILER_PATH", "toolchain-behaviour",
             "gcc searches it for its subprograms (cc1plus, as, collect2)",
             not_in_key=(SHIM,),
             source="anchors-ccache-envsnap.md A1 (ccache hashes it always)"),
    variable("GCC_EXEC_PREFIX", "toolchain-behaviour",
             "gcc's prefix for finding its own subprograms: another cc1plus, another binary",
             not_in_key=(SHIM,),
             source="anchors-ccache-envsnap.md A1 (ccache hashes it always)"),
    variable("GCC_COMPARE_DEBUG", "toolchain-behaviour",
             "makes gcc recompile with -fcompare-debug and compare",
             not_in_key=(SHIM,),
             source="anchors-ccache-envsnap.md A1 (ccache hashes it always)"),
    variable("SOURCE_DATE_EPOCH", "toolchain-behaviour",
             "fixes __DATE__/__TIME__ in gcc: changes a binary that uses temporal macros",
             not_in_key=(SHIM,),
             source="anchors-ccache-envsnap.md A1 (ccache hashes it with temporal macros)"),
    *(
        variable(name, "locale",
                 "language of compiler diagnostics; ccache keys it unless sloppiness=locale",
                 not_in_key=(SHIM,),
                 source="anchors-ccache-envsnap.md A1 (ccache hash_common_info)")
        for name in ("LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES")
    ),

    # --- ROCm: what hipcc reads (a runtime's ROCm backend may key them) ------------------------
    *(
        variable(name, category, description,
                 not_in_key=(SHIM,),
                 source="deepseek-jit.md §4")
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

    # --- the user's cache root ------------------------------------------------------------------
    variable("XDG_CACHE_HOME", "cache-location", "the user cache root",
             source="jit-runtimes.md §1 (<user cache>), §7 ($XDG_CACHE_HOME/cuda-python)"),
)
