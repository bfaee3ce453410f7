"""The DeepSeek family's environment: the `<PREFIX>_JIT_*` names DeepJIT, DeepGEMM and DeepEP
read, as registry variables, and how a setting resolves under an environment.

`JIT_FAMILY` is the `Family` the three runtimes declare (their `environment` modules list it in
`FAMILIES`): it turns a name such as `DG_JIT_DEBUG` into a variable with each flavour's key
status (from the table in `cacheaudit.runtimes._deepseek.settings`), defines the names DeepGEMM
used before its rename (`DG_CACHE_DIR`, ...), says which settings pick the compiler, and gives a
snapshot the settings in effect.

Resolution follows DeepJIT's utils/env.hpp: `<PREFIX>_<SUFFIX>`, then the global `DJ_<SUFFIX>`,
then the default; DeepGEMM <= 2.6 and DeepEP's EPv2 JIT read only their own prefix. Every value
returned goes through `redact`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from cacheaudit.envvars import (
    NO_OUTPUT_CATEGORIES,
    OUT,
    UNK,
    EnvVarsError,
    Family,
    KeyStatus,
    Variable,
    redact,
)
from cacheaudit.runtimes._deepseek.settings import (
    FLAVOUR_NAMES,
    FLAVOUR_PREFIX,
    FLAVOUR_RUNTIME,
    FLAVOURS,
    JIT_PREFIXES,
    JIT_SUFFIXES,
    LEGACY_NAME_SUFFIX,
    NOT_READ,
    PREFIX_RUNTIMES,
    PY_SRC,
    SUFFIX_ROWS,
    JitRule,
    JitSuffix,
    ReadAt,
)

__all__ = [
    "FLAVOURS",
    "FLAVOUR_NAMES",
    "JIT_FAMILY",
    "JIT_PREFIXES",
    "JIT_SUFFIXES",
    "NOT_READ",
    "JitFamily",
    "JitRule",
    "JitSuffix",
    "ResolvedSetting",
    "custom_parts",
    "custom_prefixes_in",
    "jit_prefixes_in",
    "parse_jit_bool",
    "parse_jit_int",
    "resolve_jit_setting",
    "resolve_jit_settings",
]


# --------------------------------------------------------------------------------------------
# The family's names as registry variables
# --------------------------------------------------------------------------------------------

_FAMILY_FLAVOURS: Mapping[str, tuple[tuple[str, str], ...]] = MappingProxyType({
    # prefix -> ((flavour, status key), ...)
    "DG": (("deepjit", "deepjit"), ("deepgemm", "deepgemm"),
           ("deepgemm-python", "deepgemm:python")),
    "EP": (("deepjit", "deepjit"), ("deepep", "deepep")),
    "DJ": (("deepjit", "deepjit"),),
})

_PREFIX_SET = frozenset(JIT_PREFIXES)
_FAMILY_HEADS = frozenset(f"{p}_JIT_" for p in JIT_PREFIXES)
_FAMILY_HEAD_LEN = 7  # len("DG_JIT_"): every known prefix has two letters
if {len(head) for head in _FAMILY_HEADS} != {_FAMILY_HEAD_LEN}:
    raise AssertionError("JIT_PREFIXES must all have the same length")


def _family_parts(name: str) -> tuple[str, str] | None:
    """`DG_JIT_DEBUG` -> ("DG", "JIT_DEBUG"); None when not a family name. No regex: hot path."""
    if len(name) > _FAMILY_HEAD_LEN and name[:_FAMILY_HEAD_LEN] in _FAMILY_HEADS:
        return name[:2], name[3:]
    return None


_CUSTOM_PREFIX_RE = re.compile(r"[A-Z][A-Z0-9_]*")
_MARKER = "_JIT_"


def custom_parts(name: str) -> tuple[str, str] | None:
    """`MYLIB_JIT_DEBUG` -> ("MYLIB", "JIT_DEBUG") for a prefix other than DG, EP and DJ that a
    library built on DeepJIT may have chosen (`deep_jit::Config`), when the suffix is one of
    the table's that applies to it; None otherwise. Only known suffixes count: `<X>_JIT_<Y>` is
    a common shape (PYTORCH_JIT_LOG_LEVEL), and only DeepJIT's own settings say DeepJIT."""
    prefix, marker, rest = name.partition(_MARKER)
    if not marker or not rest or prefix in _PREFIX_SET:
        return None
    spec = JIT_SUFFIXES.get(_MARKER[1:] + rest)
    if spec is None or not spec.applies_to(prefix) or not _CUSTOM_PREFIX_RE.fullmatch(prefix):
        return None
    return prefix, spec.suffix


