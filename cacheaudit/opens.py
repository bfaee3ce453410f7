"""File opens in given directories while a run lasts: how a disk hit that leaves no trace is seen.

A runtime that serves a cached kernel opens its binary to load it (`cuModuleLoad`,
`cuLibraryLoadFromFile`, `dlopen`, or a read of the bytes handed to the driver), whether or not
it writes a record, a log line or a marker. On Linux, inotify reports those opens for every
watched directory without touching the runtime: this module watches the directories it is given
(the cache entries' directories, which the caller takes from the layouts; nothing here knows a
runtime) from a thread of the controlling process (`cacheaudit run`, the pytest controller), for
IN_OPEN and IN_ACCESS, and says afterwards which files were opened and when.

Standard library only (ctypes on libc's `inotify_init1` and `inotify_add_watch`; the events are
read with `os.read`). It fails open and says what it could not see: no inotify (not Linux, a
seccomp filter), a watch limit reached (`/proc/sys/fs/inotify/max_user_watches`, shared by every
process of the user), a directory that could not be watched, a queue that overflowed. Those
directories are `unwatched`, and a caller must treat their entries as possibly served. `stop()`
ends the thread and closes every descriptor; an observer is used once.
"""

from __future__ import annotations

import errno
import os
import sys
import time
from _thread import allocate_lock

from cacheaudit.plain import MappingProxyType

# Neither `typing` nor `contextlib`, `collections.abc` or `types`: every session's first
# process starts an observer (~3 ms of imports together; `contextlib` is imported where an
# error is suppressed, which only a watched directory reaches).
TYPE_CHECKING = False
if TYPE_CHECKING:
    import struct
    import threading
    from collections.abc import Iterable, Iterator, Mapping
    from typing import NamedTuple
else:
    from cacheaudit.plain import NamedTuple

IN_ACCESS = 0x00000001
IN_OPEN = 0x00000020
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_EXCL_UNLINK = 0x04000000
IN_ISDIR = 0x40000000
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC if hasattr(os, "O_CLOEXEC") else 0o2000000

_EVENT_FORMAT = "iIII"
"""`struct inotify_event` before its name: wd, mask, cookie, len."""
_WATCHES_LIMIT = "/proc/sys/fs/inotify/max_user_watches"
WATCH_SHARE = 2
"""At most 1/WATCH_SHARE of the user's inotify watch limit is taken: editors, build tools and
file indexers of the same user need theirs."""


# Named tuples, not dataclasses: `dataclasses` imports `inspect`, and a session's first process
# starts an observer before anything else of cacheaudit needs them.
class Opened(NamedTuple):
    """The opens of one file while the observer ran: the first and the last, and how many."""

    first_ns: int
    last_ns: int
    count: int


class ObservedOpens(NamedTuple):
    """What an observer saw, as of when it was asked."""

    opens: Mapping[str, Opened] = MappingProxyType({})
    """Path (watched directory joined with the file's name) -> its opens."""
    unwatched: Mapping[str, str] = MappingProxyType({})
    """Directory -> why its opens were not (or not all) seen."""
    started_ns: int = 0

    def seen(self, directory: str) -> bool:
        return directory not in self.unwatched


def _queued(fd: int) -> Iterator[bytes]:
    """What an inotify descriptor (non-blocking) holds now, read until it is empty; raises
    OSError but for an interrupted read (retried)."""
    while True:
        try:
            data = os.read(fd, 64 * 1024)
        except BlockingIOError:
            return
        except InterruptedError:
            continue
        if not data:
            return
        yield data


def watch_limit() -> int | None:
    """The user's inotify watch limit, or None where /proc does not say."""
    try:
        with open(_WATCHES_LIMIT, encoding="ascii") as handle:
            return int(handle.read().strip())
    except (OSError, ValueError):
        return None


def _errno() -> int:
    """The errno of the last libc call made through ctypes (imported by `_Libc` already)."""
    import ctypes

    return ctypes.get_errno()


