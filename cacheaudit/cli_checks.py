"""What the command line is given, checked before any work: each check refuses bad input with a
`UsageError` whose one line names the option, file or variable and what to fix (docs/cli.md,
"Bad input"); and how the command ends when its reader goes away."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from cacheaudit.exceptions import ExitCode, UsageError

if TYPE_CHECKING:
    import click

    from cacheaudit.audit import ScanResult


def as_given(value: object, option: str, variable: str) -> str:
    """An option's value as the user gave it, for a message: `VARIABLE=value` when it is the
    variable's (typer fills the option from it), else `--option value`."""
    given = os.environ.get(variable)
    return f"{variable}={given}" if given and str(value) == given else f"{option} {value}"


def refuse_conflicts(*conflicts: tuple[bool, str]) -> None:
    """The first of (condition, message) that holds, as a usage error."""
    for holds, message in conflicts:
        if holds:
            raise UsageError(message)


def check_timeout(seconds: float) -> None:
    if not seconds > 0:
        raise UsageError(f"--timeout must be more than 0 seconds, not {seconds:g}")


def check_selection(selected: list[str], ignored: list[str]) -> None:
    """A selected code that an ignored one covers leaves that selection empty: a contradiction,
    not a request (`--select CA1 --ignore CA101` is a request: CA1 but CA101)."""
    for code in selected:
        if covering := [i for i in ignored if code.startswith(i)]:
            raise UsageError(f"--select {code} and --ignore {covering[0]} contradict each other: "
                             f"every {code} finding is ignored; leave one out")


def check_ledger_directory(option: object, location: str) -> None:
    """A ledger path typed for one command (`--ledger`, CACHEAUDIT_LEDGER) must lie in an
    existing directory: a mistyped path must not leave a new directory tree behind."""
    directory = os.path.dirname(location)
    if not os.path.isdir(directory):
        raise UsageError(f"{as_given(option, '--ledger', 'CACHEAUDIT_LEDGER')}: no directory "
                         f"{directory} (create it, or fix the path)")


def check_directories(paths: list[str], option: str) -> None:
    """Directories the user named for an option (`--include-dir`): each must exist."""
    for path in paths:
        if not os.path.isdir(os.path.expanduser(path)):
            raise UsageError(f"{option} {path}: no such directory")


def check_new_directory(directory: Path) -> None:
    """A directory a command may create, but not its parents."""
    parent = directory.absolute().parent
    if not directory.is_dir() and not parent.is_dir():
        raise UsageError(f"{directory}: no directory {parent} (create it first, or fix the "
                         "path)")


def check_writable(path: Path) -> None:
    """Refuse an output file that cannot be written before any work is done for it."""
    directory = path.resolve().parent
    if path.is_dir():
        raise UsageError(f"cannot write {path}: it is a directory")
    if not directory.is_dir():
        raise UsageError(f"cannot write {path}: no directory {directory}")
    if not os.access(directory, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"cannot write {path}: permission denied")


def refuse_nothing_scanned(result: ScanResult, variables: list[str]) -> None:
    """A guard that scanned nothing must not pass: a cache variable naming no directory, or no
    root at all, is a usage error unless `--allow-empty`."""
    if result.missing_roots:
        name, value = result.missing_roots[0]
        raise UsageError(f"{name}={value}: no such directory, so that cache was not scanned "
                         "(fix the variable, or pass --allow-empty)")
    if not result.roots:
        raise UsageError(f"no cache root found: give a path, set one of {', '.join(variables)}, "
                         "or pass --allow-empty")


def usage_line(exc: click.ClickException) -> str:
    """click's usage error as one line: what is wrong, and where the help is."""
    context = getattr(exc, "ctx", None)
    where = f" (see `{context.command_path} -h`)" if context is not None else ""
    # typer's validation prefixes its reason with "Value error, ": not the user's business.
    message = exc.format_message().replace("Value error, ", "")
    return f"cacheaudit: error: {message}{where}\n"


def quiet_broken_pipe() -> int:
    """The reader of stdout went away (`cacheaudit report | head -1`): what was left unwritten
    goes nowhere, no traceback, and the status is the shell's for SIGPIPE."""
    with contextlib.suppress(OSError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    return ExitCode.BROKEN_PIPE


def is_broken_pipe(exc: BaseException) -> bool:
    """click and rich end a write to a closed pipe with `sys.exit(1)` inside their handler."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, BrokenPipeError):
            return True
        seen = seen.__context__
    return False
