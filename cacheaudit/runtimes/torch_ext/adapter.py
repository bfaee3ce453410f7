"""torch.utils.cpp_extension (`load`, `load_inline`), observed from inside `_jit_compile`.

torch has no hook, so two module attributes are wrapped; `load` and `load_inline` look
`_jit_compile` up in the module's globals at each call, and `_write_ninja_file_and_build_library`
looks up `_run_ninja_build` the same way, so replacing the attributes is enough:

- `_jit_compile`: the in-process versioner (`JIT_EXTENSION_VERSIONER`) decides first. Its entry
  for the extension is read before and after the call: an unchanged version means torch skipped
  ninja entirely and returned the module it already had, a *memory hit* (headers edited since are
  never seen: the versioner hashes only sources, flags and the build directory).
- `_run_ninja_build`: called only when the versioner wants a build, after torch has rewritten
  build.ninja. Just before the real ninja, `ninja -n -d explain` (one process, ~2 ms) says
  whether ninja will do any work and why. When it will, the compiler's own `-M` pass runs for
  every compile edge with build.ninja's exact flags, beside ninja (a spare core makes it free
  in wall clock; `-MMD`, which ninja reads, leaves out every `-isystem` header), so that the
  graph holds torch's, Python's, the user's `-isystem` and the CPATH headers. At most as many
  passes run at once as the process may use CPUs (fewer under torch's MAX_JOBS), the next one
  starting as one ends, all within one deadline. After ninja, the
  outputs' stat says what ninja really did: written outputs make a *compile*, none a *disk hit*.

Records: runtime "torch-ext", kernel = the extension's name, entry = the build directory
(realpath), key = a digest of build.ninja's commands, tracked = what ninja's decision covers
(sources plus the headers of its deps log, read from `.ninja_deps` directly rather than through
`ninja -t deps`, which would cost another process), outputs = the library (and objects), whose
xxh3 ties the build directory found by a scan to its record.

Fail open: every step of cacheaudit's own work is guarded; `load` returns and raises exactly what
it would without the adapter; the first problem is reported once on stderr.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cacheaudit.adapter import Adapter, Switch
from cacheaudit.digest import path_stat_key

if TYPE_CHECKING:
    import inspect

    from cacheaudit.digest import StateCache
    from cacheaudit.graph import DependencyPass
    from cacheaudit.model import FileState, IncludeGraph
    from cacheaudit.runtimes._ninja.build import BuildFile, DryRun

RUNTIME = "torch-ext"
MODULE = "torch.utils.cpp_extension"
OBSERVER = "adapter:torch_ext"
_PASS_TIMEOUT_S = 600.0
"""How long the `-M` passes of one build may take, all of them together."""


# ------------------------------------------------------------------------------ per-call state


class _Pass:
    """The compiler's `-M` pass over one compile edge.

    Plain slotted classes for the per-call state: this module is imported in every process
    that arms the adapter, and each dataclass costs milliseconds to define."""

    __slots__ = ("argv", "compiler", "depfile", "error", "output", "running", "sources",
                 "tokens")

    def __init__(self, output: str, sources: tuple[str, ...], compiler: str,
                 tokens: tuple[str, ...]) -> None:
        self.output = output
        self.sources = sources
        self.compiler = compiler
        self.tokens = tokens
        self.argv: tuple[str, ...] = ()
        """The real compiler and the dependency argv; empty when there is nothing to run."""
        self.depfile: str | None = None
        self.running: DependencyPass | None = None
        self.error: str | None = None


class _Passes:
    """The `-M` passes of one build, beside ninja: at most `limit` at once (a build of 40
    sources must not start 40 compilers next to ninja's own), the next one started as one ends,
    all of them within one deadline.

    Worker threads only start passes and wait for their processes to end; reading a result
    (`DependencyPass.wait`) and killing happen on the thread that called `_jit_compile`."""

    __slots__ = ("_cwd", "_env", "_lock", "_queue", "_start", "_stopped", "_threads",
                 "deadline", "items", "timeout_s")

    def __init__(self, items: list[_Pass], cwd: str, env: Mapping[str, str], limit: int,
                 timeout_s: float, start: Callable[..., DependencyPass]) -> None:
        self.items = items
        self._start = start  # graph.start_dependency_pass, imported before any thread runs
        self.timeout_s = timeout_s
        self.deadline = time.monotonic() + timeout_s
        self._cwd = cwd
        self._env = dict(env)  # the environment of the build, not of whenever a pass starts
        self._lock = threading.Lock()
        self._queue = [item for item in items if item.argv]
        self._queue.reverse()  # popped from the end: in build.ninja's order
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name="cacheaudit-torch-ext-M",
                                          daemon=True)
                         for _ in range(min(limit, len(self._queue)))]
        for thread in self._threads:
            thread.start()

    def _work(self) -> None:
        while True:
            with self._lock:
                # Started under the lock: `stop` then sees every pass that will ever run.
                if self._stopped or not self._queue:
                    return
                item = self._queue.pop()
                if time.monotonic() >= self.deadline:
                    continue  # `finish` says it never started
                try:
                    item.running = self._start(item.argv[0], item.argv[1:], self._cwd, self._env,
                                               depfile=item.depfile)
                except Exception as exc:  # noqa: BLE001 - a pass is evidence, never a failure
                    item.error = f"could not start: {type(exc).__name__}: {exc}"
                    continue
            process = item.running.process
            if process is None:
                continue  # it could not start: its result says why
            try:
                process.wait(max(0.0, self.deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - TimeoutExpired: `finish` kills it, and reports
                return

    def stop(self) -> None:
        """Start nothing more, and kill what runs: its graph is not wanted."""
        with self._lock:
            self._stopped = True
            running = [item.running for item in self.items if item.running is not None]
        for dependency_pass in running:
            dependency_pass.kill()  # a no-op for a pass that has ended

    def finish(self) -> None:
        """Wait for the passes until the deadline; one still running then is killed (by its
        `wait`), one never started says so."""
        for thread in self._threads:
            thread.join(max(0.0, self.deadline - time.monotonic()))
        with self._lock:
            self._stopped = True
        for item in self.items:
            if item.running is not None:
                item.running.wait(timeout=max(0.0, self.deadline - time.monotonic()))
            elif item.argv and item.error is None:
                item.error = (f"not started: the passes of this build ran out of their "
                              f"{self.timeout_s:g} s")


def _pass_limit(env: Mapping[str, str]) -> int:
    """How many `-M` passes may run at once: the CPUs this process may use, and no more than
    torch's MAX_JOBS (the parallelism the user gave the build), where set."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        jobs = int(env.get("MAX_JOBS", ""))
    except ValueError:
        jobs = 0
    return max(1, min(cpus, jobs) if jobs > 0 else cpus)


class _Call:
    """One `_jit_compile` call, from entry to return."""

    __slots__ = ("before", "build", "build_dir", "dry", "given_dir", "name", "ninja",
                 "ninja_ended_ns", "ninja_started_ns", "notes", "passes", "scheduler",
                 "started_ns", "versioner_before", "workdir")

    def __init__(self, name: str, build_dir: str, given_dir: str, versioner_before: Any,
                 started_ns: int) -> None:
        self.name = name
        self.build_dir = build_dir
        self.given_dir = given_dir
        self.versioner_before = versioner_before
        self.started_ns = started_ns
        self.ninja = False
        self.build: BuildFile | None = None
        self.before: dict[str, tuple[int, int, int, int] | None] = {}
        self.dry: DryRun | None = None
        self.passes: list[_Pass] = []
        self.scheduler: _Passes | None = None
        self.workdir: str | None = None
        self.ninja_started_ns = 0
        self.ninja_ended_ns = 0
        self.notes: list[str] = []


class _Seen:
    """What this process last learnt about a build directory at a ninja run: the baseline that
    a later memory hit (the versioner skipping ninja) is compared with."""

    __slots__ = ("failed", "hit_signature", "hits_not_recorded", "key", "name", "outputs",
                 "tracked")

    def __init__(self, name: str, key: str | None, tracked: tuple[str, ...],
                 outputs: tuple[FileState, ...], failed: bool = False) -> None:
        self.name = name
        self.key = key
        self.tracked = tracked
        self.outputs = outputs
        self.failed = failed
        self.hit_signature: tuple[tuple[str, str | None], ...] | None = None
        self.hits_not_recorded = 0


# ------------------------------------------------------------------------------ the adapter


class TorchExtAdapter(Adapter):
    """The adapter for torch.utils.cpp_extension: `_jit_compile` and `_run_ninja_build`
    wrapped. Installing is a no-op while ours runs, also under another tool's wrapper (wrapping
    again would record every load twice); a torch without these functions is left alone."""

    runtime = RUNTIME
    module = MODULE
    observer = OBSERVER

    def __init__(self) -> None:
        super().__init__(label="torch-ext adapter")
        self._local = threading.local()
        self._module: Any = None
        self._seen: dict[str, _Seen] = {}
        self._cache: StateCache | None = None
        self._signature: inspect.Signature | None = None

    def _replacements(self, switch: Switch) -> list[tuple[object, str, object]]:
        import inspect

        module = importlib.import_module(MODULE)
        originals = {name: getattr(module, name) for name in ("_jit_compile",
                                                               "_run_ninja_build")}
        self._signature = inspect.signature(originals["_jit_compile"])
        self._module = module
        return [(module, "_jit_compile", self._wrap_jit(originals["_jit_compile"], switch)),
                (module, "_run_ninja_build",
                 self._wrap_ninja(originals["_run_ninja_build"], switch))]

    # ---------------------------------------------------------------- wrappers

    def _wrap_jit(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def _jit_compile(*args: Any, **kwargs: Any) -> Any:
            if not switch.on:
                return original(*args, **kwargs)
            call = self._guard(self._begin, args, kwargs)
            try:
                result = original(*args, **kwargs)
            except BaseException as exc:
                if call is not None:
                    self._pop(call)
                    self._guard(self._end, call, exc)
                raise
            if call is not None:
                self._pop(call)
                self._guard(self._end, call, None)
            return result

        return _jit_compile

    def _wrap_ninja(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def _run_ninja_build(*args: Any, **kwargs: Any) -> Any:
            call = self._current(args, kwargs) if switch.on else None
            if call is not None:
                self._guard(self._before_ninja, call)
            try:
                return original(*args, **kwargs)
            finally:
                if call is not None:
                    call.ninja_ended_ns = time.time_ns()

        return _run_ninja_build

    def _stack(self) -> list[_Call]:
        stack = getattr(self._local, "calls", None)
        if stack is None:
            stack = self._local.calls = []
        return stack  # type: ignore[no-any-return]

    def _current(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> _Call | None:
        stack = self._stack()
        if not stack:
            return None  # setup.py builds (BuildExtension) also run ninja: not a JIT lookup
        directory = args[0] if args else kwargs.get("build_directory")
        call = stack[-1]
        try:
            same = directory is not None and os.path.realpath(directory) == call.build_dir
        except (TypeError, ValueError):
            same = False
        return call if same and not call.ninja else None

    # ---------------------------------------------------------------- before and after

    def _begin(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> _Call:
        assert self._signature is not None
        bound = self._signature.bind(*args, **kwargs)
        name = bound.arguments["name"]
        directory = bound.arguments["build_directory"]
        versioner = self._module.JIT_EXTENSION_VERSIONER
        call = _Call(name=str(name), build_dir=os.path.realpath(directory),
                     given_dir=str(directory), versioner_before=versioner.entries.get(name),
                     started_ns=time.time_ns())
        self._stack().append(call)
        return call

    def _before_ninja(self, call: _Call) -> None:
        from cacheaudit.runtimes._ninja.build import BUILD_FILE, ninja_dry_run, read_build_file

        call.ninja = True
        build = call.build = read_build_file(os.path.join(call.build_dir, BUILD_FILE))
        call.before = {o: path_stat_key(os.path.join(call.build_dir, o))
                       for e in build.edges for o in e.outputs}
        call.dry = ninja_dry_run(call.build_dir)
        if call.dry.error:
            call.notes.append(call.dry.error)
        will_compile = call.dry.work is None or any(
            e.command.strip() in {c.strip() for c in call.dry.commands}
            for e in build.compile_edges)
        if call.dry.work is not False and will_compile:
            self._start_passes(call, build)
        call.ninja_started_ns = time.time_ns()

    def _start_passes(self, call: _Call, build: BuildFile) -> None:
        """The compiler's `-M` pass for every compile edge, beside ninja, with the edge's flags,
        a bounded number at a time (`_Passes`)."""
        import shlex

        from cacheaudit import compilers, graph, scratch
        from cacheaudit.runtimes._ninja.build import strip_wrapper

        if call.workdir is None:
            call.workdir = scratch.make_directory("torch-ext")
        env = os.environ
        for index, edge in enumerate(build.compile_edges):
            tokens, _wrapper = strip_wrapper(shlex.split(edge.command))
            item = _Pass(output=edge.outputs[0] if edge.outputs else "?",
                         sources=tuple(edge.inputs), compiler=tokens[0] if tokens else "",
                         tokens=tuple(tokens))
            call.passes.append(item)
            kind = compilers.compiler_kind(tokens[0]) if tokens else "unknown"
            if kind == "unknown":
                item.error = f"compiler of unknown kind: {item.compiler!r}"
                continue
            real = _real_compiler(tokens[0], env)
            if real is None:
                item.error = f"cannot find the compiler {tokens[0]!r}"
                continue
            item.depfile = os.path.join(call.workdir, f"{index}.d")
            parsed = compilers.parse_command(kind, list(tokens[1:]))
            item.argv = (real, *parsed.dependency_argv(item.depfile))
        call.scheduler = _Passes(call.passes, call.build_dir, env, _pass_limit(env),
                                 _PASS_TIMEOUT_S, graph.start_dependency_pass)

    def _pop(self, call: _Call) -> None:
        stack = self._stack()
        for index in range(len(stack) - 1, -1, -1):
            if stack[index] is call:
                del stack[index]
                break

    def _end(self, call: _Call, error: BaseException | None) -> None:
        try:
            if error is not None and not isinstance(error, Exception):
                return  # KeyboardInterrupt, SystemExit: the user wants out, not a record
            after = self._module.JIT_EXTENSION_VERSIONER.entries.get(call.name)
            version = getattr(after, "version", None)
            module = call.name if not version else f"{call.name}_v{version}"
            if call.ninja:
                self._after_ninja(call, module, version, error)
            elif (call.versioner_before is not None and after is not None
                  and after.version == call.versioner_before.version):
                if error is not None:
                    call.notes.append(f"loading the module failed: {type(error).__name__}: "
                                      f"{str(error)[:300]}")
                self._memory_hit(call, module, version)
            elif error is not None:
                return  # torch raised before any build (bad arguments): nothing was looked up
            else:
                # The versioner wanted a build, but another process held the build lock: this
                # one waited and loaded what that process built.
                call.notes.append("another process held the build directory's lock and built "
                                  "the extension; this process waited and loaded its result")
                self._lookup(call, module, version, "disk-hit")
        finally:
            if call.scheduler is not None:
                call.scheduler.stop()
            if call.workdir:
                import shutil

                shutil.rmtree(call.workdir, ignore_errors=True)

    # ---------------------------------------------------------------- events

    def _state_cache(self) -> StateCache:
        if self._cache is None:
            from cacheaudit.digest import StateCache

            self._cache = StateCache()
        return self._cache

    def _record(self, **fields: Any) -> None:
        from cacheaudit.recorder import record_event

        problem = record_event(runtime=RUNTIME, observer=OBSERVER, **fields)
        if problem:
            self._problem(problem)

    def _tracked(self, build: BuildFile, call: _Call) -> tuple[str, ...]:
        from cacheaudit.graph import NinjaDepsLogError
        from cacheaudit.runtimes._ninja.build import read_deps_log, tracked_paths

        try:
            deps = read_deps_log(call.build_dir)
        except (OSError, NinjaDepsLogError) as exc:
            call.notes.append(f"ninja's deps log is unreadable ({exc}): reading `ninja -t deps`")
            deps = _ninja_t_deps(call.build_dir)
        return tuple(sorted(tracked_paths(build, deps)))

    def _after_ninja(self, call: _Call, module: str, version: int | None,
                     error: BaseException | None) -> None:
        build = call.build
        if build is None:
            return
        changed = [o for o in call.before
                   if path_stat_key(os.path.join(call.build_dir, o)) != call.before[o]]
        dry = call.dry
        if dry is not None and dry.work is False and changed:
            call.notes.append(f"ninja wrote {', '.join(changed)} although its dry run found "
                              "no work (another writer in the build directory?)")
        if error is None and not changed:
            if call.scheduler is not None:
                call.scheduler.stop()
            self._lookup(call, module, version, "disk-hit", build=build)
            return
        self._compile(call, module, version, build, changed, error)

    def _lookup(self, call: _Call, module: str, version: int | None, event: str,
                build: BuildFile | None = None) -> None:
        """A disk hit: ninja found nothing to do (or another process built it)."""
        from cacheaudit.runtimes._ninja.build import BUILD_FILE, read_build_file
        from cacheaudit.runtimes.torch_ext.layout import entry_key

        if build is None:
            build = read_build_file(os.path.join(call.build_dir, BUILD_FILE))
        cache = self._state_cache()
        tracked = self._tracked(build, call)
        states = tuple(cache.capture(p) for p in tracked)
        library = build.library
        outputs = (cache.capture(os.path.join(call.build_dir, library)),) if library else ()
        extra = _extra(call, module, version)
        key = entry_key(build)
        self._record(kernel=call.name, event=event, key=key, entry=call.build_dir,
                     cwd=call.build_dir, sources=states, outputs=outputs, tracked=tracked,
                     started_ns=call.started_ns, duration_ns=time.time_ns() - call.started_ns,
                     notes=tuple(call.notes), extra=extra)
        self._seen[call.build_dir] = _Seen(name=call.name, key=key, tracked=tracked,
                                           outputs=outputs)

    def _compile(self, call: _Call, module: str, version: int | None, build: BuildFile,
                 changed: list[str], error: BaseException | None) -> None:
        import shlex

        from cacheaudit import compilers
        from cacheaudit.recorder import modified_since
        from cacheaudit.runtimes.torch_ext.layout import entry_key
        from cacheaudit.switches import is_masquerade_dir

        cache = self._state_cache()
        objects = set(build.objects)
        if error is None and not call.passes and any(o in objects for o in changed):
            # ninja compiled although its dry run did not say so: the pass runs after the fact.
            self._start_passes(call, build)
        sources, include_graph = self._graph(call, cache, killed=error is not None)
        tracked = self._tracked(build, call)
        if not sources:
            sources = tuple(cache.capture(p) for p in build.sources)
        outputs = tuple(cache.capture(os.path.join(call.build_dir, o))
                        for o in ([build.library] if build.library else []) + list(build.objects))
        first = next((p for p in call.passes if p.tokens), None)
        if first is None and build.compile_edges:
            from cacheaudit.runtimes._ninja.build import strip_wrapper

            tokens, _ = strip_wrapper(shlex.split(build.compile_edges[0].command))
        else:
            tokens = list(first.tokens) if first else []
        compiler = None
        effective: tuple[Any, ...] = ()
        if tokens:
            kind = compilers.compiler_kind(tokens[0])
            compiler = compilers.identify(tokens[0], env=os.environ, skip=is_masquerade_dir,
                                          argv=tokens[1:], cwd=call.build_dir,
                                          path=_real_compiler(tokens[0], os.environ))
            effective = compilers.effective_argv(kind if kind != "unknown" else "gcc",
                                                 tokens[1:], os.environ, call.build_dir)
        extra = _extra(call, module, version)
        extra["written"] = changed
        started = call.ninja_started_ns or call.started_ns
        ended = call.ninja_ended_ns or time.time_ns()
        inputs = sources + (tuple(f.state for f in include_graph.files) if include_graph else ())
        late = modified_since(inputs, started)
        if not any(o in objects for o in changed) and error is None:
            call.notes.append("only the link step ran: the objects come from an earlier build")
        notes = list(call.notes)
        if error is not None:
            notes.append(f"the build failed: {type(error).__name__}: {str(error)[:500]}")
        key = entry_key(build)
        self._record(kernel=call.name, event="compile", key=key, entry=call.build_dir,
                     compiler=compiler, argv=tuple(tokens[1:]), effective_argv=effective,
                     cwd=call.build_dir, sources=sources, graph=include_graph, outputs=outputs,
                     tracked=tracked, exit_code=0 if error is None else 1, started_ns=started,
                     duration_ns=max(0, ended - started),
                     notes=tuple(notes), extra=extra,
                     modified_during_compile=tuple(s.path for s in late))
        self._seen[call.build_dir] = _Seen(
            name=call.name, key=key, tracked=tracked, outputs=outputs[:1],
            failed=error is not None)

    def _graph(self, call: _Call, cache: StateCache, killed: bool
               ) -> tuple[tuple[FileState, ...], IncludeGraph | None]:
        """Sources and the include graph from the finished `-M` passes, merged over edges."""
        from cacheaudit import graph
        from cacheaudit.model import GraphFile, IncludeGraph

        sources: list[FileState] = []
        files: dict[str, GraphFile] = {}
        method = ""
        scheduler = call.scheduler
        if scheduler is not None:
            if killed:
                scheduler.stop()
            else:
                scheduler.finish()
        for item in call.passes:
            if item.running is None:
                if item.error:
                    call.notes.append(f"no dependency pass for {item.output}: {item.error}")
                continue
            if killed:
                continue
            result = item.running.wait()
            if not result.ok or result.depfile_text is None:
                call.notes.append(f"dependency pass for {item.output} failed "
                                  f"({result.error or result.exit_code}): "
                                  f"{(result.stderr or '').strip()[:300]}")
                continue
            try:
                found, part = graph.graph_from_depfile(
                    result.depfile_text, call.build_dir, list(item.sources), cache,
                    f"{os.path.basename(item.compiler)} -M")
            except graph.DepfileError as exc:
                call.notes.append(f"dependency pass for {item.output}: {exc}")
                continue
            method = part.method
            sources.extend(s for s in found if s.path not in {x.path for x in sources})
            for graph_file in part.files:
                files.setdefault(graph_file.path, graph_file)
        if not files and not method:
            return tuple(sources), None
        return tuple(sources), IncludeGraph(files=tuple(files.values()), method=method)

    def _memory_hit(self, call: _Call, module: str, version: int | None) -> None:
        """torch skipped ninja: record the hit with the tracked files as they are now, so that a
        header changed since the build in this process is on the record (CA106). A hit that
        shows nothing new since the last recorded one is only counted."""
        from cacheaudit.runtimes._ninja.build import BUILD_FILE, read_build_file
        from cacheaudit.runtimes.torch_ext.layout import entry_key

        seen = self._seen.get(call.build_dir)
        notes = list(call.notes)
        if seen is None or seen.name != call.name:
            build = read_build_file(os.path.join(call.build_dir, BUILD_FILE))
            tracked = self._tracked(build, call)
            library = build.library
            outputs = (self._state_cache().capture(os.path.join(call.build_dir, library)),) \
                if library else ()
            seen = self._seen[call.build_dir] = _Seen(name=call.name, key=entry_key(build),
                                                      tracked=tracked, outputs=outputs)
            notes.append("the first lookup cacheaudit saw in this process: torch had built or "
                         "loaded the extension before the adapter was installed")
        if seen.failed:
            notes.append("the previous build of this version failed in this process, and torch "
                         "skips the build anyway (pytorch/pytorch#119206)")
        cache = self._state_cache()
        states = tuple(cache.capture(p) for p in seen.tracked)
        signature = tuple((s.path, s.digest) for s in states)
        if seen.hit_signature == signature and not notes:
            seen.hits_not_recorded += 1
            return
        extra = _extra(call, module, version)
        if seen.hits_not_recorded:
            extra["hits_not_recorded"] = seen.hits_not_recorded
        self._record(kernel=call.name, event="memory-hit", key=seen.key, entry=call.build_dir,
                     cwd=call.build_dir, sources=states, outputs=seen.outputs,
                     tracked=seen.tracked, started_ns=call.started_ns,
                     duration_ns=time.time_ns() - call.started_ns, notes=tuple(notes),
                     extra=extra)
        seen.hit_signature = signature
        seen.hits_not_recorded = 0


def _extra(call: _Call, module: str, version: int | None) -> dict[str, Any]:
    extra: dict[str, Any] = {"module": module, "version": version,
                             "build_directory": call.given_dir}
    if call.dry is not None:
        extra["ninja_dry_run"] = {"work": call.dry.work, "explain": list(call.dry.explain[:50]),
                                  "ms": round(call.dry.duration_ns / 1e6, 3)}
    return extra


def _real_compiler(name: str, env: Mapping[str, str]) -> str | None:
    """The compiler a build.ninja command names, past cacheaudit's own shims: the dependency
    pass must run the real one (the shim would only exec it, a Python start-up later)."""
    from cacheaudit import compilers
    from cacheaudit.shim import ShimError, find_real_compiler
    from cacheaudit.switches import is_masquerade_dir

    if "/" in name:
        if is_masquerade_dir(os.path.dirname(name)):
            name = os.path.basename(name)
        else:
            return name if os.access(name, os.X_OK) else None
    try:
        return find_real_compiler(name, env)
    except ShimError:
        return compilers.find_program(name, env.get("PATH"), is_masquerade_dir)


def _ninja_t_deps(directory: str) -> dict[str, Any]:
    """`ninja -t deps`, by target: the fallback when the binary log is unreadable."""
    import subprocess

    from cacheaudit import children
    from cacheaudit.graph import DepfileError, parse_ninja_deps

    with contextlib.suppress(OSError, subprocess.SubprocessError, DepfileError):
        done = children.run(["ninja", "-t", "deps"], cwd=directory, env=os.environ, timeout=60)
        if done.returncode == 0 and not done.timed_out:
            text = done.stdout.decode("utf-8", "surrogateescape")
            return {d.target: d for d in parse_ninja_deps(text)}
    return {}


ADAPTER = TorchExtAdapter()
