"""Triton: `@triton.jit` and `triton.compile`, with its on-disk kernel cache."""

from __future__ import annotations

import os

from cacheaudit.roots import unique_paths
from cacheaudit.spec import RuntimeSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SPEC = RuntimeSpec(
    name="triton",
    title="Triton",
    layout="layout",
    roots="spec",
    policy="policy",
    adapter="adapter",
    adapter_imports="triton",
    cache_variables=("TRITON_CACHE_DIR", "TRITON_HOME"),
    packages=("triton",),
    snapshot="snapshot",
    environment="environment",
    docs="runtimes/triton.md",
)


# ------------------------------------------------------------------------------ default roots
# `SPEC.roots`: where the cache lives under an environment, in the standard library alone, so
# that a session knows the roots to watch without loading the reader.

def default_roots(env: Mapping[str, str]) -> list[str]:
    """`knobs.cache.dir`: TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else
    $HOME/.triton/cache. An empty TRITON_CACHE_DIR is no root at all (Triton refuses it)."""
    explicit = env.get("TRITON_CACHE_DIR")
    if explicit is not None:
        return unique_paths([explicit]) if explicit else []
    home = env.get("TRITON_HOME") or env.get("HOME")
    return unique_paths([os.path.join(home, ".triton", "cache")]) if home else []
