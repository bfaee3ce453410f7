"""NVRTC through `cuda.bindings.nvrtc`: every compile recorded with the headers NVRTC opened.

NVRTC keeps no cache and computes no key: callers build their own caches around it (cuda.core's
program cache, CuPy, numba-cuda, DeepGEMM's NVRTC mode). What this adapter adds is the evidence
NVRTC does not give: it has no dependency output at all (`-M`, `-MD`, `--dependency-output` ...
are all `NVRTC_ERROR_INVALID_OPTION`), and its automatic precompiled headers (`--pch`) are
served again inside one process after the headers behind them changed.

How, from cuda-bindings' `nvrtc.pyx` (NVIDIA/cuda-python, `cuda_bindings/cuda/bindings/`) and
measurements with NVRTC 13.0.88 (docs/runtimes/nvrtc.md lists them):

- `nvrtcCreateProgram(src, name, numHeaders, headers, includeNames)` -> `(err, prog)`: the
  wrapper remembers the source, the name and the in-memory headers per program handle
  (`int(prog)`, the `nvrtcProgram*` value that `nvrtcProgram.__hash__`/`__eq__` also use).
- `nvrtcCompileProgram(prog, numOptions, options)` -> `(err,)`: the wrapper appends
  `--fdevice-time-trace=<private temp path>`. NVRTC then writes `<path>.json`, a Chrome trace
  whose "Processing Header File" events name every header it opened (nested and unused ones
  too) as it resolved them: absolute for `-I` hits, relative to the process's working directory
  for quoted includes found beside a program name without a directory, the bare include name
  for an in-memory header (which wins over any file of that name). The option leaves the cubin,
  PTX and LTO-IR byte-identical. A trace file that already exists makes ptxas fail ("Parsed
  trace file not in expected format"), so every compile gets a fresh name (`trace.TraceFiles`).
- Where the option would change what NVRTC does, it is not added and a shadow pass takes the
  graph instead (a second program with the same source, name and headers, compiled with
  `--fdevice-syntax-only`, the PCH options removed, and the trace: `trace.trace_pass`, which
  cuda.core's header fingerprint runs too): NVRTC refuses a PCH whose creating command line
  differs from the current one in the presence of `--fdevice-time-trace`, so compiles with
  explicit PCH files, and automatic-PCH compiles while this process holds a PCH made without
  the trace, keep their command line (`pch.PchBook.trace_refusal`; pch.py tells what a record
  says of the PCH a compile created or reused).
- A compile that fails where the trace option can be the cause (NVRTC refuses the option or
  cannot write the trace, or the log names the trace: ptxas fails on a trace file that exists
  already) is run again exactly as the caller asked, and that result is returned: the option
  never turns a success into a failure. Any other failure (an error in the source) is returned
  as it is, without a second compile.
- After a successful compile the adapter reads the log, the PCH status and the outputs through
  the getters (`nvrtcGetProgramLog`, `nvrtcGetPCHCreateStatus`, `nvrtcGetCUBIN`, `nvrtcGetPTX`,
  `nvrtcGetLTOIR`, `nvrtcGetOptiXIR`), which return copies and change nothing for the caller.

In-memory files get synthetic paths under `<memory>/`: the program source (`<memory>/<name>`),
each in-memory header (`<memory>/<include name>`), and the outputs (`<memory>/<name>.cubin`,
`.ptx`, `.ltoir`, `.optixir`). Their `FileState`s carry the real size and xxh3-128 of the bytes,
with `mtime_ns`, `ctime_ns` and `inode` 0 (there is no file) and `settled` True (a Python bytes
object cannot change). NVRTC's builtin header (`__nv_nvrtc_builtin_header.h`) comes from
`libnvrtc-builtins.so`, and is recorded as that library file; the compiler identity is the
libnvrtc loaded into the process (library.py).

Reach: the functions are replaced as attributes of `cuda.bindings.nvrtc`, which catches Python
callers that look them up on the module at call time (`nvrtc.nvrtcCompileProgram(...)`, as
numba-cuda and most scripts do). Code that ran `from cuda.bindings.nvrtc import
nvrtcCompileProgram` before installation keeps the original, and Cython callers (cuda.core's
`Program`, which `cimport`s `cynvrtc`) never pass through Python attributes at all; CuPy uses its
own bindings.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cacheaudit.adapter import Adapter, Switch, memory_path, memory_state
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    GraphFile,
    IncludeGraph,
)
from cacheaudit.runtimes.nvrtc.library import builtins_library, nvrtc_identity
from cacheaudit.runtimes.nvrtc.pch import PchBook, pch_event
from cacheaudit.runtimes.nvrtc.trace import (
    BUILTIN_HEADER,
    NVRTC_TRACE_OPTIONS,
    TraceFiles,
    has_option,
    option_value,
    read_trace,
    result_code,
    result_name,
    trace_pass,
    trace_path_resolver,
)

__all__ = [
    "ADAPTER",
    "BUILTIN_HEADER",
    "NvrtcAdapter",
    "has_option",
    "memory_state",
    "option_value",
]

# MEMORY_PREFIX (cacheaudit.model) names what NVRTC reads or writes in memory: sources,
# in-memory headers, outputs.

TRACE_METHOD = "nvrtc --fdevice-time-trace"
CALLER_TRACE_METHOD = "nvrtc --fdevice-time-trace (the caller's own)"
SHADOW_METHOD = "nvrtc --fdevice-syntax-only --fdevice-time-trace (shadow pass)"
OBSERVER = "adapter:nvrtc"


_PATCHED = ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcDestroyProgram")
_GETTERS = ("nvrtcGetProgramLogSize", "nvrtcGetProgramLog", "nvrtcGetPCHCreateStatus",
            "nvrtcVersion", "nvrtcGetCUBINSize", "nvrtcGetCUBIN", "nvrtcGetPTXSize",
            "nvrtcGetPTX", "nvrtcGetLTOIRSize", "nvrtcGetLTOIR", "nvrtcGetOptiXIRSize",
            "nvrtcGetOptiXIR")
_OUTPUTS = (("cubin", "nvrtcGetCUBINSize", "nvrtcGetCUBIN"),
            ("ptx", "nvrtcGetPTXSize", "nvrtcGetPTX"),
            ("ltoir", "nvrtcGetLTOIRSize", "nvrtcGetLTOIR"),
            ("optixir", "nvrtcGetOptiXIRSize", "nvrtcGetOptiXIR"))

# nvrtcResult values (cuda.bindings.nvrtc.nvrtcResult, an int enum).
_SUCCESS = 0
_INVALID_OPTION = 5
_INTERNAL_ERROR = 11
_TIME_TRACE_FILE_WRITE_FAILED = 17
_TRACE_CODES = frozenset({_INVALID_OPTION, _INTERNAL_ERROR, _TIME_TRACE_FILE_WRITE_FAILED})
"""Failures the trace option itself can cause, whatever the log says: an NVRTC that does not
know the option, a trace it cannot write, an internal error."""
_TRACE_TROUBLE = re.compile(rb"trace file|time[- ]trace|time profiler", re.IGNORECASE)
"""A log naming the trace (ptxas: "Parsed trace file not in expected format", when a trace file
of that name exists already)."""

_PROGRAM_LIMIT = 4096


# ------------------------------------------------------------------------------ pure helpers


def _bind(args: tuple[Any, ...], kwargs: Mapping[str, Any],
          names: Sequence[str]) -> dict[str, Any] | None:
    """The call's arguments by parameter name, as the Cython signature binds them; None when
    the call does not fit (the original then raises its own error)."""
    if len(args) > len(names) or any(k not in names for k in kwargs):
        return None
    bound = dict(zip(names, args, strict=False))
    for key, value in kwargs.items():
        if key in bound:
            return None
        bound[key] = value
    return bound


def _handle(prog: Any) -> int | None:
    """The program handle's value: what `nvrtcCompileProgram` hands to NVRTC."""
    if prog is None or isinstance(prog, bool):
        return None
    try:
        return int(prog)
    except (TypeError, ValueError):
        return None


