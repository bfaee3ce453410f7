# torch.utils.cpp_extension build directories (torch 2.13, `_jit_compile`, `_get_build_directory`,
# `_write_ninja_file`, `FileBaton`), as `load` and `load_inline` leave them.
#
#   <root>/                      TORCH_EXTENSIONS_DIR when set (even to a relative path); else
#                                <user cache>/torch_extensions/py<XY><abiflags>_<cpu|cuNNN|rocmNNN>/
#                                where <user cache> is $XDG_CACHE_HOME (when set, even empty) or
#                                ~/.cache on Linux, ~/Library/Caches on macOS; realpath'd.
#                                `build_directory=` replaces <root>/<name> with any directory.
#     <name>/                    one entry: the build directory of extension <name>
#       build.ninja              rewritten by every build (only when its text changes):
#                                  cxx = <CXX or c++, ccache/sccache prepended when on PATH>
#                                  cflags = -DTORCH_EXTENSION_NAME=<name>[_vN] ... -I<user dirs>
#                                           -isystem <torch include dirs> -isystem <Python.h dir>
#                                           -fPIC -std=c++20 <extra_cflags>
#                                  post_cflags, cuda_cflags, cuda_post_cflags, ldflags = ...
#                                  rule compile: $cxx -MMD -MF $out.d $cflags -c $in -o $out
#                                                $post_cflags, depfile = $out.d, deps = gcc
#                                  rule cuda_compile: $nvcc [-MD -MF $out.d] $cuda_cflags ...
#                                  rule link: $cxx $in $ldflags -o $out
#                                  build <src stem>[.cuda|.sycl].o: <rule> <abs source>
#                                  build <name>[_vN].so: link <objects>
#                                  default <name>[_vN].so
#       .ninja_deps              binary deps log (its format: runtimes/_ninja/build.py): for
#                                each object, the headers the compiler's -MMD depfile listed,
#                                i.e. no header reached through -isystem (torch's, Python's, the
#                                user's) or C/CPLUS_INCLUDE_PATH; CPATH headers are listed
#       .ninja_log               "# ninja log v7", then per output: start end mtime path hash
#       <stem>.o, <name>.so      the objects and the library; `<name>_v<N>.so` when the same
#                                process rebuilt the extension N times (the versioner renames
#                                the module); a new process starts again at <name>.so, so older
#                                `_vN` libraries are never loaded again
#       main.cpp, cuda.cu,       load_inline's generated sources (written only when changed)
#       sycl.sycl
#       lock                     FileBaton: created O_CREAT|O_EXCL and held open by the building
#                                process, removed on release. A killed build leaves it behind and
#                                every later load() of the extension waits for it forever
#                                (pytorch/pytorch#189245)
#
# build.ninja and .ninja_deps are read by `cacheaudit.runtimes._ninja.build` (shared with the
# torch-ext policy and adapter); this module reads the directories around them.
"""Reader for torch.utils.cpp_extension build directories: one CacheEntry per extension.

torch keeps no key on disk: its in-process versioner lives in memory, and across processes ninja
decides from build.ninja's command lines and file mtimes. The entry's key is therefore a digest
of the commands build.ninja holds (what ninja compares with its log, `entry_key`), and its meta
carries the parsed build file so that the policy can rerun the compile's dependency pass and
ninja's own decision.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from cacheaudit.digest import StateCache
from cacheaudit.layout import Layout, unlistable
from cacheaudit.model import CacheEntry, CacheLeftover, FileState
from cacheaudit.runtimes._ninja.build import (
    BUILD_FILE,
    BuildFile,
    NinjaSyntaxError,
    build_path,
    read_build_file,
    read_deps_log,
)

# Re-exported: the adapter and the tests read the root from the layout.
from cacheaudit.runtimes.torch_ext.spec import default_root as default_root
from cacheaudit.runtimes.torch_ext.spec import default_roots as spec_default_roots

RUNTIME = "torch-ext"
LAYOUT_NAME = "torch_ext"

LOCK = "lock"
INLINE_SOURCES = ("main.cpp", "cuda.cu", "sycl.sycl")
ENTRY_KEY_LABEL = "torch-ext build commands"
"""What the entry's key digests the build commands under (`BuildFile.commands_key`)."""

# `_get_build_directory`: py<major><minor><abiflags>_<accelerator>.
BUILD_FOLDER_RE = re.compile(r"py\d+[a-z]*_(?:cpu|cu\d+|rocm\d+|xpu\w*)")
VERSIONED_RE = re.compile(r"(?P<name>.+)_v(?P<version>\d+)$")


