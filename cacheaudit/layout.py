"""Layouts: the base of every runtime's on-disk cache reader, and what readers share.

A layout answers three questions about one runtime's cache: where its roots are by default (from
the environment and the runtime's own defaults), whether a given directory is one of its roots,
and what entries (and leftovers) a root holds. A runtime package subclasses `Layout` in its
`layout.py`, whose docstring gives the grammar of the cache it parses (as ccache's manifest.cpp
does); the registry (`cacheaudit.runtimes`) lists them.

Readers only read: every file is opened O_RDONLY (through `StateCache.capture` or `read_file`),
directories are listed with os.scandir, nothing is created, touched or removed, and no compiler
is run. Eviction (`cacheaudit evict`) asks a layout two questions, `evict_paths` and
`eviction_blocker`, and does the removing itself (`cacheaudit.audit.evict`): a layout only names
what makes up an entry.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from cacheaudit import bounded
from cacheaudit.digest import StateCache, read_file
from cacheaudit.model import CacheEntry, CacheLeftover, FileState

# Re-exported: the readers share it with the runtimes' root rules (`cacheaudit.roots`).
from cacheaudit.roots import unique_paths as unique_paths


class Layout:
    """One cache layout. Subclasses set `layout` and `runtime` and implement the three methods;
    `layout` is the registry's name for it ("deepjit", "torch_ext", ...)."""

    layout: str = ""
    runtime: str = ""

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """Cache roots this runtime would use under `env`, existing or not, in lookup order."""
        raise NotImplementedError

    def root_variables(self, env: Mapping[str, str]) -> tuple[str, ...]:
        """Variables set in `env`, beyond the spec's `cache_variables`, whose values name this
        layout's roots (a scan refuses one that names no existing directory). Default: none;
        a layout that reads variables by pattern names those `env` holds."""
        return ()

    def is_root(self, path: str) -> bool:
        """Whether `path` looks like a root of this layout (cheap: a few stats)."""
        raise NotImplementedError

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        """Every entry and leftover under `root`. File states come from `cache`."""
        raise NotImplementedError

    def build_places(self, entry: CacheEntry) -> tuple[str, ...]:
        """Directories a compile that built `entry` ran in or wrote to: a recorded compile
        whose working directory, arguments or outputs name none of them was built for another
        cache (docs/design.md, "Tying an entry to its compile"). Default: the entry's cache
        root, which holds the temporary build directories of runtimes that build in
        `<root>/tmp/...` and rename into place, and the entry itself."""
        return (entry.root,)

    def evict_paths(self, entry: CacheEntry) -> tuple[str, ...]:
        """What to remove so that the runtime's next lookup of `entry` misses and compiles
        afresh, the path whose removal makes the miss first; the evictor renames a directory
        out of the way in one step (a reader sees the whole entry or none of it) and unlinks a
        file. Default: the entry's own path, a directory (DeepJIT, DeepGEMM, a Triton key
        directory with its `__grp__` file, a torch build directory with its objects and ninja
        logs) or a file (cuda.core). A runtime whose entry has parts beside its path (CuPy's
        saved `.cu` source) names them after it."""
        return (entry.path,)

    def eviction_blocker(self, entry: CacheEntry) -> str | None:
        """Why `entry` must not be evicted now (a build in progress owns it), or None. Default:
        None, for runtimes that build elsewhere and publish by a rename."""
        return None


JSON_LIMIT = bounded.CACHE_FILE_BYTES
"""How large a metadata file in a cache may be before a reader refuses to parse it."""


def read_json(path: str) -> Any:
    """A metadata file of a cache, parsed within `bounded`'s limits (size, nesting depth), never
    waiting on a FIFO. Raises OSError (`NotARegularFile` for a FIFO or a device, as
    `read_file`), or `bounded.Refused` with a one-line reason."""
    return bounded.loads(read_file(path, JSON_LIMIT + 1), max_bytes=JSON_LIMIT)


def refusal_text(name: str, exc: bounded.Refused) -> str | None:
    """How a reader words a refused metadata file `name` when the refusal is about the limits
    or the file's kind (None for a syntax error: each reader has its own words for those)."""
    if exc.kind == "syntax":
        return None
    return f"{name} {exc.reason}: not parsed (a runtime never writes one like it)"


TMP_DIR_REASON = ("temporary build directory that was never committed "
                  "(a crashed or interrupted compile)")


