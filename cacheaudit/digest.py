"""File states: stat fields plus xxh3-128 content hashes, with a stat-based memo.

Cheap checks first, hashes last (ccache's `result_matches`): a file whose size, mtime_ns, ctime_ns
and inode all equal a settled earlier capture is taken as unchanged without being read. A capture is
"settled" only when the file's timestamps were older than `SETTLE_WINDOW_NS` at capture time;
otherwise a same-size rewrite inside the filesystem's timestamp granularity could leave every stat
field equal, so an unsettled state is always re-hashed (ccache's "too new" rule, its inode cache
uses the same 2 s minimum age).
"""

from __future__ import annotations

import errno
import os
import stat as stat_module
import time
from collections.abc import Iterable

import xxhash

from cacheaudit.model import MEMORY_PREFIX, FileState

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


def path_stat_key(path: str) -> tuple[int, int, int, int] | None:
    """What says a file was not rewritten since it was last looked at (size, mtime, ctime,
    inode); None when it cannot be stat'ed."""
    try:
        return _stat_key(os.stat(path))
    except OSError:
        return None


def is_settled(st: os.stat_result, now_ns: int, window_ns: int = SETTLE_WINDOW_NS) -> bool:
    return now_ns - max(st.st_mtime_ns, st.st_ctime_ns) > window_ns


def _unreadable(path: str, st: os.stat_result, error: str) -> FileState:
    return FileState(path=path, exists=True, size=st.st_size, mtime_ns=st.st_mtime_ns,
                     ctime_ns=st.st_ctime_ns, inode=st.st_ino, digest=None, settled=False,
                     error=error)


_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


class NotARegularFile(OSError):
    """A path that names a FIFO, socket, device or directory where a file was expected."""

    def __init__(self, path: str) -> None:
        super().__init__(errno.EINVAL, "not a regular file", path)


def read_file(path: str, limit: int | None = None) -> bytes:
    """The bytes of a regular file (the first `limit` of them when given), exactly as stored.

    A cache can hold anything a user or a crash left there: O_NONBLOCK keeps the open of a FIFO
    from waiting for a writer, and the fstat check refuses it (and a device, whose read may
    never end) before any read. Raises OSError; `NotARegularFile` for those.
    """
    fd = os.open(path, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        if not stat_module.S_ISREG(st.st_mode):
            raise NotARegularFile(path)
        if limit is not None and limit <= 0:
            return b""
        chunks: list[bytes] = []
        got = 0
        # The size fstat gave is only a first guess: a file that grew meanwhile is read to its
        # end (or to `limit`), which is what a runtime reading it now would see.
        while limit is None or got < limit:
            ask = max(st.st_size - got + 1, 4096) if limit is None else limit - got
            chunk = os.read(fd, ask)
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def _hash_fd(fd: int, size: int) -> str:
    if size <= _CHUNK:
        # Headers are small: one read and one call into xxhash beat a streaming hasher.
        data = os.read(fd, size + 1)
        if len(data) <= size:
            while len(data) < size and (more := os.read(fd, size - len(data) + 1)):
                data += more
            return xxhash.xxh3_128_hexdigest(data)
        hasher = xxhash.xxh3_128(data)
    else:
        hasher = xxhash.xxh3_128()
    while chunk := os.read(fd, _CHUNK):
        hasher.update(chunk)
    return hasher.hexdigest()


def read_state(path: str, window_ns: int = SETTLE_WINDOW_NS) -> FileState:
    """Capture a file's state by reading it. A file that changes while being read is re-read.

    Works on one descriptor (fstat, read, fstat): no second path lookup, and a file swapped by
    rename meanwhile is still hashed consistently as the inode we opened. O_NONBLOCK keeps a FIFO
    in an include graph from hanging us.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return FileState.missing(path)
    except IsADirectoryError:
        return _unreadable(path, os.stat(path), "not a regular file")
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc.strerror or exc}"
        try:
            return _unreadable(path, os.stat(path), error)
        except OSError:
            return FileState.missing(path, error=error)
    try:
        before = os.fstat(fd)
        if not stat_module.S_ISREG(before.st_mode):
            return _unreadable(path, before, "not a regular file")
        for attempt in range(_READ_RETRIES):
            try:
                if attempt:
                    os.lseek(fd, 0, os.SEEK_SET)
                digest = _hash_fd(fd, before.st_size)
                after = os.fstat(fd)
            except OSError as exc:
                return _unreadable(path, before, f"{type(exc).__name__}: {exc.strerror or exc}")
            mtime_ns, ctime_ns = after.st_mtime_ns, after.st_ctime_ns
            if (after.st_size == before.st_size and mtime_ns == before.st_mtime_ns
                    and ctime_ns == before.st_ctime_ns):
                return FileState(path, True, after.st_size, mtime_ns, ctime_ns, after.st_ino,
                                 digest, time.time_ns() - max(mtime_ns, ctime_ns) > window_ns)
            before = after
    finally:
        os.close(fd)
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


class StatOnlyCache(StateCache):
    """States by stat alone, for a caller that needs which files there are and not what they
    hold (the watch plan at a session's start, which must not read a precompiled header of
    tens of MB to learn that it exists): a file no remembered state matches is not read, and
    its state has no digest and says why."""

    def capture(self, path: str) -> FileState:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return FileState.missing(path)
        except OSError as exc:
            return FileState.missing(path, error=f"{type(exc).__name__}: {exc.strerror or exc}")
        memo = self._memo.get(path)
        if memo is not None and _stat_key(st) == (memo.size, memo.mtime_ns, memo.ctime_ns,
                                                  memo.inode):
            return memo
        if not stat_module.S_ISREG(st.st_mode):
            return _unreadable(path, st, "not a regular file")
        return _unreadable(path, st, "not read: its stat alone was asked for")


def normalise_path(path: str, cwd: str | None = None) -> str:
    """Absolute, symlink-free form of a path as a compiler printed it (nvcc prints `bin/../...`)."""
    if cwd and not os.path.isabs(path):
        path = os.path.join(cwd, path)
    return os.path.realpath(path)


def changed_files(recorded: Iterable[FileState], cache: StateCache | None = None
                  ) -> list[tuple[FileState, FileState]]:
    """(recorded, current) for every file whose content or existence differs from the record.

    The hot loop of an audit, kept flat on purpose: one `os.stat` a file when nothing changed and
    the record is settled (what `StateCache.verify` decides, inlined).
    """
    cache = cache or StateCache()
    stat = os.stat
    changes = []
    for state in recorded:
        path, _exists, size, mtime_ns, ctime_ns, inode, digest, settled, _error = state
        if path.startswith(MEMORY_PREFIX):
            continue  # held in memory by the runtime: nothing on disk to compare
        if settled and digest is not None:
            try:
                st = stat(path)
            except OSError:
                pass
            else:
                if (st.st_mtime_ns == mtime_ns and st.st_size == size
                        and st.st_ctime_ns == ctime_ns and st.st_ino == inode):
                    continue
        current = cache.capture(path)
        if not current.same_content(state):
            changes.append((state, current))
    return changes
