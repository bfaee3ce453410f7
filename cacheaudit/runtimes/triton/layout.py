# Triton's on-disk cache layout (triton 3.9.0 python/triton/runtime/cache.py FileCacheManager,
# compiler/compiler.py compile, runtime/build.py, runtime/autotuner.py).
#
#   <root>/                      knobs.cache.dir: TRITON_CACHE_DIR when set, else
#                                $TRITON_HOME/.triton/cache, TRITON_HOME defaulting to ~ (the
#                                home directory as of Triton's import). An empty TRITON_CACHE_DIR
#                                makes every compile fail ("Could not create or locate cache dir").
#     <KEY>/                     one key directory per cache key: KEY = base32 of the 32-byte
#                                sha256, without "=" padding (52 characters of A-Z2-7)
#       <name>.source            kernel entries (compile()): the IR the front end produced (TTIR
#                                for a @jit function), then one file per stage:
#       <name>.ttir .ttgir .llir .ptx
#       <name>.cubin             the binary (AMD: <name>.hsaco); with TRITON_STORE_BINARY_ONLY=1
#                                only the binary and the json are stored
#       <name>.json              the metadata: "hash" (the hex sha256 behind KEY), "target"
#                                {backend, arch, warp_size}, every option (num_warps, ...,
#                                "extern_libs": [[name, absolute path]]), the cache-invalidating
#                                variables that were set (upper-case keys), "triton_version", and
#                                what the stages found ("name", "shared", ...)
#       __grp__<name>.json       {"child_paths": {"<name>.<ext>": "<absolute path>", ...}}: what
#                                a lookup reads. A lookup hits iff this file parses and every
#                                child path exists; the paths are absolute, so a moved or copied
#                                cache misses, or reads from wherever the old paths now lead
#       tmp.pid_<pid>_<uuid>/    a write in progress: each file is written here, then moved
#                                into place with os.replace and the directory removed; one left
#                                behind is a writer that died mid-write
#       <name><EXT_SUFFIX>       native modules built by runtime/build.py (3.9.0: cuda_utils,
#                                from backends/nvidia/driver.c, with $CC) share the root, keyed
#                                on their C source, flags and platform; not kernel entries,
#                                skipped
#       <fn>.autotune.json       autotuning results (TRITON_CACHE_AUTOTUNING), skipped
#
# A key directory holds one kernel: the key covers the @jit function's own cache_key, so two
# kernels never share one. TRITON_DUMP_DIR and TRITON_OVERRIDE_DIR use the same layout keyed by
# the source hash alone; they are not caches and are not read here.
"""Reader for Triton's kernel cache: one CacheEntry per key directory holding a kernel.

Why a reader: caches filled before cacheaudit was installed, or by processes it did not observe
(a CI cache restored onto a new machine), can only be judged from what Triton left on disk: the
metadata json carries the options, the target, the cache-invalidating environment and the
Triton version of every entry.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Iterator, Mapping
from typing import Any

from cacheaudit.bounded import Refused
from cacheaudit.digest import StateCache
from cacheaudit.layout import (
    Layout,
    capture,
    is_directory,
    lstat_mtime_ns,
    outside,
    read_json,
    refusal_text,
    scandir_sorted,
    unlistable,
    unreachable,
    unreachable_reason,
)
from cacheaudit.model import CacheEntry, CacheLeftover
from cacheaudit.runtimes.triton.spec import default_roots as spec_default_roots

RUNTIME = "triton"
LAYOUT_NAME = "triton"

KEY_RE = re.compile(r"[A-Z2-7]{52}")
TMP_RE = re.compile(r"tmp\.pid_[0-9]+_.+")
GROUP_PREFIX = "__grp__"
STAGES = ("source", "ttir", "ttgir", "llir", "ptx", "amdgcn", "json")
BINARIES = ("cubin", "hsaco")
"""Binary extensions by backend (CUDABackend.binary_ext, HIPBackend.binary_ext)."""

TMP_REASON = ("a write that never finished: Triton writes each file into tmp.pid_<pid>_<uuid>/ "
              "and moves it into place; this one's writer died first")
ODD_REASON = ("directory in Triton's cache whose name is not a key (base32 of a sha256): "
              "Triton never looks it up")


def base32_name(key: str) -> str:
    """The entry directory's name for a hex key (`runtime/cache.py` `_base32`)."""
    return base64.b32encode(bytes.fromhex(key)).decode("ascii").rstrip("=")


