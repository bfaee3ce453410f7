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

if TYPE_CHECKING:
    from cacheaudit.digest import StateCache
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
        self.before: dict[str, tuple[int, int, int] | None] = {}
        self.launcher: str | None = None
        """The launcher this call set, to be taken back when the build returns."""


def _stat_key(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def _outputs(build_dir: str) -> list[str]:
    """Every output build.ninja names (objects and library), absolute; none before the first
    build.ninja is written."""
    from cacheaudit.runtimes._ninja.build import BUILD_FILE, build_path, read_build_file

    try:
        build = read_build_file(os.path.join(build_dir, BUILD_FILE))
    except Exception:  # noqa: BLE001 - no build.ninja yet, or one we cannot read
        return []
    return [build_path(o, build_dir) for e in build.edges for o in e.outputs]


class FlashInferAdapter(Adapter):
    """The adapter for FlashInfer's JIT: `JitSpecNvcc.build` wrapped. A FlashInfer without it
    is left alone (reported once)."""

    runtime = RUNTIME
    module = MODULE
    observer = OBSERVER

    def __init__(self) -> None:
        super().__init__(label="flashinfer adapter")
        self._cache: StateCache | None = None
        self._launcher_lock = threading.Lock()
        self._launcher_users = 0

    def _replacements(self, switch: Switch) -> list[tuple[object, str, object]]:
        module = importlib.import_module(MODULE)
        spec_class = module.JitSpecNvcc
        return [(spec_class, "build", self._wrap(spec_class.build, switch)),
                (spec_class, "try_load", self._wrap_try_load(spec_class.try_load, switch))]

    def _uninstalled(self) -> None:
        self._cache = None

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

    def _guard(self, action: Callable[..., Any], *args: Any) -> Any:
        """Run cacheaudit's own work; any failure is reported once and swallowed."""
        try:
            return action(*args)
        except Exception as exc:  # noqa: BLE001 - fail open inside the runtime
            self._problem(f"{type(exc).__name__}: {exc}")
            return None

    def _begin(self, spec: Any) -> _Call:
        build_dir = os.path.realpath(os.fspath(spec.build_dir))
        call = _Call(name=str(spec.name), build_dir=build_dir,
                     toolchain=str(getattr(spec, "toolchain", "nvcc")), started_ns=time.time_ns())
        # Outputs of the build.ninja there before the call; the build rewrites it only when its
        # text changed, and an output it adds is new anyway.
        call.before = {path: _stat_key(path) for path in _outputs(build_dir)}
        library = os.path.join(build_dir, f"{call.name}.so")
        call.before.setdefault(library, _stat_key(library))
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
        from cacheaudit.runtimes._ninja.build import BUILD_FILE, read_build_file

        if error is not None and not isinstance(error, Exception):
            return  # KeyboardInterrupt, SystemExit: the user wants out, not a record
        try:
            build = read_build_file(os.path.join(call.build_dir, BUILD_FILE))
        except Exception:  # the build failed before writing build.ninja
            if error is None:
                raise
            return
        written = sorted(path for path in set(call.before) | set(_outputs(call.build_dir))
                         if _stat_key(path) != call.before.get(path))
        if error is None and not written:
            self._record_build(call, build, "disk-hit", written, None)
        else:
            self._record_build(call, build, "compile", written, error)

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

    def _record_build(self, call: _Call, build: BuildFile, event: str, written: list[str],
                      error: BaseException | None) -> None:
        from cacheaudit.graph import NinjaDepsLogError
        from cacheaudit.recorder import record_event
        from cacheaudit.runtimes._ninja.build import build_path, read_deps_log, tracked_paths
        from cacheaudit.runtimes.flashinfer.layout import entry_key

        cache = self._state_cache()
        notes: list[str] = []
        try:
            deps = read_deps_log(call.build_dir)
        except (OSError, NinjaDepsLogError) as exc:
            notes.append(f"ninja's deps log is unreadable ({exc})")
            deps = {}
        tracked = tuple(sorted(tracked_paths(build, deps)))
        library = build_path(build.library, call.build_dir) if build.library else None
        outputs = (cache.capture(library),) if library else ()
        extra: dict[str, Any] = {"module": call.name, "toolchain": call.toolchain}
        if written:
            extra["written"] = written
        if call.launcher:
            extra["launcher"] = call.launcher
        if error is not None:
            notes.append(f"the build failed: {type(error).__name__}: {str(error)[:500]}")
        sources = tuple(cache.capture(p) for p in (tracked if event == "disk-hit"
                                                   else build.sources))
        problem = record_event(
            runtime=RUNTIME, observer=OBSERVER, kernel=call.name, event=event,
            key=entry_key(build), entry=call.build_dir, cwd=call.build_dir, sources=sources,
            outputs=outputs, tracked=tracked, exit_code=0 if error is None else 1,
            started_ns=call.started_ns, duration_ns=time.time_ns() - call.started_ns,
            notes=tuple(notes), extra=extra)
        if problem:
            self._problem(problem)


ADAPTER = FlashInferAdapter()
