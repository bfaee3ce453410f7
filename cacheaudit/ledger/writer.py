"""A ledger opened for writing only: what a shim or an adapter needs to store its records, without
the read path (`reads`, `queries`: rows back into records, the audit's queries) that `Ledger`
adds. Both open, make, upgrade and close a ledger file the same way (`Opening`)."""

from __future__ import annotations

from cacheaudit.ledger.opened import Opening
from cacheaudit.ledger.writes import LedgerWrites


class LedgerWriter(Opening, LedgerWrites):
    """An open ledger file, for writing records (the shim's and the adapters' write path): the
    same file, schema and transactions as `Ledger`, which adds the readers. Use
    `LedgerWriter.open()`."""
