"""The `CompileRecord.extra` keys of FlashInfer's records: written by its adapter for the user
and the explain output; no module outside this runtime reads them."""

from __future__ import annotations

from typing import TypedDict


class FlashInferExtra(TypedDict, total=False):
    """What a FlashInfer record carries besides the typed fields."""

    module: str
    """The JIT module's name (`JitSpec.name`, the cached_ops/<name>/ directory)."""
    toolchain: str
    """The spec's toolchain (`JitSpec.toolchain`: "nvcc"), as FLASHINFER_JIT_BUILD_LOG has it."""
    written: list[str]
    """Outputs the build wrote or changed (absolute paths)."""
    aot_library: str
    """The AOT library `try_load` returned instead of building (the first, when several)."""
    hits_not_recorded: int
    """Identical no-op builds of the module (same tracked contents, same environment) counted
    since the previous recorded one, not written one by one."""
    launcher: str
    """The FLASHINFER_NVCC_LAUNCHER the adapter set for this build (the shim), when it set one."""


KEYS: frozenset[str] = frozenset(FlashInferExtra.__annotations__)