class _Libc:
    """The three libc calls, or the reason they cannot be had."""

    def __init__(self) -> None:
        self.problem: str | None = None
        self.init1 = self.add_watch = None
        if not sys.platform.startswith("linux"):
            self.problem = f"inotify exists on Linux only, not on {sys.platform}"
            return
        try:
            # Only here: most observers are given no directory (a session's first process on a
            # machine without caches), and ctypes is the dearest of this module's imports.
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            self.init1 = libc.inotify_init1
            self.init1.argtypes = [ctypes.c_int]
            self.init1.restype = ctypes.c_int
            self.add_watch = libc.inotify_add_watch
            self.add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
            self.add_watch.restype = ctypes.c_int
        except (OSError, AttributeError) as exc:
            self.problem = f"libc has no inotify: {exc}"


class OpenObserver:
    """Watches `directories` for opens from `start()` to `stop()`."""

    def __init__(self, directories: Iterable[str], *, budget: int | None = None) -> None:
        """`budget`: the most watches to take (default: 1/WATCH_SHARE of the user's limit)."""
        self.directories = list(dict.fromkeys(directories))
        self.budget = budget
        self._fd = -1
        self._wake: tuple[int, int] | None = None
        # `threading`, `select` and `struct` only where a directory is watched: most observers
        # are given none (a session's first process on a machine without caches).
        self._thread: threading.Thread | None = None
        self._lock = allocate_lock()
        self._reading = allocate_lock()
        self._event: struct.Struct | None = None
        self._by_wd: dict[int, str] = {}
        self._opens: dict[str, Opened] = {}
        self._unwatched: dict[str, str] = {}
        self._started_ns = 0
        self._stopped = False

    # ---------------------------------------------------------------- life

    def start(self) -> OpenObserver:
        """Set the watches and start the reading thread. Never raises: what cannot be watched
        is in `unwatched` with the reason."""
        self._started_ns = time.time_ns()
        if not self.directories:
            return self
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 - observing never stops the run
            self._give_up(f"the observer failed: {type(exc).__name__}: {exc}")
        return self

    def _start(self) -> None:
        libc = _Libc()
        if libc.problem is not None or libc.init1 is None or libc.add_watch is None:
            self._give_up(libc.problem or "no inotify")
            return
        fd = libc.init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            code = _errno()
            reason = ("the user's inotify instances are used up "
                      "(/proc/sys/fs/inotify/max_user_instances)" if code == errno.EMFILE
                      else f"inotify_init1 failed: {os.strerror(code)}")
            self._give_up(reason)
            return
        import struct

        self._event = struct.Struct(_EVENT_FORMAT)  # before the descriptor: `_parse` needs it
        self._fd = fd
        limit = watch_limit()
        budget = self.budget
        if budget is None:
            budget = len(self.directories) if limit is None else max(0, limit // WATCH_SHARE)
        mask = IN_OPEN | IN_ACCESS | IN_ONLYDIR | IN_EXCL_UNLINK
        for index, directory in enumerate(self.directories):
            if len(self._by_wd) >= budget:
                reason = (f"more entry directories than the {budget} inotify watches cacheaudit "
                          f"may take ({_WATCHES_LIMIT} = {limit})")
                self._unwatched.update(dict.fromkeys(self.directories[index:], reason))
                break
            wd = libc.add_watch(fd, os.fsencode(directory), mask)
            if wd >= 0:
                self._by_wd[wd] = directory
                continue
            code = _errno()
            if code == errno.ENOENT:
                continue  # gone since it was listed: nothing can be served from it
            if code == errno.ENOSPC:
                reason = f"the user's inotify watches are used up ({_WATCHES_LIMIT})"
                self._unwatched.update(dict.fromkeys(self.directories[index:], reason))
                break
            self._unwatched[directory] = f"cannot watch it: {os.strerror(code)}"
        if not self._by_wd:
            self._close_fds()
            return
        import threading

        self._wake = os.pipe()
        self._thread = threading.Thread(target=self._read_loop, name="cacheaudit-opens",
                                        daemon=True)
        self._thread.start()

    def _give_up(self, reason: str) -> None:
        self._close_fds()
        for directory in self.directories:
            self._unwatched.setdefault(directory, reason)

    def stop(self) -> ObservedOpens:
        """End the thread, close the descriptors, and say what was seen. Idempotent."""
        if not self._stopped:
            self._stopped = True
            thread = self._thread
            if thread is not None and self._wake is not None:
                import contextlib

                with contextlib.suppress(OSError):
                    os.write(self._wake[1], b"x")
                thread.join(timeout=10)
                if thread.is_alive():
                    # The descriptors stay open for the thread; it is a daemon and ends soon.
                    self._unwatched.update(dict.fromkeys(
                        self._by_wd.values(), "the observer did not stop in time"))
                    return self.observed()
            self._drain()
            self._close_fds()
        return self.observed()

    def __enter__(self) -> OpenObserver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ignoring(self) -> Ignoring:
        """Opens made inside the block are dropped: cacheaudit's own reads of the entries (an
        audit while the observer runs, the pytest fixture's) are no hits. Opens of other
        processes inside the block are dropped too; the block is kept short."""
        return Ignoring(self)

    def observed(self) -> ObservedOpens:
        """What was seen so far (the thread may still run)."""
        with self._lock:
            return ObservedOpens(dict(self._opens), dict(self._unwatched), self._started_ns)

    # ---------------------------------------------------------------- the thread

    def _read_loop(self) -> None:
        import select

        assert self._wake is not None
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._wake[0], select.POLLIN)
        try:
            while True:
                ready = {fd for fd, _ in poller.poll()}
                if self._fd in ready:
                    self._drain()
                if self._wake[0] in ready:
                    return
        except Exception as exc:  # noqa: BLE001 - a broken observer makes the run unobserved
            with self._lock:
                for directory in self._by_wd.values():
                    self._unwatched.setdefault(
                        directory, f"the observer stopped: {type(exc).__name__}: {exc}")

    def _drain(self) -> None:
        with self._reading:
            self._drain_locked(keep=True)

    def _drain_locked(self, keep: bool) -> None:
        if self._fd < 0:
            return
        for data in _queued(self._fd):
            self._parse(data, time.time_ns(), keep)

    def _parse(self, data: bytes, now: int, keep: bool) -> None:
        offset = 0
        event = self._event
        assert event is not None  # made before the descriptor was kept
        with self._lock:
            while offset + event.size <= len(data):
                wd, mask, _cookie, length = event.unpack_from(data, offset)
                name = data[offset + event.size:offset + event.size + length].split(b"\0", 1)[0]
                offset += event.size + length
                if mask & IN_Q_OVERFLOW:
                    for directory in self._by_wd.values():
                        self._unwatched.setdefault(
                            directory, "the inotify queue overflowed: opens were lost")
                    continue
                directory = self._by_wd.get(wd)
                if not keep or directory is None or mask & (IN_IGNORED | IN_ISDIR) or not name:
                    continue
                path = os.path.join(directory, os.fsdecode(name))
                known = self._opens.get(path)
                self._opens[path] = Opened(now, now, 1) if known is None else Opened(
                    known.first_ns, now, known.count + 1)

    def _close_fds(self) -> None:
        fds = [self._fd, *list(self._wake or ())]
        self._fd, self._wake = -1, None
        for fd in fds:
            if fd >= 0:
                import contextlib

                with contextlib.suppress(OSError):
                    os.close(fd)


