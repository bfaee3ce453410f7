# CuPy's kernel cache (cupy/cuda/compiler.py `_compile_with_cache_cuda`,
# cupy/cuda/_compiler_cache.py `DiskKernelCacheBackend`; checked against CuPy 14.2.0):
#
#   <root>/                     CUPY_CACHE_DIR, else ~/.cupy/kernel_cache (read when the
#                               backend is constructed, at `import cupy.cuda.compiler`)
#     <sha1>.cubin              one entry; <sha1> = sha1(key_src) (40 lowercase hex), key_src =
#                               "(arch, options, nvrtc_version, backend, arch options) <empty-file
#                               preprocess output> <source> <extra_source> <CUPY_CACHE_KEY>"
#                               [+ " ne1 " + NUL-joined sorted name expressions]
#     <sha1>.ltoir              the same for LTO-IR (to_ltoir=True)
#                               File content: the 40 ASCII hex digits of sha1(payload), then the
#                               payload. `load()` returns None (a miss, and a recompile that
#                               overwrites the file) when the prefix does not match.
#                               The payload is the binary as compiled (a cubin, or PTX text under
#                               CUPY_COMPILE_WITH_PTX), or, for a module compiled with
#                               name_expressions, b"\x93CUPYNE\x00" + uint32 count + count x
#                               (uint32 length + UTF-8 mangled name) + the cubin (little-endian;
#                               `_encode_cache_payload`, `_cache_payload_version` = 1). A framed
#                               payload that does not parse is a miss too.
#     <sha1>.cubin.cu           the source, when CUPY_CACHE_SAVE_CUDA_SOURCE is set (written with
#                               a plain open(): it can be partial after a crash)
#     tmpXXXXXXXX               tempfile.NamedTemporaryFile(dir=<root>, delete=False): an entry
#                               being written, renamed into place with os.replace; left behind
#                               when the writer dies
#     jitify_<versions>.json    Jitify's header cache (cupy/cuda/jitify.pyx), when CUPY_CACHE_DIR
#                               is set (its default is ~/.cupy/jitify_cache): not an entry
#
# CuPy keeps no record of which headers a kernel read: a header reached through -I contributes
# its directory's name to `options`, never its content (cupy/cupy#8588, #941).
"""Reader for CuPy's kernel cache: one CacheEntry per `<sha1>.cubin` / `<sha1>.ltoir` file.

Why a reader: CuPy cannot compile on a machine without a driver (it asks the device for the
architecture before its cache is consulted), so no adapter can watch it here; what it left on
disk can still be checked. Each entry's embedded SHA-1 is verified against its payload, which
costs a read of every entry on every scan (CuPy caches hold hundreds of kernels, not tens of
thousands).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterator, Mapping
from typing import Any

from cacheaudit.digest import StateCache
from cacheaudit.layout import (
    Layout,
    binary_format,
    is_directory,
    lstat_mtime_ns,
    read_file,
    read_head,
    scandir_sorted,
    unlistable,
    unreachable,
)
from cacheaudit.model import CacheEntry, CacheLeftover, FileState, content_digest
from cacheaudit.runtimes.cupy.spec import default_roots as spec_default_roots

RUNTIME = "cupy"
LAYOUT_NAME = "cupy"

ENTRY_RE = re.compile(r"([0-9a-f]{40})\.(cubin|ltoir)")
SOURCE_RE = re.compile(r"([0-9a-f]{40})\.(cubin|ltoir)\.cu")
TMP_RE = re.compile(r"tmp[a-z0-9_]{8}")
JITIFY_RE = re.compile(r"jitify_.+\.json")

HASH_LENGTH = 40
PAYLOAD_MAGIC = b"\x93CUPYNE\x00"
"""`_cache_payload_magic`: a payload that carries mangled names ahead of the cubin."""

_KERNEL_RE = re.compile(rb'__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)')


def split_file(data: bytes) -> tuple[bytes | None, bytes, str | None]:
    """(embedded sha1 prefix, payload, problem) of an entry file's bytes, by
    `DiskKernelCacheBackend._decode_cubin`'s rules."""
    if len(data) < HASH_LENGTH:
        return None, b"", (f"{len(data)} bytes, shorter than the 40-character SHA-1 prefix: "
                           "CuPy's load() treats it as a miss and recompiles over it")
    prefix, payload = data[:HASH_LENGTH], data[HASH_LENGTH:]
    if not re.fullmatch(rb"[0-9a-f]{40}", prefix):
        return None, payload, ("the first 40 bytes are not a hex SHA-1: not written by CuPy's "
                               "cache backend (or overwritten); CuPy treats it as a miss")
    import hashlib  # here: every observer loads this layout, and most never decode an entry

    if hashlib.sha1(payload, usedforsecurity=False).hexdigest().encode("ascii") != prefix:
        return prefix, payload, ("the payload's SHA-1 does not match the one stored in front of "
                                 "it (truncated or modified after it was written): CuPy "
                                 "treats it as a miss and recompiles over it")
    return prefix, payload, None


