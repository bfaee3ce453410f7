"""The `CompileRecord.extra` keys of cuda.core's records: written by the adapter, read by its
policy.

Private to this runtime: a fact another module reads is a typed field of `CompileRecord`
(`modified_during_compile`), never a key here.
"""

from __future__ import annotations

from typing import Any, TypedDict


class CudaCoreExtra(TypedDict, total=False):
    """What a cuda.core program-cache record carries besides the typed fields."""

    cache: str
    """Which cache answered: "compile" for a store, else the hit's layer ("disk", "memory")."""
    key_inputs: dict[str, Any]
    """What the key covered, field by field (`describe_key`), from which the policy recomputes
    the key; on a hit only `name`, `extra_digest`, `extra_digest_source` and `unguarded`."""
    from_working_directory: list[str]
    """Headers the compile found through the working directory, outside the key."""
    hits: int
    """How many lookups this hit record stands for."""
    last_hit_ns: int
    """When the last of those lookups happened (only when there were several)."""
    changed_before_hit: list[dict[str, Any]]
    """Watched inputs that changed between the store and the hit (`path`, `kind`, `recorded`,
    `current`): in-memory staleness evidence for the policy."""


KEYS: frozenset[str] = frozenset(CudaCoreExtra.__annotations__)
