"""torch.utils.cpp_extension: `load` and `load_inline` building through ninja."""

from __future__ import annotations

import os
import sys

from cacheaudit.spec import CompilerSetting, RuntimeSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SPEC = RuntimeSpec(
    name="torch-ext",
    title="torch.utils.cpp_extension",
    layout="layout",
    roots="spec",
    policy="policy",
    adapter="adapter",
    adapter_imports="torch.utils.cpp_extension",
    cache_variables=("TORCH_EXTENSIONS_DIR",),
    compiler_settings=(CompilerSetting("PYTORCH_NVCC", "nvcc"),),
    packages=("torch", "ninja"),
    environment="environment",
    docs="runtimes/torch-ext.md",
)


# ------------------------------------------------------------------------------ default roots
# `SPEC.roots`: where the cache lives under an environment, in the standard library alone, so
# that a session knows the roots to watch without loading the reader.

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