class Ignoring:
    """The block of `OpenObserver.ignoring()` (a class, not `contextlib.contextmanager`: see
    the imports); given no observer, a block that ignores nothing."""

    __slots__ = ("_observer",)

    def __init__(self, observer: OpenObserver | None) -> None:
        self._observer = observer

    def __enter__(self) -> None:
        if self._observer is not None:
            self._observer._drain()
            self._observer._reading.acquire()

    def __exit__(self, *exc: object) -> None:
        if self._observer is not None:
            try:
                self._observer._drain_locked(keep=False)
            finally:
                self._observer._reading.release()


IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
_CHANGE_MASK = (IN_MODIFY | IN_ATTRIB | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_CREATE
                | IN_DELETE | IN_DELETE_SELF | IN_MOVE_SELF | IN_ONLYDIR)
CHANGE_WATCHES = 1024
"""The most directories a `ChangeWatch` watches; files beyond them are never `quiet`."""


class ChangeWatch:
    """Whether any file under a set of paths may have changed since a moment: an in-process
    adapter that would otherwise stat every tracked file at every hit (a FlashInfer module
    tracks ~200 headers) asks this instead, and stats them only when something moved.

    Each covered path's every ancestor directory is watched (inotify follows the symlinks of
    the path it is given, so a watch on the directory holding a symlink is what sees it
    retargeted): a write, an attribute change (`touch`, `utime`), a rename, a creation or a
    deletion in any of them is a change. Nothing is read in a thread; `moment()` drains the
    queue without blocking. Fails closed: where inotify, a watch or the queue fails, every
    moment is a new one (the caller stats as it would without this). Events of the kernel's own
    making on a network filesystem written by another host are not seen: a caller that must
    see those does not use this."""

    def __init__(self, limit: int = CHANGE_WATCHES) -> None:
        self.limit = limit
        self._fd = -1
        self._broken: str | None = None
        self._watched: set[str] = set()
        self._moment = 0
        self._pid = os.getpid()
        self._add_watch: object = None

    def cover(self, paths: Iterable[str]) -> bool:
        """Watch every ancestor directory of `paths` from now; False where some could not be
        (then no moment is quiet)."""
        if self._broken is not None or not self._usable():
            return False
        wanted: set[str] = set()
        for path in paths:
            directory = os.path.dirname(os.path.abspath(path))
            while directory not in wanted and directory not in self._watched:
                wanted.add(directory)
                parent = os.path.dirname(directory)
                if parent == directory:
                    break
                directory = parent
        if len(self._watched) + len(wanted) > self.limit:
            self._fail(f"more than {self.limit} directories to watch")
            return False
        add_watch = self._add_watch
        for directory in sorted(wanted):
            if add_watch(self._fd, os.fsencode(directory), _CHANGE_MASK) < 0:  # type: ignore[operator]
                code = _errno()
                if code == errno.ENOENT:
                    continue  # not there: its parent's watch sees it appear
                self._fail(f"cannot watch {directory}: {os.strerror(code)}")
                return False
            self._watched.add(directory)
        return True

    def moment(self) -> int:
        """A number that stays the same while nothing under the covered paths changed; a new
        one after any change (or always, once broken)."""
        if self._broken is not None or self._fd < 0 or os.getpid() != self._pid:
            self._moment += 1
            return self._moment
        try:
            changed = False
            for _events in _queued(self._fd):  # drained to the end: one moment for them all
                changed = True
            if changed:
                self._moment += 1
        except OSError as exc:
            self._fail(f"reading inotify failed: {os.strerror(exc.errno or 0)}")
        return self._moment

    @property
    def problem(self) -> str | None:
        return self._broken

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        self._watched.clear()
        if fd >= 0:
            import contextlib

            with contextlib.suppress(OSError):
                os.close(fd)

    def _usable(self) -> bool:
        if self._fd >= 0:
            return True
        libc = _Libc()
        if libc.problem is not None or libc.init1 is None or libc.add_watch is None:
            self._fail(libc.problem or "no inotify")
            return False
        fd = libc.init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            self._fail(f"inotify_init1 failed: {os.strerror(_errno())}")
            return False
        self._fd, self._add_watch, self._pid = fd, libc.add_watch, os.getpid()
        return True

    def _fail(self, reason: str) -> None:
        self._broken = reason
        self._moment += 1
        self.close()