def custom_prefixes_in(env: Mapping[str, str]) -> list[str]:
    """The prefixes other than DG, EP and DJ with a known `<P>_JIT_*` setting set in `env`, in
    name order."""
    return sorted({parts[0] for name in env if _MARKER in name
                   and (parts := custom_parts(name)) is not None})


def _family_variable(prefix: str, spec: JitSuffix) -> Variable:
    status: dict[str, KeyStatus] = {}
    notes: dict[str, str] = {}
    ignored: set[str] = set()
    # One name serves every flavour of its prefix: it changes no binary only when no flavour
    # that reads it can change one with it.
    reading: list[JitRule] = []
    if spec.applies_to(prefix):
        # A prefix of a library's choosing is read by DeepJIT alone.
        for flavour, key in _FAMILY_FLAVOURS.get(prefix, (("deepjit", "deepjit"),)):
            rule = spec.rule(flavour)
            if rule is None:
                continue
            if rule is NOT_READ:
                ignored.add(key)
                continue
            reading.append(rule)
            status[key] = rule.status
            for variant, value in rule.variants.items():
                status[f"{key}:{variant}"] = value
            if rule.note:
                notes[key] = rule.note
    if prefix == "DJ":
        # DeepGEMM <= 2.6 and DeepEP's EPv2 JIT read only their own prefix: no DJ_ fallback.
        ignored.update(("deepgemm", "deepep"))
    return Variable(f"{prefix}_{spec.suffix}", spec.category, spec.description, status,
                    frozenset(ignored), notes, spec.category not in NO_OUTPUT_CATEGORIES
                    and (not reading or any(rule.changes_binary for rule in reading)),
                    spec.source)


def _legacy_variable(name: str) -> Variable:
    spec = JIT_SUFFIXES[LEGACY_NAME_SUFFIX[name]]
    rule = spec.deepgemm_python
    status = {"deepgemm:python": rule.status} if rule and rule is not NOT_READ else {}
    return Variable(
        name, spec.category,
        f"DeepGEMM name before the 2025-05-07 rename (bfe983c) of DG_{spec.suffix}: "
        f"{spec.description}",
        status, frozenset({"deepgemm", "deepjit"}),
        {"deepgemm:python": "read only by Python JIT revisions before bfe983c (2025-05-07); "
                            "later DeepGEMM ignores it (sglang #6073)"},
        spec.category not in NO_OUTPUT_CATEGORIES, PY_SRC)




def _unknown_suffix_variable(name: str, prefix: str) -> Variable:
    # A suffix outside the table still belongs to the family (a new DeepJIT setting, a typo the
    # user wants to see): UNKNOWN for the prefix's runtimes, category "jit-config".
    return Variable(
        name, "jit-config",
        f"a {prefix}_JIT_* setting cacheaudit's table does not know: effect and key status "
        "unknown (DeepJIT panics on values it cannot parse, ignores names it does not read)",
        {rt: UNK for rt in PREFIX_RUNTIMES[prefix]}, frozenset(), {}, True,
        "deepseek-jit.md §4 (utils/env.hpp lookup order)")


_COMPILER_SUFFIXES = tuple(f"_{s.suffix}" for s in SUFFIX_ROWS if s.compiler is not None)
_LEGACY_COMPILER_NAMES = frozenset(
    name for s in SUFFIX_ROWS if s.compiler is not None for name in s.legacy_names)


