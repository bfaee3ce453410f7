"""cuda.core: `Program` and its persistent program cache."""

from __future__ import annotations

import os

from cacheaudit.spec import RuntimeSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SPEC = RuntimeSpec(
    name="cuda-core",
    title="cuda.core",
    layout="layout",
    roots="spec",
    policy="policy",
    adapter="adapter",
    adapter_imports="cuda.core",
    cache_variables=("XDG_CACHE_HOME",),
    packages=("cuda-core",),
    environment="environment",
    docs="runtimes/cuda-core.md",
)


# ------------------------------------------------------------------------------ default roots
# `SPEC.roots`: where the cache lives under an environment, in the standard library alone, so
# that a session knows the roots to watch without loading the reader.

def default_roots(env: Mapping[str, str]) -> list[str]:
    """`$XDG_CACHE_HOME/cuda-python/program-cache`, else `~/.cache/...` (an empty
    XDG_CACHE_HOME counts as unset, as in cuda.core's `_default_cache_dir`)."""
    base = env.get("XDG_CACHE_HOME") or (
        os.path.join(env["HOME"], ".cache") if env.get("HOME") else None)
    return [os.path.join(base, "cuda-python", "program-cache")] if base else []
