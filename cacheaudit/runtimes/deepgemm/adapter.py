"""DeepGEMM's Python JIT (`deep_gemm/jit/`, 2025-02 to 2025-07), observed from inside the process.

Why in-process: that JIT keys `"<nvcc path>+(major, minor)"` (`NVCCCompiler.signature`, 8dfa329;
the `(path, version)` tuple at a6d97a1), so a shim named in `DG_JIT_NVCC_COMPILER` would change
every key and an audited run would compile fresh entries while production hits stale ones. The
session leaves that setting alone when the installed `deep_gemm` is the Python JIT (the spec's
`path_in_key_if`), and this adapter, armed at the first import of `deep_gemm.jit.compiler`,
records what the shim would have, without changing the argv, the compiler or the environment.
Where the session could not tell (a job that puts `deep_gemm` on `sys.path` itself), the adapter
undoes the session's stand-in at install time, before the runtime reads the setting
(`restore_compiler_settings`).

What is wrapped (all pure Python, looked up at each call):

- `Compiler.build` (8dfa329; a classmethod, so `NVCCCompiler.build` and `NVRTCCompiler.build`
  both reach it) and the module's `build` (all of a6d97a1's build; at 8dfa329 it picks the
  compiler class): one build, from the key to the published binary. The record is written
  when it returns, so that its output is the entry's binary after the FFMA interleave rewrote
  nvcc's output and `os.replace` moved it into the entry.
- `RuntimeCache.get` (8dfa329) / `RuntimeCache.__getitem__` (a6d97a1): the build's first lookup
  says memory hit (the path was in the module-global cache), disk hit (`is_path_valid`: only
  `kernel.cubin` exists, or `kernel.cu`, `kernel.args` and `kernel.so`) or miss.
- the module's `subprocess` name, by a proxy whose `run` and `check_call` see nvcc's argv (the
  exact list the runtime passes, `--version` calls aside) and run it unchanged; beside it the
  shim's recorder (`ShimRecorder`) runs the compiler's own `-M` pass and identifies the
  compiler, as the shim would.

Records: runtime "deepgemm", kernel = the name, key = the 12 hex digits, entry = the entry
directory, outputs = its binary; a compile's extra says what nvcc wrote before the rewrite.
Hits go through the hit buffer (DeepGEMM calls `build` at every GEMM call: memory hits are the
hot path). NVRTC (`DG_JIT_USE_NVRTC=1`) compiles in-process: its compile is recorded without an
argv or graph.

Fail open: every step of ours is guarded; `build` returns and raises what it would without us.
"""

from __future__ import annotations

import importlib
import os
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from typing import TYPE_CHECKING, Any

from cacheaudit import scratch
from cacheaudit.adapter import (
    Adapter,
    Environ,
    Hit,
    HitBuffer,
    Switch,
    environ_snapshot,
    environ_text,
)

if TYPE_CHECKING:
    from cacheaudit.digest import StateCache
    from cacheaudit.model import CompileRecord, FileState
    from cacheaudit.recorder import ShimRecorder

RUNTIME = "deepgemm"
MODULE = "deep_gemm.jit.compiler"
OBSERVER = "adapter:deepgemm"
ENTRY_PREFIX = "kernel."
BINARIES = ("kernel.cubin", "kernel.so")
_JOIN_TIMEOUT_S = 60.0


class _Compile:
    """One nvcc run inside a build: the shim's recorder working beside it."""

    __slots__ = ("duration_ns", "output", "output_state", "recorder", "returncode", "thread",
                 "workdir")

    def __init__(self, recorder: ShimRecorder, output: str | None, workdir: str,
                 thread: threading.Thread) -> None:
        self.recorder = recorder
        self.output = output
        self.workdir = workdir
        self.thread = thread
        self.returncode: int | None = None
        self.duration_ns = 0
        self.output_state: FileState | None = None


class _Build:
    """One `build` call: its first lookup, and the compiles it ran."""

    __slots__ = ("compiles", "environ", "lookup", "path", "started_ns")

    def __init__(self) -> None:
        self.path: str | None = None
        self.lookup: str | None = None
        self.compiles: list[_Compile] = []
        self.started_ns = time.time_ns()
        self.environ = environ_snapshot()


class _Lookup(Hit):
    __slots__ = ("event", "path")

    def __init__(self, event: str, path: str, ns: int, environ: Environ) -> None:
        super().__init__(ns, environ)
        self.event = event
        self.path = path