class JitFamily(Family):
    """`DG_JIT_*`, `EP_JIT_*` and `DJ_JIT_*`, with DeepGEMM's pre-rename names, and the known
    `<P>_JIT_*` settings of any other prefix (a library built on DeepJIT chooses its own)."""

    heads: Mapping[str, tuple[str, ...]] = MappingProxyType(
        {f"{prefix}_JIT_": runtimes for prefix, runtimes in PREFIX_RUNTIMES.items()})
    marker = _MARKER
    marker_readers = ("deepjit",)

    def claims(self, name: str) -> bool:
        return custom_parts(name) is not None
    settings_title = ("JIT settings in effect (`<PREFIX>_JIT_*`, then `DJ_JIT_*`, then the "
                      "default):")
    _SNAPSHOT_PREFIXES = ("DG", "EP")
    """The prefixes a snapshot resolves (DJ_ shows as their fallback)."""

    def variable(self, name: str) -> Variable | None:
        parts = _family_parts(name)
        if parts is None:
            custom = custom_parts(name)
            return None if custom is None else _family_variable(
                custom[0], JIT_SUFFIXES[custom[1]])
        prefix, suffix = parts
        spec = JIT_SUFFIXES.get(suffix)
        if spec is not None:
            return _family_variable(prefix, spec)
        return _unknown_suffix_variable(name, prefix)

    def exact(self) -> Iterator[Variable]:
        return (_legacy_variable(name) for name in LEGACY_NAME_SUFFIX)

    def expanded(self) -> Iterator[Variable]:
        for prefix in JIT_PREFIXES:
            for spec in SUFFIX_ROWS:
                variable = _family_variable(prefix, spec)
                if variable.status or variable.ignored_by:
                    yield variable

    def selects_compiler(self, name: str) -> bool:
        # Under any prefix: DeepJIT's Env reads `<PREFIX>_JIT_*` for whatever prefix a runtime
        # built on it was given, not only the three the registry lists.
        return name.endswith(_COMPILER_SUFFIXES) or name in _LEGACY_COMPILER_NAMES

    def snapshot_settings(self, env: Mapping[str, str]) -> list[dict[str, Any]]:
        settings = []
        for prefix in (*self._SNAPSHOT_PREFIXES, *custom_prefixes_in(env)):
            for setting in resolve_jit_settings(prefix, env):
                if setting.origin == "default" and setting.value is None:
                    continue
                settings.append({"setting": f"{prefix}_{setting.suffix}",
                                 "value": setting.value, "origin": setting.origin,
                                 "from": setting.name or "default"})
        return settings


JIT_FAMILY = JitFamily()
"""The one family object DeepJIT, DeepGEMM and DeepEP declare (the registry counts it once)."""


# --------------------------------------------------------------------------------------------
# Prefix resolution (DeepJIT utils/env.hpp; legacy flavours read only their own prefix)
# --------------------------------------------------------------------------------------------

SettingOrigin = Literal["prefixed", "fallback", "default"]


@dataclass(frozen=True)
class ResolvedSetting:
    """Where one `<PREFIX>_JIT_*` setting got its value, and what the runtime makes of it.

    `name` is the variable that supplied the value (None for the default); `value` is that
    variable's value, redacted, or the documented default. `parsed` is the typed value as the
    flavour would read it, `error` says why it cannot (DeepJIT panics on such a value; DeepGEMM
    <= 2.6 reads garbage). `ignored` names variables that are set but do not apply: a DJ_
    fallback shadowed by the prefixed name, a DJ_ name under a flavour without fallback, a
    pre-rename DeepGEMM name.
    """

    prefix: str
    suffix: str
    flavour: str
    name: str | None
    value: str | None
    origin: SettingOrigin
    default: str | None
    parsed: bool | int | str | None = None
    error: str | None = None
    status: KeyStatus = UNK
    read_at: ReadAt | None = None
    ignored: tuple[str, ...] = ()
    note: str = ""

    @property
    def variable(self) -> str:
        """The prefixed name the user would set."""
        return f"{self.prefix}_{self.suffix}"

    @property
    def is_fallback(self) -> bool:
        return self.origin == "fallback"

    @property
    def runtime(self) -> str:
        """The runtime id this flavour belongs to."""
        return FLAVOUR_RUNTIME[self.flavour][0]


_INT_RE = re.compile(r"-?[0-9]+")
_SSCANF_INT_RE = re.compile(r"\s*[-+]?[0-9]+")


