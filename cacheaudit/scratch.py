"""cacheaudit's temporary directories: named after their owner, removed on every exit path,
swept after a killed owner.

Every directory is `cacheaudit-<purpose>-p<pid>t<start ticks>n<pid namespace>-<random>` under
the temporary directory (TMPDIR): the owner's pid and its start time (`processes.process_stat`)
tell a live owner from a dead one, or from a later process that reuses the pid; the pid
namespace keeps a container that shares TMPDIR but not our pids from taking a live owner for a
dead one (a directory of another namespace is never swept here). A process that removes its
directory on the way out (`temporary_directory`, a `finally`; SIGTERM made an exception by the
command line and the shim) leaves nothing; one killed outright (SIGKILL, the OOM killer) leaves
its directory to `sweep`, which the next shim or command runs at most every `SWEEP_INTERVAL_S`:
one stat of a stamp file otherwise. The sweep removes only directories of this user, named so,
whose owner no longer runs, and follows no symlink.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
import time
from collections.abc import Iterator

from cacheaudit.processes import process_stat

SWEEP_INTERVAL_S = 600
"""How often the temporary directory is searched for a dead owner's leftovers."""

_NAME_RE = re.compile(
    r"^cacheaudit-[a-z0-9-]+?-p(?P<pid>\d+)t(?P<ticks>\d+)n(?P<namespace>\d+)-[^/]*$")
_STAMP = "cacheaudit-swept-{uid}"


def pid_namespace() -> int:
    """The inode of this process's pid namespace; 0 where /proc does not say."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def owner_tag() -> str:
    """`p<pid>t<start ticks>n<pid namespace>` of this process."""
    pid = os.getpid()
    found = process_stat(pid)
    return f"p{pid}t{found[2] if found else 0}n{pid_namespace()}"


def make_directory(purpose: str, parent: str | None = None) -> str:
    """A new private (0700) directory for `purpose` (lower case letters, digits and dashes),
    owned by this process in its name. The caller removes it (`remove`)."""
    return tempfile.mkdtemp(prefix=f"cacheaudit-{purpose}-{owner_tag()}-", dir=parent)


def remove(path: str | None) -> None:
    if path:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def temporary_directory(purpose: str, parent: str | None = None) -> Iterator[str]:
    """`make_directory`, removed however the block ends."""
    path = make_directory(purpose, parent)
    try:
        yield path
    finally:
        remove(path)


def owner_alive(name: str) -> bool | None:
    """Whether the process named in a directory name still runs; None when that cannot be told
    here (not a name of ours, or an owner in another pid namespace)."""
    match = _NAME_RE.match(name)
    namespace = pid_namespace()
    if match is None or not namespace or int(match["namespace"]) != namespace:
        return None
    found = process_stat(int(match["pid"]))
    return found is not None and found[2] == match["ticks"]


def sweep(parent: str | None = None, *, interval_s: float = SWEEP_INTERVAL_S,
          now: float | None = None) -> list[str]:
    """Remove the directories a killed cacheaudit process left in `parent` (TMPDIR), unless a
    sweep ran there less than `interval_s` ago. Returns what was removed; never raises."""
    try:
        return _sweep(parent or tempfile.gettempdir(), interval_s,
                      time.time() if now is None else now)
    except OSError:
        return []


def _sweep(parent: str, interval_s: float, now: float) -> list[str]:
    if process_stat(os.getpid()) is None or not pid_namespace():
        return []  # no /proc: no owner can be told dead
    uid = os.getuid()
    stamp = os.path.join(parent, _STAMP.format(uid=uid))
    with contextlib.suppress(FileNotFoundError):
        st = os.lstat(stamp)
        if st.st_uid == uid and now - st.st_mtime < interval_s:
            return []
    # The stamp first: a sweep that cannot finish is not retried by every process at once.
    fd = os.open(stamp, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.utime(fd, (now, now))
    finally:
        os.close(fd)
    removed: list[str] = []
    with os.scandir(parent) as entries:
        for entry in entries:
            if not entry.name.startswith("cacheaudit-") or owner_alive(entry.name) is not False:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if st.st_uid != uid or not stat.S_ISDIR(st.st_mode):
                continue
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(entry.path)
    return removed
