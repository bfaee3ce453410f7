"""What the DeepSeek JIT layouts share: entry-name grammars, temporary-area names, scanning.

DeepJIT (`<tag>.<digest>`) and DeepGEMM/DeepEP (`kernel.<name>.<hash>`) both keep entries in
`<root>/cache/` and builds in `<root>/tmp/`, and one root can hold both: `DG_JIT_CACHE_DIR` is
read by DeepGEMM <= 2.6 and by DeepGEMM 2.8 on DeepJIT alike, so an upgrade under one setting
leaves a mixed root. Each reader therefore knows the other's entry names, skips them instead of
calling them leftovers, and accepts a root where its own entries are a minority.

Readers only read: every file is opened O_RDONLY (through `StateCache.capture` or `read_file`),
directories are listed with os.scandir, nothing is created, touched or removed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

from cacheaudit.digest import StateCache
from cacheaudit.layout import (
    is_directory,
    lstat_mtime_ns,
    outside,
    scandir_sorted,
    tmp_leftovers,
    unlistable,
    unreachable,
    unreachable_reason,
)
from cacheaudit.model import CacheEntry, CacheLeftover

# Re-exported: the layouts of the three runtimes read them from here.
from cacheaudit.runtimes._deepseek.roots import env_path_list as env_path_list
from cacheaudit.runtimes._deepseek.roots import home_default as home_default

# DeepJIT DiskCache::entry: the tag is [A-Za-z0-9_]+ (asserted), the digest is
# FNV1a::get_hex_digest, "{:016x}{:016x}": 32 lowercase hex digits.
DEEPJIT_ENTRY_RE = re.compile(r"([A-Za-z0-9_]+)\.([0-9a-f]{32})")


# DeepGEMM C++ JIT / DeepEP: "kernel.{name}.{get_hex_digest(sig)}" (32 lowercase hex);
# the Python JIT: "kernel.{name}.{md5[:12]}". A DeepJIT tag cannot hold a dot, so the two
# grammars never match the same name.
DEEPGEMM_ENTRY_RE = re.compile(r"kernel\.(.+)\.([0-9a-f]{32}|[0-9a-f]{12})")


# Names of build areas under <root>/tmp/: get_uuid() of DeepJIT and of DeepGEMM/DeepEP is
# "<pid>-<8 hex>-<8 hex>-<8 hex>"; uuid4 spellings are accepted too (the reference runtime and
# forks use them).
TMP_NAME_RE = re.compile(
    r"[0-9]+-[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{8}"
    r"|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
    r"|[0-9a-f]{32}"
)


CACHE_FILE_REASON = ("file lying directly in cache/: the runtime only ever publishes entry "
                     "directories there")


DANGLING_REASON = "dangling symlink in cache/: it points to {target!r}, which does not exist"


def list_entry(item: os.DirEntry[str], boundary_real: str, runtime_name: str
               ) -> tuple[dict[str, os.DirEntry[str]] | None, list[str]]:
    """An entry directory's names (None when it cannot be listed) and the problems met reaching
    it (CA402 evidence)."""
    problems: list[str] = []
    if item.is_symlink() and (target := outside(item.path, boundary_real)) is not None:
        problems.append(f"the entry directory is a symlink to {target}, outside the cache: "
                        f"{runtime_name} follows it, but what it points at was not published by "
                        f"{runtime_name} and can change under the same key")
    try:
        return {e.name: e for e in scandir_sorted(item.path)}, problems
    except OSError as exc:
        problems.append(f"the entry directory cannot be listed: {type(exc).__name__}: "
                        f"{exc.strerror or exc}")
        return None, problems


def symlinks_outside(names: Mapping[str, os.DirEntry[str]], wanted: Iterable[str],
                     boundary_real: str) -> list[str]:
    """Problems (CA402 evidence) for each of the `wanted` files that is a symlink leading out of
    the cache: its content can change under an unchanged key."""
    problems = []
    for name in wanted:
        found = names.get(name)
        if found is not None and found.is_symlink() and (
                target := outside(found.path, boundary_real)) is not None:
            problems.append(f"{name} is a symlink to {target}, outside the cache: its content "
                            "can change without the key changing")
    return problems


def has_entry_named(cache_dir: str, pattern: re.Pattern[str]) -> bool:
    """Whether cache/ holds a directory whose name fits `pattern`.

    Names come from the directory listing (no stat per name); the scan stops at the first match.
    It reads the whole listing when there is none, because a mixed root may hold a few entries
    of one layout among thousands of the other: a listing of 10,000 names costs milliseconds.
    """
    try:
        with os.scandir(cache_dir) as it:
            for entry in it:
                if pattern.fullmatch(entry.name) and is_directory(entry):
                    return True
    except OSError:
        return False
    return False


# What a DeepJIT or DeepGEMM 2.x build directory holds before its commit: the source, written
# first, then the compiler's outputs and meta.json (CUDA, ROCm and Ascend spellings).
_BUILD_FILE_RE = re.compile(r"kernel\.[A-Za-z0-9_.]+|meta\.json|compiler\.log|asm")


def only_killed_builds(root: str) -> bool:
    """A root whose first build was killed before its commit: no `cache/` yet (the commit
    creates it), and a `tmp/` holding a build directory named like the family's (`TMP_NAME_RE`)
    that is empty or holds only what a build writes. The contents are looked at, not only the
    names, because a uuid-named directory under some `tmp/` proves little by itself."""
    if os.path.lexists(os.path.join(root, "cache")):
        return False
    try:
        with os.scandir(os.path.join(root, "tmp")) as it:
            builds = [entry.path for _, entry in zip(range(16), it, strict=False)
                      if TMP_NAME_RE.fullmatch(entry.name) and is_directory(entry)]
    except OSError:
        return False
    for build in builds:
        try:
            names = os.listdir(build)
        except OSError:
            continue
        if all(_BUILD_FILE_RE.fullmatch(name) for name in names):
            return True
    return False


def has_tmp_named(tmp_dir: str, pattern: re.Pattern[str], *, dirs: bool, limit: int = 16) -> bool:
    """Whether tmp/ holds, among its first `limit` names, a directory (or file) fitting
    `pattern`."""
    try:
        with os.scandir(tmp_dir) as it:
            for count, entry in enumerate(it):
                if count >= limit:
                    break
                if pattern.fullmatch(entry.name) and is_directory(entry) == dirs:
                    return True
    except OSError:
        return False
    return False


def cache_leftover(runtime: str, layout: str, root: str, entry: os.DirEntry[str],
                   dir_reason: str) -> CacheLeftover:
    """A non-entry in cache/: a stray file, a dangling link, or an odd-named directory."""
    if is_directory(entry):
        reason = dir_reason
    elif entry.is_symlink() and (error := unreachable(entry.path)) is not None:
        reason = unreachable_reason(error)
    elif entry.is_symlink() and not os.path.exists(entry.path):
        try:
            target = os.readlink(entry.path)
        except OSError:
            target = "?"
        reason = DANGLING_REASON.format(target=target)
    else:
        reason = CACHE_FILE_REASON
    return CacheLeftover(runtime=runtime, layout=layout, root=root, path=entry.path,
                         reason=reason, mtime_ns=lstat_mtime_ns(entry))


EntryReader = Callable[[str, os.DirEntry[str], str, str, str, StateCache], CacheEntry]


def read_cache_root(root: str, cache: StateCache, *, runtime: str, layout: str,
                    own: re.Pattern[str], other: re.Pattern[str], read_entry: EntryReader,
                    odd_name_reason: str, file_reason: Mapping[str, str] | None = None
                    ) -> Iterator[CacheEntry | CacheLeftover]:
    """Entries and leftovers under `root`, sorted by path (cache/ before tmp/).

    Directories named like the other layout's entries are skipped: in a root that holds both
    layouts (DG_JIT_CACHE_DIR serves DeepGEMM 2.6 and 2.8 alike) they belong to the other
    reader, not to this layout's leftovers.
    """
    cache_dir = os.path.join(root, "cache")
    try:
        listing = scandir_sorted(cache_dir)
    except FileNotFoundError:
        listing = []
    except OSError as exc:
        listing = []
        yield unlistable(runtime, layout, root, cache_dir, exc)
    boundary = os.path.realpath(cache_dir)
    for item in listing:
        match = own.fullmatch(item.name)
        if match and (is_directory(item)
                      or (item.is_symlink() and unreachable(item.path) is not None)):
            # An entry that is a symlink loop is still this runtime's entry: its reader says
            # it cannot be listed (CA402 for that entry) and the others are judged as ever.
            yield read_entry(root, item, match.group(1), match.group(2), boundary, cache)
        elif other.fullmatch(item.name) and is_directory(item):
            continue
        else:
            yield cache_leftover(runtime, layout, root, item, odd_name_reason)
    yield from tmp_leftovers(runtime, layout, root, file_reason)