def parse_jit_int(text: str, flavour: str = "deepjit",
                  bits: int = 64) -> tuple[int | None, str | None]:
    """An integer setting as the flavour reads it: (value, None) or (None, why it is invalid).

    DeepJIT (`parse_integer`, std::from_chars) takes the whole string: an optional '-' and
    digits, no '+', no blanks, in range, or it panics. DeepGEMM <= 2.6 uses sscanf("%d"), which
    takes a leading integer and ignores the rest, and leaves an uninitialised int (undefined
    result) when there is none. The Python JIT uses int().
    """
    if flavour == "deepjit":
        if not _INT_RE.fullmatch(text):
            return None, f"not an integer: {text!r} (DeepJIT panics: 'invalid value')"
        value = int(text)
        low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
        if not low <= value <= high:
            return None, f"out of range: {text!r} (DeepJIT panics: 'invalid value')"
        return value, None
    if flavour == "deepgemm-python":
        try:
            return int(text), None
        except ValueError:
            return None, f"not an integer: {text!r} (the Python JIT raises ValueError)"
    match = _SSCANF_INT_RE.match(text)
    if match is None:
        return None, (f"not an integer: {text!r} (DeepGEMM <= 2.6 reads it with sscanf into "
                      "an uninitialised int: the effect is undefined)")
    return int(match.group()), None


def parse_jit_bool(text: str, flavour: str = "deepjit") -> tuple[bool | None, str | None]:
    """A boolean setting as the flavour reads it: (value, None) or (None, why it is invalid).

    DeepJIT (`get_env<bool>`): true/yes/false/no in any case, else a whole-string integer,
    non-zero is true; anything else panics, which a user wants to know before the run does.
    Legacy flavours read an integer (see parse_jit_int).
    """
    if flavour == "deepjit":
        lowered = text.lower()
        if lowered in ("true", "yes"):
            return True, None
        if lowered in ("false", "no"):
            return False, None
    value, error = parse_jit_int(text, flavour)
    return (None, error) if value is None else (value != 0, None)


def _parse_typed(kind: str, text: str, flavour: str) -> tuple[bool | int | str | None, str | None]:
    if kind == "bool":
        return parse_jit_bool(text, flavour)
    if kind == "int":
        return parse_jit_int(text, flavour, bits=32)
    return text, None


def _check_flavour(prefix: str, flavour: str) -> None:
    if flavour not in FLAVOUR_RUNTIME:
        raise EnvVarsError(f"unknown flavour {flavour!r}; expected one of {', '.join(FLAVOURS)}")
    if not prefix or not prefix.replace("_", "").isalnum() or not prefix.isupper():
        raise EnvVarsError(f"invalid prefix {prefix!r}: an upper-case name such as DG, EP, DJ")
    required = FLAVOUR_PREFIX.get(flavour)
    if required is not None and prefix != required:
        raise EnvVarsError(f"flavour {flavour!r} reads only the {required}_ prefix, not {prefix}_")


def _normalise_suffix(suffix: str) -> str:
    suffix = suffix.strip().upper()
    return suffix if suffix.startswith("JIT_") else f"JIT_{suffix}"


