"""Settings from `[tool.cacheaudit]` in pyproject.toml, in one table with their defaults.

Precedence, lowest first: 1. the defaults below; 2. `[tool.cacheaudit]` of the nearest
pyproject.toml at or above the working directory; 3. command-line options (and the
CACHEAUDIT_LEDGER variable, which stands for `--ledger`).

Paths in the table (`ledger`, `paths`, `include-dirs`) are read as the project means them
wherever the command runs: `~` is expanded, and a relative path is taken from the
pyproject.toml's directory.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cacheaudit.exceptions import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib

FAIL_ON_CHOICES = ("error", "warning", "info", "never")


def fail_on_problem(value: str, where: str) -> str | None:
    """What is wrong with a fail-on setting `where` gave (an option, a configuration key), in
    one line; None when it is one of FAIL_ON_CHOICES."""
    if value in FAIL_ON_CHOICES:
        return None
    return f"{where} must be one of {', '.join(FAIL_ON_CHOICES)}, not {value!r}"


@dataclass
class Settings:
    fail_on: str = "error"
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    ledger: str | None = None
    reconstruct: bool = True
    verify_keys: bool = False
    redact_argv: bool = True
    """Credentials in recorded command lines stored as "<redacted>" (docs/security.md); a
    recording session exports `false` as CACHEAUDIT_REDACT_ARGV=0 to the job."""
    include_dirs: list[str] = field(default_factory=list)
    """Include trees of installed libraries a scan cannot find on its own (`--include-dir`):
    DeepGEMM's `deep_gemm/include`, for entries built without recording."""


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
    from cacheaudit.ledger import default_ledger_path

    if option:
        return os.path.abspath(os.path.expanduser(os.fspath(option)))
    return settings.ledger or default_ledger_path()


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


def load_settings(start: str | None = None) -> Settings:
    settings = Settings()
    path = find_pyproject(start)
    if path is None:
        return settings
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read it: {exc}") from exc
    table = data.get("tool", {}).get("cacheaudit")
    if table is None:
        return settings
    apply_table(settings, table, path)
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
    if problem := fail_on_problem(settings.fail_on, f"{path}: [tool.cacheaudit] fail-on"):
        raise ConfigError(problem)
    base = os.path.dirname(os.path.abspath(path))
    if settings.ledger:
        settings.ledger = resolve_path(settings.ledger, base)
    settings.paths = [resolve_path(p, base) for p in settings.paths]
    settings.include_dirs = [resolve_path(p, base) for p in settings.include_dirs]

