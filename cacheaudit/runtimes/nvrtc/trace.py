"""NVRTC's one window on the headers a compile reads: the `--fdevice-time-trace` pass.

NVRTC writes no dependency list (`-M` and its relatives are all `NVRTC_ERROR_INVALID_OPTION`).
Given `--fdevice-time-trace=<path>` it writes `<path>.json`, a Chrome trace whose "Processing
Header File" events name every header it opened, nested and unused ones too, as it resolved them
(docs/runtimes/nvrtc.md). This module holds what every reader of that trace needs:

- the option names (`NVRTC_TRACE_OPTIONS`, the PCH options), `option_value` and `has_option` to
  read them, and `nvrtc_shadow_options`: the caller's options for a pass of one's own, without
  what would replace the header reads (a PCH) or write the caller's files (`--time`, the
  caller's own trace);
- `device_time_trace_headers` and `read_trace`: the headers a trace lists (`BUILTIN_HEADER`
  first in every fresh front-end pass), and `trace_path_resolver` to resolve them;
  `TraceFiles`: fresh names for trace files, in a private directory of the process's own;
- `trace_pass`: the pass itself. A second program with the same source, name and in-memory
  headers, compiled front end only (`--fdevice-syntax-only`: every header opened, no code made)
  with the trace, then destroyed. The NVRTC adapter runs it where adding the trace to the
  caller's compile would change what NVRTC does (a shadow pass); cuda.core's header fingerprint
  runs it to learn what to digest.

Only the standard library is imported; `trace_pass` imports `cuda.bindings.nvrtc` when it is not
handed the functions to call.
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cacheaudit.graph import DepfileError

__all__ = [
    "BUILTIN_HEADER",
    "NVRTC_PCH_AUTO",
    "NVRTC_PCH_CREATE",
    "NVRTC_PCH_DIR",
    "NVRTC_PCH_USE",
    "NVRTC_SYNTAX_ONLY",
    "NVRTC_TRACE_OPTIONS",
    "NvrtcUnavailable",
    "TraceFiles",
    "TracePass",
    "device_time_trace_headers",
    "has_option",
    "nvrtc_shadow_options",
    "option_value",
    "read_trace",
    "result_code",
    "result_name",
    "trace_pass",
    "trace_path_resolver",
    "unwrapped",
]

NVRTC_TRACE_OPTIONS = ("--fdevice-time-trace", "-fdevice-time-trace")
NVRTC_SYNTAX_ONLY = ("--fdevice-syntax-only", "-fdevice-syntax-only")
NVRTC_PCH_AUTO = ("--pch", "-pch")
NVRTC_PCH_CREATE = ("--create-pch", "-create-pch")
NVRTC_PCH_USE = ("--use-pch", "-use-pch")
NVRTC_PCH_DIR = ("--pch-dir", "-pch-dir")
_NVRTC_PCH_VALUED = (*NVRTC_PCH_CREATE, *NVRTC_PCH_USE, *NVRTC_PCH_DIR, "--pch-verbose",
                     "-pch-verbose", "--pch-messages", "-pch-messages",
                     "--instantiate-templates-in-pch", "-instantiate-templates-in-pch")
_NVRTC_WRITES_FILES = ("--time", "-time", *NVRTC_TRACE_OPTIONS)
"""Options whose value is a file NVRTC writes: a shadow pass must not write the caller's."""

BUILTIN_HEADER = "__nv_nvrtc_builtin_header.h"
"""The header NVRTC reads first in every fresh front-end pass, served by libnvrtc-builtins: a
trace without it is of a compile that reused a PCH."""

_SUCCESS = 0
_PASS_FUNCTIONS = ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcDestroyProgram",
                   "nvrtcGetProgramLogSize", "nvrtcGetProgramLog")


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


