"""The environment registry: generic rows plus what each runtime declares, merged and checked.

A `Registry` is built from the generic rows (`cacheaudit.envvars.generic`) and one
`Declaration` per runtime: the variables the runtime defines, its readings of variables defined
elsewhere, the name families it reads (`Family`: names such as `<PREFIX>_JIT_<SUFFIX>` that no
table can list), the categories it adds, and its compiler settings. It answers what today's
callers ask: which variable a name is, whether a runtime keys it, whether it is an implicit
input, and which of an environment's variables a compile record keeps.

`cacheaudit.envvars.registry()` assembles the one the program uses from the runtimes' specs,
read by name: the core names no runtime. Stdlib only; `compile_environment`
runs once per compile in the shim, so its loop is a dict lookup per variable.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from cacheaudit.envvars.generic import GENERIC_ROWS, SELECTS_COMPILER
from cacheaudit.envvars.redaction import redact
from cacheaudit.envvars.vocabulary import (
    CATEGORIES,
    OUT,
    SHIM,
    UNK,
    EnvVarsError,
    KeyStatus,
    Reading,
    Variable,
)


class Family:
    """Names a runtime reads by pattern, resolved on demand: the documented defaults.

    `heads` maps each name head the family owns ("XY_JIT_") to the runtimes that read names
    under it; a name longer than a head and starting with it is the family's. A family shared by
    several runtimes is declared by each and counted once.
    """

    heads: Mapping[str, tuple[str, ...]] = MappingProxyType({})
    settings_title: str = ""
    """How a snapshot heads the family's settings in effect."""
    marker: str = ""
    """A part every name the family claims outside its `heads` holds ("_JIT_"): names without
    it are never offered to `claims`, which keeps the per-compile loop a substring test. Empty
    (the default): the family claims no name outside its heads."""
    marker_readers: tuple[str, ...] = ()
    """The runtimes that read the names the family `claims`."""

    def claims(self, name: str) -> bool:
        """Whether `name`, under none of the heads and holding `marker`, is the family's all the
        same (DeepJIT's `<P>_JIT_*` for a prefix P a library chose). Default: no."""
        return False

    def variable(self, name: str) -> Variable | None:
        """The variable for `name`, one of the family's names; None when it is not one."""
        return None

    def exact(self) -> Iterable[Variable]:
        """Variables with a fixed name the family also defines (a name before a rename)."""
        return ()

    def expanded(self) -> Iterable[Variable]:
        """Every name of the family the family can classify, for docs and checks."""
        return ()

    def selects_compiler(self, name: str) -> bool:
        """Whether `name` is one of the family's settings that pick the compiler binary."""
        return False

    def snapshot_settings(self, env: Mapping[str, str]) -> list[dict[str, Any]]:
        """The family's settings in effect under `env`, for a snapshot: each a dict with
        `setting`, `value` (redacted), `origin` and `from` (the variable that supplied it or
        "default")."""
        return []


class Declaration(NamedTuple):
    """What one runtime declares to the registry (built from its spec and environment module)."""

    runtime: str
    variants: tuple[str, ...] = ()
    rows: tuple[Variable | Reading, ...] = ()
    families: tuple[Family, ...] = ()
    categories: tuple[str, ...] = ()
    compiler_settings: tuple[str, ...] = ()
    """Variables that name the runtime's compiler (its spec's `compiler_settings`)."""


