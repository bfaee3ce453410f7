"""torch.utils.cpp_extension's default build root, from the standard library only: a
session reads them without the reader (`cacheaudit.runtimes.default_roots`)."""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def default_root(env: Mapping[str, str]) -> str | None:
    """torch's root for this environment: TORCH_EXTENSIONS_DIR, else `get_default_build_root()`
    (the user cache dir + torch_extensions, realpath'd), without the py<XY>_<acc> level, which
    depends on the interpreter and torch build that will run (the reader descends into it)."""
    explicit = env.get("TORCH_EXTENSIONS_DIR")
    if explicit is not None:
        return explicit or None
    if sys.platform == "darwin":
        home = env.get("HOME")
        base = os.path.join(home, "Library", "Caches") if home else None
    elif "XDG_CACHE_HOME" in env:
        base = env["XDG_CACHE_HOME"]
    else:
        home = env.get("HOME")
        base = os.path.join(home, ".cache") if home else None
    if base is None:
        return None
    return os.path.realpath(os.path.join(base, "torch_extensions"))


def default_roots(env: Mapping[str, str]) -> list[str]:
    root = default_root(env)
    return [root] if root else []