def nvrtc_shadow_options(options: Sequence[bytes]) -> list[bytes]:
    """The caller's NVRTC options for a pass of one's own: no PCH use or creation (a PCH would
    replace the header reads), no file written."""
    kept = []
    for option in options:
        head = option.partition(b"=")[0].decode("utf-8", "surrogateescape")
        if head in NVRTC_PCH_AUTO or head in _NVRTC_PCH_VALUED or head in _NVRTC_WRITES_FILES:
            continue
        kept.append(option)
    return kept


def device_time_trace_headers(text: str) -> list[str]:
    """Every header NVRTC opened, from its `--fdevice-time-trace` Chrome-trace JSON: the
    "Processing Header File" events, each with the resolved path in `args.detail`, in the order
    NVRTC finished them (post-order), each path once."""
    from cacheaudit import bounded

    try:
        data = bounded.loads(text)
    except bounded.Refused as exc:
        raise DepfileError(f"not an NVRTC device time trace: {exc}") from exc
    events = data.get("traceEvents", data) if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise DepfileError("not an NVRTC device time trace: no event list")
    seen: dict[str, None] = {}
    for event in events:
        if isinstance(event, dict) and event.get("name") == "Processing Header File":
            args = event.get("args")
            detail = args.get("detail") if isinstance(args, dict) else None
            if isinstance(detail, str) and detail:
                seen.setdefault(detail, None)
    return list(seen)


def read_trace(path: str) -> tuple[list[str] | None, str | None]:
    """(the headers the trace file at `path` lists, None) or (None, why there are none)."""
    try:
        with open(path, encoding="utf-8", errors="surrogateescape") as handle:
            return device_time_trace_headers(handle.read()), None
    except FileNotFoundError:
        return None, f"NVRTC wrote no trace at {path}"
    except (OSError, DepfileError) as exc:
        return None, f"the trace {path} is unreadable: {exc}"


