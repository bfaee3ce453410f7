"""The open ledger, the one public class of the ledger package: opened (made or upgraded,
else read-only), closed, and composed of the write path (`writes`: content-addressed, short
transactions) and the read path (`reads`: rows back into records by column name; `queries`)."""

from __future__ import annotations

from cacheaudit.ledger.opened import Opening
from cacheaudit.ledger.queries import LedgerQueries
from cacheaudit.ledger.writes import LedgerWrites


class Ledger(Opening, LedgerWrites, LedgerQueries):
    """An open ledger file. Use `Ledger.open()`; close it, or use it as a context manager."""
