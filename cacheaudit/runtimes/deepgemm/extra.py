"""The `CompileRecord.extra` keys of DeepGEMM's records: written by the Python JIT's adapter for
the user and the explain output; no module outside this runtime reads them.

A fact another module reads is a typed field of `CompileRecord`, never a key here.
"""

from __future__ import annotations

from typing import Any, TypedDict


class DeepGemmExtra(TypedDict, total=False):
    """What a DeepGEMM record carries besides the typed fields."""

    nvcc_output: dict[str, Any]
    """What nvcc wrote (`path`, `digest`, `size`) before the runtime rewrote or moved it."""
    rewritten_after_compile: bool
    """The entry's binary differs from nvcc's output: the FFMA interleave rewrote it."""
    hits: int
    """Identical hits of one entry under one environment folded into this record."""


KEYS: frozenset[str] = frozenset(DeepGemmExtra.__annotations__)