TMP_FILE_REASON = ("temporary file that was never renamed into place "
                   "(a crashed or interrupted compile or write)")


HEAD_BYTES = 16384
"""How much of a file `read_head` reads: enough for the headers and markers layouts look for at
the top of a generated source or a binary."""


def scandir_sorted(path: str) -> list[os.DirEntry[str]]:
    """The entries of a directory sorted by name (scandir order is the filesystem's, not stable).
    Raises OSError as os.scandir does."""
    with os.scandir(path) as it:
        return sorted(it, key=lambda e: e.name)


def is_directory(entry: os.DirEntry[str]) -> bool:
    """`entry.is_dir()` (symlinks followed) that says False where the target cannot be reached:
    a symlink loop (`ln -s loop loop`) or a denied directory on the way raises OSError there."""
    try:
        return entry.is_dir()
    except OSError:
        return False


def unreachable(path: str) -> OSError | None:
    """The error that following `path` meets when it is a symlink that leads nowhere readable
    (ELOOP for a loop, EACCES), or None: a dangling symlink (ENOENT) is not unreachable but
    missing, which readers report in their own words."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    return None


def unreachable_reason(exc: OSError) -> str:
    """A leftover's reason for a symlink that cannot be followed."""
    return (f"symlink that cannot be followed ({exc.strerror or exc}): whatever looks it up "
            "fails the same way")


def lstat_mtime_ns(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mtime_ns
    except OSError:
        return 0


def outside(path: str, boundary_real: str) -> str | None:
    """The resolved target of `path` when it lies outside `boundary_real`, else None."""
    target = os.path.realpath(path)
    if target == boundary_real or target.startswith(boundary_real.rstrip(os.sep) + os.sep):
        return None
    return target


_ELF = b"\x7fELF"


_BITCODE = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")


def binary_format(head: bytes | None) -> str:
    """What the raw bytes of an entry are: "cubin" (ELF), "ptx" (text), "ltoir" (NVVM bitcode),
    "empty", or "unknown"."""
    if head is None:
        return "unknown"
    if not head:
        return "empty"
    if head.startswith(_ELF):
        return "cubin"
    if head.startswith(_BITCODE):
        return "ltoir"
    text = head.lstrip()
    if text.startswith((b"//", b".version", b".target")):
        return "ptx"
    return "unknown"


def read_head(path: str, limit: int = HEAD_BYTES) -> bytes | None:
    """The first `limit` bytes of a regular file, or None when it cannot be read."""
    try:
        return read_file(path, limit)
    except OSError:
        return None


def capture(directory: str, name: str, names: Mapping[str, os.DirEntry[str]],
            cache: StateCache) -> FileState:
    """The state of `name` in an entry directory already listed as `names`: a name the listing
    lacks is missing without a second look (the listing is what the scan judged)."""
    path = os.path.join(directory, name)
    return cache.capture(path) if name in names else FileState.missing(path)


def unlistable(runtime: str, layout: str, root: str, path: str, exc: OSError) -> CacheLeftover:
    """A leftover standing for a directory the reader could not list: evidence, not silence."""
    reason = f"cannot list {os.path.basename(path)}/: {type(exc).__name__}: {exc.strerror or exc}"
    return CacheLeftover(runtime=runtime, layout=layout, root=root, path=path, reason=reason)


def tmp_leftovers(runtime: str, layout: str, root: str,
                  file_reason: Mapping[str, str] | None = None) -> Iterator[CacheLeftover]:
    """Everything under <root>/tmp/, sorted by name: nothing there is ever an entry.

    A compile that is running right now also has a directory here; `mtime_ns` lets the judge
    tell a fresh one from a crashed writer's. `file_reason` maps a name prefix to a more precise
    reason for temporary files (the Python JIT's "nvcc.tmp." files).
    """
    tmp_dir = os.path.join(root, "tmp")
    try:
        entries = scandir_sorted(tmp_dir)
    except FileNotFoundError:
        return
    except OSError as exc:
        yield unlistable(runtime, layout, root, tmp_dir, exc)
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            reason = TMP_DIR_REASON
        else:
            reason = next((text for prefix, text in (file_reason or {}).items()
                           if entry.name.startswith(prefix)), TMP_FILE_REASON)
        yield CacheLeftover(runtime=runtime, layout=layout, root=root, path=entry.path,
                            reason=reason, mtime_ns=lstat_mtime_ns(entry))
