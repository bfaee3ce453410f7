"""The compile-affecting environment: the registry's machinery, the generic rows, redaction.

A JIT runtime's cache key covers some of the variables that change a compile and silently misses
the rest (`NVCC_PREPEND_FLAGS`, `CPATH` and the host compiler change the binary while most keys
hold only source, flags and a compiler version). To report such an *implicit input*
(CA201/CA202) the audit needs to know, for each variable and runtime, whether the runtime keys
it. That table is kept like ccache's config.cpp keeps its keys: explicit rows, defaults in one
place, each row citing where its classification comes from. Nothing is guessed: where the
references are silent the status is UNKNOWN.

This package holds what is runtime-neutral: the vocabulary (`KeyStatus`, `Variable`, the row
builders `variable` and `reads`), the generic rows (`CPATH`, `NVCC_*`, `PATH`, the locale, ...)
with the shim's statuses only, the `Registry` that merges them with what each runtime declares
in its package's `environment` module, and redaction. `registry()` assembles the registry the
program uses from the generic rows and, for each runtime spec (`cacheaudit.spec.specs()`), the
module its `environment` field names: its `ROWS` (variables the runtime defines, and its readings
of generic ones), its optional `FAMILIES` (name patterns such as `<PREFIX>_JIT_*`) and
`CATEGORIES`, with the spec's `variants` and `compiler_settings`. The module-level functions
(`lookup`, `classify`, `compile_environment`, ...) ask that registry. A family's own settings
(the DeepSeek `<PREFIX>_JIT_*` resolution) are that family's:
`cacheaudit.runtimes._deepseek.environment`.

It is also the allowlist of what cacheaudit stores: `compile_environment` returns only registry
variables, never `HOME`, `USER` or a cloud credential, and every value it returns goes through
`redact`.

Stdlib only, and cheap to import: the shim calls `compile_environment` once per compile.
"""

from __future__ import annotations

import functools
import importlib

# Not `typing`, and none of the submodules below at import: a process that needs only the
# redaction or the shim's table (`envvars.kept`: the shim, an in-process adapter's record) must
# not pay for the vocabulary, the generic rows and the registry's machinery (~3-5 ms).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

    from cacheaudit.envvars.declarations import Declaration, Family, Registry
    from cacheaudit.envvars.generic import (
        GENERIC_ROWS,
        SELECTS_COMPILER,
        SHELLS_OUT,
        shells_out,
    )
    from cacheaudit.envvars.redaction import (
        REDACTED,
        looks_secret_name,
        looks_secret_value,
        redact,
        redact_argv,
    )
    from cacheaudit.envvars.vocabulary import CATEGORIES as GENERIC_CATEGORIES
    from cacheaudit.envvars.vocabulary import (
        IN,
        NO_OUTPUT_CATEGORIES,
        OUT,
        SHIM,
        UNK,
        EnvVarsError,
        KeyStatus,
        Reading,
        Variable,
        reads,
        variable,
    )

    # Provided by __getattr__ on first use (see there).
    VARIABLES: Mapping[str, Variable]
    RUNTIMES: tuple[str, ...]
    VARIANTS: Mapping[str, tuple[str, ...]]
    CATEGORIES: tuple[str, ...]

_FROM_SUBMODULES: dict[str, tuple[str, str]] = {
    **{name: ("generic", name) for name in ("GENERIC_ROWS", "SELECTS_COMPILER", "SHELLS_OUT",
                                            "shells_out")},
    **{name: ("redaction", name) for name in ("REDACTED", "looks_secret_name",
                                              "looks_secret_value", "redact", "redact_argv")},
    **{name: ("declarations", name) for name in ("Declaration", "Family", "Registry")},
    **{name: ("vocabulary", name) for name in ("IN", "NO_OUTPUT_CATEGORIES", "OUT", "SHIM", "UNK",
                                               "EnvVarsError", "KeyStatus", "Reading", "Variable",
                                               "reads", "variable")},
    "GENERIC_CATEGORIES": ("vocabulary", "CATEGORIES"),
}
"""The package's names that its submodules define: imported on first use (`__getattr__`)."""

__all__ = [
    "CATEGORIES",
    "GENERIC_CATEGORIES",
    "GENERIC_ROWS",
    "IN",
    "NO_OUTPUT_CATEGORIES",
    "OUT",
    "REDACTED",
    "RUNTIMES",
    "SELECTS_COMPILER",
    "SHELLS_OUT",
    "SHIM",
    "UNK",
    "VARIABLES",
    "VARIANTS",
    "Declaration",
    "EnvVarsError",
    "Family",
    "KeyStatus",
    "Reading",
    "Registry",
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
    "reads",
    "redact",
    "redact_argv",
    "registry",
    "selects_compiler",
    "settings_title",
    "shells_out",
    "snapshot_settings",
    "variable",
]


def _declaration(spec: Any) -> Declaration:
    from cacheaudit.envvars.declarations import Declaration

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
    """The generic rows merged with every registered runtime's declarations, built once.

    Fails open: a runtime whose declaration cannot be read or contradicts the others (a plugin's
    row naming another runtime, a variable defined twice) is left out, and `problem(runtime)`
    says why, so that its entries are reported unverified (CA501) while every other runtime is
    judged as usual."""
    from cacheaudit.envvars.declarations import Registry
    from cacheaudit.envvars.vocabulary import EnvVarsError
    from cacheaudit.spec import specs

    declarations: list[Declaration] = []
    problems: dict[str, str] = {}
    for spec in specs():
        try:
            declarations.append(_declaration(spec))
        except Exception as exc:  # noqa: BLE001 - reported per runtime
            problems[spec.name] = f"its environment declaration cannot be read: " \
                                  f"{type(exc).__name__}: {exc}"
    try:
        built = Registry(declarations)
    except EnvVarsError:
        # Find the declarations that break it, one at a time: only on this rare path, since
        # every compile through the shim builds the registry.
        accepted: list[Declaration] = []
        for declaration in declarations:
            try:
                Registry([*accepted, declaration])
            except EnvVarsError as exc:
                problems[declaration.runtime] = f"its environment declaration is rejected: {exc}"
                continue
            accepted.append(declaration)
        built = Registry(accepted)
    for declaration in declarations:
        if not declaration.rows and not declaration.families:
            problems.setdefault(declaration.runtime, "it declares no environment variables")
    built.problems.update(problems)
    return built


def problem(runtime: str) -> str | None:
    """Why the registry cannot judge `runtime`'s environment, or None when it can."""
    known = registry()
    if runtime in known.problems:
        return known.problems[runtime]
    return None if runtime in known.runtimes else f"no runtime {runtime!r} is declared"


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
    if name in _FROM_SUBMODULES:
        submodule, attribute = _FROM_SUBMODULES[name]
        value = getattr(importlib.import_module(f"{__name__}.{submodule}"), attribute)
        globals()[name] = value  # later look-ups skip this function
        return value
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