def trace_path_resolver(cwd: str) -> Callable[[str], str]:
    """`os.path.realpath` of the paths a trace names, relative ones against `cwd` (the compile's
    working directory), with each
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


class TraceFiles:
    """Fresh paths for `--fdevice-time-trace=<path>` (NVRTC writes `<path>.json`) in a private
    directory, made on first use, again in a forked child, and removed at exit by the process
    that made it. A trace file that exists already makes ptxas fail ("Parsed trace file not in
    expected format"), so no name is handed out twice. Not locked: callers serialise."""

    def __init__(self, purpose: str) -> None:
        self._purpose = purpose
        self._directory: str | None = None
        self._pid = 0
        self._counter = itertools.count()

    def new_path(self) -> str:
        """A path whose `.json` does not exist. Raises OSError when no directory can be made."""
        from cacheaudit import scratch

        if self._directory is None or self._pid != os.getpid():
            self._directory = scratch.make_directory(self._purpose)
            self._pid = os.getpid()
            atexit.register(_remove_own_directory, self._directory, self._pid)
        while True:
            path = os.path.join(self._directory, f"trace-{next(self._counter)}")
            # ptxas parses an existing trace file and fails on one it did not write.
            if not os.path.lexists(path + ".json"):
                return path


def result_code(result: Any) -> int | None:
    """The nvrtcResult of a binding's return tuple as an int, None when it has no such shape."""
    try:
        return int(result[0])
    except (TypeError, ValueError, IndexError):
        return None


def result_name(code: int | None) -> str:
    try:
        from cuda.bindings import nvrtc

        return str(nvrtc.nvrtcResult(code).name)
    except Exception:  # noqa: BLE001 - a name is a nicety
        return f"nvrtcResult {code}"


def unwrapped(function: Any) -> Any:
    """The function under any `functools.wraps` wrappers: cacheaudit's own NVRTC adapter must not
    record a private pass as one of the program's compiles."""
    seen = 0
    while hasattr(function, "__wrapped__") and seen < 16:
        function = function.__wrapped__
        seen += 1
    return function


class NvrtcUnavailable(Exception):
    """NVRTC cannot run here: `cuda.bindings.nvrtc` does not import, libnvrtc does not load, or
    NVRTC creates no program."""


@dataclass(frozen=True)
class TracePass:
    """What one trace pass found."""

    headers: list[str] | None
    """Every header NVRTC opened, as it reported them; None when no readable trace was written."""
    code: int | None
    """The pass's nvrtcResult (0: success)."""
    log: str = ""
    """NVRTC's log, read when the pass failed."""
    problem: str | None = None
    """Why `headers` is None."""
    written: bool = False
    """Whether NVRTC wrote a trace file at all (a trace it wrote may still be unreadable)."""

    @property
    def ok(self) -> bool:
        return self.code == _SUCCESS


def _nvrtc_functions() -> dict[str, Callable[..., Any]]:
    try:
        from cuda.bindings import nvrtc
    except Exception as exc:  # any import failure means: no NVRTC here
        raise NvrtcUnavailable(f"cuda.bindings.nvrtc cannot be imported: {exc}") from exc
    return {name: unwrapped(getattr(nvrtc, name)) for name in _PASS_FUNCTIONS}


def _log(functions: Mapping[str, Callable[..., Any] | None], program: Any) -> str:
    size_fn, get_fn = functions.get("nvrtcGetProgramLogSize"), functions.get("nvrtcGetProgramLog")
    if size_fn is None or get_fn is None:
        return ""
    with contextlib.suppress(Exception):
        _err, size = size_fn(program)
        # A bytearray: NVRTC writes into the buffer, and `b" " * 1` is a shared object.
        buffer = bytearray(size)
        get_fn(program, buffer)
        return bytes(buffer).rstrip(b"\0 ").decode("utf-8", "replace")
    return ""


def trace_pass(source: bytes, name: bytes | bytearray, options: Sequence[bytes],
               trace_path: str, headers: Sequence[tuple[str, bytes]] = (),
               functions: Mapping[str, Callable[..., Any] | None] | None = None) -> TracePass:
    """Compile `source` as program `name` with the in-memory `headers` ((include name, content)
    pairs), front end only, with NVRTC's trace written to `trace_path` + ".json", and read the
    headers it lists. The options are the caller's, less what `nvrtc_shadow_options` drops and
    any syntax-only flag of theirs (the pass adds its own).

    `functions` are the NVRTC entry points to call, by name (the adapter hands in the originals
    it replaced); by default those of `cuda.bindings.nvrtc`, unwrapped. Raises NvrtcUnavailable
    when NVRTC cannot run or creates no program; a compile that fails is a result (its trace
    may still list the headers its front end opened). The trace file is removed."""
    functions = _nvrtc_functions() if functions is None else functions
    create, compile_, destroy = (functions[n] for n in _PASS_FUNCTIONS[:3])
    flags = [o for o in nvrtc_shadow_options(options)
             if o.partition(b"=")[0].decode("utf-8", "surrogateescape") not in NVRTC_SYNTAX_ONLY]
    flags += [b"--fdevice-syntax-only", b"--fdevice-time-trace=" + os.fsencode(trace_path)]
    try:
        created = create(source, name, len(headers), [content for _, content in headers],
                         [n.encode("utf-8", "surrogateescape") for n, _ in headers])
    except Exception as exc:  # libnvrtc missing surfaces here
        raise NvrtcUnavailable(f"NVRTC cannot be loaded: {type(exc).__name__}: {exc}") from exc
    if result_code(created) != _SUCCESS:
        raise NvrtcUnavailable(f"nvrtcCreateProgram failed: {created[0]}")
    program = created[1]
    trace_file = trace_path + ".json"
    try:
        try:
            code = result_code(compile_(program, len(flags), flags))
            log = _log(functions, program) if code != _SUCCESS else ""
        finally:
            with contextlib.suppress(Exception):
                destroy(program)
        written = os.path.lexists(trace_file)
        found, problem = read_trace(trace_file)
        return TracePass(headers=found, code=code, log=log, problem=problem, written=written)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(trace_file)
