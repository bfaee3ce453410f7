"""Settings from `[tool.cacheaudit]` in pyproject.toml, in one table with their defaults.

Precedence, lowest first: 1. the defaults below; 2. `[tool.cacheaudit]` of the nearest
pyproject.toml at or above the working directory; 3. command-line options (and the
CACHEAUDIT_LEDGER variable, which stands for `--ledger`).

A pyproject.toml that cannot be read as TOML (a syntax error, bytes that are not UTF-8) stops
the command only when it mentions cacheaudit: one without any `[tool.cacheaudit]` belongs to
other tools, and is skipped with a warning (`Settings.warnings`). A `fail-on` in the table is
checked where it is used: a valid `--fail-on` on the command line overrides an invalid one.

Paths in the table (`ledger`, `paths`, `include-dirs`) are read as the project means them
wherever the command runs: `~` is expanded, and a relative path is taken from the
pyproject.toml's directory.
"""

from __future__ import annotations

import os
import sys

from cacheaudit.exceptions import ConfigError

# Not `typing` nor `collections.abc`: every session reads its settings at its start.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

FAIL_ON_CHOICES = ("error", "warning", "info", "never")


def fail_on_problem(value: str, where: str) -> str | None:
    """What is wrong with a fail-on setting `where` gave (an option, a configuration key), in
    one line; None when it is one of FAIL_ON_CHOICES."""
    if value in FAIL_ON_CHOICES:
        return None
    return f"{where} must be one of {', '.join(FAIL_ON_CHOICES)}, not {value!r}"


class Settings:
    """The settings in effect. (A plain class, not a dataclass: every process that prepares a
    recording session reads one, and `dataclasses` imports `inspect`, ~10 ms.)"""

    fail_on: str
    select: list[str]
    ignore: list[str]
    paths: list[str]
    ledger: str | None
    reconstruct: bool
    verify_keys: bool
    redact_argv: bool
    """Credentials in recorded command lines stored as "<redacted>" (docs/security.md); a
    recording session exports `false` as CACHEAUDIT_REDACT_ARGV=0 to the job."""
    include_dirs: list[str]
    """Include trees of installed libraries a scan cannot find on its own (`--include-dir`):
    DeepGEMM's `deep_gemm/include`, for entries built without recording."""
    source: str | None
    """The pyproject.toml the table came from, for messages about its values."""
    warnings: list[str]
    """One line each: what was skipped and why (a pyproject.toml of other tools that cannot be
    parsed). The command prints them on stderr and goes on."""

    def __init__(self, fail_on: str = "error", select: list[str] | None = None,
                 ignore: list[str] | None = None, paths: list[str] | None = None,
                 ledger: str | None = None, reconstruct: bool = True,
                 verify_keys: bool = False, redact_argv: bool = True,
                 include_dirs: list[str] | None = None, source: str | None = None,
                 warnings: list[str] | None = None) -> None:
        self.fail_on = fail_on
        self.select = [] if select is None else select
        self.ignore = [] if ignore is None else ignore
        self.paths = [] if paths is None else paths
        self.ledger = ledger
        self.reconstruct = reconstruct
        self.verify_keys = verify_keys
        self.redact_argv = redact_argv
        self.include_dirs = [] if include_dirs is None else include_dirs
        self.source = source
        self.warnings = [] if warnings is None else warnings

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Settings):
            return NotImplemented
        return vars(self) == vars(other)

    __hash__ = None  # type: ignore[assignment] - mutable, as a dataclass's

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={value!r}" for name, value in vars(self).items())
        return f"Settings({fields})"


# key in [tool.cacheaudit] -> (attribute, expected type)
_TABLE: dict[str, tuple[str, type]] = {
    "fail-on": ("fail_on", str),
    "select": ("select", list),
    "ignore": ("ignore", list),
    "paths": ("paths", list),
    "ledger": ("ledger", str),
    "reconstruct": ("reconstruct", bool),
    "verify-keys": ("verify_keys", bool),
    "include-dirs": ("include_dirs", list),
    "redact-argv": ("redact_argv", bool),
}


def resolve_path(value: str, base: str) -> str:
    """A path from the settings table: `~` expanded, then joined to `base` when relative."""
    return os.path.normpath(os.path.join(base, os.path.expanduser(value)))


def ledger_location(option: str | os.PathLike[str] | None, settings: Settings) -> str:
    """The ledger a command uses: `--ledger` (or CACHEAUDIT_LEDGER), else `[tool.cacheaudit]`
    ledger, else the default place."""
    if option:
        return os.path.abspath(os.path.expanduser(os.fspath(option)))
    if settings.ledger:
        return settings.ledger
    from cacheaudit.ledger import default_ledger_path

    return default_ledger_path()


