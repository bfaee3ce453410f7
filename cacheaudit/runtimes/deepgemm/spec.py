"""DeepGEMM up to 2.6: its C++ JIT (csrc/jit/) and its 2025 Python JIT."""

from cacheaudit.spec import CompilerSetting, RuntimeSpec

SPEC = RuntimeSpec(
    name="deepgemm",
    title="DeepGEMM",
    layout="layout",
    policy="policy",
    cache_variables=("DG_JIT_CACHE_DIR",),
    # DeepGEMM <= 2.6 reads only DG_; on DeepJIT (2.8+) it falls back to DJ_, and a user's DJ_
    # setting must then stay the one it follows.
    compiler_settings=(
        CompilerSetting("DG_JIT_NVCC_COMPILER", "nvcc", session_fills=True,
                        unless_set=("DJ_JIT_NVCC_COMPILER",)),
    ),
    packages=("deep_gemm", "deep-gemm"),
    variants=("nvrtc", "python"),
    environment="environment",
    docs="runtimes/deepjit.md",
)
