"""Post-import hooks: run a callback right after a module's first import (or now, if it is
imported already), without importing it. The registry arms each adapter this way, so that the
start-up hook costs a process that never imports a runtime almost nothing: this module is
stdlib only and imports no adapter.

A problem in a callback is reported once on stderr and never breaks the import: never
`warnings.warn`, since under `-W error` (or pytest's filterwarnings = error) a warning raised
from a post-import hook would fail the user's import.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from cacheaudit.problems import report_problem

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.RLock()
_resolving: set[str] = set()


class _HookedLoader:
    """Runs the real loader, then the hooks registered for the module. (Plain classes: the
    import protocol needs no `importlib.abc` base, which would cost every start-up ~30 ms.)"""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_hooks(self._name, module)

    def __getattr__(self, name: str) -> object:
        # Loaders carry extras (get_resource_reader, is_package, ...) that importers ask for.
        return getattr(self._loader, name)


class _PostImportFinder:
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> Any:
        if fullname not in _hooks or fullname in _resolving:
            return None
        _resolving.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _resolving.discard(fullname)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, fullname)  # type: ignore[assignment]
        return spec


_FINDER = _PostImportFinder()


def _run_hooks(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # noqa: BLE001 - an adapter never breaks the import
            with contextlib.suppress(Exception):
                report_problem(f"could not hook {name}: {type(exc).__name__}: {exc}")


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` now if `name` is imported, else right after its first import."""
    module = sys.modules.get(name)
    if module is not None:
        _hooks.setdefault(name, []).append(callback)
        _run_hooks(name, module)
        return
    with _lock:
        _hooks.setdefault(name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def forget_hooks() -> None:
    with _lock:
        _hooks.clear()
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_FINDER)


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork() stays held forever in the child.
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
