"""Triton: `@triton.jit` and `triton.compile`, with its on-disk kernel cache."""

from cacheaudit.spec import RuntimeSpec

SPEC = RuntimeSpec(
    name="triton",
    title="Triton",
    layout="layout",
    roots="roots",
    policy="policy",
    adapter="adapter",
    adapter_imports="triton",
    cache_variables=("TRITON_CACHE_DIR", "TRITON_HOME"),
    packages=("triton",),
    snapshot="snapshot",
    environment="environment",
    docs="runtimes/triton.md",
)