def _decode(raw: bytes | bytearray) -> str:
    return bytes(raw).decode("utf-8", "surrogateescape")


# ------------------------------------------------------------------------------ state


@dataclass(frozen=True)
class _Program:
    """What `nvrtcCreateProgram` was given: NVRTC reads these, never a file, for the source."""

    source: bytes
    raw_name: bytes | bytearray
    name: str
    headers: tuple[tuple[str, bytes], ...]


@dataclass
class _Plan:
    """One compile as the wrapper prepared it."""

    prog: Any
    raw_options: list[bytes]
    options: list[str]
    program: _Program | None
    cwd: str
    trace_option: bytes | None = None
    trace_file: str | None = None
    own_trace: bool = False
    method: str = ""
    shadow: bool = False
    skipped: str | None = None
    inflight: int | None = None
    notes: list[str] = field(default_factory=list)


class NvrtcAdapter(Adapter):
    """Installs wrappers around `cuda.bindings.nvrtc`'s program functions; see the module doc.
    Installing is a no-op while ours run, also under another tool's wrapper (it calls through
    ours: wrapping again would record every compile twice)."""

    runtime = "nvrtc"
    module = "cuda.bindings.nvrtc"
    observer = OBSERVER

    def __init__(self) -> None:
        super().__init__()
        self._module: Any = None
        self._originals: dict[str, Any] = {}
        self._getters: dict[str, Any] = {}
        self._programs: dict[int, _Program] = {}
        self._cache: Any = None
        self._identity: CompilerIdentity | None = None
        self._builtins: str | None = None
        self._traces = TraceFiles(purpose="nvrtc")
        self._pch = PchBook()

    # -------------------------------------------------------------------------- install

    def _replacements(self, switch: Switch) -> list[tuple[object, str, object]]:
        """The three program functions; the originals (the very objects found now, which
        uninstall puts back) and the getters are kept for the wrappers and the shadow pass."""
        module = importlib.import_module(self.module)
        originals = {name: getattr(module, name) for name in _PATCHED}
        self._getters = {name: getattr(module, name, None) for name in _GETTERS}
        self._module, self._originals = module, originals
        return [(module, "nvrtcCreateProgram",
                 self._wrap_create(originals["nvrtcCreateProgram"], switch)),
                (module, "nvrtcCompileProgram",
                 self._wrap_compile(originals["nvrtcCompileProgram"], switch)),
                (module, "nvrtcDestroyProgram",
                 self._wrap_destroy(originals["nvrtcDestroyProgram"], switch))]

    def _uninstalled(self) -> None:
        self._module = None
        self._originals = {}
        self._programs.clear()

    def _after_fork_in_child(self) -> None:
        self._pch.after_fork()

    # -------------------------------------------------------------------------- wrappers

    def _wrap_create(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def nvrtcCreateProgram(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if switch.on:
                try:
                    self._on_create(args, kwargs, result)
                except Exception as exc:  # noqa: BLE001 - fail open
                    self._problem(f"{type(exc).__name__}: {exc}")
            return result

        return nvrtcCreateProgram

    def _wrap_compile(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def nvrtcCompileProgram(*args: Any, **kwargs: Any) -> Any:
            if not switch.on:
                return original(*args, **kwargs)
            try:
                plan = self._plan(args, kwargs)
            except Exception as exc:  # noqa: BLE001 - fail open: compile as asked
                self._problem(f"{type(exc).__name__}: {exc}")
                plan = None
            if plan is None:
                return original(*args, **kwargs)
            try:
                return self._compile(original, plan, args, kwargs)
            finally:
                if plan.own_trace and plan.trace_file:
                    with contextlib.suppress(OSError):
                        os.unlink(plan.trace_file)
                self._pch.traced_compile_ended(plan.inflight)

        return nvrtcCompileProgram

    def _compile(self, original: Callable[..., Any], plan: _Plan, args: tuple[Any, ...],
                 kwargs: Mapping[str, Any]) -> Any:
        """Compile with the trace option; on a failure the option could have caused, compile
        again exactly as the caller asked. Then record, whatever happens."""
        started_ns = time.time_ns()
        clock = time.perf_counter_ns()
        result = None
        if plan.trace_option is not None:
            try:
                result = original(plan.prog, len(plan.raw_options) + 1,
                                  [*plan.raw_options, plan.trace_option])
            except Exception as exc:  # noqa: BLE001 - the caller's own call decides below
                plan.notes.append(f"the compile with the trace option raised "
                                  f"{type(exc).__name__}: {exc}; compiled as asked instead")
                result = None
            code = result_code(result) if result is not None else None
            if result is not None and code != _SUCCESS and self._trace_failed(plan, code):
                plan.notes.append(f"the compile failed with the trace option "
                                  f"({result_name(code)}); compiled again as asked, and that "
                                  "result is the one returned")
                result = None
            if result is None:
                plan.trace_option = None
                plan.skipped = "the compile failed with the trace option"
                plan.shadow = True
        if result is None:
            result = original(*args, **kwargs)
        duration_ns = time.perf_counter_ns() - clock
        try:
            self._after(plan, result, started_ns, duration_ns)
        except Exception as exc:  # noqa: BLE001 - fail open
            self._problem(f"{type(exc).__name__}: {exc}")
        return result

    def _trace_failed(self, plan: _Plan, code: int | None) -> bool:
        """Whether a failure of the compile with the trace option may come from the option. An
        ordinary failure (an error in the source) is returned as it is: compiling it again
        without the option would only double its latency."""
        if code is None or code in _TRACE_CODES:
            return True
        log = self._log(plan.prog)
        path = plan.trace_option.partition(b"=")[2] if plan.trace_option else b""
        return bool(_TRACE_TROUBLE.search(log)) or bool(path and path in log)

    def _wrap_destroy(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def nvrtcDestroyProgram(*args: Any, **kwargs: Any) -> Any:
            if not switch.on:
                return original(*args, **kwargs)
            key = None
            with contextlib.suppress(Exception):
                bound = _bind(args, kwargs, ("prog",))
                prog = bound.get("prog") if bound else None
                # An int here is a pointer to a handle, not a handle: leave those alone.
                if prog is not None and not isinstance(prog, int):
                    key = int(prog)
            result = original(*args, **kwargs)
            if key is not None:
                self._programs.pop(key, None)
            return result

        return nvrtcDestroyProgram

    # -------------------------------------------------------------------------- create

    def _on_create(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], result: Any) -> None:
        if result_code(result) != _SUCCESS or len(result) < 2:
            return
        bound = _bind(args, kwargs, ("src", "name", "numHeaders", "headers", "includeNames"))
        key = _handle(result[1])
        if bound is None or key is None:
            return
        count = int(bound.get("numHeaders") or 0)
        contents = list(bound.get("headers") or [])[:count]
        names = list(bound.get("includeNames") or [])[:count]
        raw_name = bound.get("name") or b""
        program = _Program(source=bytes(bound["src"]), raw_name=raw_name,
                           name=_decode(raw_name) or "default_program",
                           headers=tuple((_decode(n), bytes(c))
                                         for n, c in zip(names, contents, strict=True)))
        with self._lock:
            self._programs.pop(key, None)
            self._programs[key] = program
            while len(self._programs) > _PROGRAM_LIMIT:
                self._programs.pop(next(iter(self._programs)))

    # -------------------------------------------------------------------------- compile

    def _plan(self, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> _Plan | None:
        """How to run this compile: with our trace, with the caller's, or with a shadow pass.
        None when the call is not one NVRTC would accept (the original reports it)."""
        bound = _bind(args, kwargs, ("prog", "numOptions", "options"))
        if bound is None or "prog" not in bound or "numOptions" not in bound:
            return None
        prog, count = bound["prog"], bound["numOptions"]
        options = bound.get("options")
        options = [] if options is None else options
        if (prog is None or isinstance(count, bool) or not isinstance(count, int) or count < 0
                or not isinstance(options, (list, tuple)) or count > len(options)
                or not all(isinstance(o, bytes) for o in options)):
            return None
        key = _handle(prog)
        raw = list(options[:count])
        texts = [_decode(o) for o in raw]
        plan = _Plan(prog=prog, raw_options=raw, options=texts,
                     program=self._programs.get(key) if key is not None else None,
                     cwd=os.getcwd())
        caller_trace = option_value(texts, NVRTC_TRACE_OPTIONS)
        if caller_trace is not None:
            plan.method = CALLER_TRACE_METHOD
            if caller_trace:
                plan.trace_file = os.path.join(plan.cwd, caller_trace + ".json")
            else:
                plan.skipped = "the caller's --fdevice-time-trace names no file"
            return plan
        refusal = self._pch.trace_refusal(texts, plan.cwd)
        if refusal is not None:
            plan.shadow = True
            plan.skipped = refusal
            return plan
        try:
            path = self._new_trace_path()
        except OSError as exc:
            plan.skipped = f"no private directory for the trace: {exc}"
            return plan
        plan.trace_option = b"--fdevice-time-trace=" + os.fsencode(path)
        plan.trace_file = path + ".json"
        plan.own_trace = True
        plan.method = TRACE_METHOD
        plan.inflight = self._pch.traced_compile_started(texts)
        return plan

    def _new_trace_path(self) -> str:
        with self._lock:
            return self._traces.new_path()

    # -------------------------------------------------------------------------- after

    def _after(self, plan: _Plan, result: Any, started_ns: int, duration_ns: int) -> None:
        from cacheaudit.digest import StateCache
        from cacheaudit.ledger import new_record_id

        if self._cache is None:
            self._cache = StateCache()
        code = result_code(result)
        ok = code == _SUCCESS
        record_id = new_record_id()
        notes = list(plan.notes)
        extra: dict[str, Any] = {"trace": {"added": plan.trace_option is not None}}
        if plan.skipped:
            extra["trace"]["skipped"] = plan.skipped
        log = self._log(plan.prog)
        if not ok:
            notes.append(f"NVRTC returned {result_name(code)}: "
                         f"{log.decode('utf-8', 'replace').strip()[:1000]}")
        program = plan.program
        if program is None:
            notes.append("the program was created before cacheaudit was installed: its source "
                         "and in-memory headers are unknown")
        else:
            extra["program"] = {"name": program.name,
                                "memory_headers": [n for n, _ in program.headers]}

        details: list[str] | None = None
        problem: str | None = None
        method = plan.method
        if plan.trace_file is not None and (plan.trace_option is not None or not plan.own_trace):
            details, problem = read_trace(plan.trace_file)
        elif plan.shadow:
            if ok:
                details, problem = self._shadow(plan)
                method = SHADOW_METHOD
                if problem and plan.skipped:
                    problem = f"{plan.skipped}; {problem}"
        else:
            problem = plan.skipped or "no trace was taken"
        graph_files = self._graph_files(details, plan) if details is not None else None

        traced = plan.trace_option is not None
        pch = pch_event(plan.options, plan.cwd, log, ok, lambda: self._pch_create_status(plan),
                        traced, details)
        outputs = self._outputs(plan) if ok else []
        if pch is not None:
            extra["pch"] = pch
            if pch["event"] == "created" and pch.get("file") and os.path.exists(pch["file"]):
                outputs.append(self._cache.capture(pch["file"]))
            if pch["event"] == "reused":
                memory = dict(program.headers) if program is not None else {}
                self._pch.reuse(pch, memory, traced, graph_files, self._cache.capture)
                if graph_files is not None and pch.get("file"):
                    graph_files.append(GraphFile(self._cache.capture(pch["file"]), pch["file"]))
        graph = IncludeGraph(files=tuple(graph_files), method=method) \
            if graph_files is not None else None
        extra["trace"]["method"] = method if graph is not None else None
        graph_problem = (problem or "no trace was taken") if graph is None else None
        if pch is not None and pch["event"] == "created" and ok:
            self._pch.remember_creation(pch, record_id, program.name if program is not None
                                        else "", graph, plan.options, plan.cwd, traced)

        sources = (memory_state(program.name, program.source),) if program is not None else ()
        modified: tuple[str, ...] = ()
        if graph is not None:
            from cacheaudit.recorder import modified_since

            late = modified_since([f.state for f in graph.files], started_ns)
            modified = tuple(s.path for s in late)
        record = CompileRecord(
            record_id=record_id, event="compile", started_ns=started_ns, runtime=self.runtime,
            kernel=program.name if program is not None else None,
            compiler=self._compiler(), argv=tuple(plan.options),
            effective_argv=tuple(ArgToken(t) for t in plan.options), cwd=plan.cwd,
            sources=sources, graph=graph, outputs=tuple(outputs), exit_code=code,
            duration_ns=duration_ns, notes=tuple(notes), extra=extra,
            modified_during_compile=modified, graph_problem=graph_problem)
        self._write(record)

    def _write(self, record: CompileRecord) -> None:
        # Built here rather than through `recorder.record_event`: the PCH bookkeeping needs the
        # record id before the record is written.
        from cacheaudit.recorder import store_in_process

        problem = store_in_process(record, observer=OBSERVER)
        if problem:
            self._problem(problem)

    def _log(self, prog: Any) -> bytes:
        size_fn = self._getters.get("nvrtcGetProgramLogSize")
        get_fn = self._getters.get("nvrtcGetProgramLog")
        if size_fn is None or get_fn is None:
            return b""
        with contextlib.suppress(Exception):
            sized = size_fn(prog)
            if result_code(sized) == _SUCCESS and sized[1]:
                # A bytearray: NVRTC writes into the buffer, and `b" " * 1` is a shared object.
                buffer = bytearray(sized[1])
                if result_code(get_fn(prog, buffer)) == _SUCCESS:
                    return bytes(buffer).rstrip(b"\0")
        return b""

    def _outputs(self, plan: _Plan) -> list[FileState]:
        """The compile's outputs as the getters hand them out (PTX with its trailing NUL)."""
        name = plan.program.name if plan.program is not None else "default_program"
        states = []
        for kind, size_name, get_name in _OUTPUTS:
            size_fn, get_fn = self._getters.get(size_name), self._getters.get(get_name)
            if size_fn is None or get_fn is None:
                continue
            try:
                sized = size_fn(plan.prog)
                if (result_code(sized) != _SUCCESS or not sized[1]
                        or (kind == "ptx" and sized[1] <= 1)):
                    continue
                buffer = bytearray(sized[1])
                if result_code(get_fn(plan.prog, buffer)) != _SUCCESS:
                    continue
            except Exception:  # noqa: BLE001 - an output NVRTC cannot give is not recorded
                continue
            states.append(memory_state(f"{name}.{kind}", bytes(buffer)))
        return states

    def _shadow(self, plan: _Plan) -> tuple[list[str] | None, str | None]:
        """The headers the compile reads, from the trace pass over a second program
        (`trace.trace_pass`, with the originals): no PCH, no file of the caller's written,
        nothing shared with the real program."""
        program = plan.program
        if program is None:
            return None, ("the program was created before cacheaudit was installed, so no "
                          "shadow pass can be run")
        try:
            path = self._new_trace_path()
        except OSError as exc:
            return None, f"no private directory for the trace: {exc}"
        try:
            traced = trace_pass(program.source, program.raw_name, plan.raw_options, path,
                                program.headers, {**self._getters, **self._originals})
        except Exception as exc:  # noqa: BLE001 - a shadow pass is evidence, never a failure
            return None, f"the shadow pass failed: {type(exc).__name__}: {exc}"
        if not traced.ok:
            return None, f"the shadow pass failed: {result_name(traced.code)}"
        return traced.headers, traced.problem

    def _graph_files(self, details: Sequence[str], plan: _Plan) -> list[GraphFile]:
        """Trace entries to file states: in-memory headers by include name (they win over any
        file of that name), the builtin header as libnvrtc-builtins, every other path resolved
        against the working directory of the compile, as NVRTC opened it."""
        memory = dict(plan.program.headers) if plan.program is not None else {}
        files: list[GraphFile] = []
        seen: set[str] = set()
        resolve = trace_path_resolver(plan.cwd)
        for written in details:
            if written in memory:
                state = memory_state(written, memory[written])
            elif written == BUILTIN_HEADER:
                library = self._builtins_library()
                state = (self._cache.capture(library) if library else FileState.missing(
                    memory_path(written), error="libnvrtc-builtins is not mapped in this process"))
            else:
                state = self._cache.capture(resolve(written))
            if state.path not in seen:
                seen.add(state.path)
                files.append(GraphFile(state=state, written=written))
        return files

    def _pch_create_status(self, plan: _Plan) -> int | None:
        """nvrtcGetPCHCreateStatus of the compile's program; None when it cannot be asked."""
        getter = self._getters.get("nvrtcGetPCHCreateStatus")
        if getter is not None:
            with contextlib.suppress(Exception):
                return result_code(getter(plan.prog))
        return None

    # -------------------------------------------------------------------------- identity

    def _compiler(self) -> CompilerIdentity:
        """libnvrtc as loaded into this process (`library.nvrtc_identity`), kept once known."""
        if self._identity is not None:
            return self._identity
        identity = nvrtc_identity(self._getters.get("nvrtcVersion"))
        if identity.path and not identity.error:
            self._identity = identity
        return identity

    def _builtins_library(self) -> str | None:
        if self._builtins is None:
            self._builtins = builtins_library()
        return self._builtins


ADAPTER = NvrtcAdapter()