def entry_key(build: BuildFile) -> str:
    """The key of the entry a build.ninja describes (and of the adapter's records): a digest of
    every edge's command line, what ninja compares between builds besides mtimes."""
    return build.commands_key(ENTRY_KEY_LABEL)



# ------------------------------------------------------------------------------ the lock


def lock_holders(path: str) -> list[int] | None:
    """Pids of processes that hold `path` open (FileBaton keeps its descriptor for the whole
    build); None when /proc cannot say: not Linux, or no holder among the processes whose
    descriptors can be read while some cannot (another user's build sharing the directory
    would be one of those)."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    target = os.path.realpath(path)
    holders = []
    hidden = False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            fds = os.listdir(fd_dir)
        except FileNotFoundError:
            continue  # the process exited after /proc was listed
        except OSError:
            hidden = True
            continue
        for fd in fds:
            try:
                if os.readlink(f"{fd_dir}/{fd}") == target:
                    holders.append(int(pid))
                    break
            except OSError:
                continue
    if not holders and hidden:
        return None
    return holders


def lock_problem(path: str, now_ns: int | None = None) -> str | None:
    """Why a `lock` file in a build directory is a problem, or None while a build holds it."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    holders = lock_holders(path)
    age_s = ((now_ns or time.time_ns()) - st.st_mtime_ns) / 1e9
    if holders:
        return None
    if holders is None:
        return (f"a FileBaton lock file {age_s:.0f} s old: if no build is running, every later "
                f"load() of this extension waits for it forever (pytorch/pytorch#189245)")
    return (f"stale FileBaton lock file, {age_s:.0f} s old and held open by no process: a killed "
            f"build left it, and every later load() of this extension waits for it forever "
            f"(pytorch/pytorch#189245); remove it")


# ------------------------------------------------------------------------------ the reader


def _is_build_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, BUILD_FILE))


def _subdirs(path: str) -> list[os.DirEntry[str]]:
    """The directories in `path`, sorted by name. Raises OSError as os.scandir does."""
    with os.scandir(path) as it:
        return sorted((e for e in it if e.is_dir()), key=lambda e: e.name)


def _children(path: str) -> list[os.DirEntry[str]]:
    try:
        return _subdirs(path)
    except OSError:
        return []


