"""CuPy's default cache root, from the standard library only: a
session reads them without the reader (`cacheaudit.runtimes.default_roots`)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def default_roots(env: Mapping[str, str]) -> list[str]:
    """CUPY_CACHE_DIR, else `~/.cupy/kernel_cache` (`os.path.expanduser`: HOME)."""
    if env.get("CUPY_CACHE_DIR"):
        return [env["CUPY_CACHE_DIR"]]
    return [os.path.join(env["HOME"], ".cupy", "kernel_cache")] if env.get("HOME") else []
