"""File states: stat fields plus xxh3-128 content hashes, with a stat-based memo.

Cheap checks first, hashes last (ccache's `result_matches`): a file whose size, mtime_ns, ctime_ns
and inode all equal a settled earlier capture is taken as unchanged without being read. A capture is
"settled" only when the file's timestamps were older than `SETTLE_WINDOW_NS` at capture time;
otherwise a same-size rewrite inside the filesystem's timestamp granularity could leave every stat
field equal, so an unsettled state is always re-hashed (ccache's "too new" rule, its inode cache
uses the same 2 s minimum age).
"""

from __future__ import annotations

import os
import stat as stat_module
import time
from collections.abc import Iterable

import xxhash

from cacheaudit.model import FileState

SETTLE_WINDOW_NS = 2_000_000_000
_CHUNK = 1 << 20
_READ_RETRIES = 3


def hash_file(path: str) -> str:
    """xxh3-128 of a file's bytes, streamed so that large binaries (nvcc, libnvrtc) stay cheap."""
    hasher = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def is_settled(st: os.stat_result, now_ns: int, window_ns: int = SETTLE_WINDOW_NS) -> bool:
    return now_ns - max(st.st_mtime_ns, st.st_ctime_ns) > window_ns


def _unreadable(path: str, st: os.stat_result, error: str) -> FileState:
    return FileState(path=path, exists=True, size=st.st_size, mtime_ns=st.st_mtime_ns,
                     ctime_ns=st.st_ctime_ns, inode=st.st_ino, digest=None, settled=False,
                     error=error)


def read_state(path: str, window_ns: int = SETTLE_WINDOW_NS) -> FileState:
    """Capture a file's state by reading it. A file that changes while being read is re-read."""
    try:
        before = os.stat(path)
    except FileNotFoundError:
        return FileState.missing(path)
    except OSError as exc:
        return FileState.missing(path, error=f"{type(exc).__name__}: {exc.strerror or exc}")
    if not stat_module.S_ISREG(before.st_mode):
        return _unreadable(path, before, "not a regular file")
    for _ in range(_READ_RETRIES):
        try:
            digest = hash_file(path)
            after = os.stat(path)
        except OSError as exc:
            return _unreadable(path, before, f"{type(exc).__name__}: {exc.strerror or exc}")
        if _stat_key(after) == _stat_key(before):
            return FileState(path=path, exists=True, size=after.st_size,
                             mtime_ns=after.st_mtime_ns, ctime_ns=after.st_ctime_ns,
                             inode=after.st_ino, digest=digest,
                             settled=is_settled(after, time.time_ns(), window_ns))
        before = after
    # Still changing after several reads: keep the last content seen, never trust its stat.
    return FileState(path=path, exists=True, size=before.st_size, mtime_ns=before.st_mtime_ns,
                     ctime_ns=before.st_ctime_ns, inode=before.st_ino, digest=digest,
                     settled=False, error="changed while being read")


class StateCache:
    """A per-process memo of file states keyed by path, trusted only while the stat is unchanged.

    Seed it with states loaded from the ledger (`remember`) so that verifying a recorded graph costs
    one `os.stat` a file when nothing changed.
    """

    def __init__(self, window_ns: int = SETTLE_WINDOW_NS) -> None:
        self.window_ns = window_ns
        self._memo: dict[str, FileState] = {}
        self.reads = 0

    def remember(self, states: Iterable[FileState]) -> None:
        for state in states:
            if state.settled and state.digest is not None:
                self._memo[state.path] = state

    def capture(self, path: str) -> FileState:
        """The state of `path` now; read only when no settled memo matches its stat."""
        memo = self._memo.get(path)
        if memo is not None:
            try:
                st = os.stat(path)
            except OSError:
                self._memo.pop(path, None)
                return read_state(path, self.window_ns)
            if _stat_key(st) == (memo.size, memo.mtime_ns, memo.ctime_ns, memo.inode):
                return memo
        self.reads += 1
        state = read_state(path, self.window_ns)
        if state.settled and state.digest is not None:
            self._memo[path] = state
        else:
            self._memo.pop(path, None)
        return state

    def capture_all(self, paths: Iterable[str]) -> list[FileState]:
        return [self.capture(p) for p in paths]

    def verify(self, recorded: FileState) -> FileState:
        """The current state of a recorded file: `recorded` itself when provably unchanged.

        Provably means: the recorded capture was settled and size, mtime_ns, ctime_ns and inode are
        all equal now. Anything else is re-hashed, and equal content under new timestamps still
        counts as unchanged (the caller compares with `FileState.same_content`).
        """
        if recorded.settled and recorded.digest is not None:
            try:
                st = os.stat(recorded.path)
            except OSError:
                return read_state(recorded.path, self.window_ns)
            if (st.st_size == recorded.size and st.st_mtime_ns == recorded.mtime_ns
                    and st.st_ctime_ns == recorded.ctime_ns and st.st_ino == recorded.inode):
                return recorded
        return self.capture(recorded.path)


def normalise_path(path: str, cwd: str | None = None) -> str:
    """Absolute, symlink-free form of a path as a compiler printed it (nvcc prints `bin/../...`)."""
    if cwd and not os.path.isabs(path):
        path = os.path.join(cwd, path)
    return os.path.realpath(path)
