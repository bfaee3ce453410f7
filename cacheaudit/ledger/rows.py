"""How values go into the ledger's SQLite file and rows come back out: text SQLite can hold,
rows read by column name (never by position), and retries while another writer holds the lock."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

_RETRY_DEADLINE_S = 60.0

T = TypeVar("T")


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _retrying(action: Callable[[], T], deadline_s: float = _RETRY_DEADLINE_S) -> T:
    """Run `action`, retrying with jittered backoff while another writer holds the lock.

    The busy timeout already waits inside SQLite; this outer loop covers the cases where SQLite
    gives up at once (a deadlock between two readers upgrading to writers, say).
    """
    deadline = time.monotonic() + deadline_s
    delay = 0.005
    while True:
        try:
            return action()
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 2, 0.5)


def _blob_json(value: Any) -> str:
    # ASCII escapes carry surrogate-escaped bytes (undecodable paths) through SQLite's UTF-8 TEXT.
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _storable(value: Any) -> Any:
    """A str SQLite can hold: paths and compiler output may carry undecodable bytes as surrogate
    escapes, which UTF-8 TEXT refuses; those are stored as their original bytes instead."""
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return os.fsencode(value)
    return value


def _params(values: Sequence[Any]) -> tuple[Any, ...]:
    # Nearly every value is ASCII (or not text): convert only when one is not. A batch of
    # records passes millions of values through here.
    for value in values:
        if isinstance(value, str) and not value.isascii():
            return tuple(_storable(v) for v in values)
    return tuple(values)


def _text(value: Any) -> Any:
    return os.fsdecode(value) if isinstance(value, bytes) else value


def _texts(row: Sequence[Any]) -> Sequence[Any]:
    # Nearly every row is plain text: convert only when an undecodable path is present.
    if any(type(v) is bytes for v in row):
        return [_text(v) for v in row]
    return row


Row = sqlite3.Row | dict[str, Any]
"""A row read by column name (the `AS` name where the query gives one), never by position: an
`sqlite3.Row`, or a dict where an undecodable path had to be turned back into the str it was
stored from."""


def _rows(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> list[Row]:
    cursor = conn.cursor()
    cursor.row_factory = sqlite3.Row
    rows = cursor.execute(sql, params).fetchall()
    if not rows or not any(type(v) is bytes for row in rows for v in row):
        return rows
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, _texts(row), strict=True)) for row in rows]


def _row(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Row | None:
    found = _rows(conn, sql, params)
    return found[0] if found else None


def _named_params(row: Row) -> Row:
    """A row read back as the named parameters of a statement that stores it again."""
    # An sqlite3.Row iterates over its values: its names come from keys().
    return {name: _storable(row[name]) for name in row.keys()}  # noqa: SIM118


def _select_list(*columns: str) -> str:
    """`t.name AS name, ...`: each column named for `Row` access (an explicit `AS` kept), since
    SQLite leaves a result column's name unspecified without one."""
    return ", ".join(c if " AS " in c else f"{c} AS {c.rsplit('.', 1)[-1]}" for c in columns)


STATE_COLUMNS = _select_list("f.path", "s.present", "s.size", "s.mtime_ns", "s.ctime_ns",
                              "s.inode", "s.digest", "s.settled", "s.error")
"""A file state's columns, from `file_states s JOIN files f`."""


def _value(conn: sqlite3.Connection, sql: str, params: Sequence[Any] = ()) -> Any:
    """The one column of the first row of `sql`, None when there is no row."""
    row = _row(conn, sql, params)
    if row is None:
        return None
    (name,) = row.keys()
    return row[name]



def _chunks(values: Iterable[Any], size: int = 500) -> Iterator[list[Any]]:
    """`values` without repeats, sorted, in lists short enough for one `IN (...)` each (SQLite
    caps the parameters of a statement)."""
    wanted = sorted(set(values))
    for start in range(0, len(wanted), size):
        yield wanted[start:start + size]
