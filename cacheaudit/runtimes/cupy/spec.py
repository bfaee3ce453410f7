"""CuPy's kernel cache (`compile_with_cache`)."""

from cacheaudit.spec import RuntimeSpec

SPEC = RuntimeSpec(
    name="cupy",
    title="CuPy",
    layout="layout",
    roots="roots",
    policy="policy",
    cache_variables=("CUPY_CACHE_DIR",),
    packages=("cupy", "cupy-cuda12x", "cupy-cuda13x"),
    variants=("nvrtc", "nvcc"),
    environment="environment",
    docs="runtimes/cupy.md",
)
