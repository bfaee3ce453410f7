# FlashInfer's JIT workspace (flashinfer-python 0.7.4; file:line below are that wheel's).
#
#   <root>/                      <base>/.cache/flashinfer, <base> = FLASHINFER_WORKSPACE_BASE,
#                                else the home directory (jit/env.py:66-70)
#     <version>/                 flashinfer.__version__ (env.py:391)
#       <archs>/                 the target archs, sorted, each <major><minor>, joined by "_"
#                                (env.py:382-391): FLASHINFER_CUDA_ARCH_LIST=9.0 gives "90a".
#                                No arch list and no GPU gives no archs, and the level is absent
#                                (<version>/cached_ops/: pathlib drops the empty name)
#         cached_ops/            FLASHINFER_JIT_DIR (env.py:396)
#           <name>/              one entry: a JIT module (JitSpecNvcc.build_dir, core.py:503-505)
#             build.ninja        generate_ninja_build_for_op (cpp_ext.py:252-401), rewritten only
#                                when its text changes (write_if_different, jit/utils.py:22-30):
#                                  cuda_home = $CUDA_HOME or $CUDA_PATH, else dirname(dirname(
#                                              which nvcc)), else /usr/local/cuda (47-64)
#                                  cxx = $CXX or c++; nvcc = $FLASHINFER_NVCC or
#                                  $cuda_home/bin/nvcc; cxx_launcher, nvcc_launcher =
#                                  $FLASHINFER_CXX_LAUNCHER, $FLASHINFER_NVCC_LAUNCHER (288-292)
#                                  common_cflags = -I<extra dirs> -I<vendored CCCL>
#                                    -isystem <Python.h dir, $cuda_home/include, tvm_ffi,
#                                    dlpack, flashinfer data/include, data/csrc, CUTLASS,
#                                    spdlog> (131-179)
#                                  cflags += $FLASHINFER_EXTRA_CFLAGS (194-196); cuda_cflags +=
#                                  $FLASHINFER_EXTRA_CUDAFLAGS (245-247), -ccbin $CC when set
#                                  (207-209); ldflags = -shared -L$cuda_home/lib64[/stubs]
#                                  -lcudart -lcuda $FLASHINFER_EXTRA_LDFLAGS (273-283)
#                                  rule compile: $cxx_launcher $cxx -MMD -MF $out.d $cflags -c
#                                    $in -o $out (deps = gcc: no -isystem header is listed)
#                                  rule cuda_compile: $nvcc_launcher $nvcc
#                                    --generate-dependencies-with-compile -MF $out.d
#                                    $cuda_cflags -c $in -o $out (nvcc lists -isystem headers)
#                                  rule link: $cxx $in $ldflags -o $out (or nvcc_link)
#                                  build <abs dir>/<parent>_<stem>[.cuda].o: <rule> <abs source>
#                                  build <abs dir>/<name>.so: link <objects>; default <name>.so
#             .ninja_deps        ninja -C <name>/ (run_ninja, cpp_ext.py:411-445; core.py:640):
#             .ninja_log         the deps log and build log sit in the module's own directory
#             <objects>, <name>.so
#           tmp/                 <name>.lock (FileLock, core.py:549-550, 859-864) and the AOT
#                                prebuild's flashinfer_jit.ninja of `subninja` lines
#                                (core.py:867-905): no entry
#         generated/             FLASHINFER_GEN_SRC_DIR (env.py:397): sources the generators
#                                write; build.ninja names the ones a module compiles
#     cubins/                    downloaded cubins (env.py:93-132): no JIT entry
#
# AOT modules (`<flashinfer package>/data/aot/<name>/<name>.so`, or a flashinfer-jit-cache
# provider's directory; env.py:238-242, 296-335) are loaded by `try_load` before any build, with
# no freshness check at all (core.py:577-611): a JIT entry whose name has an AOT library beside
# the installed package is never what FlashInfer loads. The reader notes the shadow in the
# entry's meta (`aot_library`), found without importing flashinfer.
"""Reader for FlashInfer's JIT workspace: one CacheEntry per cached_ops/<name>/ module.

FlashInfer keeps no key on disk: `JitSpecNvcc.try_load` returns only AOT modules, so every
`build_and_load` runs ninja (core.py:372-393, 577-640), and ninja alone decides, from
build.ninja's command lines and the files' mtimes. The entry's key is, as for torch extensions,
a digest of build.ninja's commands; its meta carries the parsed build file (`library`: the
`<name>.so` FlashInfer loads) and the deps log, for the policy to rerun ninja's decision and the
compile's dependency pass.

The entry's `source` is the first compile edge's source and its `binary` that edge's object,
not the library: the object is what the compile of the source wrote, so its digest confirms
which recorded compile (the shim's record of nvcc or c++) built the module, and a rebuild that
changed it unties the older compile; the library is made by the link edge from all objects,
and no compile ever writes it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Iterator, Mapping
from typing import Any

from cacheaudit.digest import StateCache
from cacheaudit.layout import Layout, is_directory, scandir_sorted, unlistable
from cacheaudit.model import CacheEntry, CacheLeftover, FileState
from cacheaudit.runtimes._ninja.build import (
    BUILD_FILE,
    BuildFile,
    NinjaSyntaxError,
    build_path,
    read_build_file,
    read_deps_log,
)

# Re-exported: the adapter and the tests read them from the layout.
from cacheaudit.runtimes.flashinfer.spec import CACHE_SUBPATH as CACHE_SUBPATH
from cacheaudit.runtimes.flashinfer.spec import default_root as default_root
from cacheaudit.runtimes.flashinfer.spec import default_roots as spec_default_roots

RUNTIME = "flashinfer"
LAYOUT_NAME = "flashinfer"

JIT_DIR = "cached_ops"
GENERATED_DIR = "generated"
TMP_DIR = "tmp"
"""cached_ops/tmp holds locks and the AOT prebuild's ninja file, never a module."""
ENTRY_KEY_LABEL = "flashinfer build commands"
MAX_DEPTH = 3
"""<root>/<version>/<archs>/cached_ops: how far below a root the reader looks for cached_ops."""


