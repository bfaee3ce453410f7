"""NVRTC through cuda-python (`cuda.bindings.nvrtc`): no disk cache of its own."""

from cacheaudit.spec import RuntimeSpec

SPEC = RuntimeSpec(
    name="nvrtc",
    title="NVRTC",
    policy="policy",
    adapter="adapter",
    adapter_imports="cuda.bindings.nvrtc",
    packages=("cuda-python", "cuda-bindings", "cuda-pathfinder"),
    snapshot="snapshot",
    environment="environment",
    docs="runtimes/nvrtc.md",
)
