"""What the ledger takes and gives besides the model's records: runs, test windows, attributions,
record ids, and where the ledger lives when nothing says otherwise."""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple


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

COMPANION_SUFFIXES = ("-wal", "-shm", IDENTITY_MEMO_SUFFIX)
"""The files SQLite and the shim keep beside a ledger: removed with it when `combine` takes it
in."""


def spool_dir(ledger_path: str) -> str:
    """Where records kept aside for the ledger at `ledger_path` wait (`cacheaudit.ledger.spool`)."""
    return ledger_path + ".spool"


class Attribution(NamedTuple):
    """What an audit learnt about a compile record: the entry it built, and so its runtime,
    kernel and key."""

    record_uuid: str
    runtime: str
    kernel: str
    key: str | None
    entry: str


@dataclass(frozen=True)
class RunInfo:
    """The process tree a record belongs to."""

    run_uuid: str
    label: str
    started_ns: int = field(default_factory=time.time_ns)
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    command: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TestWindow:
    """When one test ran: the interval that a disk hit's timestamp is matched against."""

    nodeid: str
    started_ns: int
    finished_ns: int
    outcome: str = ""
    worker: str = ""
    run_uuid: str = ""


def new_record_id() -> str:
    return uuid.uuid4().hex