def entry_key(build: BuildFile) -> str:
    """The key of the entry a build.ninja describes: every edge's command line, what ninja
    compares with its log besides mtimes."""
    return build.commands_key(ENTRY_KEY_LABEL)


def workspace_of(path: str) -> dict[str, str]:
    """What a module directory's path says of the workspace it is in: the version and the arch
    list (empty when the workspace has no arch level), from .../<version>[/<archs>]/cached_ops/
    <name>. Empty when the path is not laid out so (a module directory scanned on its own)."""
    jit_dir = os.path.dirname(path)
    if os.path.basename(jit_dir) != JIT_DIR:
        return {}
    above = os.path.dirname(jit_dir)
    upper = os.path.dirname(above)
    if os.path.basename(upper) == CACHE_SUBPATH[-1] or not _looks_like_version(
            os.path.basename(upper)):
        return {"version": os.path.basename(above), "archs": ""}
    return {"version": os.path.basename(upper), "archs": os.path.basename(above)}


def _looks_like_version(name: str) -> bool:
    return bool(name) and name[0].isdigit() and "." in name


@functools.cache
def _package_locations() -> tuple[str, ...]:
    """Where the installed flashinfer package lives (`importlib.util.find_spec`, which does not
    run flashinfer); empty when it is not installed. Once per process: a scan reads many
    modules."""
    try:
        spec = importlib.util.find_spec("flashinfer")
    except (ImportError, ValueError):
        return ()
    return tuple(spec.submodule_search_locations or ()) if spec else ()


def aot_library(name: str) -> str | None:
    """The AOT library of module `name` beside the installed flashinfer package
    (`FLASHINFER_AOT_DIR/<name>/<name>.so`, env.py:238, 298-300), which FlashInfer loads instead
    of building; None when there is none or flashinfer is not installed."""
    for location in _package_locations():
        candidate = os.path.join(location, "data", "aot", name, f"{name}.so")
        if os.path.isfile(candidate):
            return candidate
    return None


def _is_module_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, BUILD_FILE))


def _subdirs(path: str) -> list[os.DirEntry[str]]:
    try:
        return [e for e in scandir_sorted(path) if is_directory(e)]
    except OSError:
        return []


def _jit_dirs(path: str, depth: int = MAX_DEPTH) -> Iterator[str]:
    """The cached_ops directories at or below `path`, at most `depth` levels down; cubins/ and
    generated/ are never descended into."""
    if os.path.basename(path) == JIT_DIR:
        yield path
        return
    if depth == 0:
        return
    if depth == 1:
        # Only a child named cached_ops can be one now: asked by name, one stat, rather than
        # listing the directory (a DeepJIT cache's 100,000 entries, each listed and sorted,
        # when its root is asked whether it is FlashInfer's).
        if os.path.isdir(candidate := os.path.join(path, JIT_DIR)):
            yield candidate
        return
    levels = _level_dirs(path)
    for child in levels:
        if child.name in ("cubins", GENERATED_DIR):
            continue
        yield from _jit_dirs(child.path, depth - 1)


LEVELS_MAX = 256
"""The most subdirectories a level above cached_ops has (versions, arch lists: a handful): a
directory with more is no FlashInfer workspace level, and is not listed to its end."""


def _level_dirs(path: str) -> list[os.DirEntry[str]]:
    """The subdirectories of a directory above cached_ops, sorted; none where there are more
    than `LEVELS_MAX` (another runtime's cache of 100,000 entries, asked whether it is
    FlashInfer's, is not listed, sorted and stat'ed entry by entry)."""
    found: list[os.DirEntry[str]] = []
    try:
        with os.scandir(path) as listing:
            for item in listing:
                if is_directory(item):
                    if len(found) == LEVELS_MAX:
                        return []
                    found.append(item)
    except OSError:
        return []
    return sorted(found, key=lambda item: item.name)


