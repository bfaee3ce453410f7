"""The environment registry the program uses: the generic rows plus every runtime's declarations.

`registry()` builds it once, from the core's generic rows (`cacheaudit.envvars`) and, for each
spec in the runtime registry, the module its `environment` field names: that module's `ROWS`
(variables the runtime defines, and its readings of generic ones), its optional `FAMILIES`
(name patterns such as `<PREFIX>_JIT_*`) and `CATEGORIES`, with the spec's `variants` and
`compiler_settings`. A runtime added to the registry is in the environment registry with nothing
else changed.

The module-level functions keep the names and signatures callers used before the registry was
split by runtime, so a call site reads `from cacheaudit.runtimes import environment as envvars`
and nothing else changes. `VARIABLES`, `RUNTIMES`, `VARIANTS` and `CATEGORIES` are computed on
first use. Settings of one family (the DeepSeek `<PREFIX>_JIT_*` resolution) are that family's:
`cacheaudit.runtimes._deepseek.environment`.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from cacheaudit.envvars import (
    REDACTED,
    Declaration,
    EnvVarsError,
    KeyStatus,
    Registry,
    Variable,
    looks_secret_name,
    looks_secret_value,
    redact,
)

if TYPE_CHECKING:
    # Provided by __getattr__ on first use (see there).
    VARIABLES: Mapping[str, Variable]
    RUNTIMES: tuple[str, ...]
    VARIANTS: Mapping[str, tuple[str, ...]]
    CATEGORIES: tuple[str, ...]

__all__ = [
    "CATEGORIES",
    "REDACTED",
    "RUNTIMES",
    "VARIABLES",
    "VARIANTS",
    "EnvVarsError",
    "KeyStatus",
    "Variable",
    "affects_output",
    "check_runtime",
    "classify",
    "compile_environment",
    "is_implicit_input",
    "iter_variables",
    "looks_secret_name",
    "looks_secret_value",
    "lookup",
    "redact",
    "registry",
    "selects_compiler",
    "settings_title",
    "snapshot_settings",
]


def _declaration(spec: Any) -> Declaration:
    rows: tuple[Any, ...] = ()
    families: tuple[Any, ...] = ()
    categories: tuple[str, ...] = ()
    if spec.environment is not None:
        module = importlib.import_module(spec.module(spec.environment))
        rows = tuple(module.ROWS)
        # FAMILIES and CATEGORIES are optional: most runtimes read only names a table lists.
        families = tuple(getattr(module, "FAMILIES", ()))
        categories = tuple(getattr(module, "CATEGORIES", ()))
    return Declaration(spec.name, tuple(spec.variants), rows, families, categories,
                       tuple(setting.name for setting in spec.compiler_settings))


@functools.cache
def registry() -> Registry:
    """The generic rows merged with every registered runtime's declarations, built once."""
    from cacheaudit import runtimes

    return Registry(_declaration(spec) for spec in runtimes.specs())


def __getattr__(name: str) -> Any:
    # Computed on first use: importing this module must not load every runtime's declarations.
    if name == "VARIABLES":
        return registry().variables
    if name == "RUNTIMES":
        return registry().runtimes
    if name == "VARIANTS":
        return registry().variants
    if name == "CATEGORIES":
        return registry().categories
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def lookup(name: str) -> Variable | None:
    """The registry's entry for `name`, or None when cacheaudit does not track it."""
    return registry().lookup(name)


def iter_variables() -> Iterator[Variable]:
    """Every registry variable, each family's names expanded: for docs."""
    return registry().iter_variables()


def check_runtime(runtime: str) -> None:
    """Raise EnvVarsError (one line) for a runtime id nobody declared."""
    registry().check_runtime(runtime)


def classify(name: str, runtime: str, variant: str | None = None) -> KeyStatus:
    """Whether `runtime` (optionally a variant such as "rocm") keys `name`; UNKNOWN if unsaid
    or for a runtime nobody declared."""
    return registry().classify(name, runtime, variant)


def affects_output(name: str, runtime: str, variant: str | None = None) -> bool | None:
    """Whether a change of `name` can change what `runtime` compiles (None: unknown)."""
    return registry().affects_output(name, runtime, variant)


def is_implicit_input(name: str, runtime: str, variant: str | None = None) -> bool:
    """True when `name` changes `runtime`'s binary but not its key: the CA201/CA202 subject."""
    return registry().is_implicit_input(name, runtime, variant)


def selects_compiler(name: str) -> bool:
    """Whether `name` picks the compiler binary itself, whose identity is judged instead."""
    return registry().selects_compiler(name)


def compile_environment(env: Mapping[str, str], runtime: str | None = None) -> dict[str, str]:
    """The registry variables set in `env`, sorted by name, values redacted: what the shim
    stores. `runtime` narrows it to what that runtime reads (EnvVarsError if nobody declared
    it)."""
    return registry().compile_environment(env, runtime)


def snapshot_settings(env: Mapping[str, str]) -> list[dict[str, Any]]:
    """The name families' settings in effect under `env`, for a snapshot."""
    return registry().snapshot_settings(env)


def settings_title() -> str:
    """How a snapshot heads the families' settings in effect."""
    return registry().settings_title()
