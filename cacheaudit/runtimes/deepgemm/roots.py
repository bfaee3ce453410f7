"""DeepGEMM's and DeepEP's default cache roots (standard library `os` only: a session reads
them without the reader, `cacheaudit.runtimes.default_roots`)."""

from __future__ import annotations

from cacheaudit.roots import unique_paths
from cacheaudit.runtimes._deepseek.roots import home_default

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def default_roots(env: Mapping[str, str]) -> list[str]:
    """DeepGEMM's root, its pre-2025-05 name, then DeepEP's.

    `DG_JIT_CACHE_DIR` when non-empty (empty counts as unset, as in the C++ JIT), else the
    Python JIT's pre-rename `DG_CACHE_DIR`, else `$HOME/.deep_gemm`. When only
    `DG_CACHE_DIR` is set, `$HOME/.deep_gemm` follows it: a DeepGEMM newer than the rename
    ignores the old name and writes there (the breakage of sglang #6073). Then DeepEP's
    `EP_JIT_CACHE_DIR`, else `$HOME/.deep_ep`. No HOME, no home default: DeepGEMM would use
    a path relative to its working directory.
    """
    roots: list[str] = []
    current = env.get("DG_JIT_CACHE_DIR")
    legacy = env.get("DG_CACHE_DIR")
    home = home_default(env, ".deep_gemm")
    if current:
        roots.append(current)
    elif legacy:
        roots.append(legacy)
        if home:
            roots.append(home)
    elif home:
        roots.append(home)
    ep = env.get("EP_JIT_CACHE_DIR") or home_default(env, ".deep_ep")
    if ep:
        roots.append(ep)
    return unique_paths(roots)
