"""The `CompileRecord.extra` keys of Inductor's records. None yet: this session's records come
from the shim alone (the in-process adapter, which will note the FX and C++ cache lookups, is
the next step; docs/runtimes/inductor.md, "Not yet")."""

from __future__ import annotations

from typing import TypedDict


class InductorExtra(TypedDict, total=False):
    """What an Inductor record carries besides the typed fields (nothing yet)."""


KEYS: frozenset[str] = frozenset(InductorExtra.__annotations__)
