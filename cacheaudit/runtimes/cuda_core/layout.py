# cuda.core's FileStreamProgramCache (cuda-core >= 1.2,
# cuda_core/cuda/core/utils/_program_cache/_file_stream.py, checked against 1.2.2):
#
#   <root>/                     FileStreamProgramCache(path); default
#                               $XDG_CACHE_HOME/cuda-python/program-cache, with XDG_CACHE_HOME
#                               unset or empty: ~/.cache/cuda-python/program-cache
#                               (utils/_cache_dir.py; %LOCALAPPDATA% on Windows)
#     entries/                  created by the constructor
#       <2 hex>/<62 hex>        one entry: the raw compiled bytes (cubin, PTX or LTO-IR), no
#                               header or framing. The 64 hex digits are
#                               sha256(key bytes), key = make_program_cache_key(...) (32 bytes)
#                               or any bytes/str key a caller uses (str as UTF-8). Written to
#                               tmp/ first, fsynced, then os.replace'd into place; a read bumps
#                               the atime (os.utime), eviction (max_size_bytes) removes the
#                               oldest atime first. Lookups follow symlinks (Path.read_bytes);
#                               counting and eviction skip them (is_file(follow_symlinks=False)).
#     tmp/                      mode 0700; entry-XXXXXXXX files from tempfile.mkstemp(prefix=
#                               "entry-"): a write in progress, or the leftover of a writer that
#                               died before os.replace. Swept when older than 3600 s by the
#                               next constructor, clear() or size-cap eviction.
#
# Nothing else is written: no index, no metadata, no key. The entry's name is all there is of
# its key, and the bytes are all there is of its compile, so the compile record (adapter
# cuda_core) is what ties an entry to its source, options and headers, through the bytes'
# xxh3-128.
"""Reader for cuda.core's FileStreamProgramCache: one CacheEntry per file under entries/.

Why a reader: a cache built by processes cacheaudit did not observe can still be listed, checked
for interrupted writes and empty entries, and tied to whatever compile records exist for the
same bytes.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping

from cacheaudit.digest import StateCache
from cacheaudit.layout import (
    Layout,
    binary_format,
    is_directory,
    lstat_mtime_ns,
    read_head,
    scandir_sorted,
    unlistable,
    unreachable,
)
from cacheaudit.model import CacheEntry, CacheLeftover
from cacheaudit.runtimes.cuda_core.spec import default_roots as spec_default_roots

RUNTIME = "cuda-core"
LAYOUT_NAME = "cuda_core"

ENTRIES = "entries"
TMP = "tmp"
TMP_STALE_S = 3600
"""cuda.core's _TMP_STALE_AGE_SECONDS: temp files older than this are a dead writer's."""

SUBDIR_RE = re.compile(r"[0-9a-f]{2}")
NAME_RE = re.compile(r"[0-9a-f]{62}")
TMP_RE = re.compile(r"entry-[A-Za-z0-9_]+")

class CudaCoreReader(Layout):
    """The `Reader` for FileStreamProgramCache's layout (see the module header)."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """`$XDG_CACHE_HOME/cuda-python/program-cache`, else under `~/.cache`
        (the spec's `default_roots`)."""
        return spec_default_roots(env)

    def is_root(self, path: str) -> bool:
        """An `entries/` directory beside a `tmp/` one (the constructor makes both), or one
        holding a two-hex-digit directory."""
        entries = os.path.join(path, ENTRIES)
        if not os.path.isdir(entries):
            return False
        if os.path.isdir(os.path.join(path, TMP)):
            return True
        try:
            with os.scandir(entries) as it:
                return any(SUBDIR_RE.fullmatch(e.name) and is_directory(e) for e in it)
        except OSError:
            return False

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        entries_dir = os.path.join(root, ENTRIES)
        try:
            subdirs = scandir_sorted(entries_dir)
        except FileNotFoundError:
            subdirs = []
        except OSError as exc:
            subdirs = []
            yield unlistable(RUNTIME, LAYOUT_NAME, root, entries_dir, exc)
        for subdir in subdirs:
            if not (SUBDIR_RE.fullmatch(subdir.name) and subdir.is_dir(follow_symlinks=False)):
                yield CacheLeftover(
                    runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=subdir.path,
                    reason=("in entries/ but not a two-hex-digit directory: cuda.core never "
                            "looks it up (its entries are entries/<2 hex>/<62 hex>)"),
                    mtime_ns=lstat_mtime_ns(subdir))
                continue
            try:
                files = scandir_sorted(subdir.path)
            except OSError as exc:
                yield unlistable(RUNTIME, LAYOUT_NAME, root, subdir.path, exc)
                continue
            for item in files:
                named = NAME_RE.fullmatch(item.name) is not None
                if named and not is_directory(item):
                    yield read_entry(root, subdir.name, item, cache)
                    continue
                if named:
                    reason = ("a directory with an entry's name: cuda.core only ever writes "
                              "files there; a lookup of this key reads it with "
                              "Path.read_bytes, whose IsADirectoryError is no miss but an error "
                              "out of the compile, until the directory is removed")
                else:
                    reason = ("not a name cuda.core writes (62 hex digits of a SHA-256 after "
                              "the two in the directory name): never looked up")
                yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=item.path,
                                    reason=reason, mtime_ns=lstat_mtime_ns(item))
        yield from tmp_files(root)