def resolve_jit_setting(prefix: str, suffix: str, env: Mapping[str, str], *,
                        flavour: str = "deepjit", backend: str | None = None) -> ResolvedSetting:
    """Which variable supplies `<prefix>_<suffix>` under `flavour`, and with what value.

    DeepJIT (`Env::get`, utils/env.hpp): `<PREFIX>_<SUFFIX>` if set (even to ""), else
    `DJ_<SUFFIX>`, else the default; DJ is the global prefix, never a runtime's own. DeepGEMM
    <= 2.6 and DeepEP's EPv2 JIT read only their own prefix, with their own defaults. `suffix`
    may be given with or without its "JIT_" head; `backend` ("rocm", "ascend") picks a DeepJIT
    backend's key status where it differs from CUDA's.
    """
    prefix = prefix.strip().upper()
    _check_flavour(prefix, flavour)
    suffix = _normalise_suffix(suffix)
    spec = JIT_SUFFIXES.get(suffix)
    rule = spec.rule(flavour) if spec is not None and spec.applies_to(prefix) else None
    kind: str = spec.kind if spec is not None else "str"

    own = f"{prefix}_{suffix}"
    fallback = f"DJ_{suffix}" if flavour == "deepjit" and prefix != "DJ" else None
    ignored: list[str] = []
    name: str | None
    origin: SettingOrigin
    if own in env:
        name, origin = own, "prefixed"
        if fallback is not None and fallback in env:
            ignored.append(fallback)
    elif fallback is not None and fallback in env:
        name, origin = fallback, "fallback"
    else:
        name, origin = None, "default"
    if flavour != "deepjit" and f"DJ_{suffix}" in env:
        ignored.append(f"DJ_{suffix}")
    if prefix == "DG":
        ignored.extend(old for old in (spec.legacy_names if spec else ()) if old in env)

    default = rule.default if rule is not None and rule is not NOT_READ else None
    parsed: bool | int | str | None = None
    error: str | None = None
    if name is not None:
        raw = env[name]
        value: str | None = redact(name, raw)
        if kind in ("bool", "int"):
            parsed, error = _parse_typed(kind, raw, flavour)
        else:
            parsed = value
    else:
        value = default
        if default is not None and kind in ("bool", "int"):
            parsed, _ = _parse_typed(kind, default, flavour)
        elif default is not None:
            parsed = default

    if rule is NOT_READ:
        status, read_at, note = OUT, None, f"not read by the {flavour} flavour"
    elif rule is not None:
        status = rule.variants.get(backend, rule.status) if backend else rule.status
        read_at, note = rule.read_at, rule.note
    elif spec is None:
        status, read_at, note = UNK, None, "suffix not in cacheaudit's table"
    elif not spec.applies_to(prefix):
        status, read_at, note = UNK, None, f"a setting of {', '.join(spec.only_prefixes)} only"
    else:
        status, read_at, note = UNK, None, f"the references do not say how {flavour} reads it"
    return ResolvedSetting(prefix, suffix, flavour, name, value, origin, default, parsed, error,
                           status, read_at, tuple(ignored), note)


def resolve_jit_settings(prefix: str, env: Mapping[str, str], *, flavour: str = "deepjit",
                         backend: str | None = None) -> list[ResolvedSetting]:
    """Every setting the flavour reads for `prefix`, in table order, then unknown ones that are set.

    An unknown `<PREFIX>_JIT_*` (or, for DeepJIT, `DJ_JIT_*`) that is set comes last, UNKNOWN:
    the snapshot should show a misspelt variable rather than hide it.
    """
    prefix = prefix.strip().upper()
    _check_flavour(prefix, flavour)
    out: list[ResolvedSetting] = []
    for spec in SUFFIX_ROWS:
        rule = spec.rule(flavour)
        if rule is None or rule is NOT_READ or not spec.applies_to(prefix):
            continue
        out.append(resolve_jit_setting(prefix, spec.suffix, env, flavour=flavour,
                                       backend=backend))
    heads = [prefix] + (["DJ"] if flavour == "deepjit" and prefix != "DJ" else [])
    unknown = sorted({
        parts[1]
        for name in env
        if (parts := _family_parts(name) or _custom_split(name)) is not None
        and parts[0] in heads and parts[1] not in JIT_SUFFIXES
    })
    out.extend(resolve_jit_setting(prefix, suffix, env, flavour=flavour, backend=backend)
               for suffix in unknown)
    return out


def _custom_split(name: str) -> tuple[str, str] | None:
    # Any `<P>_JIT_<X>`, known suffix or not: resolving a prefix already chosen lists the
    # unknown settings set under it too.
    prefix, marker, rest = name.partition(_MARKER)
    return (prefix, _MARKER[1:] + rest) if marker and rest and prefix not in _PREFIX_SET else None


def jit_prefixes_in(env: Mapping[str, str]) -> list[str]:
    """The family prefixes (DG, EP, DJ) with any registry variable of theirs set, in that order.

    Counts `<PREFIX>_JIT_*` names and exact registry names of the prefix (DG_CACHE_DIR,
    EP_NUM_TOPK_IDX_BITS), so a DeepGEMM configured only with pre-rename names is still seen.
    """
    from cacheaudit.envvars import registry

    exact = registry().variables
    found: set[str] = set()
    for name in env:
        parts = _family_parts(name)
        if parts is not None:
            found.add(parts[0])
            continue
        head = name.partition("_")[0]
        if head in _PREFIX_SET and name in exact:
            found.add(head)
    return [p for p in JIT_PREFIXES if p in found]
