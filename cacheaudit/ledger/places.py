"""Where a ledger lives when nothing says otherwise, and the files beside it: its spool, SQLite's
and the shim's companions. Standard library `os` only: the start-up hook asks these of every
session's process, most of which never open the ledger."""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


def default_ledger_path(env: Mapping[str, str] | None = None) -> str:
    """CACHEAUDIT_LEDGER, else `$XDG_CACHE_HOME/cacheaudit/ledger.db`, else ~/.cache/..."""
    env = os.environ if env is None else env
    explicit = env.get("CACHEAUDIT_LEDGER")
    if explicit:
        return os.path.abspath(os.path.expanduser(explicit))
    cache_home = env.get("XDG_CACHE_HOME")
    if not cache_home or not os.path.isabs(cache_home):
        # The XDG spec: a relative value is invalid and must be ignored.
        cache_home = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache_home, "cacheaudit", "ledger.db")


IDENTITY_MEMO_SUFFIX = ".compilers.json"
"""The compilers' identities file beside a ledger (`<ledger>.compilers.json`, the shim's memo)."""

ENVIRONMENT_TABLE_SUFFIX = ".environment.json"
"""The registry's table of kept names beside a ledger (`<ledger>.environment.json`, written by
the first shim: `envvars.kept`)."""

COMPANION_SUFFIXES = ("-wal", "-shm", IDENTITY_MEMO_SUFFIX, ENVIRONMENT_TABLE_SUFFIX)
"""The files SQLite and the shim keep beside a ledger: removed with it when `combine` takes it
in."""


def spool_dir(ledger_path: str) -> str:
    """Where records kept aside for the ledger at `ledger_path` wait (`cacheaudit.ledger.spool`)."""
    return ledger_path + ".spool"


def pending_spooled(ledger_path: str) -> int:
    """How many records wait in the spool of the ledger at `ledger_path`."""
    try:
        return sum(1 for n in os.listdir(spool_dir(ledger_path)) if n.endswith(".json"))
    except OSError:
        return 0
