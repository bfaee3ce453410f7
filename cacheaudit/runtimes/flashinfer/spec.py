"""FlashInfer's JIT (ninja builds under its workspace)."""

from cacheaudit.spec import RuntimeSpec

SPEC = RuntimeSpec(
    name="flashinfer",
    title="FlashInfer",
    layout="layout",
    roots="roots",
    policy="policy",
    adapter="adapter",
    adapter_imports="flashinfer.jit.core",
    cache_variables=("FLASHINFER_WORKSPACE_BASE",),
    # No compiler setting: the adapter records nvcc through FLASHINFER_NVCC_LAUNCHER, which
    # leaves build.ninja's nvcc line (FLASHINFER_NVCC or $cuda_home/bin/nvcc) and the link edge
    # as FlashInfer writes them unrecorded (docs/runtimes/flashinfer.md, "Recording").
    packages=("flashinfer-python", "flashinfer"),
    environment="environment",
    docs="runtimes/flashinfer.md",
)
