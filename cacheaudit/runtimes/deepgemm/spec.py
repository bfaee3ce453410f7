"""DeepGEMM up to 2.6: its C++ JIT (csrc/jit/) and its 2025 Python JIT."""

from cacheaudit.spec import CompilerSetting, RuntimeSpec

SPEC = RuntimeSpec(
    name="deepgemm",
    title="DeepGEMM",
    layout="layout",
    roots="roots",
    policy="policy",
    cache_variables=("DG_JIT_CACHE_DIR",),
    # DeepGEMM <= 2.6 reads only DG_; on DeepJIT (2.8+) it falls back to DJ_, and a user's DJ_
    # setting must then stay the one it follows. The Python JIT (deep_gemm/jit/compiler.py, up
    # to 2025-07) keys "<nvcc path>+(major, minor)": a stand-in would change every key, so the
    # session leaves the setting alone there and the adapter records in-process. (Its first
    # release's DG_NVCC_COMPILER is no setting of ours for the same reason.)
    compiler_settings=(
        CompilerSetting("DG_JIT_NVCC_COMPILER", "nvcc", session_fills=True,
                        unless_set=("DJ_JIT_NVCC_COMPILER",),
                        path_in_key_if=("deep_gemm", "jit/compiler.py")),
    ),
    adapter="adapter",
    adapter_imports="deep_gemm.jit.compiler",
    packages=("deep_gemm", "deep-gemm"),
    variants=("nvrtc", "python"),
    environment="environment",
    docs="runtimes/deepjit.md",
)