def entry_parts(path: str) -> tuple[str | None, str | None]:
    """(kernel name, key) of `<cache>/kernel.<name>.<hash>`."""
    base = os.path.basename(path.rstrip(os.sep))
    if not base.startswith(ENTRY_PREFIX) or base.count(".") < 2:
        return None, None
    name, _, key = base[len(ENTRY_PREFIX):].rpartition(".")
    return name, key


def _binary(path: str) -> str:
    for name in BINARIES:
        candidate = os.path.join(path, name)
        if os.path.exists(candidate):
            return candidate
    return os.path.join(path, BINARIES[0])


def _output_of(argv: Sequence[str]) -> str | None:
    """nvcc's `-o` (DeepGEMM's command is `[nvcc, src, "-o", tmp, *flags]`)."""
    for index, token in enumerate(argv[:-1]):
        if token == "-o":
            return argv[index + 1]
    return None


def restore_compiler_settings(environ: MutableMapping[str, str]) -> list[str]:
    """Undo what a session did to the settings this runtime keys by path, where the session
    could not tell the Python JIT was installed (a job that puts `deep_gemm` on `sys.path`
    itself): a stand-in the session filled in is removed, one that stood in for the user's
    value gives that value back. Runs at the first import of `deep_gemm.jit.compiler`, before
    its `lru_cache`d `get_nvcc_compiler` reads the setting. Returns the names restored."""
    from cacheaudit.shim import lookup_variable, real_variable
    from cacheaudit.switches import is_masquerade_dir

    from .spec import SPEC

    restored = []
    for setting in SPEC.compiler_settings:
        value = environ.get(setting.name)
        if not setting.path_in_key_if or not value or not is_masquerade_dir(
                os.path.dirname(value)):
            continue
        link = os.path.basename(value)
        original = environ.get(real_variable(link))
        if original:
            environ[setting.name] = original
        elif environ.get(lookup_variable(link)):
            del environ[setting.name]
        else:
            continue
        restored.append(setting.name)
    return restored


class _Subprocess:
    """`subprocess` as `deep_gemm.jit.compiler` sees it: `run` and `check_call` pass through the
    adapter, which runs them unchanged; everything else is the module itself."""

    def __init__(self, real: Any, adapter: DeepGemmAdapter, switch: Switch) -> None:
        self._real = real
        self._adapter = adapter
        self._switch = switch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._adapter._call(self._real.run, self._switch, args, kwargs)

    def check_call(self, *args: Any, **kwargs: Any) -> Any:
        return self._adapter._call(self._real.check_call, self._switch, args, kwargs)


