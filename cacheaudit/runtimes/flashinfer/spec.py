"""FlashInfer's JIT (ninja builds under its workspace)."""

from __future__ import annotations

import os

from cacheaudit.spec import RuntimeSpec

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

SPEC = RuntimeSpec(
    name="flashinfer",
    title="FlashInfer",
    layout="layout",
    roots="spec",
    policy="policy",
    adapter="adapter",
    adapter_imports="flashinfer.jit.core",
    cache_variables=("FLASHINFER_WORKSPACE_BASE",),
    # No compiler setting: the adapter records nvcc through FLASHINFER_NVCC_LAUNCHER, which
    # leaves build.ninja's nvcc line (FLASHINFER_NVCC or $cuda_home/bin/nvcc) and the link edge
    # as FlashInfer writes them unrecorded (docs/runtimes/flashinfer.md, "Recording").
    packages=("flashinfer-python", "flashinfer"),
    environment="environment",
    docs="runtimes/flashinfer.md",
)


# ------------------------------------------------------------------------------ default roots
# `SPEC.roots`: where the cache lives under an environment, in the standard library alone, so
# that a session knows the roots to watch without loading the reader.

CACHE_SUBPATH = (".cache", "flashinfer")


def default_root(env: Mapping[str, str]) -> str | None:
    """FlashInfer's cache directory under `env` (env.py:66-70): FLASHINFER_WORKSPACE_BASE, else
    the home directory (pathlib's `Path.home()`: $HOME), then .cache/flashinfer."""
    base = env.get("FLASHINFER_WORKSPACE_BASE") or env.get("HOME")
    return os.path.join(base, *CACHE_SUBPATH) if base else None


def default_roots(env: Mapping[str, str]) -> list[str]:
    root = default_root(env)
    return [root] if root else []
