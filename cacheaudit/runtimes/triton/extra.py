"""The `CompileRecord.extra` keys of Triton's records: written by the adapter, read by its policy.

Private to this runtime: a fact another module reads is a typed field of `CompileRecord`,
never a key here.
"""

from __future__ import annotations

from typing import Any, TypedDict


class TritonExtra(TypedDict, total=False):
    """What a Triton record carries besides the typed fields."""

    # A compile.
    triton_version: str | None
    """`triton_version` of the kernel's metadata."""
    target: Any
    """The `GPUTarget` compiled for, as JSON."""
    options: dict[str, Any]
    """The backend's options as the metadata holds them, as JSON."""
    env_in_key: dict[str, str]
    """The environment the cache key covers (`recipe.build_env`)."""
    times_us: dict[str, Any]
    """The compile's own timings: IR initialisation, lowering stages, storing the results."""
    key_parts: dict[str, Any]
    """The cache key's parts as the compile hashed them, `verified` when they rebuild the key;
    the policy recomputes the key from them."""
    # A memory hit served although the environment changed.
    env_drift: dict[str, list[str | None]]
    """Variable -> [value at the compile, value now], for CA202 on in-memory hits."""
    memory_layer: str
    """Which in-memory cache served the hit, and what it keys on."""
    function: str | None
    """The @jit function's name."""
    # Any event seen more than once.
    repeats: int
    """How many more times the same event happened before the record was written."""
    last_ns: int
    """When the last of those repeats happened."""


KEYS: frozenset[str] = frozenset(TritonExtra.__annotations__)
