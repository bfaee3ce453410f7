"""The words of the environment registry: key statuses, categories, variables and the builders
that declare them.

A `Variable` is one compile-affecting environment variable with what each runtime does with it.
The module that defines a variable (the core for generic ones such as `CPATH`, a runtime's
`environment` module for its own) builds it with `variable()`; a runtime that reads a variable
defined elsewhere says what it does with it through a `Reading` built by `reads()`. The registry
(`cacheaudit.envvars.declarations.Registry`, built by `cacheaudit.envvars.registry()`) merges
the two and checks every runtime id they name.

Stdlib only, and cheap to import: the shim builds the registry once per compile.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import NamedTuple

from cacheaudit.exceptions import UsageError

SHIM = "shim"
"""The core's own pseudo-runtime: a plain compiler invocation seen by the shim, no runtime known.
It has no key at all, so nothing is in it."""

CATEGORIES: tuple[str, ...] = (
    "include-path",         # adds directories to the header search
    "compiler-flags",       # adds or changes compiler/assembler options
    "compiler-choice",      # picks the compiler binary (or a compiler vs a runtime compiler)
    "toolkit",              # locates a toolkit, its headers and tools
    "toolchain-behaviour",  # read by gcc/ld themselves (ccache keys them)
    "locale",               # language of compiler diagnostics (ccache keys them)
    "jit-config",           # a runtime setting not covered by a finer category
    "cache-location",       # where the cache lives; changes no binary
    "cache-control",        # bypasses or disables a cache layer; changes no binary
    "build-tracking",       # changes what the build system tracks, not the binary
    "build-parallelism",    # number of compile jobs
    "build-only",           # read while building the runtime itself, not at JIT time
    "launch-config",        # read at kernel launch, not at compile
    "print-only",           # prints or dumps extra files; changes no binary
)
"""The core's categories; a runtime may declare more (its `CATEGORIES`), which change output."""

NO_OUTPUT_CATEGORIES = frozenset({
    "cache-location", "cache-control", "build-tracking", "build-parallelism", "build-only",
    "launch-config", "print-only", "locale",
})
"""Categories whose variables cannot change a compiled binary, only where it lives, whether it
is looked up, what is printed, or how many jobs run."""


class KeyStatus(str, enum.Enum):
    """Whether a variable's value enters a runtime's cache key."""

    IN_KEY = "in-key"
    NOT_IN_KEY = "not-in-key"
    UNKNOWN = "unknown"


IN = KeyStatus.IN_KEY
OUT = KeyStatus.NOT_IN_KEY
UNK = KeyStatus.UNKNOWN


class EnvVarsError(UsageError, ValueError):
    """A runtime, flavour, prefix or declaration the registry does not know: one line, no
    traceback."""


def _frozen_map(data: Mapping[str, object] | None) -> Mapping:
    return MappingProxyType(dict(data or {}))


