"""NVRTC's precompiled headers, as the NVRTC adapter's records see them.

NVRTC makes and uses PCHs two ways (measured with NVRTC 13.0.88, docs/runtimes/nvrtc.md):

- automatic (`--pch`): NVRTC keeps the PCHs it made in a per-process registry (files in `--pch-dir`,
  else in its `__nvrtc_auto_pch_<pid>_<n>` directories under TMPDIR) and uses one again for a
  later program with the same header prefix and command line, without looking at the headers
  again: an edit of a header, in memory or on disk, goes unseen in that process (CA106);
- explicit (`--create-pch=<file>`, `--use-pch=<file>`): the file outlives the process.

Either way NVRTC refuses a PCH whose creating command line differs from the current one in the
presence of `--fdevice-time-trace` (warning #629-D, then a fresh compile). So the adapter must not
add its trace to a compile with explicit PCH options, nor to an automatic-PCH compile while this
process holds a PCH made without the trace (before installation, or by a Cython caller): a shadow
pass takes the graph instead (`PchBook.trace_refusal`). A PCH that appears while a compile with
the trace runs may be that compile's own: it is not counted as made without the trace.

What a record carries (`extra["pch"]`, `pch_event`): "created" or "reused", the file, and how that
was told (NVRTC's log, `nvrtcGetPCHCreateStatus`, or a trace that opened no header). A creation
is remembered with the header states its compile recorded (`PchBook.remember_creation`); a reuse
is tied to it (`PchBook.reuse`): the states now of the headers the PCH stands for, and which of
them changed: those the creating compile opened and this compile's own trace did not, when
this compile was traced and its PCH file is known ("exact"); else every header the creating
compile opened ("assumed").
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cacheaudit.adapter import memory_path, memory_state
from cacheaudit.model import MEMORY_PREFIX, FileState, GraphFile, IncludeGraph
from cacheaudit.processes import start_ns
from cacheaudit.runtimes.nvrtc.trace import (
    BUILTIN_HEADER,
    NVRTC_PCH_AUTO,
    NVRTC_PCH_CREATE,
    NVRTC_PCH_DIR,
    NVRTC_PCH_USE,
    has_option,
    option_value,
)

__all__ = ["PchBook", "PchCreation", "pch_dirs", "pch_event", "pch_path"]

_CREATED = re.compile(rb'creating precompiled header file "([^"\n]+)"')
_USED = re.compile(rb'using precompiled header file "([^"\n]+)"')

# nvrtcResult values (cuda.bindings.nvrtc.nvrtcResult, an int enum).
_SUCCESS = 0
_NO_PCH_CREATE_ATTEMPTED = 13


def pch_path(raw: bytes, cwd: str) -> str:
    """A PCH file as NVRTC named it (relative ones against the compile's working directory),
    realpath'd."""
    return os.path.realpath(os.path.join(cwd, os.fsdecode(raw)))


def pch_dirs(options: Sequence[str], cwd: str) -> list[str]:
    """Where this process's automatic PCHs go: `--pch-dir`, else NVRTC's per-process
    `__nvrtc_auto_pch_<pid>_<n>` directories in TMPDIR (or /tmp)."""
    explicit = option_value(options, NVRTC_PCH_DIR)
    if explicit:
        return [os.path.realpath(os.path.join(cwd, explicit))]
    # Probed by name rather than by listing TMPDIR, which may hold thousands of entries.
    roots = {os.environ.get("TMPDIR") or "/tmp", "/tmp"}
    return [path for root in sorted(roots) for n in range(4)
            if os.path.isdir(path := os.path.join(root, f"__nvrtc_auto_pch_{os.getpid()}_{n}"))]


def pch_event(options: Sequence[str], cwd: str, log: bytes, ok: bool,
              create_status: Callable[[], int | None], traced: bool,
              details: Sequence[str] | None) -> dict[str, Any] | None:
    """What a compile with `options` did with a PCH: from NVRTC's `log` ("creating"/"using
    precompiled header file"), else from nvrtcGetPCHCreateStatus (`create_status`, asked only
    then) and the trace (`details`; a compile that reuses a PCH opens no header, not even the
    builtin one), which tells only when it is the adapter's own (`traced`). None when the
    compile uses no PCH option or nothing can be told."""
    auto = has_option(options, NVRTC_PCH_AUTO)
    explicit_create = option_value(options, NVRTC_PCH_CREATE)
    explicit_use = option_value(options, NVRTC_PCH_USE)
    if not (auto or explicit_create or explicit_use):
        return None
    used, created = _USED.search(log), _CREATED.search(log)
    if used:
        return {"event": "reused", "file": pch_path(used.group(1), cwd),
                "how": "NVRTC's log: using precompiled header file"}
    if created:
        return {"event": "created", "file": pch_path(created.group(1), cwd),
                "how": "NVRTC's log: creating precompiled header file"}
    if not ok:
        return None
    status = create_status()
    if status == _SUCCESS:
        file = pch_path(os.fsencode(explicit_create), cwd) if explicit_create else None
        return {"event": "created", "file": file,
                "how": "nvrtcGetPCHCreateStatus: NVRTC_SUCCESS"}
    if (status == _NO_PCH_CREATE_ATTEMPTED and traced
            and details is not None and BUILTIN_HEADER not in details):
        file = pch_path(os.fsencode(explicit_use), cwd) if explicit_use else None
        return {"event": "reused", "file": file,
                "how": "no header opened by the front end (the trace) and no PCH created "
                       "(nvrtcGetPCHCreateStatus); NVRTC printed no PCH message"}
    return None


@dataclass(frozen=True)
class PchCreation:
    """A PCH this process's NVRTC made, with the header states its compile recorded."""

    record_id: str
    file: str | None
    kernel: str
    states: Mapping[str, FileState]
    traced: bool


class PchBook:
    """The PCH state of one process: the PCHs seen made (with their creating compiles), the
    automatic PCH made without the trace (sticky once found), and the compiles with the trace
    running now. One per adapter; a forked child takes a new lock (`after_fork`)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._known: set[str] = set()
        """Automatic PCHs whose creation this process has accounted for (ours, with the trace)."""
        self._created: dict[str, PchCreation] = {}
        self._last_creation: PchCreation | None = None
        self._foreign: str | None = None
        self._inflight: dict[int, int] = {}
        """The compiles with the trace and `--pch` running now, by token: when each started."""
        self._inflight_ids = itertools.count()
        self._start_ns: int | None = None

    def after_fork(self) -> None:
        # A lock held by another thread at fork() stays held forever in the child.
        self._lock = threading.RLock()

    # ------------------------------------------------------------------------ before a compile

    def trace_refusal(self, options: Sequence[str], cwd: str) -> str | None:
        """Why the trace option must not be added to a compile with `options` (a shadow pass
        takes the graph instead), or None."""
        if has_option(options, NVRTC_PCH_CREATE) or has_option(options, NVRTC_PCH_USE):
            return ("NVRTC compares a PCH's command line with the current one, "
                    "--fdevice-time-trace included, and PCH files outlive the process: "
                    "the trace is taken by a shadow pass instead")
        if has_option(options, NVRTC_PCH_AUTO):
            foreign = self.foreign_auto_pch(options, cwd)
            if foreign is not None:
                return (f"this process holds a PCH made without the trace ({foreign}): "
                        "adding it would make NVRTC refuse that PCH; the trace is taken "
                        "by a shadow pass instead")
        return None

    def traced_compile_started(self, options: Sequence[str]) -> int | None:
        """A compile with the trace starts: for an automatic-PCH one, a token for
        `traced_compile_ended`, so that a PCH that appears meanwhile is not taken for one made
        without the trace (it may be this compile's own)."""
        if not has_option(options, NVRTC_PCH_AUTO):
            return None
        with self._lock:
            token = next(self._inflight_ids)
            self._inflight[token] = time.time_ns()
        return token

    def traced_compile_ended(self, token: int | None) -> None:
        if token is not None:
            with self._lock:
                self._inflight.pop(token, None)

    def foreign_auto_pch(self, options: Sequence[str], cwd: str) -> str | None:
        """A PCH this process's NVRTC made without the trace option, if any (then sticky):
        every automatic PCH in NVRTC's in-process registry must see the same command line."""
        if self._foreign is not None:
            return self._foreign
        if self._start_ns is None:
            self._start_ns = start_ns(os.getpid()) or 0
        since = self._start_ns - 1_000_000_000
        with self._lock:
            until = min(self._inflight.values(), default=None)
        for directory in pch_dirs(options, cwd):
            with contextlib.suppress(OSError), os.scandir(directory) as entries:
                for entry in entries:
                    if not entry.name.endswith(".pch"):
                        continue
                    path = os.path.realpath(entry.path)
                    if path in self._known:
                        continue
                    with contextlib.suppress(OSError):
                        mtime = entry.stat().st_mtime_ns
                        if mtime >= since and (until is None or mtime < until):
                            self._foreign = path
                            return path
        return None

    # ------------------------------------------------------------------------ after a compile

    def remember_creation(self, pch: dict[str, Any], record_id: str, kernel: str,
                          graph: IncludeGraph | None, options: Sequence[str], cwd: str,
                          traced: bool) -> None:
        """A compile (record `record_id`) created the PCH of `pch` (its `pch_event`, whose
        missing file is filled in when the PCH directory tells it)."""
        file = pch.get("file")
        if file is None and traced:
            # No message: the new file in the PCH directory is the one NVRTC just wrote.
            fresh = []
            for directory in pch_dirs(options, cwd):
                with contextlib.suppress(OSError), os.scandir(directory) as entries:
                    fresh += [os.path.realpath(e.path) for e in entries
                              if e.name.endswith(".pch")
                              and os.path.realpath(e.path) not in self._known]
            self._known.update(fresh)
            if len(fresh) == 1:
                file = pch["file"] = fresh[0]
        creation = PchCreation(
            record_id=record_id, file=file, kernel=kernel,
            states={f.path: f.state for f in graph.files} if graph is not None else {},
            traced=traced)
        with self._lock:
            if file is not None:
                if traced and has_option(options, NVRTC_PCH_AUTO):
                    self._known.add(file)
                self._created[file] = creation
            self._last_creation = creation

    def reuse(self, pch: dict[str, Any], memory: Mapping[str, bytes], traced: bool,
              graph_files: list[GraphFile] | None, capture: Callable[[str], FileState]) -> None:
        """For a compile that reused the PCH of `pch` (its `pch_event`, completed here): the
        states now of the headers the PCH stands for, and which of them changed since the
        compile that created it recorded them. `memory`: the program's in-memory headers by
        include name; `graph_files`: what this compile's trace found; `capture`: a file's state
        now."""
        file = pch.get("file")
        creation = self._created.get(file) if file else None
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
        exact = traced and graph_files is not None and file is not None
        # Only this compile's own trace tells which headers it read itself, past the PCH.
        read_now = {f.path for f in graph_files or ()} if exact else set()
        pch["coverage"] = "exact" if exact else "assumed"
        pch["coverage_how"] = (
            "the headers the creating compile opened that this compile's own trace did not"
            if exact else "every header the creating compile opened (this compile's trace "
                          "cannot tell which of them the PCH holds)")
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
                now = capture(path)
            headers.append(now.to_dict())
            if not recorded.same_content(now):
                changed.append({"path": path, "recorded": recorded.digest,
                                "current": now.digest if now.exists else None})
        pch["headers"] = headers
        pch["changed"] = changed
