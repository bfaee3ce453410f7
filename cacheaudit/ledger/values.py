"""What the ledger takes and gives besides the model's records: runs, test windows, attributions,
record ids (where the ledger lives when nothing says otherwise: `places`)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import NamedTuple

# Re-exported: they were defined here first.
from cacheaudit.ids import hostname, uuid4_hex
from cacheaudit.ledger.places import (  # noqa: F401
    COMPANION_SUFFIXES,
    IDENTITY_MEMO_SUFFIX,
    default_ledger_path,
    spool_dir,
)


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
    host: str = field(default_factory=hostname)
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
    return uuid4_hex()
