"""The `CompileRecord.extra` keys of NVRTC's records: written by the adapter, read by its policy.

Private to this runtime: a fact another module reads is a typed field of `CompileRecord`
(`graph_problem`, `modified_during_compile`), never a key here.
"""

from __future__ import annotations

from typing import Any, TypedDict


class NvrtcExtra(TypedDict, total=False):
    """What an NVRTC compile record carries besides the typed fields."""

    trace: dict[str, Any]
    """How the include graph was taken: `added` (the adapter added `--fdevice-time-trace`),
    `skipped` (why it was not), `method` (the graph's method, None without a graph)."""
    program: dict[str, Any]
    """The program as created: `name` and the names of its `memory_headers`."""
    pch: dict[str, Any]
    """The automatic PCH event: `event` ("created", "reused"), `file`, and for a reuse
    `created_by` (the creating record), `coverage`, `coverage_how`, `headers`, `changed`,
    `file_assumed`, `note`; the policy's CA106 evidence."""


KEYS: frozenset[str] = frozenset(NvrtcExtra.__annotations__)
