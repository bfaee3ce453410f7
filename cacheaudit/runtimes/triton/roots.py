"""Triton's default cache root, from the standard library only: a
session reads them without the reader (`cacheaudit.runtimes.default_roots`)."""

from __future__ import annotations

import os

from cacheaudit.roots import unique_paths

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def default_roots(env: Mapping[str, str]) -> list[str]:
    """`knobs.cache.dir`: TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else
    $HOME/.triton/cache. An empty TRITON_CACHE_DIR is no root at all (Triton refuses it)."""
    explicit = env.get("TRITON_CACHE_DIR")
    if explicit is not None:
        return unique_paths([explicit]) if explicit else []
    home = env.get("TRITON_HOME") or env.get("HOME")
    return unique_paths([os.path.join(home, ".triton", "cache")]) if home else []
