"""`AuditedProgramCache`: any cuda.core `ProgramCacheResource`, its lookups and stores recorded.

The adapter hooks the two caches cuda.core ships (`FileStreamProgramCache`,
`InMemoryProgramCache`) on their classes; a user's own backend has no hook, so it is wrapped:
`AuditedProgramCache(inner)` (`adapter.AuditedProgramCache`) forwards every call to `inner` and
records each hit and store through the adapter's recorder, the same way as the hooks do. It
observes keys on its own (`ADAPTER.observe_keys()`), so a compile record carries its key's
inputs without a full installation. While it calls its inner cache the class hooks stay silent
(`quietly`): wrapping a FileStreamProgramCache gives one record per lookup, not two.

The class is built on first use: it must subclass cuda.core's `ProgramCacheResource`
(`Program.compile` checks), and importing cuda.core at module import is not allowed.
"""

from __future__ import annotations

from typing import Any

from cacheaudit.model import Event
from cacheaudit.runtimes.cuda_core.adapter import _RECORDER, ADAPTER, entry_path, quietly

__all__ = ["audited_class"]

_MISSING = object()
_AUDITED: type | None = None


def audited_class() -> type:
    """Built on first use: it must subclass cuda.core's ProgramCacheResource (Program.compile
    checks), and importing cuda.core at module import is not allowed."""
    global _AUDITED
    if _AUDITED is not None:
        return _AUDITED
    from cuda.core.utils._program_cache import (
        FileStreamProgramCache,
        InMemoryProgramCache,
        ProgramCacheResource,
    )

    class _AuditedProgramCache(ProgramCacheResource):
        """Any ProgramCacheResource, with its lookups and stores recorded."""

        def __init__(self, inner: Any, *, event: str | None = None) -> None:
            if not isinstance(inner, ProgramCacheResource):
                raise TypeError("AuditedProgramCache wraps a cuda.core ProgramCacheResource, "
                                f"not {type(inner).__name__}")
            if event is None:
                event = "memory-hit" if isinstance(inner, InMemoryProgramCache) else "disk-hit"
            if event not in ("disk-hit", "memory-hit"):
                raise ValueError("event must be 'disk-hit' or 'memory-hit'")
            self._inner = inner
            self._event: Event = "memory-hit" if event == "memory-hit" else "disk-hit"
            self._files = isinstance(inner, FileStreamProgramCache)
            try:
                ADAPTER.observe_keys()
            except Exception as exc:  # noqa: BLE001 - fail open: records without key inputs
                _RECORDER.problem(exc, "observe keys")

        @property
        def inner(self) -> Any:
            return self._inner

        def _hit(self, key: Any, data: bytes) -> None:
            try:
                _RECORDER.hit(key, data, self._event,
                              self._inner if self._files else None, self)
            except Exception as exc:  # noqa: BLE001 - fail open
                _RECORDER.problem(exc, "hit")

        def _missed(self, key: Any) -> None:
            try:
                _RECORDER.missed(key)
            except Exception as exc:  # noqa: BLE001 - fail open
                _RECORDER.problem(exc, "miss")

        def __getitem__(self, key: Any) -> bytes:
            try:
                with quietly():
                    data = self._inner[key]
            except KeyError:
                self._missed(key)
                raise
            self._hit(key, data)
            return data  # type: ignore[no-any-return]

        def get(self, key: Any, default: bytes | None = None) -> bytes | None:
            with quietly():
                data = self._inner.get(key, _MISSING)
            if data is _MISSING:
                self._missed(key)
                return default
            self._hit(key, data)
            return data  # type: ignore[no-any-return]

        def __setitem__(self, key: Any, value: Any) -> None:
            with quietly():
                self._inner[key] = value
            try:
                _RECORDER.store(key, value, self._event,
                                entry_path(self._inner, key) if self._files else None)
            except Exception as exc:  # noqa: BLE001 - fail open
                _RECORDER.problem(exc, "store")

        def __delitem__(self, key: Any) -> None:
            with quietly():
                del self._inner[key]

        def __len__(self) -> int:
            return len(self._inner)

        def clear(self) -> None:
            self._inner.clear()

        def close(self) -> None:
            self._inner.close()

        def __getattr__(self, name: str) -> Any:
            if name.startswith("__") or name in ("_inner", "_event", "_files"):
                raise AttributeError(name)
            return getattr(self._inner, name)

        def __repr__(self) -> str:
            return f"AuditedProgramCache({self._inner!r})"

    _AuditedProgramCache.__name__ = _AuditedProgramCache.__qualname__ = "AuditedProgramCache"
    _AUDITED = _AuditedProgramCache
    return _AUDITED