def key_from_name(name: str) -> str | None:
    """The hex key behind an entry directory's name, or None when it is not one."""
    if len(name) != 52:
        return None
    try:
        raw = base64.b32decode(name + "====", casefold=False)
    except (binascii.Error, ValueError):
        return None
    return raw.hex() if len(raw) == 32 else None


class TritonReader(Layout):
    """The `Reader` for Triton's layout (see the module header for the format)."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """`knobs.cache.dir`: TRITON_CACHE_DIR, else under TRITON_HOME or HOME
        (the spec's `default_roots`)."""
        return spec_default_roots(env)

    def is_root(self, path: str) -> bool:
        """A directory holding a key directory with a kernel's group or metadata file (the
        first few key directories are looked into; a root of native modules only says no)."""
        try:
            with os.scandir(path) as it:
                looked = 0
                for item in it:
                    if not KEY_RE.fullmatch(item.name) or not is_directory(item):
                        continue
                    looked += 1
                    if _has_kernel_files(item.path):
                        return True
                    if looked >= 64:
                        break
        except OSError:
            return False
        return False

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        try:
            listing = scandir_sorted(root)
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, root, exc)
            return
        boundary = os.path.realpath(root)
        for item in listing:
            if not is_directory(item):
                if (item.is_symlink() and KEY_RE.fullmatch(item.name)
                        and (error := unreachable(item.path)) is not None):
                    # A key directory that is a symlink loop: Triton's lookup of the key fails
                    # on it, so it is said, and the other keys are read as ever.
                    yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root,
                                        path=item.path, reason=unreachable_reason(error),
                                        mtime_ns=lstat_mtime_ns(item))
                continue  # Triton writes nothing directly into the root; leave strays alone
            if not KEY_RE.fullmatch(item.name):
                yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=item.path,
                                    reason=ODD_REASON, mtime_ns=lstat_mtime_ns(item))
                continue
            yield from read_key_directory(root, item, boundary, cache)


def _has_kernel_files(path: str) -> bool:
    try:
        with os.scandir(path) as it:
            return any(e.name.startswith(GROUP_PREFIX) or (
                e.name.endswith(".json") and not e.name.endswith(".autotune.json")) for e in it)
    except OSError:
        return False


def _kernel_names(names: Mapping[str, os.DirEntry[str]]) -> list[str]:
    """The kernels a key directory holds files of: from group files, metadata files and stage
    files (a crash can leave stages without either json)."""
    found: set[str] = set()
    for name in names:
        if name.startswith(GROUP_PREFIX) and name.endswith(".json"):
            found.add(name[len(GROUP_PREFIX):-len(".json")])
        elif name.endswith(".autotune.json"):
            continue
        else:
            stem, dot, ext = name.rpartition(".")
            if dot and stem and ext in STAGES + BINARIES:
                found.add(stem)
    return sorted(found)


def read_metadata(path: str, what: str) -> tuple[Any, str | None]:
    """A json file parsed once, within the size and depth limits of `bounded`: (value, None),
    or (None, why it is unusable)."""
    try:
        return read_json(path), None
    except OSError as exc:
        return None, f"{what} cannot be read: {type(exc).__name__}: {exc.strerror or exc}"
    except Refused as exc:
        return None, refusal_text(what, exc) or (
            f"{what} is not valid JSON ({exc}): Triton treats the key as a miss and overwrites it")


def read_key_directory(root: str, item: os.DirEntry[str], boundary: str,
                       cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
    """The kernel entry (if any) of one key directory, and its unfinished writes."""
    path = item.path
    try:
        names = {e.name: e for e in scandir_sorted(path)}
    except OSError as exc:
        yield unlistable(RUNTIME, LAYOUT_NAME, root, path, exc)
        return
    for name, entry in names.items():
        if TMP_RE.fullmatch(name):
            yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=entry.path,
                                reason=TMP_REASON, mtime_ns=lstat_mtime_ns(entry))
    for kernel in _kernel_names(names):
        yield read_entry(root, path, kernel, names, boundary, cache)


