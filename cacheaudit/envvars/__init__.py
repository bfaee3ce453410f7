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
in its package's `environment` module, and redaction. The registry the program uses, with
today's module-level functions (`lookup`, `classify`, `compile_environment`, ...), is assembled
from the runtimes' specs in `cacheaudit.runtimes.environment`.

It is also the allowlist of what cacheaudit stores: `compile_environment` returns only registry
variables, never `HOME`, `USER` or a cloud credential, and every value it returns goes through
`redact`.

Stdlib only, and cheap to import: the shim calls `compile_environment` once per compile.
"""

from __future__ import annotations

from typing import Any

from cacheaudit.envvars.generic import GENERIC_ROWS, SELECTS_COMPILER, SHELLS_OUT, shells_out
from cacheaudit.envvars.redaction import REDACTED, looks_secret_name, looks_secret_value, redact
from cacheaudit.envvars.registry import Declaration, Family, Registry
from cacheaudit.envvars.vocabulary import (
    CATEGORIES,
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

__all__ = [
    "CATEGORIES",
    "GENERIC_ROWS",
    "IN",
    "NO_OUTPUT_CATEGORIES",
    "OUT",
    "REDACTED",
    "SELECTS_COMPILER",
    "SHELLS_OUT",
    "SHIM",
    "UNK",
    "Declaration",
    "EnvVarsError",
    "Family",
    "KeyStatus",
    "Reading",
    "Registry",
    "Variable",
    "looks_secret_name",
    "looks_secret_value",
    "reads",
    "redact",
    "shells_out",
    "variable",
]

# Transition only, until cacheaudit/audit.py imports these from where they now live (its split
# is under way in another branch): the names it still reaches through this module, forwarded on
# first use. Imported by name at run time, never at import: the core does not depend on the
# registry of runtimes. Delete once audit.py no longer says `envvars.<name>` for them.
_MOVED = {
    "compile_environment": "cacheaudit.runtimes.environment",
    "is_implicit_input": "cacheaudit.runtimes.environment",
    "selects_compiler": "cacheaudit.runtimes.environment",
    "resolve_jit_settings": "cacheaudit.runtimes._deepseek.environment",
    "FLAVOUR_NAMES": "cacheaudit.runtimes._deepseek.environment",
}


def __getattr__(name: str) -> Any:
    module = _MOVED.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
