"""DeepJIT (deepseek-ai/DeepJIT), and DeepGEMM 2.8+ and DeepEP-Ascend built on it."""

from cacheaudit.spec import CompilerSetting, RuntimeSpec

SPEC = RuntimeSpec(
    name="deepjit",
    title="DeepJIT",
    layout="layout",
    roots="roots",
    policy="policy",
    cache_variables=("DJ_JIT_CACHE_DIR", "DG_JIT_CACHE_DIR", "EP_JIT_CACHE_DIR"),
    compiler_settings=(
        CompilerSetting("DJ_JIT_NVCC_COMPILER", "nvcc", session_fills=True),
        # Every library built on DeepJIT chooses its env prefix (`deep_jit::Config`); its
        # compiler setting is `<P>_JIT_NVCC_COMPILER`, read before DJ_'s.
        CompilerSetting("<P>_JIT_NVCC_COMPILER", "nvcc",
                        pattern=r"[A-Za-z0-9_]+_JIT_NVCC_COMPILER"),
    ),
    variants=("cuda", "rocm", "ascend"),
    environment="environment",
    docs="runtimes/deepjit.md",
)
