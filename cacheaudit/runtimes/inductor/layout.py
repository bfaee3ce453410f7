# Inductor's on-disk caches (torch 2.13.0; paths from torch/_inductor/codecache.py and
# torch/_functorch/_aot_autograd/autograd_cache.py).
#
#   <root>/                      cache_dir(): $TORCHINDUCTOR_CACHE_DIR made absolute, else
#                                default_cache_dir() = $TMPDIR/torchinductor_<user>
#                                (runtime/cache_dir_utils.py:14, :24; <user> from getpass with
#                                \/:*?"<>| replaced by _)
#     <xx>/                      two characters: key[1:3] (codecache.py get_path, :439)
#       <key>.main.cpp           a C++ kernel's source (CppCodeCache.load_async, :3764): key =
#                                code_hash(source.strip(), extra=f"{optimized_code} {command}"),
#                                "c" + 51 base32 characters; the command is CppBuilder's
#                                get_command_line() for name "o", source "i" (:3752)
#       <key>.main.so            the library built from it: loaded when it exists, never
#                                rebuilt (_worker_compile_cpp, :3873)
#       <key>.optimized.cpp/.o   cpp_wrapper mode only: the kernel half, compiled and linked in
#       <key>.main.o             into the .main.so
#       <key>.cpp, <key>.so      other C++ compiled the same way: the vector-ISA probes
#                                (cpu_vec_isa.py VecISA.check_build, :164: `__avx_chk_kernel`)
#       <key>_CxxBuild/          the build's working directory (cpp_builder.py CppBuilder.build,
#                                :2556), removed after a build; one left is a build that died
#       <key>.py                 generated Python wrappers (PyCodeCache): not compiled, skipped
#     fxgraph/<key[1:3]>/<key>/<entry>
#                                FX graph entries (FxGraphCache._get_tmp_dir_for_key, :1887):
#                                a pickle of the compiled graph with its wrapper source; <entry>
#                                is a hash of the guards. Never unpickled here: a pickle names
#                                code to run when loaded. Read as files only: name, size, mtime
#     aotautograd/<key>/<entry>  AOTAutograd entries (autograd_cache.py:1159, :1162): pickles too
#     locks/<key>.lock           FileLocks (codecache.py get_lock_dir, :422): skipped
#     precompiled_headers/       only under default_cache_dir(), whatever TORCHINDUCTOR_CACHE_DIR
#                                says (codecache.py _HEADER_DIR, :3542):
#       <key>.h                  `#include <torch/csrc/inductor/cpp_prefix.h>`; key over the
#                                command line, the sha512 of the preprocessed header and
#                                `<compiler> -v` (_precompile_header, :3594)
#       <key>.h.gch              the precompiled header g++ uses for -include <key>.h
#       locks/                   skipped
"""Reader for Inductor's caches: one entry per C++ kernel (source and library pair), per
precompiled header, and per FX graph or AOTAutograd entry file.

What was chosen for the pickled entries: their file names, sizes and times only. Nothing in
them is parsed (a pickle is a program for the unpickler, and cacheaudit never runs what a cache
holds); the kernels they call are the `<xx>/<key>.main.so` files, which are entries of their
own and carry the C++ layer's evidence.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

from cacheaudit.digest import StateCache
from cacheaudit.layout import (
    Layout,
    is_directory,
    lstat_mtime_ns,
    scandir_sorted,
    unlistable,
)
from cacheaudit.model import CacheEntry, CacheLeftover

# Re-exported: the adapter and the tests read it from the layout.
from cacheaudit.runtimes.inductor.spec import default_cache_dir as default_cache_dir
from cacheaudit.runtimes.inductor.spec import default_roots as spec_default_roots

RUNTIME = "inductor"
LAYOUT_NAME = "inductor"

KEY_RE = re.compile(r"[a-z][a-z2-7]{51}")
"""code_hash's keys: a one-letter prefix and 51 base32 characters (lower case)."""
SHARD_RE = re.compile(r"[a-z2-7]{2}")
FX_KEY_RE = re.compile(r"f[a-z2-7]{51}")
AOT_KEY_RE = re.compile(r"a[a-z2-7]{51}")

KERNEL_SUFFIXES = ((".main.cpp", ".main.so", "kernel"), (".cpp", ".so", "cpp"))
"""(source suffix, library suffix, kind), the longer suffix first."""
BUILD_DIR_SUFFIX = "_CxxBuild"
HEADERS_DIR = "precompiled_headers"
FX_DIR = "fxgraph"
AOT_DIR = "aotautograd"

BUILD_DIR_REASON = ("an Inductor C++ build that never finished: CppBuilder.build compiles in "
                    "<key>_CxxBuild/ and removes it afterwards")
NO_LIBRARY_REASON = ("C++ source without its library: a compile that failed or is running "
                     "(the next lookup compiles it again)")


