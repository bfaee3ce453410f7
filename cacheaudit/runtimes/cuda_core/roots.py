"""cuda.core's default program cache, from the standard library only: a
session reads them without the reader (`cacheaudit.runtimes.default_roots`)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def default_roots(env: Mapping[str, str]) -> list[str]:
    """`$XDG_CACHE_HOME/cuda-python/program-cache`, else `~/.cache/...` (an empty
    XDG_CACHE_HOME counts as unset, as in cuda.core's `_default_cache_dir`)."""
    base = env.get("XDG_CACHE_HOME") or (
        os.path.join(env["HOME"], ".cache") if env.get("HOME") else None)
    return [os.path.join(base, "cuda-python", "program-cache")] if base else []
