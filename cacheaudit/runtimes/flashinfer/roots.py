"""FlashInfer's default cache root, from the standard library only: a
session reads them without the reader (`cacheaudit.runtimes.default_roots`)."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


CACHE_SUBPATH = (".cache", "flashinfer")


def default_root(env: Mapping[str, str]) -> str | None:
    """FlashInfer's cache directory under `env` (env.py:66-70): FLASHINFER_WORKSPACE_BASE, else
    the home directory (pathlib's `Path.home()`: $HOME), then .cache/flashinfer."""
    base = env.get("FLASHINFER_WORKSPACE_BASE") or env.get("HOME")
    return os.path.join(base, *CACHE_SUBPATH) if base else None


def default_roots(env: Mapping[str, str]) -> list[str]:
    root = default_root(env)
    return [root] if root else []
