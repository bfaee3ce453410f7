"""FlashInfer's JIT, observed from inside `JitSpecNvcc.build` (flashinfer-python 0.7.4).

Every JIT module goes through `JitSpecNvcc.build`: `build_and_load` (core.py:372-393) and the
AOT fallback (core.py:613-616) call it through `_timed_build`, ahead-of-time tooling calls it
directly. It writes build.ninja when its text changed and runs ninja in `cached_ops/<name>/`
(core.py:618-640); `try_load` before it returns only AOT libraries. So one wrapped method sees
every JIT lookup, and the outputs' stat before and after says what ninja did:

- nothing written: a *disk hit* (ninja's no-op; FlashInfer has no other hit), recorded with the
  module's name, its tracked set and the tracked files' states now, so that a header whose
  bytes changed since the build is on the record;
- outputs written: a *compile* of the module, with the module's name and what was written. Its
  only hashed output is the library, never the objects: the entry's build is the shim's record
  of the first object's compile (the layout's `binary`), which holds the include graph, and an
  attributed record that wrote another digest is not taken for it (audit/identity.py).

Recording through the launcher: during the wrapped call, in a recording session, and where the
user set no `FLASHINFER_NVCC_LAUNCHER` of their own, the adapter sets
`FLASHINFER_NVCC_LAUNCHER` to this installation's `cacheaudit-shim` (launcher mode:
`cacheaudit-shim COMPILER ARGS`), which build.ninja writes onto the `nvcc_launcher` line
(cpp_ext.py:292). The `nvcc` line, the compiler's path on every command and the link edge stay
as FlashInfer writes them unrecorded; `c++` is reached through PATH's masquerade link with no
change at all. docs/runtimes/flashinfer.md says what that leaves changed.

Fail open: every step of cacheaudit's own work is guarded; `build` returns and raises exactly
what it would without the adapter; the first problem is reported once on stderr.
"""

from __future__ import annotations

import functools
import importlib
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cacheaudit.adapter import Adapter, Switch
from cacheaudit.digest import path_stat_key

if TYPE_CHECKING:
    from cacheaudit.digest import StateCache
    from cacheaudit.opens import ChangeWatch
    from cacheaudit.runtimes._ninja.build import BuildFile

RUNTIME = "flashinfer"
MODULE = "flashinfer.jit.core"
OBSERVER = "adapter:flashinfer"
LAUNCHER_VARIABLE = "FLASHINFER_NVCC_LAUNCHER"
NVCC_VARIABLE = "FLASHINFER_NVCC"


class _Call:
    """One `build` call, from entry to return."""

    __slots__ = ("before", "build_dir", "launcher", "name", "started_ns", "toolchain")

    def __init__(self, name: str, build_dir: str, toolchain: str, started_ns: int) -> None:
        self.name = name
        self.build_dir = build_dir
        self.toolchain = toolchain
        self.started_ns = started_ns
        self.before: dict[str, tuple[int, int, int, int] | None] = {}
        self.launcher: str | None = None
        """The launcher this call set, to be taken back when the build returns."""


class _Parsed:
    """build.ninja and the deps log of one module directory as last read, with the stat they
    were read at: a no-op build leaves both as they were, and parsing them again on every hit
    would cost more than FlashInfer's own hit path allows (benchmarks/bench_flashinfer.py)."""

    __slots__ = ("build", "build_stat", "deps_stat", "outputs", "tracked")

    def __init__(self, build: BuildFile, build_stat: tuple[int, int, int, int] | None,
                 outputs: list[str]) -> None:
        self.build = build
        self.build_stat = build_stat
        self.outputs = outputs
        self.deps_stat: tuple[int, int, int, int] | None = None
        self.tracked: tuple[str, ...] | None = None