class FlashInferReader(Layout):
    """The `Layout` of FlashInfer's JIT workspace (see the module header)."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """FlashInfer's cache directory under `env` (the spec's `default_roots`)."""
        return spec_default_roots(env)

    def is_root(self, path: str) -> bool:
        """A module directory, a cached_ops directory, or a directory with one at most three
        levels down (the cache directory, a version or an arch level)."""
        if _is_module_dir(path):
            return True
        return any(any(_is_module_dir(c.path) for c in _subdirs(jit))
                   for jit in _jit_dirs(path))

    def build_places(self, entry: CacheEntry) -> tuple[str, ...]:
        """The module's own directory: FlashInfer writes every object and the library there by
        absolute path (cpp_ext.py:354-364, 396) and runs ninja in it, so a compile that wrote
        elsewhere built another module, even of the same source."""
        return (entry.path,)

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        if _is_module_dir(root):
            yield read_module_dir(root, root, cache)
            return
        for jit in _jit_dirs(root):
            try:
                children = scandir_sorted(jit)
            except FileNotFoundError:
                continue
            except OSError as exc:
                yield unlistable(RUNTIME, LAYOUT_NAME, root, jit, exc)
                continue
            for child in children:
                if child.name == TMP_DIR or not is_directory(child):
                    continue
                if _is_module_dir(child.path):
                    yield read_module_dir(root, child.path, cache)
                else:
                    yield from _not_a_module(root, child.path)


def _not_a_module(root: str, path: str) -> Iterator[CacheLeftover]:
    try:
        names = os.listdir(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        yield unlistable(RUNTIME, LAYOUT_NAME, root, path, exc)
        return
    yield CacheLeftover(
        runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path, mtime_ns=_mtime(path),
        reason=("module directory without build.ninja: FlashInfer created it (write_ninja "
                "makes the directory first) and never wrote the build file"
                + ("" if not names else f"; it holds {len(names)} other files")))


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def read_module_dir(root: str, path: str, cache: StateCache) -> CacheEntry:
    """One cached_ops/<name>/ directory as an entry."""
    real = os.path.realpath(path)
    problems: list[str] = []
    try:
        names = set(os.listdir(real))
    except OSError as exc:
        names = set()
        problems.append(f"the module directory cannot be listed ({type(exc).__name__}: "
                        f"{exc.strerror or exc})")
    meta: dict[str, Any] = {**workspace_of(real)}
    build: BuildFile | None = None
    try:
        build = read_build_file(os.path.join(real, BUILD_FILE))
    except (OSError, NinjaSyntaxError) as exc:
        problems.append(f"{BUILD_FILE} cannot be read: {exc}")
    if build is not None:
        meta.update(build.meta())
        problems.extend(f"{BUILD_FILE}: {p}" for p in build.problems)

    library = build.library if build is not None else None
    if library is not None:
        state = cache.capture(build_path(library, real))
        if not state.exists:
            problems.append(f"{BUILD_FILE} names {library}, which is missing: the last build "
                            "failed or was interrupted (the next build_and_load builds it)")
        elif state.digest is None:
            problems.append(f"{library} cannot be read: {state.error}")
    elif build is not None:
        problems.append(f"{BUILD_FILE} names no library (no default target, no link edge)")

    source: FileState | None = None
    binary: FileState | None = None
    first = _first_compile(build) if build is not None else None
    if first is not None:
        source_path, object_path = first
        source = cache.capture(source_path)
        if not source.exists:
            problems.append(f"the source {source_path} is gone: ninja fails on the next build")
        binary = cache.capture(object_path)
        if not binary.exists:
            problems.append(f"the object {object_path} is missing: ninja compiles it again on "
                            "the next build")

    from cacheaudit.graph import NinjaDepsLogError

    try:
        deps = read_deps_log(real)
        meta["deps"] = {out: list(e.inputs) for out, e in deps.items()}
    except (OSError, NinjaDepsLogError) as exc:
        meta["deps_error"] = str(exc)

    kernel = os.path.basename(real)
    if build is not None and build.variables.get("name"):
        kernel = build.variables["name"]
    aot = aot_library(kernel)
    if aot is not None:
        meta["aot_library"] = aot

    return CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=real, kernel=kernel,
                      key=entry_key(build) if build is not None else None, binary=binary,
                      source=source, meta=meta, files=tuple(sorted(names)),
                      problems=tuple(problems))


def _first_compile(build: BuildFile) -> tuple[str, str] | None:
    """(source, object) of the module's first compile edge, both absolute."""
    for edge in build.compile_edges:
        if edge.inputs and edge.outputs:
            return (build_path(edge.inputs[0], build.directory),
                    build_path(edge.outputs[0], build.directory))
    return None


LAYOUT = FlashInferReader()
