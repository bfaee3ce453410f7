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
  trace file not in expected format"), so every compile gets a fresh name.
- Where the option would change what NVRTC does, it is not added and a shadow pass takes the
  graph instead (a second program with the same source, name and headers, compiled with
  `--fdevice-syntax-only`, the PCH options removed, and the trace: `trace.trace_pass`, which
  cuda.core's header fingerprint runs too): NVRTC refuses a PCH whose
  creating command line differs from the current one in the presence of `--fdevice-time-trace`
  (warning #629-D, then a fresh compile), so explicit `--create-pch`/`--use-pch` files (they
  outlive the process) and automatic PCHs made in this process without the trace (before
  installation, or by Cython callers) must keep seeing the command line they were made with.
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
`libnvrtc-builtins.so`, and is recorded as that library file.

Reach: the functions are replaced as attributes of `cuda.bindings.nvrtc`, which catches Python
callers that look them up on the module at call time (`nvrtc.nvrtcCompileProgram(...)`, as
numba-cuda and most scripts do). Code that ran `from cuda.bindings.nvrtc import
nvrtcCompileProgram` before installation keeps the original, and Cython callers (cuda.core's
`Program`, which `cimport`s `cynvrtc`) never pass through Python attributes at all; CuPy uses its
own bindings.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import itertools
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cacheaudit.adapter import Adapter, Switch, memory_path, memory_state
from cacheaudit.model import (
    MEMORY_PREFIX,
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    GraphFile,
    IncludeGraph,
)
from cacheaudit.processes import start_ns
from cacheaudit.runtimes.nvrtc.trace import (
    NVRTC_PCH_AUTO,
    NVRTC_PCH_CREATE,
    NVRTC_PCH_DIR,
    NVRTC_PCH_USE,
    NVRTC_TRACE_OPTIONS,
    read_trace,
    result_code,
    result_name,
    trace_pass,
)

# MEMORY_PREFIX (cacheaudit.model) names what NVRTC reads or writes in memory: sources,
# in-memory headers, outputs.

BUILTIN_HEADER = "__nv_nvrtc_builtin_header.h"
"""The header NVRTC reads first in every fresh front-end pass, served by libnvrtc-builtins."""

TRACE_METHOD = "nvrtc --fdevice-time-trace"
CALLER_TRACE_METHOD = "nvrtc --fdevice-time-trace (the caller's own)"
SHADOW_METHOD = "nvrtc --fdevice-syntax-only --fdevice-time-trace (shadow pass)"
OBSERVER = "adapter:nvrtc"


_CREATED = re.compile(rb'creating precompiled header file "([^"\n]+)"')
_USED = re.compile(rb'using precompiled header file "([^"\n]+)"')
_LIBNVRTC = re.compile(r"^libnvrtc(\.alt)?\.so")
_LIBNVRTC_BUILTINS = re.compile(r"^libnvrtc-builtins(\.alt)?\.so")

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
_NO_PCH_CREATE_ATTEMPTED = 13
_TIME_TRACE_FILE_WRITE_FAILED = 17
_TRACE_CODES = frozenset({_INVALID_OPTION, _INTERNAL_ERROR, _TIME_TRACE_FILE_WRITE_FAILED})
"""Failures the trace option itself can cause, whatever the log says: an NVRTC that does not
know the option, a trace it cannot write, an internal error."""
_TRACE_TROUBLE = re.compile(rb"trace file|time[- ]trace|time profiler", re.IGNORECASE)
"""A log naming the trace (ptxas: "Parsed trace file not in expected format", when a trace file
of that name exists already)."""

_PROGRAM_LIMIT = 4096


# ------------------------------------------------------------------------------ pure helpers


def option_value(options: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last `name=value` option among `names`; "" for a bare `name`."""
    found: str | None = None
    for option in options:
        head, sep, value = option.partition("=")
        if head in names:
            found = value if sep else ""
    return found


def has_option(options: Sequence[str], names: Sequence[str]) -> bool:
    return option_value(options, names) is not None


def mapped_library(pattern: re.Pattern[str]) -> str | None:
    """The first file mapped into this process whose basename matches: the library really
    loaded, whichever of libnvrtc.so.13 and libnvrtc.alt.so.13 that is."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as handle:
            for line in handle:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].rstrip("\n")
                    if path.startswith("/") and pattern.match(os.path.basename(path)):
                        return path
    except OSError:
        return None
    return None


def _resolver(cwd: str) -> Callable[[str], str]:
    """`os.path.realpath` of paths NVRTC printed, relative ones against `cwd`, with each
    directory resolved once per compile: a trace of a thousand headers in a few dozen
    directories costs a thousand `lstat`s instead of ten thousand."""
    directories: dict[str, str] = {}

    def resolve(written: str) -> str:
        head, tail = os.path.split(os.path.join(cwd, written))
        real = directories.get(head)
        if real is None:
            real = directories[head] = os.path.realpath(head)
        path = os.path.join(real, tail)
        return os.path.realpath(path) if not tail or tail in (".", "..") \
            or os.path.islink(path) else path

    return resolve


def _remove_own_directory(path: str, pid: int) -> None:
    """At exit, the private trace directory goes, but only in the process that made it: a
    forked child inherits the handler and must not pull it from under its parent."""
    if os.getpid() == pid:
        import shutil

        shutil.rmtree(path, ignore_errors=True)


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


@dataclass(frozen=True)
class _PchCreation:
    """A PCH this process's NVRTC made, with the header states its compile recorded."""

    record_id: str
    file: str | None
    kernel: str
    states: Mapping[str, FileState]
    traced: bool


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
        self._trace_dir: str | None = None
        self._trace_pid = 0
        self._counter = itertools.count()
        self._known_pchs: set[str] = set()
        self._pch_created: dict[str, _PchCreation] = {}
        self._last_creation: _PchCreation | None = None
        self._foreign_pch: str | None = None
        self._inflight: dict[int, int] = {}
        self._inflight_ids = itertools.count()
        self._start_ns: int | None = None

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
                if plan.inflight is not None:
                    with self._lock:
                        self._inflight.pop(plan.inflight, None)

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
        if has_option(texts, NVRTC_PCH_CREATE) or has_option(texts, NVRTC_PCH_USE):
            plan.shadow = True
            plan.skipped = ("NVRTC compares a PCH's command line with the current one, "
                            "--fdevice-time-trace included, and PCH files outlive the process: "
                            "the trace is taken by a shadow pass instead")
            return plan
        if has_option(texts, NVRTC_PCH_AUTO):
            foreign = self._foreign_auto_pch(texts, plan.cwd)
            if foreign is not None:
                plan.shadow = True
                plan.skipped = (f"this process holds a PCH made without the trace ({foreign}): "
                                "adding it would make NVRTC refuse that PCH; the trace is taken "
                                "by a shadow pass instead")
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
        if has_option(texts, NVRTC_PCH_AUTO):
            # A PCH that appears while this compile runs may be its own: not foreign (yet).
            with self._lock:
                plan.inflight = next(self._inflight_ids)
                self._inflight[plan.inflight] = time.time_ns()
        return plan

    def _new_trace_path(self) -> str:
        import tempfile

        with self._lock:
            if self._trace_dir is None or self._trace_pid != os.getpid():
                self._trace_dir = tempfile.mkdtemp(prefix="cacheaudit-nvrtc-")
                self._trace_pid = os.getpid()
                atexit.register(_remove_own_directory, self._trace_dir, self._trace_pid)
            while True:
                path = os.path.join(self._trace_dir, f"trace-{next(self._counter)}")
                # ptxas parses an existing trace file and fails on one it did not write.
                if not os.path.lexists(path + ".json"):
                    return path

    def _pch_dirs(self, options: Sequence[str], cwd: str) -> list[str]:
        """Where this process's automatic PCHs go: `--pch-dir`, else NVRTC's per-process
        `__nvrtc_auto_pch_<pid>_<n>` directories in TMPDIR (or /tmp)."""
        explicit = option_value(options, NVRTC_PCH_DIR)
        if explicit:
            return [os.path.realpath(os.path.join(cwd, explicit))]
        # Probed by name rather than by listing TMPDIR, which may hold thousands of entries.
        roots = {os.environ.get("TMPDIR") or "/tmp", "/tmp"}
        return [path for root in sorted(roots) for n in range(4)
                if os.path.isdir(path := os.path.join(root, f"__nvrtc_auto_pch_{os.getpid()}_{n}"))]

    def _foreign_auto_pch(self, options: Sequence[str], cwd: str) -> str | None:
        """A PCH this process's NVRTC made without the trace option, if any (then sticky):
        every automatic PCH in NVRTC's in-process registry must see the same command line."""
        if self._foreign_pch is not None:
            return self._foreign_pch
        if self._start_ns is None:
            self._start_ns = start_ns(os.getpid()) or 0
        since = self._start_ns - 1_000_000_000
        with self._lock:
            until = min(self._inflight.values(), default=None)
        for directory in self._pch_dirs(options, cwd):
            with contextlib.suppress(OSError), os.scandir(directory) as entries:
                for entry in entries:
                    if not entry.name.endswith(".pch"):
                        continue
                    path = os.path.realpath(entry.path)
                    if path in self._known_pchs:
                        continue
                    with contextlib.suppress(OSError):
                        mtime = entry.stat().st_mtime_ns
                        if mtime >= since and (until is None or mtime < until):
                            self._foreign_pch = path
                            return path
        return None

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

        pch = self._pch_event(plan, log, ok, details)
        outputs = self._outputs(plan) if ok else []
        if pch is not None:
            extra["pch"] = pch
            if pch["event"] == "created" and pch.get("file") and os.path.exists(pch["file"]):
                outputs.append(self._cache.capture(pch["file"]))
            if pch["event"] == "reused":
                self._reuse(pch, plan, graph_files)
                if graph_files is not None and pch.get("file"):
                    graph_files.append(GraphFile(self._cache.capture(pch["file"]), pch["file"]))
        graph = IncludeGraph(files=tuple(graph_files), method=method) \
            if graph_files is not None else None
        extra["trace"]["method"] = method if graph is not None else None
        graph_problem = (problem or "no trace was taken") if graph is None else None
        if pch is not None and pch["event"] == "created" and ok:
            self._remember_creation(pch, record_id, program, graph, plan)

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
        resolve = _resolver(plan.cwd)
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

    # -------------------------------------------------------------------------- PCH

    def _pch_event(self, plan: _Plan, log: bytes, ok: bool,
                   details: Sequence[str] | None) -> dict[str, Any] | None:
        """What this compile did with a PCH: from NVRTC's log ("creating"/"using precompiled
        header file"), else from nvrtcGetPCHCreateStatus and the trace (a compile that reuses a
        PCH opens no header, not even the builtin one)."""
        options = plan.options
        auto = has_option(options, NVRTC_PCH_AUTO)
        explicit_create = option_value(options, NVRTC_PCH_CREATE)
        explicit_use = option_value(options, NVRTC_PCH_USE)
        if not (auto or explicit_create or explicit_use):
            return None
        used, created = _USED.search(log), _CREATED.search(log)
        if used:
            return {"event": "reused", "file": self._pch_path(used.group(1), plan.cwd),
                    "how": "NVRTC's log: using precompiled header file"}
        if created:
            return {"event": "created", "file": self._pch_path(created.group(1), plan.cwd),
                    "how": "NVRTC's log: creating precompiled header file"}
        if not ok:
            return None
        status = None
        getter = self._getters.get("nvrtcGetPCHCreateStatus")
        if getter is not None:
            with contextlib.suppress(Exception):
                status = result_code(getter(plan.prog))
        if status == _SUCCESS:
            file = self._pch_path(os.fsencode(explicit_create), plan.cwd) \
                if explicit_create else None
            return {"event": "created", "file": file,
                    "how": "nvrtcGetPCHCreateStatus: NVRTC_SUCCESS"}
        if (status == _NO_PCH_CREATE_ATTEMPTED and plan.trace_option is not None
                and details is not None and BUILTIN_HEADER not in details):
            file = self._pch_path(os.fsencode(explicit_use), plan.cwd) if explicit_use else None
            return {"event": "reused", "file": file,
                    "how": "no header opened by the front end (the trace) and no PCH created "
                           "(nvrtcGetPCHCreateStatus); NVRTC printed no PCH message"}
        return None

    @staticmethod
    def _pch_path(raw: bytes, cwd: str) -> str:
        return os.path.realpath(os.path.join(cwd, os.fsdecode(raw)))

    def _remember_creation(self, pch: dict[str, Any], record_id: str, program: _Program | None,
                           graph: IncludeGraph | None, plan: _Plan) -> None:
        file = pch.get("file")
        traced = plan.trace_option is not None
        if file is None and traced:
            # No message: the new file in the PCH directory is the one NVRTC just wrote.
            fresh = []
            for directory in self._pch_dirs(plan.options, plan.cwd):
                with contextlib.suppress(OSError), os.scandir(directory) as entries:
                    fresh += [os.path.realpath(e.path) for e in entries
                              if e.name.endswith(".pch")
                              and os.path.realpath(e.path) not in self._known_pchs]
            self._known_pchs.update(fresh)
            if len(fresh) == 1:
                file = pch["file"] = fresh[0]
        creation = _PchCreation(
            record_id=record_id, file=file,
            kernel=program.name if program is not None else "",
            states={f.path: f.state for f in graph.files} if graph is not None else {},
            traced=traced)
        with self._lock:
            if file is not None:
                if traced and has_option(plan.options, NVRTC_PCH_AUTO):
                    self._known_pchs.add(file)
                self._pch_created[file] = creation
            self._last_creation = creation

    def _reuse(self, pch: dict[str, Any], plan: _Plan,
               graph_files: list[GraphFile] | None) -> None:
        """For a compile that reused a PCH: the states now of the headers the PCH stands for,
        and which of them changed since the compile that created it recorded them."""
        file = pch.get("file")
        creation = self._pch_created.get(file) if file else None
        if creation is None and file is None:
            creation = self._last_creation
            if creation is not None:
                pch["file_assumed"] = creation.file
        if creation is None:
            pch["created_by"] = None
            pch["note"] = ("the compile that created this PCH was not observed (before "
                           "cacheaudit was installed, through a caller it cannot see, or in "
                           "another process)")
            return
        pch["created_by"] = creation.record_id
        exact = plan.trace_option is not None and graph_files is not None and file is not None
        # Only this compile's own trace tells which headers it read itself, past the PCH.
        read_now = {f.path for f in graph_files or ()} if exact else set()
        pch["coverage"] = "exact" if exact else "assumed"
        pch["coverage_how"] = (
            "the headers the creating compile opened that this compile's own trace did not"
            if exact else "every header the creating compile opened (this compile's trace "
                          "cannot tell which of them the PCH holds)")
        memory = dict(plan.program.headers) if plan.program is not None else {}
        headers, changed = [], []
        for path, recorded in creation.states.items():
            if path in read_now or (file is not None and path == file):
                continue
            if path.startswith(MEMORY_PREFIX):
                name = path[len(MEMORY_PREFIX):]
                content = memory.get(name)
                if content is None:
                    content = next((c for n, c in memory.items() if memory_path(n) == path),
                                   None)
                now = (memory_state(name, content) if content is not None
                       else FileState.missing(path, error="not among this program's headers"))
            else:
                now = self._cache.capture(path)
            headers.append(now.to_dict())
            if not recorded.same_content(now):
                changed.append({"path": path, "recorded": recorded.digest,
                                "current": now.digest if now.exists else None})
        pch["headers"] = headers
        pch["changed"] = changed

    # -------------------------------------------------------------------------- identity

    def _compiler(self) -> CompilerIdentity:
        """libnvrtc as loaded into this process: its path, content hash and nvrtcVersion."""
        if self._identity is not None:
            return self._identity
        from cacheaudit.digest import read_state

        error = None
        path = mapped_library(_LIBNVRTC)
        if path is None:
            try:
                from cuda.pathfinder import load_nvidia_dynamic_lib

                path = load_nvidia_dynamic_lib("nvrtc").abs_path
            except Exception as exc:  # noqa: BLE001 - identity is evidence, not a requirement
                error = f"libnvrtc not found: {type(exc).__name__}: {exc}"
        version = ""
        with contextlib.suppress(Exception):
            answer = self._getters["nvrtcVersion"]()
            if result_code(answer) == _SUCCESS:
                version = f"NVRTC {answer[1]}.{answer[2]} (nvrtcVersion)"
        resolved = os.path.realpath(path) if path else ""
        state = read_state(resolved) if resolved else None
        if state is not None and not state.readable:
            error = error or state.error or "libnvrtc is unreadable"
        identity = CompilerIdentity(
            invoked="libnvrtc", path=path or "", resolved=resolved, kind="nvrtc",
            version_text=version, digest=state.digest if state else None,
            size=state.size if state else -1, mtime_ns=state.mtime_ns if state else 0,
            error=error)
        if path is not None and not error:
            self._identity = identity
        return identity

    def _builtins_library(self) -> str | None:
        if self._builtins is None:
            found = mapped_library(_LIBNVRTC_BUILTINS)
            self._builtins = os.path.realpath(found) if found else None
        return self._builtins

ADAPTER = NvrtcAdapter()
