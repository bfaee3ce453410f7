"""The `CompileRecord.extra` keys of Inductor's records, written by the in-process adapter
(`adapter.py`; docs/runtimes/inductor.md, "The adapter"). Shim records carry none."""

from __future__ import annotations

from typing import Any, TypedDict


class InductorExtra(TypedDict, total=False):
    """What an Inductor adapter record carries besides the typed fields."""

    layer: str
    """"fxgraph", "aotautograd" or "cpp": which of Inductor's caches the lookup was."""
    components: list[str]
    """An FX hit's labelled key components (`debug_lines`), the first 64, each cut short."""
    custom_ops: dict[str, dict[str, Any]]
    """The torch.library custom-op snapshot (`adapter.snapshot_custom_ops`)."""
    custom_ops_changed: list[dict[str, Any]]
    """On an FX hit: (op, field, recorded, current) against the entry's compile record."""
    custom_passes: dict[str, dict[str, Any]]
    """The custom-pass snapshot (`adapter.snapshot_custom_passes`), by config slot."""
    custom_passes_changed: list[dict[str, Any]]
    """On an FX hit: (pass, class, field, recorded, current) against the entry's compile
    record, for a pass whose uuid() is unchanged."""
    graph_ops: list[str]
    """On an FX hit inside `AOTAutogradCache.try_load`: the custom ops (`ns::name`) Dynamo's
    graph calls, the only ones its snapshot is compared for."""
    is_backward: bool
    """On an FX hit: whether it is the backward half of an AOTAutograd graph (a forward half is
    not told of a new backward formula)."""
    built_record: str
    """On an FX hit: the id of the compile record its snapshot was compared with."""
    source: str
    """A C++ hit's `<key>.main.cpp`."""
    command_line: str
    """The command line Inductor hashed into the C++ kernel key."""
    existed: bool
    """Whether `<key>.main.so` existed before the load (a hit without a compile)."""
    isa: str
    """The vector ISA of the command line (`-DCPU_CAPABILITY_*`), "none" without one."""


KEYS: frozenset[str] = frozenset(InductorExtra.__annotations__)
