"""Files cacheaudit keeps for the user alone: the ledger, its WAL and SHM, the spool, snapshots.

They hold command lines, paths and environment values of the user's compiles, so they are made
0600 in directories made 0700, whatever the umask (SQLite on its own makes a database 0644 less
the umask, and its WAL and SHM files take the database's mode). Directories the user made are
never changed: only those cacheaudit creates itself get 0700. Files that already exist keep
their mode: a ledger a team shares on purpose (group-readable) stays shared.

Standard library only: the shim's recording path uses it.
"""

from __future__ import annotations

import contextlib
import os

FILE_MODE = 0o600
DIRECTORY_MODE = 0o700


def make_directories(path: str) -> None:
    """`path` and its missing parents, each made 0700 (the umask cannot widen or empty that);
    existing directories are left as they are."""
    path = os.path.abspath(path)
    missing: list[str] = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIRECTORY_MODE)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise
            continue  # another process made it first: theirs, left alone
        # mkdir's mode is reduced by the umask; a umask of 0o700 would leave it unusable.
        os.chmod(directory, DIRECTORY_MODE)


def create_file(path: str) -> bool:
    """Create `path` empty and 0600 when it does not exist; True when this call made it.

    SQLite creates a missing database 0644 (less the umask) and gives its WAL and SHM the
    database's mode, so the ledger is made here first and SQLite opens what is already there.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE)
    except FileExistsError:
        return False
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
    return True


def write_file(path: str, data: bytes, *, sync: bool = False,
               temporary: str | None = None) -> None:
    """Write `data` to `path` through a temporary file beside it and a rename, so that a reader
    sees the whole file or none. A new file is 0600; a file being replaced keeps its mode. A
    failed write (a full disk) removes the temporary and raises the OSError.

    `sync` flushes the data to disk before the rename: on a filesystem with delayed allocation
    a full disk may show only at fsync, and a rename without it could publish an empty file.
    `temporary` names the temporary file (by default `.<name>.<pid>.tmp` beside `path`)."""
    directory = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = FILE_MODE
    temporary = temporary or os.path.join(directory,
                                          f".{os.path.basename(path)}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, FILE_MODE)
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def write_output(path: str, data: bytes) -> None:
    """Write a file the user named (`--output`): created 0600 when new, an existing one (or a
    device, `/dev/stdout`) written in place with its mode kept."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)

