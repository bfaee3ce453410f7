"""What the ledger's write and read paths share: its connection, what is known about its
writability, the ids and values already looked up, and short write transactions that wait a
while for another writer's lock (`Ledger` in `store` is the one public class)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from cacheaudit.exceptions import LedgerBusy, LedgerError, LedgerReadOnly
from cacheaudit.ledger.rows import _is_busy, _retrying
from cacheaudit.ledger.schema import BUSY_TIMEOUT_S

# Annotations only: a session's end opens the ledger without the records' model.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from cacheaudit.model import CompilerIdentity, IncludeGraph

T = TypeVar("T")


class LedgerConnection:
    """An open ledger file's connection and state; `Ledger.open()` makes one."""

    def __init__(self, path: str, conn: sqlite3.Connection, *,
                 patience_s: float = BUSY_TIMEOUT_S, read_only: bool = False) -> None:
        self.path = path
        self.conn = conn
        self.patience_s = patience_s
        self.read_only = read_only
        """Opened read-only: the file or its directory cannot be written here."""
        self.unwritable: str | None = None
        """Why writes into this ledger stopped (busy past `patience_s`, read-only): once one
        write failed so, the next fail at once instead of waiting again."""
        self.tell: Callable[[str], None] | None = None
        """Told once, in one line, when this ledger turns out not to be writable (the readers'
        way in sets it; a recorder spools instead and says so itself)."""
        self._told = False
        self.unseen: str | None = None
        """What a read-only connection cannot read (a WAL it cannot share), or None."""
        self._ids: dict[tuple[str, Any], int] = {}
        self._graph_cache: dict[int, IncludeGraph] = {}
        self._compiler_cache: dict[int, CompilerIdentity] = {}
        self._blob_cache: dict[int, Any] = {}
        self._refused_blobs: dict[int, str] = {}
        self._made: dict[tuple[str, int | None], Any] = {}
        """(column, blob id) -> the value as a record holds it (`LedgerReads._stored`)."""

    def _retry(self, write: Callable[[], T]) -> T:
        """Run a write transaction, retrying while another writer holds the lock, for at most
        `patience_s`; then `LedgerBusy`. A ledger found unwritable once fails at once."""
        if self.unwritable is not None:
            self._cannot_write(self.unwritable, LedgerReadOnly if self.read_only else LedgerBusy)
        try:
            return _retrying(write, self.patience_s)
        except sqlite3.OperationalError as exc:
            if _is_busy(exc):
                self._cannot_write(
                    f"the ledger {self.path} is busy: another process has held its write lock "
                    f"for over {self.patience_s:g} s", LedgerBusy, exc)
            if "readonly" in str(exc) or "read-only" in str(exc):
                self.read_only = True
                self._cannot_write(f"the ledger {self.path} is read-only ({exc})",
                                   LedgerReadOnly, exc)
            raise

    def try_again(self) -> None:
        """Let the next write wait for the lock again after a busy one: for a connection kept
        open between writes (an in-process recorder's), where a later write may find it free."""
        if not self.read_only:
            self.unwritable = None

    def _cannot_write(self, why: str, kind: type[LedgerError],
                      cause: BaseException | None = None) -> None:
        self.unwritable = why
        if self.tell is not None and not self._told:
            self._told = True
            with contextlib.suppress(Exception):
                self.tell(f"{why}: nothing this command learnt is kept in it")
        raise kind(why) from cause

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            self._ids.clear()  # ids handed out inside the rolled-back transaction are void
            raise
