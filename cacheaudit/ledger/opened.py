"""How a ledger file is opened (made or upgraded, else read-only) and closed: `Opening`, the base
of `Ledger`, `LedgerWriter` and `SessionLedger`. Without the records' model, so that a test
session's end that recorded nothing opens its ledger for the price of SQLite."""

from __future__ import annotations

import os
import sqlite3
from typing import TypeVar

from cacheaudit.exceptions import LedgerError
from cacheaudit.ledger import private
from cacheaudit.ledger.connection import LedgerConnection
from cacheaudit.ledger.opening import connect_read_only, truncated, writable
from cacheaudit.ledger.schema import (
    BUSY_TIMEOUT_S,
    RESTORE,
    damage,
    damaged_file,
    missing_columns,
    prepare,
)
from cacheaudit.ledger.values import default_ledger_path

Opened = TypeVar("Opened", bound="Opening")


class Opening(LedgerConnection):
    """How a ledger file is opened (made or upgraded, else read-only) and closed, for `Ledger`,
    `LedgerWriter` and `SessionLedger` alike."""

    @classmethod
    def open(cls: type[Opened], path: str | None = None, *, create: bool = True,
             patience_s: float = BUSY_TIMEOUT_S, reader: bool = False) -> Opened:
        """Open (and with `create`, make or upgrade) the ledger at `path` or the default place.

        A new ledger is made 0600 in directories made 0700 (`private`); its WAL and SHM take
        its mode. A ledger that cannot be written (a read-only mount, no write permission) is
        opened read-only: readable, and every write raises `LedgerReadOnly`. Writes wait
        `patience_s` for another process's lock, then raise `LedgerBusy`. A `reader` is
        opened read-only wherever it stands (a scan's worker, which only reads)."""
        path = os.path.abspath(path or default_ledger_path())
        exists = os.path.exists(path)
        if not exists and not create:
            raise LedgerError(f"no ledger at {path}")
        if exists and os.path.isdir(path):
            raise LedgerError(f"{path} is a directory, not a cacheaudit ledger (give a file "
                              f"in it: {os.path.join(path, 'ledger.db')})")
        cut = truncated(path) if exists else None
        if cut is not None:
            raise LedgerError(cut + RESTORE)
        if not exists:
            try:
                private.make_directories(os.path.dirname(path))
                private.create_file(path)
            except OSError as exc:
                raise LedgerError(f"cannot create a ledger at {path}: {exc.strerror}") from exc
        read_only, unseen = False, None
        try:
            if not reader and writable(path):
                conn = sqlite3.connect(path, timeout=patience_s, isolation_level=None,
                                       check_same_thread=False)
            else:
                conn, unseen = connect_read_only(path, patience_s)
                read_only = True
        except sqlite3.DatabaseError as exc:
            if "not a database" in str(exc):
                raise LedgerError(
                    f"{path} is not a cacheaudit ledger (not an SQLite file)") from exc
            raise LedgerError(f"cannot open {path}: {exc}") from exc
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot open {path}: {exc}") from exc
        ledger = cls(path, conn, patience_s=patience_s, read_only=read_only)
        ledger.unseen = unseen
        if read_only:
            ledger.unwritable = f"the ledger {path} is read-only"
        try:
            prepare(conn, path, create, patience_s, read_only=read_only)
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "not a database" in str(exc):
                raise LedgerError(
                    f"{path} is not a cacheaudit ledger (not an SQLite file)") from exc
            if "malformed" in str(exc):
                raise LedgerError(damaged_file(path, exc)) from exc
            raise LedgerError(f"cannot use ledger {path}: {exc}") from exc
        except BaseException:
            conn.close()
            raise
        return ledger

    def check_columns(self) -> None:
        """Refuse a ledger whose tables lack columns this version reads (a damaged or
        hand-edited file), naming them: before a command writes into it."""
        try:
            lacking = missing_columns(self.conn)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(damaged_file(self.path, exc)) from exc
        if lacking:
            raise LedgerError(f"{self.path} is a damaged cacheaudit ledger: {lacking}{RESTORE}")

    def explained(self, error: BaseException) -> LedgerError | None:
        """`error`, raised while this ledger was read or written, as the bad input it is when
        the file is to blame (damaged pages, a table or column it lost), naming the file; None
        otherwise. The one place where what SQLite finds wrong with a ledger met after its
        opening becomes a usage error instead of an internal one."""
        if not isinstance(error, sqlite3.DatabaseError):
            return None
        try:
            why = damage(self.conn, self.path, error)
        except sqlite3.Error:
            return None
        return None if why is None else LedgerError(why)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self: Opened) -> Opened:
        return self

    def __exit__(self, _type: object, error: BaseException | None, _traceback: object) -> None:
        try:
            explained = self.explained(error) if error is not None else None
        finally:
            self.close()
        if explained is not None:
            raise explained from error