def read_entry(root: str, prefix: str, item: os.DirEntry[str], cache: StateCache) -> CacheEntry:
    """One entry file, with every reason it is corrupt or partial (CA402 evidence)."""
    path = item.path
    problems: list[str] = []
    if item.is_symlink():
        target = os.path.realpath(path)
        if (error := unreachable(path)) is not None:
            problems.append(f"a symlink that cannot be followed ({error.strerror or error}): a "
                            "lookup of this key fails on it, and the next store replaces it")
        elif not os.path.exists(path):
            try:
                pointed = os.readlink(path)
            except OSError:
                pointed = "?"
            problems.append(f"dangling symlink to {pointed!r}: a lookup misses and the next "
                            "store replaces it")
        else:
            problems.append(f"a symlink to {target}: cuda.core reads through it on a hit, but "
                            "never wrote it, never counts it toward max_size_bytes and never "
                            "evicts it; what it points at can change under the same key")
    binary = cache.capture(path)
    fmt = "unknown"
    if binary.exists and binary.digest is None:
        problems.append(f"the entry cannot be read: {binary.error}")
    elif binary.exists:
        fmt = binary_format(read_head(path, 64))
        if binary.size == 0:
            problems.append("empty (0 bytes): a hit hands back an empty binary, which fails to "
                            "load; cuda.core stores whatever the compile returned without "
                            "checking it")
    key = prefix + item.name
    return CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path,
                      kernel=f"{fmt} {key[:12]}", key=key, binary=binary,
                      meta={"format": fmt, "key_is": "sha256 of the program-cache key"},
                      files=(item.name,), problems=tuple(problems))


def tmp_files(root: str, now_s: float | None = None) -> Iterator[CacheLeftover]:
    """Files in tmp/: each is a write that never reached os.replace (or one running now), judged
    by cuda.core's own sweep age (unlike `cacheaudit.layout.tmp_leftovers`, where everything in
    tmp/ is a crashed build)."""
    tmp_dir = os.path.join(root, TMP)
    try:
        items = scandir_sorted(tmp_dir)
    except FileNotFoundError:
        return
    except OSError as exc:
        yield unlistable(RUNTIME, LAYOUT_NAME, root, tmp_dir, exc)
        return
    now_s = time.time() if now_s is None else now_s
    for item in items:
        mtime_ns = lstat_mtime_ns(item)
        age = now_s - mtime_ns / 1e9
        if item.is_dir(follow_symlinks=False):
            reason = "a directory in tmp/: cuda.core only ever writes files there"
        elif not TMP_RE.fullmatch(item.name):
            reason = "a file in tmp/ that cuda.core did not name (its temp files are entry-*)"
        elif age > TMP_STALE_S:
            reason = (f"temporary file of a write that never reached os.replace, "
                      f"{age / 3600:.1f} h old: its writer died; cuda.core sweeps it on the "
                      f"next open, clear() or eviction")
        else:
            reason = (f"temporary file {age:.0f} s old: a write in progress, or one whose "
                      f"writer died (cuda.core waits {TMP_STALE_S} s before sweeping)")
        yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=item.path,
                            reason=reason, mtime_ns=mtime_ns)


LAYOUT = CudaCoreReader()
