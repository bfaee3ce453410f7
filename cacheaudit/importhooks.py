"""Post-import hooks: run a callback right after a module's first import (or now, if it is
imported already), without importing it. The registry arms each adapter this way, so that the
start-up hook costs a process that never imports a runtime almost nothing.

Two finders, both on `sys.meta_path`:

- `when_imported(name, callback)`: the exact module; the callback runs once it has executed.
- `when_first_imported(names, callback)`: the first find of any of a few top-level names (the
  runtimes' packages, "torch", "triton"): the callback runs before that import goes on, so
  that it can register `when_imported` hooks for the modules below it. A session's child
  process arms its adapters this way (`cacheaudit.startup`), knowing the names from its
  environment, without reading a spec.

This module imports nothing but builtins (`sys`, `os` and `_thread` are loaded before `site`
runs; `threading`, `typing` or `contextlib` would cost every Python process of a session about
17, 10 and 1 ms). A problem in a callback is reported once on stderr and never breaks the
import: never `warnings.warn`, since under `-W error` (or pytest's filterwarnings = error) a
warning raised from a post-import hook would fail the user's import.
"""

from __future__ import annotations

import os
import sys
from _thread import RLock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence
    from types import ModuleType
    from typing import Any

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = RLock()
_resolving: set[str] = set()


def _report(problem: str) -> None:
    try:
        from cacheaudit.problems import report_problem

        report_problem(problem)
    except Exception:  # noqa: BLE001 - reporting never breaks the user's import
        pass


class _HookedLoader:
    """Runs the real loader, then the hooks registered for the module. (Plain classes: the
    import protocol needs no `importlib.abc` base, which would cost every start-up ~30 ms.)"""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_hooks(self._name, module)

    def __getattr__(self, name: str) -> object:
        # Loaders carry extras (get_resource_reader, is_package, ...) that importers ask for.
        return getattr(self._loader, name)


def _find_past(finder: object, fullname: str, path: Sequence[str] | None,
               target: ModuleType | None) -> Any:
    """The spec the finders after ours on `sys.meta_path` give for `fullname`."""
    for other in sys.meta_path:
        if other is finder or isinstance(other, _FirstImportTrigger):
            continue
        find_spec = getattr(other, "find_spec", None)
        if find_spec is None:
            continue
        spec = find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


class _PostImportFinder:
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> Any:
        if fullname not in _hooks or fullname in _resolving:
            return None
        _resolving.add(fullname)
        try:
            spec = _find_past(self, fullname, path, target)
        finally:
            _resolving.discard(fullname)
        if spec is None:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


_FINDER = _PostImportFinder()


def _run_hooks(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # noqa: BLE001 - an adapter never breaks the import
            _report(f"could not hook {name}: {type(exc).__name__}: {exc}")


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


class _FirstImportTrigger:
    """Fires its callback at the first find of one of `names` (top-level module names).

    It stays on `sys.meta_path` after firing, answering None: removing an entry while the
    import system iterates the list would make that import skip the finder after it. The
    callback inserts `_FINDER` ahead of it, which this iteration has passed already, so the
    import under way is handed to `_FINDER` here (the name itself may be hooked: "triton")."""

    def __init__(self, names: Collection[str], callback: Callable[[], None]) -> None:
        self.names = frozenset(names)
        self.callback: Callable[[], None] | None = callback

    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> Any:
        if fullname not in self.names:
            return None
        with _lock:
            self.fire()
        return _FINDER.find_spec(fullname, path, target)

    def fire(self) -> None:
        callback, self.callback = self.callback, None
        if callback is None:
            return
        try:
            callback()
        except Exception as exc:  # noqa: BLE001 - an adapter never breaks the import
            _report(f"could not arm the adapters: {type(exc).__name__}: {exc}")


def when_first_imported(names: Collection[str], callback: Callable[[], None]) -> None:
    """Call `callback()` once: now if one of the top-level `names` is imported already, else
    at the first import of any of them, before it runs."""
    trigger = _FirstImportTrigger(names, callback)
    if any(name in sys.modules for name in trigger.names):
        trigger.fire()
        return
    with _lock:
        sys.meta_path.insert(0, trigger)


def forget_hooks() -> None:
    with _lock:
        _hooks.clear()
        for finder in list(sys.meta_path):
            if finder is _FINDER or isinstance(finder, _FirstImportTrigger):
                sys.meta_path.remove(finder)


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork() stays held forever in the child.
    global _lock
    _lock = RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
