"""FlashInfer's JIT (ninja builds under its workspace)."""

from cacheaudit.spec import CompilerSetting, RuntimeSpec

SPEC = RuntimeSpec(
    name="flashinfer",
    title="FlashInfer",
    layout="layout",
    policy="policy",
    cache_variables=("FLASHINFER_WORKSPACE_BASE",),
    compiler_settings=(CompilerSetting("FLASHINFER_NVCC", "nvcc", session_fills=True),),
    packages=("flashinfer-python", "flashinfer"),
    environment="environment",
    docs="runtimes/flashinfer.md",
)
