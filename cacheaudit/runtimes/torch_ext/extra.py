"""The `CompileRecord.extra` keys of torch-ext's records: written by the adapter for the user and
the explain output; no module outside this runtime reads them.

A fact another module reads is a typed field of `CompileRecord` (`modified_during_compile`),
never a key here.
"""

from __future__ import annotations

from typing import Any, TypedDict


class TorchExtExtra(TypedDict, total=False):
    """What a torch.utils.cpp_extension record carries besides the typed fields."""

    module: str
    """The extension's module name as `load()` was given it."""
    version: int | None
    """torch's `JIT_EXTENSION_VERSIONER` version of the build (the `_v<N>` suffix)."""
    build_directory: str | None
    """The build directory the caller passed, None for torch's default."""
    ninja_dry_run: dict[str, Any]
    """`ninja -n -d explain` before the build: `work` (ninja would rebuild), `explain` (its
    first 50 lines), `ms`."""
    written: list[str]
    """Files the build wrote or changed."""
    hits_not_recorded: int
    """Identical memory hits folded into this record."""


KEYS: frozenset[str] = frozenset(TorchExtExtra.__annotations__)