def effective_fail_on(option: str | None, settings: Settings) -> str:
    """`--fail-on` when given, else the table's `fail-on`, else the default; raises ConfigError
    (one line naming where the value came from) when the one used is not a severity."""
    if option is not None:
        where = "--fail-on"
        value = option
    else:
        where = (f"{settings.source}: [tool.cacheaudit] fail-on" if settings.source
                 else "fail-on")
        value = settings.fail_on
    if problem := fail_on_problem(value, where):
        raise ConfigError(problem)
    return value


def find_pyproject(start: str | None = None) -> str | None:
    directory = os.path.abspath(start or os.getcwd())
    while True:
        candidate = os.path.join(directory, "pyproject.toml")
        if os.path.isfile(candidate):
            return candidate
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def load_settings(start: str | None = None, *, table_only: bool = False) -> Settings:
    """The settings of the nearest pyproject.toml. `table_only`: a file that cannot hold a
    `[tool.cacheaudit]` is not parsed, and gives no warning (a recording session's start, in
    every Python process of a project: parsing TOML imports `tomllib`, `typing`, `re` and
    `datetime`, ~15 ms, for the table that most projects do not have)."""
    settings = Settings()
    path = find_pyproject(start)
    if path is None:
        return settings
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it: {exc.strerror or exc}") from exc
    if table_only and not may_hold_table(raw):
        return settings
    # Imported only now: a process with no pyproject.toml above it (most of a session's) never
    # parses TOML.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - 3.10
        import tomli as tomllib
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        problem = (f"{path}: not UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                   "TOML files must be UTF-8")
        return _unreadable(settings, raw, problem)
    except tomllib.TOMLDecodeError as exc:
        return _unreadable(settings, raw, f"{path}: not valid TOML {_toml_place(exc)}")
    tool = data.get("tool", {})
    # TOML's tables are dicts (`tomllib` makes nothing else of them).
    table = tool.get("cacheaudit") if isinstance(tool, dict) else None
    if table is None:
        return settings
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.cacheaudit] must be a table, not {table!r} "
                          "(write `[tool.cacheaudit]` and its settings below it)")
    apply_table(settings, table, path)
    return settings


def may_hold_table(raw: bytes) -> bool:
    """Whether TOML text can hold `[tool.cacheaudit]` in any spelling: the key is written out
    (bare, quoted, dotted or inline), or it may hide behind a basic string's escapes."""
    return b"cacheaudit" in raw or b"\\u" in raw or b"\\U" in raw


def _toml_place(error: Exception) -> str:
    """Where the parser stopped, in words that do not change with the Python release (the
    parser's own wording does)."""
    import re  # only for a pyproject.toml that cannot be parsed

    found = re.search(r"at line (\d+), column (\d+)", str(error))
    return f"at line {found[1]}, column {found[2]}" if found else f"({error})"


def _unreadable(settings: Settings, raw: bytes, problem: str) -> Settings:
    """A pyproject.toml that does not parse: ours to stop at when it mentions cacheaudit (its
    settings would be lost), another tool's business otherwise: a warning, and the defaults."""
    if b"cacheaudit" in raw:
        raise ConfigError(f"{problem}; fix it: its [tool.cacheaudit] cannot be read")
    settings.warnings.append(f"{problem}; it has no [tool.cacheaudit], so it is skipped")
    return settings


def apply_table(settings: Settings, table: Mapping[str, Any], path: str) -> None:
    for key, value in table.items():
        if key not in _TABLE:
            known = ", ".join(sorted(_TABLE))
            raise ConfigError(f"{path}: [tool.cacheaudit] has no setting {key!r} (known: {known})")
        attribute, expected = _TABLE[key]
        if not isinstance(value, expected) or (expected is list and not all(
                isinstance(v, str) for v in value)):
            raise ConfigError(f"{path}: [tool.cacheaudit] {key} must be a {expected.__name__}"
                              f"{' of strings' if expected is list else ''}, not {value!r}")
        setattr(settings, attribute, value)
    settings.source = path
    base = os.path.dirname(os.path.abspath(path))
    if settings.ledger:
        settings.ledger = resolve_path(settings.ledger, base)
    settings.paths = [resolve_path(p, base) for p in settings.paths]
    settings.include_dirs = [resolve_path(p, base) for p in settings.include_dirs]

