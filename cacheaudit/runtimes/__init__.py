"""The runtimes' code, found through their specs: layouts, policies, adapters and their activation.

A runtime is one package here (`cacheaudit/runtimes/<name>/`): its `spec.py` declares it, and the
modules the spec names hold its layout reader, key recipe, policy and adapter. The list of
runtimes is one line per runtime in `cacheaudit.spec.BUILT_IN` (the core reads the specs, which
are plain data, to assemble the environment registry); this module loads a spec's modules only
when they are asked for: the start-up hook arms the adapters from the specs and imports no
reader, policy or adapter, nor any runtime.

Adding a runtime: see "Adding a runtime" in docs/design.md.
"""

from __future__ import annotations

import os
import sys

from cacheaudit import spec as spec_module
from cacheaudit.plain import import_module, memoized
from cacheaudit.problems import report_problem
from cacheaudit.spec import EXTRA_VARIABLE, names, spec, specs

# Not `typing`, nor `functools`, `contextlib` or `collections.abc`: a session's first process
# reads the specs and the default roots through this module (`cacheaudit.plain`).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from types import ModuleType
    from typing import Any

    from cacheaudit.adapter import Adapter
    from cacheaudit.layout import Layout
    from cacheaudit.policy import Policy
    from cacheaudit.spec import RuntimeSpec

__all__ = ["EXTRA_VARIABLE", "activate", "adapter", "arming_text", "available", "deactivate",
           "default_roots", "flush_all", "layout_for", "layouts", "names", "policy_for", "reset",
           "spec", "specs"]


def reset() -> None:
    """Forget every spec, layout and policy loaded, and the environment registry built from them:
    the next call reads `CACHEAUDIT_RUNTIMES` and the specs again (for tests and plugins that
    change the set of runtimes within one process)."""
    from cacheaudit import envvars

    for cached in (spec_module.specs, spec_module.by_name, layouts, _layout_of, policy_for,
                   envvars.registry):
        cached.cache_clear()


def _attribute(module: str, attribute: str) -> Any:
    return getattr(import_module(module), attribute)


# ------------------------------------------------------------------------------ layouts, policies


@memoized
def layouts() -> tuple[Layout, ...]:
    """One reader per layout, in registry order (runtimes that share a layout list it once).
    A layout that cannot be loaded (a broken plugin) is left out, said once on stderr."""
    seen: dict[str, Layout] = {}
    for declared in specs():
        if declared.layout is not None:
            module = declared.module(declared.layout)
            if module not in seen and (layout := _layout_of(declared, module)) is not None:
                seen[module] = layout
    return tuple(seen.values())


@memoized
def _layout_of(declared: RuntimeSpec, module: str) -> Layout | None:
    try:
        return _attribute(module, "LAYOUT")
    except Exception as exc:  # noqa: BLE001 - one bad plugin never stops a scan
        _report_once(f"the layout of runtime {declared.name!r} cannot be loaded "
                     f"({module}): {type(exc).__name__}: {exc}")
        return None


def layouts_declaring(env: Mapping[str, str]) -> dict[str, tuple[Layout, ...]]:
    """Each default cache root under `env` that exists -> the layouts whose default roots
    name it, only those loaded: a session's observer reads a default root with the readers
    that declared it, and loads no other."""
    found: dict[str, dict[str, RuntimeSpec]] = {}
    for declared, module, root in _default_roots(env):
        if os.path.isdir(root):
            found.setdefault(root, {}).setdefault(module, declared)
    return {root: tuple(layout for module, declared in modules.items()
                        if (layout := _layout_of(declared, module)) is not None)
            for root, modules in found.items()}


def default_roots(env: Mapping[str, str]) -> list[str]:
    """Every layout's default cache roots under `env`, existing or not: what
    `layout.default_roots(env)` returns for each of `layouts()`, read from each spec's `roots`
    module (standard library only) without loading a reader; a spec without one has its layout
    loaded for it. A roots module that cannot be loaded or fails (a broken plugin) is left out,
    said once on stderr, as a layout that cannot be loaded is."""
    return [root for _declared, _module, root in _default_roots(env)]


def _default_roots(env: Mapping[str, str]) -> list[tuple[RuntimeSpec, str, str]]:
    """(the spec, its layout module, a default root) for `default_roots`."""
    found: list[tuple[RuntimeSpec, str, str]] = []
    seen: set[str] = set()
    for declared in specs():
        if declared.layout is None:
            continue
        layout_module = declared.module(declared.layout)
        if layout_module in seen:
            continue  # runtimes that share a layout share its roots (`layouts()` lists it once)
        seen.add(layout_module)
        try:
            if declared.roots is None:
                roots = _attribute(layout_module, "LAYOUT").default_roots(env)
            else:
                roots = _attribute(declared.module(declared.roots), "default_roots")(env)
        except Exception as exc:  # noqa: BLE001 - one bad plugin never stops a session
            _report_once(f"the default roots of runtime {declared.name!r} cannot be read "
                         f"({declared.roots or layout_module}): {type(exc).__name__}: {exc}")
            continue
        found.extend((declared, layout_module, root) for root in roots)
    return found