class _LastHit:
    """What the last recorded hit of a module directory showed: a hit showing the same (the
    same tracked contents, under the same environment) is only counted. `moment` is the
    adapter's `ChangeWatch` moment the tracked files were captured at, once they are watched
    (from a module's second hit in the process): while it holds and build.ninja, the tracked
    set and the environment are the same, the files are not stat'ed again."""

    __slots__ = ("count", "moment", "quick", "signature")

    def __init__(self, signature: tuple[Any, ...]) -> None:
        self.signature = signature
        self.count = 0
        self.moment: int | None = None
        self.quick: tuple[Any, ...] = ()


class FlashInferAdapter(Adapter):
    """The adapter for FlashInfer's JIT: `JitSpecNvcc.build` wrapped. A FlashInfer without it
    is left alone (reported once)."""

    runtime = RUNTIME
    module = MODULE
    observer = OBSERVER

    def __init__(self) -> None:
        super().__init__(label="flashinfer adapter")
        self._cache: StateCache | None = None
        self._parsed: dict[str, _Parsed] = {}
        self._real_dirs: dict[str, str] = {}
        """Each module directory as FlashInfer names it -> its realpath (the entry)."""
        self._last_hits: dict[str, _LastHit] = {}
        self._changes: ChangeWatch | None = None
        self._launcher_lock = threading.Lock()
        self._launcher_users = 0

    def _replacements(self, switch: Switch) -> list[tuple[object, str, object]]:
        module = importlib.import_module(MODULE)
        spec_class = module.JitSpecNvcc
        return [(spec_class, "build", self._wrap(spec_class.build, switch)),
                (spec_class, "try_load", self._wrap_try_load(spec_class.try_load, switch))]

    def _uninstalled(self) -> None:
        self._cache = None
        self._parsed.clear()
        self._real_dirs.clear()
        self._last_hits.clear()
        self._forget_changes()

    def _after_fork_in_child(self) -> None:
        self._last_hits.clear()  # the child's hits are its own records
        self._forget_changes()  # and the parent's inotify queue is the parent's to read

    def _forget_changes(self) -> None:
        changes, self._changes = self._changes, None
        if changes is not None:
            changes.close()

    def _watch(self) -> ChangeWatch:
        if self._changes is None:
            from cacheaudit.opens import ChangeWatch

            self._changes = ChangeWatch()
        return self._changes

    def _build_file(self, build_dir: str) -> _Parsed | None:
        """build.ninja of `build_dir`, parsed again only when its stat changed; None before the
        first one is written."""
        from cacheaudit.runtimes._ninja.build import BUILD_FILE, build_path, read_build_file

        path = os.path.join(build_dir, BUILD_FILE)
        stat = path_stat_key(path)
        if stat is None:
            return None
        parsed = self._parsed.get(build_dir)
        if parsed is not None and parsed.build_stat == stat:
            return parsed
        build = read_build_file(path)
        outputs = [build_path(o, build_dir) for e in build.edges for o in e.outputs]
        parsed = self._parsed[build_dir] = _Parsed(build, stat, outputs)
        return parsed

    def _tracked(self, build_dir: str, parsed: _Parsed, notes: list[str]) -> tuple[str, ...]:
        """What ninja tracks (sources plus the deps log), read again only when the deps log's
        stat changed."""
        from cacheaudit.graph import NinjaDepsLogError
        from cacheaudit.runtimes._ninja.build import read_deps_log, tracked_paths

        stat = path_stat_key(os.path.join(build_dir, ".ninja_deps"))
        if parsed.tracked is not None and parsed.deps_stat == stat:
            return parsed.tracked
        try:
            deps = read_deps_log(build_dir)
        except (OSError, NinjaDepsLogError) as exc:
            notes.append(f"ninja's deps log is unreadable ({exc})")
            deps = {}
        parsed.deps_stat = stat
        parsed.tracked = tuple(sorted(tracked_paths(parsed.build, deps)))
        return parsed.tracked

    # ---------------------------------------------------------------- the wrapper

    def _wrap(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def build(spec: Any, *args: Any, **kwargs: Any) -> Any:
            if not switch.on:
                return original(spec, *args, **kwargs)
            call = self._guard(self._begin, spec)
            try:
                result = original(spec, *args, **kwargs)
            except BaseException as exc:
                if call is not None:
                    self._guard(self._release_launcher, call)
                    self._guard(self._end, call, exc)
                raise
            if call is not None:
                self._guard(self._release_launcher, call)
                self._guard(self._end, call, None)
            return result

        return build

    def _wrap_try_load(self, original: Callable[..., Any], switch: Switch
                       ) -> Callable[..., Any]:
        @functools.wraps(original)
        def try_load(spec: Any, *args: Any, **kwargs: Any) -> Any:
            loaded = original(spec, *args, **kwargs)
            if loaded is not None and switch.on:
                self._guard(self._aot_loaded, spec)
            return loaded

        return try_load

    def _begin(self, spec: Any) -> _Call:
        given = os.fspath(spec.build_dir)
        build_dir = self._real_dirs.get(given)
        if build_dir is None:
            if len(self._real_dirs) > 256:
                self._real_dirs.clear()
            build_dir = self._real_dirs[given] = os.path.realpath(given)
        call = _Call(name=str(spec.name), build_dir=build_dir,
                     toolchain=str(getattr(spec, "toolchain", "nvcc")), started_ns=time.time_ns())
        # Outputs of the build.ninja there before the call; the build rewrites it only when its
        # text changed, and an output it adds is new anyway.
        parsed = self._build_file(build_dir)
        call.before = {path: path_stat_key(path) for path in (parsed.outputs if parsed else ())}
        library = os.path.join(build_dir, f"{call.name}.so")
        call.before.setdefault(library, path_stat_key(library))
        self._take_launcher(call)
        return call

    # ---------------------------------------------------------------- the launcher

    def _take_launcher(self, call: _Call) -> None:
        """Point FLASHINFER_NVCC_LAUNCHER at the shim for this build, in a recording session
        only, and only where the user named neither a launcher (theirs runs nvcc by path: a
        ccache, whose own compiler lookup cacheaudit leaves alone). An FLASHINFER_NVCC the
        user set is launched as named; one that is already a shim of ours records itself."""
        from cacheaudit.switches import (
            ACTIVE,
            DISABLE_VARIABLE,
            LEDGER,
            flag_set,
            is_masquerade_dir,
        )

        environ = os.environ
        if not (flag_set(environ, ACTIVE) and environ.get(LEDGER)) or flag_set(
                environ, DISABLE_VARIABLE):
            return
        with self._launcher_lock:
            if self._launcher_users:
                self._launcher_users += 1
                call.launcher = environ.get(LAUNCHER_VARIABLE)
                return
            nvcc = environ.get(NVCC_VARIABLE, "")
            if environ.get(LAUNCHER_VARIABLE) or (nvcc and is_masquerade_dir(
                    os.path.dirname(nvcc))):
                return
            from cacheaudit.shim import shim_executable

            launcher = shim_executable()
            environ[LAUNCHER_VARIABLE] = launcher
            call.launcher = launcher
            self._launcher_users = 1

    def _release_launcher(self, call: _Call) -> None:
        if call.launcher is None:
            return
        with self._launcher_lock:
            self._launcher_users -= 1
            if self._launcher_users <= 0:
                self._launcher_users = 0
                if os.environ.get(LAUNCHER_VARIABLE) == call.launcher:
                    del os.environ[LAUNCHER_VARIABLE]

    # ---------------------------------------------------------------- after the build

    def _state_cache(self) -> StateCache:
        if self._cache is None:
            from cacheaudit.digest import StateCache

            self._cache = StateCache()
        return self._cache

    def _end(self, call: _Call, error: BaseException | None) -> None:
        if error is not None and not isinstance(error, Exception):
            return  # KeyboardInterrupt, SystemExit: the user wants out, not a record
        try:
            parsed = self._build_file(call.build_dir)
        except Exception:  # the build failed before writing a readable build.ninja
            if error is None:
                raise
            return
        if parsed is None:
            return
        written = sorted(path for path in set(call.before) | set(parsed.outputs)
                         if path_stat_key(path) != call.before.get(path))
        if error is None and not written:
            self._record_build(call, parsed, "disk-hit", written, None)
        else:
            self._record_build(call, parsed, "compile", written, error)

    def _aot_loaded(self, spec: Any) -> None:
        """`try_load` returned an AOT library: FlashInfer builds nothing and checks nothing. A
        JIT module of the same name in the workspace is recorded as hit-by-nobody: a disk-hit
        naming the AOT library, so that the run's audit reads the workspace (and the policy
        says which library wins, CA105)."""
        from cacheaudit.recorder import record_event

        build_dir = os.path.realpath(os.fspath(spec.build_dir))
        if not os.path.isdir(build_dir):
            return
        name = str(spec.name)
        paths = getattr(spec, "get_library_paths", None)
        libraries = [os.fspath(p) for p in paths()] if callable(paths) else [
            os.fspath(spec.aot_path)]
        cache = self._state_cache()
        problem = record_event(
            runtime=RUNTIME, observer=OBSERVER, kernel=name, event="disk-hit", entry=build_dir,
            cwd=build_dir, outputs=tuple(cache.capture(p) for p in libraries),
            notes=(f"FlashInfer loaded the AOT library {', '.join(libraries)} (try_load, no "
                   f"freshness check); the JIT module in {build_dir} is not what it loads",),
            extra={"module": name, "toolchain": str(getattr(spec, "toolchain", "nvcc")),
                   "aot_library": libraries[0] if libraries else ""})
        if problem:
            self._problem(problem)

    def _record_build(self, call: _Call, parsed: _Parsed, event: str, written: list[str],
                      error: BaseException | None) -> None:
        from cacheaudit.adapter import environ_snapshot
        from cacheaudit.recorder import record_event
        from cacheaudit.runtimes._ninja.build import build_path
        from cacheaudit.runtimes.flashinfer.layout import entry_key

        build = parsed.build
        cache = self._state_cache()
        notes: list[str] = []
        tracked = self._tracked(call.build_dir, parsed, notes)
        extra: dict[str, Any] = {"module": call.name, "toolchain": call.toolchain}
        moment: int | None = None
        if event == "disk-hit":
            last = self._last_hits.get(call.build_dir)
            quick = (parsed.build_stat, tracked, id(environ_snapshot()))
            if last is not None and last.moment is not None and last.quick == quick and (
                    self._watch().moment() == last.moment):
                last.count += 1  # nothing under the tracked files moved since their capture
                return
            if last is not None and self._watch().cover(tracked):
                # A module hit again in this process: watched from now, captured after.
                moment = self._watch().moment()
        sources = tuple(cache.capture(p) for p in (tracked if event == "disk-hit"
                                                   else build.sources))
        if event == "disk-hit":
            signature = (parsed.build_stat, tuple((s.path, s.digest) for s in sources),
                         id(environ_snapshot()))
            if last is not None and last.signature == signature:
                last.count += 1
                last.moment, last.quick = moment, quick
                return
            if last is not None and last.count:
                extra["hits_not_recorded"] = last.count
            hit = self._last_hits[call.build_dir] = _LastHit(signature)
            hit.moment, hit.quick = moment, quick
        else:
            self._last_hits.pop(call.build_dir, None)
        library = build_path(build.library, call.build_dir) if build.library else None
        outputs = (cache.capture(library),) if library else ()
        if written:
            extra["written"] = written
        if call.launcher:
            extra["launcher"] = call.launcher
        if error is not None:
            notes.append(f"the build failed: {type(error).__name__}: {str(error)[:500]}")
        problem = record_event(
            runtime=RUNTIME, observer=OBSERVER, kernel=call.name, event=event,
            key=entry_key(build), entry=call.build_dir, cwd=call.build_dir, sources=sources,
            outputs=outputs, tracked=tracked, exit_code=0 if error is None else 1,
            started_ns=call.started_ns, duration_ns=time.time_ns() - call.started_ns,
            notes=tuple(notes), extra=extra)
        if problem:
            self._problem(problem)


ADAPTER = FlashInferAdapter()
