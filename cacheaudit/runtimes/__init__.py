"""The registry: every runtime cacheaudit understands, one line each.

A runtime is one package here (`cacheaudit/runtimes/<name>/`): its `spec.py` declares it (see
`cacheaudit.spec`), and the modules the spec names hold its layout reader, key recipe, policy and
adapter. This module is the only place that lists runtimes. It loads a spec's modules only when
they are asked for: the start-up hook reads the specs (plain data) to arm the adapters, and
imports no reader, policy or adapter, nor any runtime.

Runtimes outside this package (a plugin, a toy runtime in tests) are named, as dotted package
paths separated by ":", in `CACHEAUDIT_RUNTIMES`; each is read like a built-in one.

Adding a runtime: see "Adding a runtime" in docs/design.md.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cacheaudit.adapter import Adapter
    from cacheaudit.layout import Layout
    from cacheaudit.policy import Policy
    from cacheaudit.spec import RuntimeSpec

_PACKAGES = (
    "deepjit",     # deepseek-ai/DeepJIT, and DeepGEMM 2.8+ / DeepEP-Ascend built on it
    "deepgemm",    # DeepGEMM up to 2.6 (C++ JIT) and its 2025 Python JIT
    "deepep",      # DeepEP's EPv2 JIT (DeepGEMM's recipe)
    "torch_ext",   # torch.utils.cpp_extension load / load_inline
    "triton",
    "nvrtc",       # NVRTC through cuda-python
    "cupy",
    "cuda_core",   # cuda.core Program and its program cache
    "flashinfer",
)

EXTRA_VARIABLE = "CACHEAUDIT_RUNTIMES"


def _package_names() -> list[str]:
    extra = [name for name in os.environ.get(EXTRA_VARIABLE, "").split(":") if name]
    return [f"{__name__}.{name}" for name in _PACKAGES] + extra


@functools.cache
def specs() -> tuple[RuntimeSpec, ...]:
    """Every runtime's spec, built-in ones first, in registry order."""
    import dataclasses

    found = []
    for package in _package_names():
        declared = importlib.import_module(f"{package}.spec").SPEC
        found.append(dataclasses.replace(declared, package=package))
    return tuple(found)


def spec(runtime: str) -> RuntimeSpec | None:
    """The spec of the runtime with this id, None for a runtime nobody declared."""
    return _by_name().get(runtime)


@functools.cache
def _by_name() -> dict[str, RuntimeSpec]:
    return {s.name: s for s in specs()}


def names() -> list[str]:
    return [s.name for s in specs()]


def _attribute(module: str, attribute: str) -> Any:
    return getattr(importlib.import_module(module), attribute)


# ------------------------------------------------------------------------------ layouts, policies


@functools.cache
def layouts() -> tuple[Layout, ...]:
    """One reader per layout, in registry order (runtimes that share a layout list it once)."""
    seen: dict[str, Layout] = {}
    for declared in specs():
        if declared.layout is not None:
            module = declared.module(declared.layout)
            if module not in seen:
                seen[module] = _attribute(module, "LAYOUT")
    return tuple(seen.values())


def layout_for(name: str) -> Layout:
    for layout in layouts():
        if layout.layout == name:
            return layout
    raise KeyError(f"no layout named {name!r}")


@functools.cache
def policy_for(runtime: str) -> Policy:
    """The policy that judges `runtime`'s entries; KeyError for a runtime without one."""
    declared = spec(runtime)
    if declared is None or declared.policy is None:
        raise KeyError(f"no policy for runtime {runtime!r}")
    return _attribute(declared.module(declared.policy), "POLICIES")[runtime]  # type: ignore[no-any-return]


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


def _report(problem: str) -> None:
    from cacheaudit.recorder import report_problem

    report_problem(problem)


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
    from cacheaudit.adapter import when_imported

    known = _adapters()
    armed = []
    for name in names or known:
        declared = known.get(name)
        if declared is None or declared.adapter_imports is None:
            _report(f"no adapter named {name!r} (known: {', '.join(known)})")
            continue
        when_imported(declared.adapter_imports, _installer(name))
        armed.append(name)
    return armed


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
        with contextlib.suppress(Exception):  # flush() never raises; a plugin's might
            hooked.flush()


def deactivate() -> None:
    """Uninstall every adapter and drop pending hooks."""
    from cacheaudit.adapter import forget_hooks

    flush_all()
    forget_hooks()
    for hooked in _loaded_adapters():
        # Unconditionally: `installed()` can be False while a hook of ours sits under another
        # tool's (Triton's listener slot), and exactly then ours must be switched to
        # pass-through. Each uninstall is idempotent.
        with contextlib.suppress(Exception):
            hooked.uninstall()
