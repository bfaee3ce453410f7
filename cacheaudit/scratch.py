"""cacheaudit's temporary directories: named after their owner, removed on every exit path,
swept after a killed owner.

Every directory is `cacheaudit-<purpose>-p<pid>t<start ticks>n<pid namespace>-<random>` under
the temporary directory (TMPDIR): the owner's pid and its start time (`processes.process_stat`)
tell a live owner from a dead one, or from a later process that reuses the pid; the pid
namespace keeps a container that shares TMPDIR but not our pids from taking a live owner for a
dead one (a directory of another namespace is never swept here). A process that removes its
directory on the way out (`temporary_directory`, a `finally`; SIGTERM made an exception by the
command line and the shim) leaves nothing; one killed outright (SIGKILL, the OOM killer) leaves
its directory to `sweep`, which every `cacheaudit` command runs and one shim in `SWEEP_ONE_IN`
(by pid: no stamp file is kept anywhere, so TMPDIR and the user's home stay as they were). The
sweep removes only directories of this user, named so, whose owner no longer runs, and follows
no symlink.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator

from cacheaudit.processes import process_stat

SWEEP_ONE_IN = 32
"""One shim in this many (by pid) sweeps; every `cacheaudit` command does."""

_NAME_RE = re.compile(
    r"^cacheaudit-[a-z0-9-]+?-p(?P<pid>\d+)t(?P<ticks>\d+)n(?P<namespace>\d+)-[^/]*$")


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


def sweep(parent: str | None = None) -> list[str]:
    """Remove the directories a killed cacheaudit process left in `parent` (TMPDIR). Returns
    what was removed; never raises. One `scandir` of TMPDIR, and an `lstat` and a /proc read
    per entry named like ours."""
    try:
        return _sweep(parent or tempfile.gettempdir())
    except OSError:
        return []


def sweep_now_and_then() -> list[str]:
    """`sweep`, in one process of `SWEEP_ONE_IN` (by pid): what the shim runs, so that a busy
    build pays for a few sweeps, not one per compile. It needs no state kept anywhere."""
    return sweep() if os.getpid() % SWEEP_ONE_IN == 0 else []


def _sweep(parent: str) -> list[str]:
    if process_stat(os.getpid()) is None or not pid_namespace():
        return []  # no /proc: no owner can be told dead
    uid = os.getuid()
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
