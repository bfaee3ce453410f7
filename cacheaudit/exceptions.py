"""One exception family for cacheaudit, mapped to documented exit codes by the CLI."""

from __future__ import annotations


class ExitCode:
    """Process exit statuses of the `cacheaudit` command (documented in docs/cli.md)."""

    CLEAN = 0
    FINDINGS = 1
    USAGE = 2
    INTERNAL = 3
    UNTRUSTED = 4  # the rebuild oracle met commands this user did not seal, and no --yes
    NOT_EXECUTABLE = 126  # `run`: the command exists but cannot be executed, as shells say
    NOT_FOUND = 127  # `run`: no such command, as shells say
    INTERRUPTED = 130  # 128 + SIGINT, the shell's convention for Ctrl-C
    TERMINATED = 143  # 128 + SIGTERM: killed children, removed temporary directories, then out
    BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away (`| head`), as shells say


class CacheAuditError(Exception):
    """Base of every error cacheaudit raises on purpose; the CLI prints it as one line."""

    exit_code = ExitCode.INTERNAL


class UsageError(CacheAuditError):
    """The user asked for something that cannot be done as asked (bad path, bad option value)."""

    exit_code = ExitCode.USAGE


class LedgerError(UsageError):
    """A ledger file cannot be used: not a cacheaudit ledger, newer than this code, unreadable."""


class LedgerBusy(LedgerError):
    """Another process has held the ledger's write lock for longer than this one may wait."""


class LedgerReadOnly(LedgerError):
    """The ledger can be read but not written (a read-only mount, a file without write
    permission, another user's ledger)."""


class ConfigError(UsageError):
    """A `[tool.cacheaudit]` setting or CACHEAUDIT_* variable has a value we cannot use."""


class CommandNotRun(CacheAuditError):
    """`cacheaudit run`: the command could not be started; the status is the shell's (127 when
    there is no such command, 126 when it cannot be executed)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class TokenizeError(ValueError):
    """An argument string that the compiler itself would reject (an unbalanced quote, say)."""


class CacheAuditWarning(UserWarning):
    """Something went wrong inside cacheaudit that the user's run survives."""
