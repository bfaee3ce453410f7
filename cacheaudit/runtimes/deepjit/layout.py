# DeepJIT on-disk cache layout (deepseek-ai/DeepJIT include/deep_jit/cache/disk.hpp), as used
# by DeepJIT itself, DeepGEMM 2.8+ (env prefix DG) and DeepEP-Ascend (EP).
#
#   <root>/                      one item of <P>_JIT_CACHE_DIR, else DJ_JIT_CACHE_DIR, else
#                                $HOME/.dj; the variable is colon-separated: the first root is
#                                written, every root is searched on lookup
#     cache/
#       <tag>.<digest>/          one entry; published by renaming a whole build directory
#         .committed             empty marker, written (and fsynced) before the rename. A lookup
#                                is a hit iff <entry>/.committed exists in any root; on a hit its
#                                mtime is set to now (try_update_mtime, best effort: read-only
#                                roots keep the old one), so mtime_ns(.committed) = last disk hit
#         kernel.cu              the generated source exactly as compiled (CUDA backend)
#         kernel.cubin           the binary (CUDA backend; asserted non-empty before commit)
#         kernel.ptx             optional, <P>_JIT_DUMP_PTX / JIT_DEBUG
#         kernel.sass            optional, <P>_JIT_DUMP_SASS / JIT_DEBUG (cuobjdump --dump-sass)
#         meta.json              one JSON object, written last before .committed:
#           "command"            the compile command, naming the build's tmp/<uuid>/ paths
#           "config"             {python_library_root, extra_signature, include_dirs,
#                                 include_prefixes} (the env prefix is not recorded)
#           "compiler_info"      {path, version}: version is the whole `nvcc --version` output,
#                                whose digest is the only compiler part of the key
#           "compiler_options"   the options object (arch, flags, post hook, dumps, ...)
#     tmp/
#       <pid>-<8hex>-<8hex>-<8hex>/   a build in progress (get_uuid); removed by the writer on
#                                failure, left behind when the writer is killed
#
#   tag     [A-Za-z0-9_]+ (DiskCache::entry asserts it), the kernel's name; never in the key
#   digest  32 lowercase hex digits: FNV1a::get_hex_digest of the chained key parts
#           (extra_signature, compiler version digest, options, post hook, source + tracked
#           headers)
#
# Other backends use other file names in the same layout: ROCm kernel.hip / kernel.hsaco (plus
# compiler.log, kernel.metadata, kernel.ll, kernel.isa, and "backend": "ROCm" in meta.json),
# Ascend kernel.asc / kernel.o (plus asm/). The reference runtime's g++ mode (fixtures/minijit)
# writes kernel.cu / kernel.so. A committed entry with an empty or missing binary is still a
# hit for DeepJIT, which then fails at load ("missing CUDA CUBIN").
"""Reader for the DeepJIT cache layout: one CacheEntry per `<root>/cache/<tag>.<digest>/`.

Why a reader at all: caches built before cacheaudit was installed, or by processes it did not
observe, can only be judged from what the runtime left on disk. DeepJIT leaves a good deal:
the full compiler version text and configuration in meta.json, and a disk-hit clock in the
mtime of `.committed`.

Symlinks: DeepJIT follows them (std::filesystem::exists), so the reader does too, and reads a
symlinked entry or file like any other. When one resolves outside the cache directory, the
entry's problems say so: what it points at was not published by the runtime and can change
under an unchanged key. The root's own `cache/` and `tmp/` are taken as configured (a
symlinked cache/ on another disk is an ordinary setup).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from cacheaudit import bounded
from cacheaudit.bounded import Refused
from cacheaudit.digest import StateCache, read_file
from cacheaudit.layout import JSON_LIMIT, Layout, capture, refusal_text
from cacheaudit.model import CacheEntry, CacheLeftover
from cacheaudit.runtimes._deepseek.layout import (
    DEEPGEMM_ENTRY_RE,
    DEEPJIT_ENTRY_RE,
    TMP_NAME_RE,
    has_entry_named,
    has_tmp_named,
    list_entry,
    only_killed_builds,
    read_cache_root,
    symlinks_outside,
)

# Re-exported: the policy and the tests read the prefixes and their roots from the layout.
from cacheaudit.runtimes.deepjit.spec import CACHE_DIR_TAIL
from cacheaudit.runtimes.deepjit.spec import PREFIXES as PREFIXES
from cacheaudit.runtimes.deepjit.spec import custom_prefixes as custom_prefixes
from cacheaudit.runtimes.deepjit.spec import default_roots as spec_default_roots
from cacheaudit.runtimes.deepjit.spec import prefix_roots as prefix_roots

RUNTIME = "deepjit"
LAYOUT_NAME = "deepjit"

COMMITTED = ".committed"
META = "meta.json"

# (binary, source) per backend, in the order the binary is looked for.
BACKEND_FILES: tuple[tuple[str, str], ...] = (
    ("kernel.cubin", "kernel.cu"),    # CUDA
    ("kernel.so", "kernel.cu"),       # the reference runtime's g++ mode
    ("kernel.hsaco", "kernel.hip"),   # ROCm
    ("kernel.o", "kernel.asc"),       # Ascend
)
_SOURCE_TO_BINARY = {"kernel.hip": "kernel.hsaco", "kernel.asc": "kernel.o"}

META_KEYS = ("command", "config", "compiler_info", "compiler_options")
META_CONFIG_KEYS = ("python_library_root", "extra_signature", "include_dirs", "include_prefixes")
META_COMPILER_KEYS = ("path", "version")

ODD_NAME_REASON = ("directory in cache/ whose name is not <tag>.<32 hex digest>: DeepJIT never "
                   "looks it up")


class DeepJitReader(Layout):
    """The `Reader` for DeepJIT's layout (see the module header for the format)."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """Roots for each prefix, as DeepJIT's Env resolves them (the spec's `default_roots`)."""
        return spec_default_roots(env)

    def root_variables(self, env: Mapping[str, str]) -> tuple[str, ...]:
        """A library's own `<P>_JIT_CACHE_DIR` (its prefix, `custom_prefixes`)."""
        return tuple(f"{prefix}{CACHE_DIR_TAIL}" for prefix in custom_prefixes(env))

    def is_root(self, path: str) -> bool:
        """A `cache/` holding a `<tag>.<32hex>` directory, or (no entry of either layout yet) a
        `cache/` beside a `tmp/` with build directories. A DeepGEMM root says no: its entries
        have two dots. The build-directories-only root is claimed by the deepgemm reader too
        (both runtimes name them alike).

        A root holding only a killed first build (`tmp/<build>/`, no `cache/` yet: DeepJIT
        creates it at the first commit) is a root too (`only_killed_builds`), so that its
        leftover is reported rather than the root refused."""
        cache_dir = os.path.join(path, "cache")
        if not os.path.isdir(cache_dir):
            return only_killed_builds(path)
        if has_entry_named(cache_dir, DEEPJIT_ENTRY_RE):
            return True
        if has_entry_named(cache_dir, DEEPGEMM_ENTRY_RE):
            return False
        return has_tmp_named(os.path.join(path, "tmp"), TMP_NAME_RE, dirs=True)

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        return read_cache_root(root, cache, runtime=RUNTIME, layout=LAYOUT_NAME,
                               own=DEEPJIT_ENTRY_RE, other=DEEPGEMM_ENTRY_RE, read_entry=read_entry,
                               odd_name_reason=ODD_NAME_REASON)


def _pick_backend(names: Mapping[str, os.DirEntry[str]]) -> tuple[str, str]:
    for binary, source in BACKEND_FILES:
        if binary in names:
            return binary, source
    for source, binary in _SOURCE_TO_BINARY.items():
        if source in names:
            return binary, source
    return BACKEND_FILES[0]


def read_meta(path: str) -> tuple[dict[str, Any], str | None]:
    """meta.json parsed once, within the size and depth limits of `bounded`: (object, None), or
    ({}, why it is unusable)."""
    meta, why, _gaps = read_checked_meta(path)
    return meta, why


def read_checked_meta(path: str) -> tuple[dict[str, Any], str | None, tuple[str, ...]]:
    """`read_meta`, and the `meta_gaps` of what it read. The file is read every time; what is
    made of its bytes is kept (`_judged_meta`): the entries of one cache share a few meta.json
    texts (one per configuration), and a scan of 100,000 entries would otherwise parse and
    hold 100,000 copies of them."""
    try:
        data = read_file(path, JSON_LIMIT + 1)
    except FileNotFoundError:
        return {}, (f"{META} is missing: the compiler identity and configuration DeepJIT "
                    "records for every entry cannot be checked"), ()
    except OSError as exc:
        return {}, f"{META} cannot be read: {type(exc).__name__}: {exc.strerror or exc}", ()
    if len(data) > _KEPT_META_BYTES:
        return _judge_meta(data)
    return _judged_meta(data)


_KEPT_META_BYTES = 65_536
"""The largest meta.json whose judgement is kept (DeepJIT's are about a kilobyte): 256 of
them bound the memo to 16 MiB."""


@functools.lru_cache(maxsize=256)
def _judged_meta(data: bytes) -> tuple[dict[str, Any], str | None, tuple[str, ...]]:
    return _judge_meta(data)


def _judge_meta(data: bytes) -> tuple[dict[str, Any], str | None, tuple[str, ...]]:
    # The object returned is shared by every entry whose meta.json holds these bytes: nothing
    # changes an entry's meta (CacheEntry is frozen, and its readers only read).
    meta, why = _parsed_meta(data)
    return meta, why, tuple(meta_gaps(meta)) if why is None else ()


def _parsed_meta(data: bytes) -> tuple[dict[str, Any], str | None]:
    try:
        meta = bounded.loads(data, max_bytes=JSON_LIMIT)
    except Refused as exc:
        return {}, refusal_text(META, exc) or (
            f"{META} is not valid JSON ({exc}): DeepJIT writes it whole, so it was damaged")
    if not isinstance(meta, dict):
        return {}, f"{META} holds a JSON {type(meta).__name__}, not the object DeepJIT writes"
    return meta, None


def _is_str_list(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


# What DeepJIT's meta.json holds in each field it always writes (backend.hpp serialises them
# from typed members): a value of another type was not written by DeepJIT, and feeding it to the
# key recipe would crash the recomputation or, worse, silently compute something else (a string
# of include prefixes taken as one prefix per character).
META_TYPES: Mapping[str, tuple[Callable[[object], bool], str]] = {
    "command": (lambda v: isinstance(v, str), "a string"),
    "compiler_options": (lambda v: isinstance(v, dict), "an object"),
    "config.python_library_root": (lambda v: isinstance(v, str), "a string"),
    "config.extra_signature": (lambda v: isinstance(v, str), "a string"),
    "config.include_dirs": (_is_str_list, "a list of strings"),
    "config.include_prefixes": (_is_str_list, "a list of strings"),
    "compiler_info.path": (lambda v: isinstance(v, str), "a string"),
    "compiler_info.version": (lambda v: isinstance(v, str), "a string"),
}


@functools.lru_cache(maxsize=64)
def _field_path(dotted: str) -> tuple[str, ...]:
    return tuple(dotted.split("."))


def meta_field(meta: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    """(present, value) of a dotted meta.json field ("config.include_dirs")."""
    value: Any = meta
    for part in _field_path(dotted):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def mistyped(meta: Mapping[str, Any], dotted: str) -> str | None:
    """Why a present field of meta.json cannot be what DeepJIT wrote there, or None."""
    present, value = meta_field(meta, dotted)
    check = META_TYPES.get(dotted)
    if not present or check is None or check[0](value):
        return None
    return _mistyped_text(dotted, value)


def _mistyped_text(dotted: str, value: object) -> str:
    return f"{dotted} (a JSON {type(value).__name__}, not {META_TYPES[dotted][1]})"


# (key, ((subkey, dotted name, type check), ...)) for the two objects meta.json always holds:
# names and checks resolved once, since every entry of a scan goes through them.
_OBJECT_FIELDS = tuple(
    (key, tuple((sub, f"{key}.{sub}", META_TYPES[f"{key}.{sub}"][0]) for sub in subkeys))
    for key, subkeys in (("config", META_CONFIG_KEYS), ("compiler_info", META_COMPILER_KEYS)))


def meta_gaps(meta: Mapping[str, Any]) -> list[str]:
    """Dotted names of the keys DeepJIT always writes that `meta` lacks (or has mistyped)."""
    gaps = [key for key in META_KEYS if key not in meta]
    for key, fields in _OBJECT_FIELDS:
        value = meta.get(key)
        if key in meta and not isinstance(value, dict):
            gaps.append(f"{key} (not an object)")
        elif isinstance(value, dict):
            for sub, dotted, check in fields:
                if sub not in value:
                    gaps.append(dotted)
                elif not check(value[sub]):
                    gaps.append(_mistyped_text(dotted, value[sub]))
    for key in ("command", "compiler_options"):
        if key in meta and not META_TYPES[key][0](meta[key]):
            gaps.append(_mistyped_text(key, meta[key]))
    return gaps


def read_entry(root: str, item: os.DirEntry[str], tag: str, digest: str, boundary: str,
               cache: StateCache) -> CacheEntry:
    """One entry directory, with every reason it is corrupt or partial (CA402 evidence)."""
    path = item.path
    names, problems = list_entry(item, boundary, "DeepJIT")
    if names is None:
        return CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path, kernel=tag,
                          key=digest, problems=tuple(problems))

    binary_name, source_name = _pick_backend(names)
    problems += symlinks_outside(names, (binary_name, source_name, COMMITTED, META), boundary)

    committed_ns: int | None = None
    marker = names.get(COMMITTED)
    if marker is not None:
        try:
            committed_ns = marker.stat().st_mtime_ns
        except OSError as exc:
            problems.append(f"{COMMITTED} cannot be read: {type(exc).__name__}: "
                            f"{exc.strerror or exc}")
    elif names:
        problems.append(f"no {COMMITTED} marker: DeepJIT treats this key as a miss, and when this "
                        "is its first (writable) root the rename that publishes the rebuild "
                        "fails on this non-empty directory ('failed to publish disk cache "
                        "entry') until it is removed")
    else:
        problems.append(f"empty directory, no {COMMITTED} marker: DeepJIT treats this key as a "
                        "miss and its publishing rename replaces the directory")

    binary = capture(path, binary_name, names, cache)
    if not binary.exists:
        problems.append(f"{binary_name} is missing: DeepJIT still counts the entry as a hit "
                        f"(it checks only {COMMITTED}) and then fails to load it")
    elif binary.digest is None:
        problems.append(f"{binary_name} cannot be read: {binary.error}")
    elif binary.size == 0:
        problems.append(f"{binary_name} is empty (0 bytes): DeepJIT never publishes an empty "
                        "binary, so it was truncated afterwards; loading it fails")

    source = capture(path, source_name, names, cache)
    if not source.exists:
        problems.append(f"{source_name} is missing: DeepJIT does not need it to load the kernel, "
                        "but the cached binary can no longer be tied to its source")
    elif source.digest is None:
        problems.append(f"{source_name} cannot be read: {source.error}")

    meta: dict[str, Any] = {}
    gaps: tuple[str, ...] = ()
    if META in names:
        meta, why, gaps = read_checked_meta(os.path.join(path, META))
    else:
        why = (f"{META} is missing: the compiler identity and configuration DeepJIT records "
               "for every entry cannot be checked")
    if why is not None:
        problems.append(why)
    elif gaps:
        problems.append(f"{META} lacks {', '.join(gaps)}: DeepJIT always writes them, so it was "
                        "written by something else or edited")

    return CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path, kernel=tag,
                      key=digest, binary=binary, source=source, committed_ns=committed_ns,
                      meta=meta, files=tuple(sorted(names)), problems=tuple(problems))


LAYOUT = DeepJitReader()
