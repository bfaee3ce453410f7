"""DeepEP's EPv2 JIT, a near-copy of DeepGEMM's C++ JIT: DeepGEMM's layout reads its entries and
DeepGEMM's recipe keys them."""

from cacheaudit.spec import CompilerSetting, RuntimeSpec

SPEC = RuntimeSpec(
    name="deepep",
    title="DeepEP",
    layout="cacheaudit.runtimes.deepgemm.layout",
    roots="cacheaudit.runtimes.deepgemm.spec",
    policy="cacheaudit.runtimes.deepgemm.policy",
    cache_variables=("EP_JIT_CACHE_DIR",),
    compiler_settings=(
        CompilerSetting("EP_JIT_NVCC_COMPILER", "nvcc", session_fills=True,
                        unless_set=("DJ_JIT_NVCC_COMPILER",)),
    ),
    packages=("deep_ep", "deep-ep"),
    environment="environment",
    docs="runtimes/deepjit.md",
)
