"""cuda.core: `Program` and its persistent program cache."""

from cacheaudit.spec import RuntimeSpec

SPEC = RuntimeSpec(
    name="cuda-core",
    title="cuda.core",
    layout="layout",
    roots="roots",
    policy="policy",
    adapter="adapter",
    adapter_imports="cuda.core",
    cache_variables=("XDG_CACHE_HOME",),
    packages=("cuda-core",),
    environment="environment",
    docs="runtimes/cuda-core.md",
)