class TorchExtReader(Layout):
    """The `Reader` for torch extension build directories (see the module header)."""

    layout = LAYOUT_NAME
    runtime = RUNTIME

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """torch's root for this environment (the spec's `default_roots`)."""
        return spec_default_roots(env)

    def is_root(self, path: str) -> bool:
        """A build directory itself, a directory of build directories, or torch's default root
        with its py<XY>_<acc> level."""
        if _is_build_dir(path):
            return True
        for child in _children(path):
            if _is_build_dir(child.path):
                return True
            if BUILD_FOLDER_RE.fullmatch(child.name) and any(
                    _is_build_dir(c.path) for c in _children(child.path)):
                return True
        return False

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        if _is_build_dir(root):
            yield from read_build_dir(root, root, cache)
            return
        yield from self._level(root, root, cache, descend=True)

    def eviction_blocker(self, entry: CacheEntry) -> str | None:
        """A build directory whose `lock` a process holds (or may hold: /proc cannot say) is
        being built: ninja and torch's import go on writing and loading by its path, so moving
        it away would fail that build. The whole directory is what evicting removes (the
        default `evict_paths`): the library alone would only be relinked from the stale objects
        that `.ninja_log` still calls up to date."""
        lock = os.path.join(entry.path, LOCK)
        if not os.path.lexists(lock):
            return None
        holders = lock_holders(lock)
        if holders is None:
            return f"{LOCK} exists and /proc cannot say whether a build holds it"
        if holders:
            return (f"a build holds its {LOCK} (pid {', '.join(map(str, holders))}): evict it "
                    "when the build is done")
        return None

    def _level(self, root: str, path: str, cache: StateCache, *, descend: bool
               ) -> Iterator[CacheEntry | CacheLeftover]:
        """The extension directories in `path`; with `descend`, also those one py<XY>_<acc>
        level down. A directory that cannot be listed is said so, not passed over as empty."""
        try:
            children = _subdirs(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, path, exc)
            return
        for child in children:
            if descend and BUILD_FOLDER_RE.fullmatch(child.name) and not _is_build_dir(
                    child.path):
                yield from self._level(root, child.path, cache, descend=False)
            else:
                yield from self._one(root, child.path, cache)

    def _one(self, root: str, path: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        if _is_build_dir(path):
            yield from read_build_dir(root, path, cache)
            return
        try:
            names = set(os.listdir(path))
        except FileNotFoundError:
            return  # removed since its parent was listed
        except OSError as exc:
            yield unlistable(RUNTIME, LAYOUT_NAME, root, path, exc)
            return
        lock = os.path.join(path, LOCK)
        if LOCK in names and (why := lock_problem(lock)) is not None:
            yield CacheLeftover(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=lock,
                                reason=why, mtime_ns=_mtime(lock))
        elif not names:
            yield CacheLeftover(
                runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=path, mtime_ns=_mtime(path),
                reason="empty extension directory: torch created it for a load() that never "
                       "wrote build.ninja (interrupted, or it failed before the build)")


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def read_build_dir(root: str, path: str, cache: StateCache
                   ) -> Iterator[CacheEntry | CacheLeftover]:
    """One build directory: the entry, then its leftovers (older `_vN` libraries)."""
    real = os.path.realpath(path)
    problems: list[str] = []
    try:
        names = set(os.listdir(real))
    except OSError as exc:
        names = set()
        problems.append(f"the build directory cannot be listed ({type(exc).__name__}: "
                        f"{exc.strerror or exc}): its lock, inline sources and older libraries "
                        "cannot be checked")
    meta: dict[str, Any] = {}
    build: BuildFile | None = None
    try:
        build = read_build_file(os.path.join(real, BUILD_FILE))
    except (OSError, NinjaSyntaxError) as exc:
        problems.append(f"{BUILD_FILE} cannot be read: {exc}")
    if build is not None:
        meta = build.meta()
        problems.extend(f"{BUILD_FILE}: {p}" for p in build.problems)
    library = build.library if build is not None else None
    if LOCK in names and (why := lock_problem(os.path.join(real, LOCK))) is not None:
        problems.append(why)

    binary: FileState | None = None
    if library is not None:
        binary = cache.capture(build_path(library, real))
        if not binary.exists:
            problems.append(f"{BUILD_FILE} names {library}, which is missing: the last build "
                            f"failed or was interrupted (the next load() in a new process "
                            f"builds it again)")
        elif binary.digest is None:
            problems.append(f"{library} cannot be read: {binary.error}")
    elif build is not None:
        problems.append(f"{BUILD_FILE} names no library (no default target, no link edge)")

    source_path = next((os.path.join(real, n) for n in INLINE_SOURCES if n in names), None)
    if source_path is None and build is not None and build.sources:
        source_path = build.sources[0]
    source = cache.capture(source_path) if source_path else None
    if source is not None and not source.exists:
        problems.append(f"the source {source_path} is gone: ninja fails on the next load()")

    from cacheaudit.graph import NinjaDepsLogError

    try:
        deps = read_deps_log(real)
        meta["deps"] = {out: list(e.inputs) for out, e in deps.items()}
    except (OSError, NinjaDepsLogError) as exc:
        meta["deps_error"] = str(exc)

    kernel = os.path.basename(real)
    if library is not None:
        stem = os.path.splitext(os.path.basename(library))[0] or library
        match = VERSIONED_RE.fullmatch(stem)
        kernel = match.group("name") if match else stem
        if match:
            meta["version"] = int(match.group("version"))

    yield CacheEntry(runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=real, kernel=kernel,
                     key=entry_key(build) if build is not None else None, binary=binary,
                     source=source, meta=meta, files=tuple(sorted(names)),
                     problems=tuple(problems))

    current = os.path.basename(library) if library else None
    for name in sorted(names):
        stem, suffix = os.path.splitext(name)
        match = VERSIONED_RE.fullmatch(stem)
        if suffix in (".so", ".pyd", ".dylib") and match and match.group("name") == kernel \
                and name != current:
            leftover = os.path.join(real, name)
            yield CacheLeftover(
                runtime=RUNTIME, layout=LAYOUT_NAME, root=root, path=leftover,
                mtime_ns=_mtime(leftover),
                reason=f"library of in-process rebuild {match.group('version')} of {kernel}: "
                       f"torch's versioner names rebuilds within one process {kernel}_v<N>, and "
                       f"a new process starts again at {kernel}{suffix}, so no load() uses it "
                       f"again")


LAYOUT = TorchExtReader()
