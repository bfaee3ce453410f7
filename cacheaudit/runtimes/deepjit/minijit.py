"""The reference runtime (fixtures/minijit): its lookups and refusals, seen from the inside.

minijit, like Triton, offers a listener list that it calls after every lookup; DeepJIT itself has
none. This adapter turns memory and disk hits into records (the shim records the compiles) and a
refused source (DeepJIT's "non-standard include" panic) into a record carrying the error, so that
in-memory staleness (CA106) is proven by an observed hit rather than inferred.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cacheaudit.recorder import record_event, report_problem

_MARK = "_cacheaudit_listener"


def _listener(event: Mapping[str, Any]) -> None:
    kind = event.get("event")
    if kind in ("disk-hit", "memory-hit"):
        tracked = {name: value[0] for name, value in (event.get("tracked") or {}).items()}
        problem = record_event(runtime=event.get("runtime", "deepjit"), kernel=event.get("name"),
                                event=kind, key=event.get("key"), entry=event.get("path"),
                                observer="adapter:minijit", extra={"tracked": tracked})
    elif kind == "error":
        error = str(event.get("error"))
        problem = record_event(runtime=event.get("runtime", "deepjit"), kernel=event.get("name"),
                                event="compile", key=event.get("key"), entry=event.get("path"),
                                observer="adapter:minijit",
                                notes=(f"the runtime refused the compile: {error}",),
                                runtime_error=error)
    else:
        return
    if problem:
        report_problem(problem)


setattr(_listener, _MARK, True)


def install(runtime: Any) -> None:
    """Observe one runtime object; installing twice is a no-op."""
    if not any(getattr(listener, _MARK, False) for listener in runtime.listeners):
        runtime.listeners.append(_listener)


def uninstall(runtime: Any) -> None:
    runtime.listeners[:] = [li for li in runtime.listeners if not getattr(li, _MARK, False)]