def layout_for(name: str) -> Layout:
    for layout in layouts():
        if layout.layout == name:
            return layout
    raise KeyError(f"no layout named {name!r}")


@memoized
def policy_for(runtime: str) -> Policy:
    """The policy that judges `runtime`'s entries. KeyError, with the reason, for a runtime
    without one or whose policy cannot be loaded (a broken plugin): its entries are then
    unverified (CA501), never a crash."""
    declared = spec(runtime)
    if declared is None or declared.policy is None:
        raise KeyError(f"no policy for runtime {runtime!r}")
    module = declared.module(declared.policy)
    try:
        return _attribute(module, "POLICIES")[runtime]  # type: ignore[no-any-return]
    except Exception as exc:
        raise KeyError(f"the policy of runtime {runtime!r} cannot be loaded ({module}): "
                       f"{type(exc).__name__}: {exc}") from exc


# ------------------------------------------------------------------------------ adapters


def _adapters() -> dict[str, RuntimeSpec]:
    return {s.package.rsplit(".", 1)[-1]: s for s in specs() if s.adapter is not None}


def available() -> list[str]:
    """The names of the adapters (the runtime packages that have one)."""
    return list(_adapters())


def adapter(name: str) -> Adapter:
    declared = _adapters().get(name)
    if declared is None or declared.adapter is None:
        raise KeyError(f"no adapter named {name!r} (known: {', '.join(_adapters())})")
    return _attribute(declared.module(declared.adapter), "ADAPTER")  # type: ignore[no-any-return]


@memoized
def _report_once(problem: str) -> None:
    report_problem(problem, prefix="")


def _installer(name: str) -> Callable[[ModuleType], None]:
    def install(_runtime: ModuleType) -> None:
        # The adapter module is imported only now, once its runtime is: most processes the
        # start-up hook arms never import one, and the adapters cost ~100 ms together.
        adapter(name).install()

    return install


def activate(names: Sequence[str] | None = None) -> list[str]:
    """Install the named adapters (all by default) now or at their runtime's first import.
    Returns the names that were armed. Safe to call twice. Imports no adapter module whose
    runtime is not imported yet."""
    from cacheaudit.importhooks import when_imported

    known = _adapters()
    armed = []
    for name in names or known:
        declared = known.get(name)
        if declared is None or declared.adapter_imports is None:
            report_problem(f"no adapter named {name!r} (known: {', '.join(known)})")
            continue
        when_imported(declared.adapter_imports, _installer(name))
        armed.append(name)
    return armed


def arming_text() -> str:
    """What a session tells its child processes (`CACHEAUDIT_ADAPTER_IMPORTS`) so that their
    start-up hook arms the adapters without reading a spec: the `CACHEAUDIT_RUNTIMES` these
    were read under, ";", then the top-level packages of the adapters' `adapter_imports`
    joined by ":". The first import of one of them reads the specs and arms them all."""
    import os

    tops = sorted({declared.adapter_imports.split(".", 1)[0] for declared in _adapters().values()
                   if declared.adapter_imports})
    return f"{os.environ.get(EXTRA_VARIABLE, '')};{':'.join(tops)}"


def _loaded_adapters() -> list[Adapter]:
    loaded = []
    for declared in _adapters().values():
        module = sys.modules.get(declared.module(declared.adapter or ""))
        if module is not None and hasattr(module, "ADAPTER"):
            loaded.append(module.ADAPTER)
    return loaded


def flush_all() -> None:
    """Write out what the adapters' hit buffers hold, before an audit reads the ledger."""
    for hooked in _loaded_adapters():
        try:  # noqa: SIM105 - not `contextlib`: every hooked process runs this at its exit
            hooked.flush()
        except Exception:  # noqa: BLE001 - flush() never raises; a plugin's might
            pass


def deactivate() -> None:
    """Uninstall every adapter and drop pending hooks."""
    import contextlib

    from cacheaudit.importhooks import forget_hooks

    flush_all()
    forget_hooks()
    for hooked in _loaded_adapters():
        # Unconditionally: `installed()` can be False while a hook of ours sits under another
        # tool's (Triton's listener slot), and exactly then ours must be switched to
        # pass-through. Each uninstall is idempotent.
        with contextlib.suppress(Exception):
            hooked.uninstall()