class Registry:
    """Generic rows and runtime declarations, merged; every key checked against the runtimes."""

    def __init__(self, declarations: Iterable[Declaration],
                 generic: Iterable[Variable] = GENERIC_ROWS) -> None:
        declared = tuple(declarations)
        self.problems: dict[str, str] = {}
        """Runtimes the registry cannot judge, and why (filled in by whoever builds it)."""
        self.runtimes: tuple[str, ...] = (*(d.runtime for d in declared), SHIM)
        if len(set(self.runtimes)) != len(self.runtimes):
            raise EnvVarsError(f"a runtime declared twice: {', '.join(self.runtimes)}")
        self.variants: Mapping[str, tuple[str, ...]] = MappingProxyType(
            {d.runtime: d.variants for d in declared if d.variants})
        self._runtime_set = frozenset(self.runtimes)
        extra = [c for d in declared for c in d.categories if c not in CATEGORIES]
        self.categories: tuple[str, ...] = (*CATEGORIES, *dict.fromkeys(extra))
        families: dict[int, Family] = {}
        for d in declared:
            for family in d.families:
                families.setdefault(id(family), family)
        self.families: tuple[Family, ...] = tuple(families.values())

        rows: dict[str, Variable] = {}
        for row in generic:
            self._check_keys(row.name, row.keys(), (SHIM,))
            self._add(rows, row)
        readings: list[Reading] = []
        for d in declared:
            for row in d.rows:
                self._check_keys(row.name, row.keys(), (d.runtime,))
                if isinstance(row, Reading):
                    readings.append(row)
                else:
                    self._add(rows, row)
        for family in self.families:
            for row in family.exact():
                self._add(rows, row)
        for reading in readings:
            if reading.name not in rows:
                raise EnvVarsError(f"{reading.name}: read by a runtime, defined by nobody")
            rows[reading.name] = _merged(rows[reading.name], reading)
        for row in rows.values():
            if row.category not in self.categories:
                raise EnvVarsError(f"{row.name}: unknown category {row.category!r}")
        self.variables: Mapping[str, Variable] = MappingProxyType(rows)
        """Every variable with an exact name; family names are resolved by `lookup`."""
        self._exact: dict[str, Variable] = dict(rows)  # a plain dict for the per-compile loop

        self._heads: dict[str, Family] = {}
        self._head_runtimes: dict[str, tuple[str, ...]] = {}
        for family in self.families:
            for head, readers in family.heads.items():
                if head in self._heads:
                    raise EnvVarsError(f"two families own the names under {head}")
                self._heads[head] = family
                self._head_runtimes[head] = tuple(readers)
        self._head_lengths = tuple(sorted({len(head) for head in self._heads}))
        self._all_heads = frozenset(self._heads)
        self._claiming = tuple(f for f in self.families if f.marker)
        self._compiler_names = SELECTS_COMPILER | frozenset(
            name for d in declared for name in d.compiler_settings)
        self.lookup = functools.lru_cache(maxsize=1024)(self._lookup)
        self._read_by = functools.lru_cache(maxsize=None)(self._names_read_by)

    # -------------------------------------------------------------------------- building

    def _check_keys(self, name: str, keys: Iterable[str], owners: tuple[str, ...]) -> None:
        """A declaration names only its own runtime and that runtime's declared variants."""
        for key in keys:
            runtime, _, variant = key.partition(":")
            if runtime not in owners:
                raise EnvVarsError(f"{name}: {key} is not the declaring runtime's "
                                   f"({', '.join(owners)})")
            if variant and variant not in self.variants.get(runtime, ()):
                raise EnvVarsError(f"{name}: {runtime} declares no variant {variant!r}")

    @staticmethod
    def _add(rows: dict[str, Variable], row: Variable) -> None:
        if row.name in rows:
            raise EnvVarsError(f"{row.name}: defined twice in the environment registry")
        rows[row.name] = row

    # -------------------------------------------------------------------------- queries

    def check_runtime(self, runtime: str) -> None:
        """Raise EnvVarsError for a runtime id nobody declared."""
        if runtime not in self._runtime_set:
            raise EnvVarsError(f"unknown runtime {runtime!r}; expected one of "
                               f"{', '.join(self.runtimes)}")

    def _family_of(self, name: str) -> Family | None:
        for length in self._head_lengths:
            if len(name) > length:
                family = self._heads.get(name[:length])
                if family is not None:
                    return family
        for family in self._claiming:
            if family.marker in name and family.claims(name):
                return family
        return None

    def _claimed(self, name: str, runtime: str | None) -> bool:
        """Whether a family claims `name` outside its heads (and, given a runtime, whether
        that runtime reads it)."""
        return any(family.marker in name and family.claims(name)
                   and (runtime is None or runtime in family.marker_readers)
                   for family in self._claiming)

    def _lookup(self, name: str) -> Variable | None:
        """The registry's entry for `name`, or None when cacheaudit does not track it.

        A family name the family's table does not know still belongs to the family (a new
        setting, a typo the user wants to see): the family says what it makes of it.
        """
        exact = self._exact.get(name)
        if exact is not None:
            return exact
        family = self._family_of(name)
        return family.variable(name) if family is not None else None

    def iter_variables(self) -> Iterator[Variable]:
        """Every registry variable, each family's names expanded: for docs."""
        yield from self._exact.values()
        for family in self.families:
            for row in family.expanded():
                if row.name not in self._exact:
                    yield row

    def classify(self, name: str, runtime: str, variant: str | None = None) -> KeyStatus:
        """Whether `runtime` (optionally a variant such as "rocm") keys `name`; UNKNOWN if
        unsaid, and for a runtime nobody declared (an entry of a runtime this installation does
        not know is unverified, not a crash)."""
        row = self.lookup(name)
        if row is None:
            return UNK
        return row.status_for(runtime, variant)

    def affects_output(self, name: str, runtime: str, variant: str | None = None) -> bool | None:
        """Whether a change of `name` can change what `runtime` compiles (None: unknown)."""
        row = self.lookup(name)
        if row is None:
            return None
        if row.ignored(runtime, variant):
            return False
        if not row.affects_output:
            return False
        return None if row.status_for(runtime, variant) is UNK else True

    def is_implicit_input(self, name: str, runtime: str, variant: str | None = None) -> bool:
        """True when `name` changes `runtime`'s binary but not its key: the CA201/CA202
        subject. False for a runtime nobody declared."""
        return (self.classify(name, runtime, variant) is OUT
                and self.affects_output(name, runtime, variant) is True)

    def selects_compiler(self, name: str) -> bool:
        """Whether `name` picks the compiler binary itself, whose identity is judged instead."""
        # Families are asked even outside their heads: a setting's name before a rename is
        # theirs too.
        return name in self._compiler_names or any(
            family.selects_compiler(name) for family in self.families)

    def _names_read_by(self, runtime: str) -> tuple[frozenset[str], frozenset[str]]:
        names = frozenset(v.name for v in self._exact.values() if runtime in v.runtimes)
        heads = frozenset(h for h, readers in self._head_runtimes.items() if runtime in readers)
        return names, heads

    def compile_environment(self, env: Mapping[str, str],
                            runtime: str | None = None) -> dict[str, str]:
        """The registry variables set in `env`, sorted by name, values redacted: what the shim
        stores.

        `runtime` narrows the subset to variables the registry says that runtime reads (its
        status lists it, or it is under a family head the runtime reads). When unsure, pass
        None: an extra variable costs bytes, a missing one loses evidence. One dict lookup per
        variable in `env`; the redaction regex runs only on the few values kept.
        """
        exact: Mapping[str, object] = self._exact
        heads: frozenset[str] = self._all_heads
        if runtime is not None:
            self.check_runtime(runtime)
            exact, heads = self._read_by(runtime)
        kept: list[tuple[str, str]] = []
        lengths = self._head_lengths
        claiming = bool(self._claiming)
        if len(lengths) == 1:
            # The usual case, inlined: this loop runs over every variable of every compile.
            head_len = lengths[0]
            for name, value in env.items():
                if (name in exact or (len(name) > head_len and name[:head_len] in heads)
                        or (claiming and self._claimed(name, runtime))):
                    kept.append((name, redact(name, value)))
        else:
            for name, value in env.items():
                if (name in exact or any(len(name) > n and name[:n] in heads for n in lengths)
                        or (claiming and self._claimed(name, runtime))):
                    kept.append((name, redact(name, value)))
        kept.sort()
        return dict(kept)

    def snapshot_settings(self, env: Mapping[str, str]) -> list[dict[str, Any]]:
        """Every family's settings in effect under `env` (see `Family.snapshot_settings`)."""
        return [s for family in self.families for s in family.snapshot_settings(env)]

    def settings_title(self) -> str:
        """How a snapshot heads the settings in effect: the families' own words."""
        titles = [f.settings_title for f in self.families if f.settings_title]
        return " ".join(titles) or "Settings in effect:"


def _merged(row: Variable, reading: Reading) -> Variable:
    """`row` with a runtime's reading of it folded in; a key said twice is a declaration bug."""
    status = dict(row.status)
    for key, value in reading.status.items():
        if key in status:
            raise EnvVarsError(f"{row.name}: {key} classified twice")
        status[key] = value
    notes = dict(row.notes)
    for key, note in reading.notes.items():
        if key in notes:
            raise EnvVarsError(f"{row.name}: two notes for {key}")
        notes[key] = note
    source = "; ".join(s for s in (row.source, reading.source) if s)
    return Variable(row.name, row.category, row.description + reading.description, status,
                    row.ignored_by | reading.ignored_by, notes, row.affects_output, source)