class DeepGemmAdapter(Adapter):
    """The adapter for DeepGEMM's Python JIT; see the module docstring."""

    runtime = RUNTIME
    module = MODULE
    observer = OBSERVER

    def __init__(self) -> None:
        super().__init__(label="deepgemm adapter", hits=HitBuffer(limit=4096, age_ns=60e9))
        self._local = threading.local()
        self._states: StateCache | None = None

    # ---------------------------------------------------------------- installing

    def _install(self, switch: Switch) -> None:
        restore_compiler_settings(os.environ)
        super()._install(switch)

    def _replacements(self, switch: Switch) -> list[tuple[object, str, object]]:
        compiler = importlib.import_module(MODULE)
        runtime = importlib.import_module("deep_gemm.jit.runtime")
        replacements: list[tuple[object, str, object]] = []
        base = getattr(compiler, "Compiler", None)
        own = vars(base).get("build") if base is not None else None
        if isinstance(own, classmethod):
            replacements.append((base, "build",
                                 classmethod(self._wrap_build(own.__func__, switch))))
        # Both, nested: the innermost build that looked a path up records it (a6d97a1 has only
        # the function; 8dfa329's function hands over to the classmethod).
        replacements.append((compiler, "build", self._wrap_build(compiler.build, switch)))
        cache_class = runtime.RuntimeCache
        for name in ("get", "__getitem__"):
            if name in vars(cache_class):
                replacements.append((cache_class, name,
                                     self._wrap_lookup(vars(cache_class)[name], switch)))
        replacements.append((compiler, "subprocess",
                             _Subprocess(compiler.subprocess, self, switch)))
        return replacements

    def _builds(self) -> list[_Build]:
        stack = getattr(self._local, "builds", None)
        if stack is None:
            stack = self._local.builds = []
        return stack

    def _after_fork_in_child(self) -> None:
        self._local = threading.local()

    # ---------------------------------------------------------------- the wrappers

    def _wrap_build(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        adapter = self

        def build(*args: Any, **kwargs: Any) -> Any:
            if not switch.on:
                return original(*args, **kwargs)
            state = _Build()
            stack = adapter._builds()
            stack.append(state)
            try:
                result = original(*args, **kwargs)
            except BaseException:
                stack.pop()
                adapter._finish(state, failed=True)
                raise
            stack.pop()
            adapter._finish(state, failed=False)
            return result

        build.__wrapped__ = original  # type: ignore[attr-defined]
        return build

    def _wrap_lookup(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        adapter = self

        def lookup(cache: Any, path: str, *args: Any, **kwargs: Any) -> Any:
            stack = adapter._builds() if switch.on else None
            state = stack[-1] if stack else None
            if state is None or state.path is not None:
                # Not the build's first lookup: the load right after its compile.
                return original(cache, path, *args, **kwargs)
            try:
                in_memory = path in cache.cache
            except Exception:  # noqa: BLE001 - a RuntimeCache we do not know
                in_memory = False
            result = original(cache, path, *args, **kwargs)
            state.path = path
            state.lookup = ("memory-hit" if in_memory else "disk-hit" if result is not None
                            else "miss")
            return result

        lookup.__wrapped__ = original  # type: ignore[attr-defined]
        return lookup

    def _call(self, call: Callable[..., Any], switch: Switch, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
        """A `subprocess` call of the runtime: nvcc's compile observed, anything else as is."""
        from cacheaudit.shim import is_query

        stack = self._builds() if switch.on else None
        argv = args[0] if args else kwargs.get("args")
        if (not stack or not isinstance(argv, (list, tuple)) or len(argv) < 2
                or is_query([str(token) for token in argv[1:]])):
            return call(*args, **kwargs)
        observed = self._start([str(token) for token in argv], kwargs)
        started = time.perf_counter()
        returncode: int | None = None
        try:
            result = call(*args, **kwargs)
            returncode = getattr(result, "returncode", result if isinstance(result, int) else 0)
            return result
        except Exception as exc:
            returncode = getattr(exc, "returncode", None)
            raise
        finally:
            if observed is not None:
                observed.returncode = returncode
                observed.duration_ns = int((time.perf_counter() - started) * 1e9)
                if observed.output is not None:
                    observed.output_state = self._capture(observed.output)
                stack[-1].compiles.append(observed)

    # ---------------------------------------------------------------- recording

    def _capture(self, path: str) -> FileState | None:
        try:
            if self._states is None:
                from cacheaudit.digest import StateCache

                self._states = StateCache()
            return self._states.capture(path)
        except Exception as exc:  # noqa: BLE001
            self._report("capture", exc)
            return None

    def _start(self, argv: list[str], kwargs: Mapping[str, Any]) -> _Compile | None:
        """The shim's recorder for this nvcc run, its `-M` pass and the compiler's identity
        started on a thread beside the compile. None when there is nothing to record."""
        try:
            from cacheaudit.recorder import ShimRecorder, disabled
            from cacheaudit.shim import compiler_env

            given = kwargs.get("env")
            env = {str(k): str(v) for k, v in (given if given is not None
                                                else os.environ).items()}
            if disabled(env):
                return None
            recorder = ShimRecorder.prepare("nvcc", argv[0], argv[1:], env)
            if recorder is None:
                return None
            workdir = scratch.make_directory("deepgemm")
            started_ns = time.time_ns()
            recorder.started_ns = started_ns

            def start() -> None:
                try:
                    recorder.start(compiler_env(env), started_ns, workdir)
                except Exception as exc:  # noqa: BLE001 - evidence, never a failure
                    recorder.notes.append(f"recording setup failed: {type(exc).__name__}: {exc}")

            thread = threading.Thread(target=start, name="cacheaudit-deepgemm-M", daemon=True)
            thread.start()
            return _Compile(recorder, _output_of(argv), workdir, thread)
        except Exception as exc:  # noqa: BLE001 - the compile must run regardless
            self._report("compile", exc)
            return None

    def _finish(self, state: _Build, *, failed: bool) -> None:
        try:
            if state.path is None:
                return
            if state.compiles or (state.lookup == "miss" and not failed):
                records = [self._compile_record(state, observed) for observed in state.compiles]
                if not state.compiles:
                    records.append(self._nvrtc_record(state))
                self._write_with_hits([r for r in records if r is not None])
            elif state.lookup in ("memory-hit", "disk-hit"):
                assert self._hits is not None
                now = time.time_ns()
                due = self._hits.note((state.lookup, state.path, id(state.environ)), now,
                                      lambda: _Lookup(state.lookup or "", state.path or "",
                                                      now, state.environ))
                if due:
                    self._write_with_hits(())
        except Exception as exc:  # noqa: BLE001 - fail open
            self._report("build", exc)
        finally:
            for observed in state.compiles:
                if observed.recorder.dependency_pass is not None:
                    observed.recorder.dependency_pass.kill()
                shutil.rmtree(observed.workdir, ignore_errors=True)

    def _complete(self, record: CompileRecord, state: _Build,
                  env: Mapping[str, str]) -> CompileRecord:
        """A record with what only the runtime knows: its entry, key, binary and process."""
        import dataclasses

        from cacheaudit.processes import runtime_process
        from cacheaudit.switches import RUN_VARIABLE

        assert state.path is not None
        name, key = entry_parts(state.path)
        binary = self._capture(_binary(state.path))
        process = None
        if env.get(RUN_VARIABLE):
            pid, ticks = runtime_process(os.getpid())
            process = f"{socket.gethostname()}:{pid}:{ticks}"
        return dataclasses.replace(
            record, runtime=RUNTIME, kernel=name, key=key, entry=state.path,
            outputs=(binary,) if binary is not None and binary.exists else (),
            observer=OBSERVER, runtime_process=process, pid=os.getpid())

    def _compile_record(self, state: _Build, observed: _Compile
                        ) -> tuple[CompileRecord, Mapping[str, str]] | None:
        recorder = observed.recorder
        observed.thread.join(_JOIN_TIMEOUT_S)
        if observed.thread.is_alive():
            recorder.notes.append("the compiler's identity or -M pass did not start in time")
        code = observed.returncode
        record = recorder.build(code if code is not None else -1, observed.duration_ns)
        record = self._complete(record, state, recorder.env)
        written = observed.output_state
        extra: dict[str, Any] = {}
        if written is not None and written.exists:
            final = record.outputs[0].digest if record.outputs else None
            extra = {"nvcc_output": {"path": written.path, "digest": written.digest,
                                     "size": written.size},
                     "rewritten_after_compile": final is not None and final != written.digest}
        import dataclasses

        record = dataclasses.replace(record, extra={**record.extra, **extra})
        kept, _ = environ_text(state.environ)
        return record, kept

    def _nvrtc_record(self, state: _Build) -> tuple[CompileRecord, Mapping[str, str]] | None:
        from cacheaudit.model import CompileRecord
        from cacheaudit.recorder import new_record_id, test_id_from

        kept, compile_env = environ_text(state.environ)
        record = CompileRecord(
            record_id=new_record_id(), event="compile", started_ns=state.started_ns,
            env=compile_env, host=socket.gethostname(), test_id=test_id_from(kept),
            duration_ns=time.time_ns() - state.started_ns, exit_code=0,
            notes=("compiled without a compiler process (DG_JIT_USE_NVRTC=1: NVRTC in-process); "
                   "no argv or include graph observed",))
        return self._complete(record, state, kept), kept

    def _records(self, hits: list[Any], observed: Sequence[Any]
                 ) -> Iterator[tuple[CompileRecord, Mapping[str, str]]]:
        from cacheaudit.model import CompileRecord
        from cacheaudit.recorder import new_record_id, test_id_from

        yield from observed
        for hit in hits:
            kept, compile_env = environ_text(hit.environ)
            name, key = entry_parts(hit.path)
            binary = self._capture(_binary(hit.path)) if hit.event == "disk-hit" else None
            yield CompileRecord(
                record_id=new_record_id(), event=hit.event, started_ns=hit.ns,
                runtime=RUNTIME, kernel=name, key=key, entry=hit.path, env=compile_env,
                outputs=(binary,) if binary is not None and binary.exists else (),
                pid=os.getpid(), host=socket.gethostname(), test_id=test_id_from(kept),
                observer=OBSERVER, extra={"hits": hit.count} if hit.count > 1 else {}), kept


ADAPTER = DeepGemmAdapter()
