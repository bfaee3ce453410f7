"""How a ledger file is connected to: for writing where SQLite can write it, else read-only
(a read-only mount, a file or directory without write permission), where nothing at all may be
written, not even the WAL index."""

from __future__ import annotations

import contextlib
import os
import sqlite3


def writable(path: str) -> bool:
    """Whether SQLite can write the ledger at `path`: the file, and its directory unless the
    WAL and SHM files it would create are already there and writable. `os.access` answers
    for read-only mounts too (EROFS)."""
    if not os.access(path, os.W_OK):
        return False
    if os.access(os.path.dirname(path) or ".", os.W_OK):
        return True
    return all(os.access(path + suffix, os.W_OK) for suffix in ("-wal", "-shm"))


def read_only_uris(path: str) -> tuple[str, str]:
    """The URIs a reader opens the ledger at `path` by: `mode=ro`, and `immutable=1` for where
    SQLite cannot share the WAL index. The path is quoted as its bytes (one that is not UTF-8
    included)."""
    import urllib.parse  # here: a writer (the shim) never needs it

    uri = "file:" + urllib.parse.quote(os.fsencode(path))
    return uri + "?mode=ro", uri + "?immutable=1"


def connect_read_only(path: str, patience_s: float) -> tuple[sqlite3.Connection, str | None]:
    """A connection that never writes, and how it reads: `mode=ro` where SQLite can share the
    WAL index, else `immutable=1` (nothing at all is written, not even the SHM file, and a WAL
    file's last transactions are not seen)."""
    read_only, immutable = read_only_uris(path)
    conn = sqlite3.connect(read_only, uri=True, timeout=patience_s,
                           isolation_level=None, check_same_thread=False)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        return conn, None
    except sqlite3.DatabaseError as exc:
        conn.close()
        if "not a database" in str(exc):
            raise
    conn = sqlite3.connect(immutable, uri=True, timeout=patience_s,
                           isolation_level=None, check_same_thread=False)
    wal = path + "-wal"
    unseen = os.path.exists(wal) and os.path.getsize(wal) > 0
    return conn, (f"its WAL file {wal} cannot be shared, so its latest transactions are not "
                  "read" if unseen else None)


def attach_read_only(conn: sqlite3.Connection, path: str, name: str) -> None:
    """The ledger at `path` attached to `conn` as schema `name`, read as `connect_read_only`
    reads: `mode=ro`, else `immutable=1`."""
    read_only, immutable = read_only_uris(path)
    try:
        conn.execute(f"ATTACH DATABASE ? AS {name}", (read_only,))
        conn.execute(f"SELECT count(*) FROM {name}.sqlite_master").fetchone()
        return
    except sqlite3.DatabaseError as exc:
        with contextlib.suppress(sqlite3.Error):
            conn.execute(f"DETACH DATABASE {name}")
        if "not a database" in str(exc):
            raise
    conn.execute(f"ATTACH DATABASE ? AS {name}", (immutable,))
