"""The `CompileRecord.extra` keys of DeepJIT's records (the minijit listener's hits).

Private to this runtime: a fact another module reads is a typed field of `CompileRecord`
(`runtime_error` for a refused compile), never a key here.
"""

from __future__ import annotations

from typing import TypedDict


class DeepjitExtra(TypedDict, total=False):
    """What a minijit hit record carries besides the typed fields."""

    tracked: dict[str, str]
    """Include name -> the file behind it, for the headers the hit's key covered (the runtime's
    own parse, cached in memory for the runtime object's lifetime)."""


KEYS: frozenset[str] = frozenset(DeepjitExtra.__annotations__)
