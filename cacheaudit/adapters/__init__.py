"""Adapters: in-process hooks, one module per runtime, and their activation.

Each adapter module exposes `ADAPTER`, an object with `runtime` (the runtime id), `module` (the
module whose import makes the runtime available: "triton", "torch.utils.cpp_extension", ...),
`install()`, `uninstall()` and `installed()`. Installing twice is a no-op, uninstalling restores
the runtime's originals, and both fail open: an adapter that cannot install says so once and
leaves the runtime as it was.

`activate()` installs every adapter whose runtime is already imported and arranges for the others
to install themselves right after their runtime is first imported (a post-import hook on
`sys.meta_path`), so that `import cacheaudit` never imports torch, triton or cuda.

Adding a runtime: a module here with an `ADAPTER`, and one line in `_MODULES`.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, Protocol

from cacheaudit.exceptions import CacheAuditWarning

# minijit (the reference runtime) is observed per runtime object, `adapters.minijit.install(rt)`.
_MODULES = ("torch_ext", "triton", "nvrtc", "cuda_core")


class Adapter(Protocol):
    runtime: str
    module: str

    def install(self) -> None: ...

    def uninstall(self) -> None: ...

    def installed(self) -> bool: ...

    # Optional: `flush()`, for adapters that batch what they record (hits on a hot path) and
    # must write it out before an audit reads the ledger.


def available() -> list[str]:
    return list(_MODULES)


def adapter(name: str) -> Adapter:
    if name not in _MODULES:
        raise KeyError(f"no adapter named {name!r} (known: {', '.join(_MODULES)})")
    return importlib.import_module(f"cacheaudit.adapters.{name}").ADAPTER  # type: ignore[no-any-return]


# ------------------------------------------------------------------------------ post-import hooks

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
            warnings.warn(f"cacheaudit: could not hook {name}: {type(exc).__name__}: {exc}",
                          CacheAuditWarning, stacklevel=2)


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


def _forget_hooks() -> None:
    with _lock:
        _hooks.clear()
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_FINDER)


# ------------------------------------------------------------------------------ activation


def activate(names: Sequence[str] | None = None) -> list[str]:
    """Install the named adapters (all by default) now or at their runtime's first import.
    Returns the names that were armed. Safe to call twice."""
    armed = []
    for name in names or _MODULES:
        try:
            hooked = adapter(name)
        except ModuleNotFoundError as exc:
            if exc.name == f"cacheaudit.adapters.{name}":
                continue  # registered ahead of its module
            warnings.warn(f"cacheaudit: adapter {name} unavailable: {exc}", CacheAuditWarning,
                          stacklevel=2)
            continue
        except Exception as exc:  # noqa: BLE001 - one broken adapter must not stop the rest
            warnings.warn(f"cacheaudit: adapter {name} unavailable: {exc}", CacheAuditWarning,
                          stacklevel=2)
            continue
        when_imported(hooked.module, lambda _module, hooked=hooked: hooked.install())
        armed.append(name)
    return armed


def flush_all() -> None:
    """Write out what batching adapters hold, before an audit reads the ledger."""
    for name in _MODULES:
        module = sys.modules.get(f"cacheaudit.adapters.{name}")
        flush = getattr(getattr(module, "ADAPTER", None), "flush", None)
        if flush is not None:
            with contextlib.suppress(Exception):
                flush()


def deactivate() -> None:
    """Uninstall every installed adapter and drop pending hooks."""
    flush_all()
    _forget_hooks()
    for name in _MODULES:
        module = sys.modules.get(f"cacheaudit.adapters.{name}")
        if module is None:
            continue
        with contextlib.suppress(Exception):
            if module.ADAPTER.installed():
                module.ADAPTER.uninstall()
