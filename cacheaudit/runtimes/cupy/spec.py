"""CuPy's kernel cache (`compile_with_cache`)."""

from __future__ import annotations

import os

from cacheaudit.spec import RuntimeSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SPEC = RuntimeSpec(
    name="cupy",
    title="CuPy",
    layout="layout",
    roots="spec",
    policy="policy",
    cache_variables=("CUPY_CACHE_DIR",),
    packages=("cupy", "cupy-cuda12x", "cupy-cuda13x"),
    variants=("nvrtc", "nvcc"),
    environment="environment",
    docs="runtimes/cupy.md",
)


# ------------------------------------------------------------------------------ default roots
# `SPEC.roots`: where the cache lives under an environment, in the standard library alone, so
# that a session knows the roots to watch without loading the reader.

def default_roots(env: Mapping[str, str]) -> list[str]:
    """CUPY_CACHE_DIR, else `~/.cupy/kernel_cache` (`os.path.expanduser`: HOME)."""
    if env.get("CUPY_CACHE_DIR"):
        return [env["CUPY_CACHE_DIR"]]
    return [os.path.join(env["HOME"], ".cupy", "kernel_cache")] if env.get("HOME") else []
