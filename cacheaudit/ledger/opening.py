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


_HEADER = 100
_MAGIC = b"SQLite format 3\x00"


def truncated(path: str) -> str | None:
    """How much of the SQLite file at `path` is missing, or None: its header counts more pages
    than the file holds (a copy cut short), which SQLite would only find when a query reaches
    the lost pages, after a command had written into the rest. Judged only while no WAL file
    is beside it: a checkpoint in progress writes the header before the pages it counts."""
    if os.path.exists(path + "-wal"):
        return None
    try:
        with open(path, "rb") as handle:
            header = handle.read(_HEADER)
            size = os.fstat(handle.fileno()).st_size
    except OSError:
        return None
    if len(header) < _HEADER or not header.startswith(_MAGIC):
        return None
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(header[28:32], "big")
    # The page count is trusted only where SQLite trusts it: written by the same change.
    if header[24:28] != header[92:96] or pages == 0:
        return None
    expected = pages * page_size
    if size >= expected:
        return None
    return f"{path} is a truncated SQLite file ({size} of its {expected} bytes)"


def read_only_uris(path: str) -> tuple[str, str]:
    """The URIs a reader opens the ledger at `path` by: `mode=ro`, and `immutable=1` for where
    SQLite cannot share the WAL index. The path is quoted as its bytes (one that is not UTF-8
    included)."""
    import urllib.parse  # here: a writer (the shim) never needs it

    uri = "file:" + urllib.parse.quote(os.fsencode(path))
    return uri + "?mode=ro", uri + "?immutable=1"


def shares_wal(path: str) -> bool:
    """Whether a reader that may not write the ledger at `path` reads it through the WAL: only
    where its WAL and SHM files are already there (a writer has it open). Elsewhere `mode=ro`
    would create them beside the ledger and, unable to remove them, leave them behind: a
    look at a ledger must leave its directory as it found it. Without a WAL file no
    transaction waits outside the ledger, so reading it `immutable=1` misses nothing."""
    return os.path.exists(path + "-wal") and os.path.exists(path + "-shm")


def read_only_uri(path: str) -> str:
    """The one URI a reader that never writes opens the ledger at `path` by."""
    read_only, immutable = read_only_uris(path)
    return read_only if shares_wal(path) else immutable


def connect_read_only(path: str, patience_s: float) -> tuple[sqlite3.Connection, str | None]:
    """A connection that never writes, and how it reads: `mode=ro` where SQLite can share the
    WAL index already there, else `immutable=1` (nothing at all is written, not even the SHM
    file, and a WAL file's last transactions are not seen)."""
    read_only, immutable = read_only_uris(path)
    if shares_wal(path):
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


def known_roots_at(path: str, patience_s: float = 1.0) -> list[str]:
    """The cache roots the ledger at `path` keeps (`cache_roots`), read as `connect_read_only`
    reads and with the standard library alone: a session's observer needs them before
    anything else of the ledger, whose record model costs more to import than the session's
    start may take. [] where the file cannot be read as a ledger: the audit at the end opens
    it in full and says why."""
    try:
        conn, _unseen = connect_read_only(path, patience_s)
    except (sqlite3.Error, OSError):
        return []
    try:
        return [str(row[0]) for row in conn.execute("SELECT path FROM cache_roots")]
    except sqlite3.Error:
        return []
    finally:
        conn.close()


def attach_read_only(conn: sqlite3.Connection, path: str, name: str) -> None:
    """The ledger at `path` attached to `conn` as schema `name`, read as `connect_read_only`
    reads: `mode=ro` where its WAL files are there to share, else `immutable=1`."""
    read_only, immutable = read_only_uris(path)
    if not shares_wal(path):
        conn.execute(f"ATTACH DATABASE ? AS {name}", (immutable,))
        return
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