@dataclass(frozen=True)
class Variable:
    """One compile-affecting environment variable and what each runtime does with it.

    `status` maps a runtime id (or "runtime:variant") to its KeyStatus. A runtime that is not
    listed is UNKNOWN: the references do not say that it reads the variable, which for another
    runtime's family (a compiler runtime's knob seen by a driver-based runtime) usually means it
    is never read, but we do not claim so. `ignored_by` lists runtimes (or variants) known not to
    read it at all (a runtime compiler that ignores `CPATH`); for them the variable is trivially
    not in the key and changes nothing. `affects_output` is False where no value can change a
    compiled binary (cache roots, prints). `notes` qualify a status per runtime ("only its
    `--version` text is keyed").
    """

    name: str
    category: str
    description: str
    status: Mapping[str, KeyStatus] = field(default_factory=dict)
    ignored_by: frozenset[str] = frozenset()
    notes: Mapping[str, str] = field(default_factory=dict)
    affects_output: bool = True
    source: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", _frozen_map(self.status))
        object.__setattr__(self, "notes", _frozen_map(self.notes))
        object.__setattr__(self, "ignored_by", frozenset(self.ignored_by))

    def __hash__(self) -> int:
        return hash(self.name)

    @property
    def runtimes(self) -> frozenset[str]:
        """The runtimes the registry says read this variable (in any variant)."""
        return frozenset(key.split(":", 1)[0] for key in self.status)

    def status_for(self, runtime: str, variant: str | None = None) -> KeyStatus:
        keys = [f"{runtime}:{variant}", runtime] if variant else [runtime]
        for key in keys:
            if key in self.status:
                return self.status[key]
            if key in self.ignored_by:
                return OUT
        return UNK

    def ignored(self, runtime: str, variant: str | None = None) -> bool:
        if variant and f"{runtime}:{variant}" in self.status:
            return False
        return (variant is not None and f"{runtime}:{variant}" in self.ignored_by) or (
            runtime in self.ignored_by
        )

    def note_for(self, runtime: str, variant: str | None = None) -> str:
        if variant and f"{runtime}:{variant}" in self.notes:
            return self.notes[f"{runtime}:{variant}"]
        return self.notes.get(runtime, "")

    def keys(self) -> Iterable[str]:
        """Every runtime id (or "runtime:variant") the variable names: for validation."""
        return (*self.status, *self.ignored_by, *self.notes)


class Reading(NamedTuple):
    """What one runtime says about a variable defined elsewhere (a generic row such as `CPATH`).

    The registry merges it into the variable: `status`, `ignored_by` and `notes` as in
    `Variable`, keyed by the declaring runtime's id or "runtime:variant"; `description` is
    appended to the variable's description as written (with its own leading punctuation: ": ",
    "; "), `source` to its source after "; ", each only where the runtime adds a fact or a
    citation the row does not already hold. Built by `reads()`. A NamedTuple, not a dataclass:
    every shim process that records a compile builds the registry.
    """

    name: str
    status: Mapping[str, KeyStatus]
    ignored_by: frozenset[str]
    notes: Mapping[str, str]
    source: str = ""
    description: str = ""

    def keys(self) -> Iterable[str]:
        return (*self.status, *self.ignored_by, *self.notes)


def _statuses(name: str, in_key: Iterable[str], not_in_key: Iterable[str],
              unknown: Iterable[str]) -> dict[str, KeyStatus]:
    status: dict[str, KeyStatus] = {}
    for keys, value in ((in_key, IN), (not_in_key, OUT), (unknown, UNK)):
        for key in keys:
            if key in status:
                raise EnvVarsError(f"{name}: {key} classified twice")
            status[key] = value
    return status


def variable(
    name: str,
    category: str,
    description: str,
    *,
    in_key: Iterable[str] = (),
    not_in_key: Iterable[str] = (),
    unknown: Iterable[str] = (),
    ignored_by: Iterable[str] = (),
    notes: Mapping[str, str] | None = None,
    affects_output: bool | None = None,
    source: str = "",
) -> Variable:
    """A variable the declaring module defines, with the statuses of the runtimes it knows.

    `affects_output` defaults to what the category says (NO_OUTPUT_CATEGORIES). Runtime ids are
    checked when the registry is built, against the runtimes that are registered.
    """
    status = _statuses(name, in_key, not_in_key, unknown)
    if affects_output is None:
        affects_output = category not in NO_OUTPUT_CATEGORIES
    return Variable(name, category, description, status, frozenset(ignored_by), notes or {},
                    affects_output, source)


def reads(
    name: str,
    *,
    in_key: Iterable[str] = (),
    not_in_key: Iterable[str] = (),
    unknown: Iterable[str] = (),
    ignored_by: Iterable[str] = (),
    notes: Mapping[str, str] | None = None,
    source: str = "",
    description: str = "",
) -> Reading:
    """A runtime's statuses, notes and ignored variants for a variable defined elsewhere."""
    return Reading(name, MappingProxyType(_statuses(name, in_key, not_in_key, unknown)),
                   frozenset(ignored_by), _frozen_map(notes), source, description)