def read_entry(root: str, path: str, kernel: str, names: Mapping[str, os.DirEntry[str]],
               boundary: str, cache: StateCache) -> CacheEntry:
    """One kernel of a key directory, with every reason Triton would not serve it as is."""
    problems: list[str] = []
    directory_key = key_from_name(os.path.basename(path))
    if item_target := outside(path, boundary):
        problems.append(f"the key directory is a symlink to {item_target}, outside the cache: "
                        "what it points at was not written by Triton and can change under the "
                        "same key")

    meta_name = f"{kernel}.json"
    meta: dict[str, Any] = {}
    if meta_name in names:
        value, why = read_metadata(os.path.join(path, meta_name), meta_name)
        if why is not None:
            problems.append(why)
        elif not isinstance(value, dict):
            problems.append(f"{meta_name} holds a JSON {type(value).__name__}, not the metadata "
                            "object Triton writes")
        else:
            meta = value
    else:
        problems.append(f"{meta_name} is missing: Triton treats the key as a miss (its group "
                        "cannot list the metadata) and compiles again")

    key = directory_key
    recorded = meta.get("hash")
    if isinstance(recorded, str) and directory_key is not None and recorded != directory_key:
        problems.append(f"the metadata's hash {recorded[:16]}... is not the key of the directory "
                        f"it sits in ({directory_key[:16]}..., {base32_name(directory_key)[:12]}"
                        "...): copied or edited by hand")

    backend = (meta.get("target") or {}).get("backend") if isinstance(meta.get("target"),
                                                                       dict) else None
    binary_ext = "hsaco" if backend == "hip" else next(
        (ext for ext in BINARIES if f"{kernel}.{ext}" in names), "cubin")
    binary_name = f"{kernel}.{binary_ext}"
    binary = capture(path, binary_name, names, cache)
    if not binary.exists:
        problems.append(f"{binary_name} is missing: a group that lists it makes Triton miss and "
                        "compile again; without one the entry was never completed")
    elif binary.digest is None:
        problems.append(f"{binary_name} cannot be read: {binary.error}")
    elif binary.size == 0:
        problems.append(f"{binary_name} is empty: Triton never writes an empty binary, so it was "
                        "truncated afterwards; loading it fails")
    source = capture(path, f"{kernel}.source", names, cache)

    group_name = f"{GROUP_PREFIX}{kernel}.json"
    if group_name not in names:
        problems.append(f"{group_name} is missing: Triton writes it last, so the compile that "
                        "began this entry never finished; every lookup misses")
    else:
        problems += _group_problems(os.path.join(path, group_name), group_name, path, names)

    return CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path, kernel=kernel,
                      key=key, binary=binary, source=source, meta=meta,
                      files=tuple(sorted(n for n in names if not TMP_RE.fullmatch(n))),
                      problems=tuple(problems))


def _group_problems(group_path: str, group_name: str, entry_path: str,
                    names: Mapping[str, os.DirEntry[str]]) -> list[str]:
    value, why = read_metadata(group_path, group_name)
    if why is not None:
        return [why]
    children = value.get("child_paths") if isinstance(value, dict) else None
    if not isinstance(children, dict):
        return [f"{group_name} has no child_paths object: Triton treats the key as a miss"]
    problems = []
    entry_real = os.path.realpath(entry_path)
    for child, target in sorted(children.items()):
        if not isinstance(target, str) or "\0" in target:
            # A NUL byte cannot be in a path (os.path refuses it): no path either.
            problems.append(f"{group_name} lists {child} with no path")
            continue
        if os.path.dirname(os.path.realpath(target)) != entry_real:
            where = "exists there" if os.path.exists(target) else "does not exist"
            problems.append(f"{group_name} lists {child} at {target}, outside this entry "
                            f"({where}): the cache was moved or copied; Triton reads the listed "
                            "path, so it misses, or serves a file of another cache")
        elif child not in names:
            problems.append(f"{group_name} lists {child}, which is missing: Triton treats the "
                            "key as a miss and compiles again")
    return problems


LAYOUT = TritonReader()