def decode_payload(payload: bytes) -> tuple[list[str] | None, bytes, str | None]:
    """(mangled names or None, the binary, problem) by `_decode_cache_payload`'s layout."""
    if not payload.startswith(PAYLOAD_MAGIC):
        return None, payload, None
    pos = len(PAYLOAD_MAGIC)
    bad = ("a name-expression payload whose framing does not parse: CuPy treats it as a miss "
           "and recompiles")
    if len(payload) < pos + 4:
        return None, b"", bad
    (count,) = struct.unpack_from("<I", payload, pos)
    pos += 4
    names: list[str] = []
    for _ in range(count):
        if len(payload) < pos + 4:
            return None, b"", bad
        (size,) = struct.unpack_from("<I", payload, pos)
        pos += 4
        if len(payload) < pos + size:
            return None, b"", bad
        try:
            names.append(payload[pos:pos + size].decode("utf-8"))
        except UnicodeDecodeError:
            return None, b"", bad
        pos += size
    return names, payload[pos:], None


class CupyReader(Layout):
    """The `Reader` for CuPy's flat kernel cache (see the module header)."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """CUPY_CACHE_DIR, else `~/.cupy/kernel_cache` (the spec's `default_roots`)."""
        return spec_default_roots(env)

    def is_root(self, path: str) -> bool:
        """A directory holding at least one `<sha1>.cubin`/`.ltoir` file (names only, no stat)."""
        try:
            with os.scandir(path) as it:
                return any(ENTRY_RE.fullmatch(e.name) for e in it)
        except OSError:
            return False

    def evict_paths(self, entry: CacheEntry) -> tuple[str, ...]:
        """The entry file first (CuPy's lookup reads only it), then the source CuPy saved beside
        it under CUPY_CACHE_SAVE_CUDA_SOURCE, which nothing reads without the entry."""
        return (entry.path, entry.path + ".cu")

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        try:
            listing = scandir_sorted(root)
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, root, exc)
            return
        names = {item.name for item in listing}
        for item in listing:
            match = ENTRY_RE.fullmatch(item.name)
            if match and not is_directory(item):
                yield read_entry(root, item, match.group(1), names, cache)
                continue
            source = SOURCE_RE.fullmatch(item.name)
            if source:
                if item.name[:-3] not in names:
                    yield CacheLeftover(
                        runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=item.path,
                        reason=("source saved by CUPY_CACHE_SAVE_CUDA_SOURCE for an entry that "
                                "is gone"), mtime_ns=lstat_mtime_ns(item))
                continue
            if JITIFY_RE.fullmatch(item.name) and not is_directory(item):
                continue  # Jitify's header cache: CuPy's, but not a kernel entry
            if is_directory(item):
                reason = "a directory in CuPy's kernel cache: CuPy writes flat files only"
            elif TMP_RE.fullmatch(item.name):
                reason = ("temporary file of a write that never reached os.replace "
                          "(NamedTemporaryFile in the cache directory): its writer died, or is "
                          "still writing; CuPy never removes it")
            else:
                reason = "not a name CuPy writes here (<sha1>.cubin, <sha1>.ltoir, .cu, tmp*)"
            yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=item.path,
                                reason=reason, mtime_ns=lstat_mtime_ns(item))


def read_entry(root: str, item: os.DirEntry[str], digest: str, names: set[str],
               cache: StateCache) -> CacheEntry:
    path = item.path
    problems: list[str] = []
    meta: dict[str, Any] = {"kind": item.name.rsplit(".", 1)[1]}
    if item.is_symlink() and (error := unreachable(path)) is not None:
        problems.append(f"the entry is a symlink that cannot be followed "
                        f"({error.strerror or error}): CuPy's lookup of this key fails on it")
    binary = cache.capture(path)
    if binary.exists and binary.digest is None:
        problems.append(f"the entry cannot be read: {binary.error}")
    elif binary.exists:
        try:
            data = read_file(path)
        except OSError as exc:
            data = b""
            problems.append(f"the entry cannot be read: {exc.strerror or exc}")
        else:
            prefix, payload, problem = split_file(data)
            if problem:
                problems.append(problem)
            else:
                mangled, raw, framing = decode_payload(payload)
                if framing:
                    problems.append(framing)
                meta["payload_sha1"] = prefix.decode("ascii") if prefix else None
                meta["binary_xxh3"] = content_digest(raw)
                meta["format"] = binary_format(raw)
                if mangled is not None:
                    meta["mangled_names"] = mangled
                if not raw and not framing:
                    problems.append("the payload is empty: its SHA-1 matches, so CuPy loads it, "
                                    "and loading an empty module fails")
    kernel = digest[:12]
    source: FileState | None = None
    if item.name + ".cu" in names:
        source_path = path + ".cu"
        source = cache.capture(source_path)
        head = read_head(source_path)
        found = _KERNEL_RE.search(head or b"")
        if found:
            kernel = found.group(1).decode("utf-8", "replace")
    return CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path, kernel=kernel,
                      key=digest, binary=binary, source=source, meta=meta,
                      files=tuple(n for n in (item.name, item.name + ".cu") if n in names),
                      problems=tuple(problems))


LAYOUT = CupyReader()
