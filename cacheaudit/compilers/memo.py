"""A compiler's identity taken once per binary: an `IdentityMemo` kept in a small file.

Every shim process identifies its compiler, and a `--version` run costs more than the rest of
the shim's fixed cost together (nvcc's forks cicc's driver; gcc's reads its specs). The file
holds, per `identity_cache_key` (the binary's and every wrapper's path, device, inode, size,
mtime and ctime, and the locale), the version text, digest, size and mtime taken when that key
was first seen; a binary replaced, rebuilt or touched has another key and is identified afresh.

The file is evidence about this user's compilers, so it is read only when it is this user's own
and no one else may write it (a record's version text must not come from another account), and
written 0600 by rename, so that a reader never sees half of it. Races between processes lose at
most an entry (the next process identifies that compiler again). Nothing here raises: a memo
that cannot be read is empty, one that cannot be written is left as it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat as stat_module
from typing import Any

from cacheaudit.model import CompilerIdentity

__all__ = ["FileMemo"]

_FORMAT = "cacheaudit-compiler-identities-v1"
_MAX_BYTES = 4 << 20
"""Far above `LIMIT` entries of the longest `--version` text seen (nvcc's, ~300 bytes)."""
_OPEN_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0))


class FileMemo:
    """An `IdentityMemo` in the JSON file `path` (the recorder keeps it beside the ledger)."""

    LIMIT = 256
    """Entries kept; the oldest go first. A machine has a few compilers, each with a few
    wrappers and locales."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._entries: dict[str, dict[str, Any]] | None = None
        self.hits = 0

    def get(self, key: str) -> CompilerIdentity | None:
        entry = self._load().get(key)
        if not isinstance(entry, dict):
            return None
        try:
            version_text, digest = entry["version_text"], entry["digest"]
            size, mtime_ns = entry["size"], entry["mtime_ns"]
        except KeyError:
            return None
        if not (isinstance(version_text, str) and isinstance(digest, str)
                and type(size) is int and type(mtime_ns) is int):
            return None
        self.hits += 1
        return CompilerIdentity(invoked="", path="", resolved=str(entry.get("resolved", "")),
                                kind="", version_text=version_text, digest=digest, size=size,
                                mtime_ns=mtime_ns)

    def put(self, key: str, identity: CompilerIdentity) -> None:
        entries = dict(self._load())
        entries.pop(key, None)
        entries[key] = {"resolved": identity.resolved, "version_text": identity.version_text,
                        "digest": identity.digest, "size": identity.size,
                        "mtime_ns": identity.mtime_ns}
        while len(entries) > self.LIMIT:
            del entries[next(iter(entries))]
        self._entries = entries
        _write(self.path, entries)

    def _load(self) -> dict[str, dict[str, Any]]:
        if self._entries is None:
            self._entries = _read(self.path)
        return self._entries


def _read(path: str) -> dict[str, dict[str, Any]]:
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return {}
    try:
        st = os.fstat(fd)
        if (not stat_module.S_ISREG(st.st_mode) or st.st_uid != os.getuid()
                or st.st_mode & 0o022 or st.st_size > _MAX_BYTES):
            return {}
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = json.loads(handle.read(_MAX_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        return {}
    entries = data.get("compilers")
    return entries if isinstance(entries, dict) else {}


def _write(path: str, entries: dict[str, dict[str, Any]]) -> None:
    """Replace `path` by rename; nothing when its directory is not there (the ledger's: made
    with the ledger, not here) or cannot be written."""
    staging = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"format": _FORMAT, "compilers": entries}, handle)
        os.replace(staging, path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            os.remove(staging)