class InductorReader(Layout):
    """The reader of Inductor's layout (the grammar is the module header)."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """cache_dir(), then the default directory (the spec's `default_roots`)."""
        return spec_default_roots(env)

    def is_root(self, path: str) -> bool:
        """A directory holding fxgraph/, aotautograd/, precompiled_headers/ or a shard with a
        kernel pair (the first few shards are looked into)."""
        for name in (FX_DIR, AOT_DIR, HEADERS_DIR):
            if os.path.isdir(os.path.join(path, name)):
                return True
        try:
            with os.scandir(path) as it:
                shards = [item.path for item in it
                          if SHARD_RE.fullmatch(item.name) and is_directory(item)][:16]
        except OSError:
            return False
        return any(_kernel_pairs(shard) for shard in shards)

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        try:
            listing = scandir_sorted(root)
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, root, exc)
            return
        for item in listing:
            if not is_directory(item) or item.is_symlink():
                continue  # a symlinked shard leads outside the root: never followed
            if SHARD_RE.fullmatch(item.name):
                yield from self._shard(root, item.path, cache)
            elif item.name == FX_DIR:
                yield from self._pickled(root, item.path, "fxgraph", cache, sharded=True)
            elif item.name == AOT_DIR:
                yield from self._pickled(root, item.path, "aotautograd", cache, sharded=False)
            elif item.name == HEADERS_DIR:
                yield from self._headers(root, item.path, cache)

    def _shard(self, root: str, shard: str, cache: StateCache
               ) -> Iterator[CacheEntry | CacheLeftover]:
        try:
            listing = scandir_sorted(shard)
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, shard, exc)
            return
        names = {item.name: item for item in listing}
        for item in listing:
            if (item.name.endswith(BUILD_DIR_SUFFIX) and item.is_dir(follow_symlinks=False)
                    and not any(item.name[:-len(BUILD_DIR_SUFFIX)] + suffix in names
                                for suffix in (".main.so", ".so"))):
                yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root,
                                    path=item.path, reason=BUILD_DIR_REASON,
                                    mtime_ns=lstat_mtime_ns(item))
        for key, source_name, library_name, kind in _kernel_pairs_of(names):
            source = os.path.join(shard, source_name)
            library = os.path.join(shard, library_name)
            if library_name not in names:
                yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root,
                                    path=source, reason=NO_LIBRARY_REASON,
                                    mtime_ns=lstat_mtime_ns(names[source_name]))
                continue
            files = tuple(os.path.join(shard, f"{key}{suffix}")
                          for suffix in (".optimized.cpp", ".optimized.o", ".main.o")
                          if f"{key}{suffix}" in names)
            yield CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=library,
                             kernel=kind, key=key, binary=cache.capture(library),
                             source=cache.capture(source), files=files,
                             meta={"kind": kind})

    def _pickled(self, root: str, top: str, kind: str, cache: StateCache, *, sharded: bool
                 ) -> Iterator[CacheEntry | CacheLeftover]:
        """FX graph or AOTAutograd entries: one per file under <key>/, by name only."""
        pattern = FX_KEY_RE if kind == "fxgraph" else AOT_KEY_RE
        try:
            tops = scandir_sorted(top)
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, top, exc)
            return
        key_dirs: list[os.DirEntry[str]] = []
        for item in tops:
            if item.is_symlink() or not is_directory(item):
                continue
            if not sharded:
                key_dirs.append(item)
                continue
            try:
                key_dirs.extend(scandir_sorted(item.path))
            except OSError as exc:
                yield unlistable(RUNTIME, LAYOUT_NAME, root, item.path, exc)
        for key_dir in key_dirs:
            if key_dir.is_symlink() or not is_directory(key_dir) \
                    or not pattern.fullmatch(key_dir.name):
                continue
            try:
                files = scandir_sorted(key_dir.path)
            except OSError as exc:
                yield unlistable(RUNTIME, LAYOUT_NAME, root, key_dir.path, exc)
                continue
            for entry_file in files:
                if not entry_file.is_file(follow_symlinks=False):
                    continue
                yield CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root,
                                 path=entry_file.path, kernel=kind, key=key_dir.name,
                                 binary=cache.capture(entry_file.path),
                                 meta={"kind": kind, "guards": entry_file.name})

    def _headers(self, root: str, directory: str, cache: StateCache
                 ) -> Iterator[CacheEntry | CacheLeftover]:
        try:
            listing = scandir_sorted(directory)
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, directory, exc)
            return
        names = {item.name for item in listing}
        for item in listing:
            key = item.name[:-2] if item.name.endswith(".h") else None
            if key is None or not KEY_RE.fullmatch(key) or f"{item.name}.gch" not in names:
                continue
            binary = os.path.join(directory, f"{item.name}.gch")
            yield CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=binary,
                             kernel="precompiled_header", key=key,
                             binary=cache.capture(binary), source=cache.capture(item.path),
                             meta={"kind": "precompiled_header"})

    def evict_paths(self, entry: CacheEntry) -> tuple[str, ...]:
        """The library first (a lookup that finds no library compiles afresh:
        `_worker_compile_cpp` checks for it), then the source and the other halves."""
        if entry.meta.get("kind") in ("kernel", "cpp", "precompiled_header"):
            source = (entry.source.path,) if entry.source is not None else ()
            return (entry.path, *source, *entry.files)
        return (entry.path,)


def _kernel_pairs_of(names: Mapping[str, os.DirEntry[str]]
                     ) -> Iterator[tuple[str, str, str, str]]:
    """(key, source name, library name, kind) for every C++ source in a shard listing."""
    for name in sorted(names):
        for source_suffix, library_suffix, kind in KERNEL_SUFFIXES:
            if not name.endswith(source_suffix):
                continue
            key = name[:-len(source_suffix)]
            if KEY_RE.fullmatch(key) and not names[name].is_symlink():
                yield key, name, key + library_suffix, kind
            break


def _kernel_pairs(shard: str) -> bool:
    try:
        with os.scandir(shard) as it:
            names = {item.name: item for item in it}
    except OSError:
        return False
    return any(library in names for _, _, library, _ in _kernel_pairs_of(names))


LAYOUT = InductorReader()
