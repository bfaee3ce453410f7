"""Processes on this host: who asked for a compile, and whether it still runs.

A JIT runtime's in-memory caches live exactly as long as its process, so "is the process that
compiled this still running?" is the question behind in-memory staleness (CA106).
"""

from __future__ import annotations

import os
import time

from cacheaudit.ids import hostname

_SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "busybox"})


def process_stat(pid: int) -> tuple[str, int, str] | None:
    """(command name, parent pid, start time in clock ticks) of a process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: split around the last ')'.
    name = text[text.find("(") + 1:text.rfind(")")]
    fields = text.rsplit(")", 1)[1].split()
    try:
        return name, int(fields[1]), fields[19]
    except (IndexError, ValueError):
        return None


def runtime_process(start: int | None = None) -> tuple[int, str]:
    """(pid, start ticks) of the process that asked for the compile.

    Runtimes run the compiler through a shell (DeepJIT and DeepGEMM `popen("cd tmp && nvcc
    ...")`), so the shim's parent is usually `sh`: the runtime is the first ancestor that is not
    a shell. Its start time tells a live process from a reused pid later (CA106); the shim
    records both as `CompileRecord.runtime_process`.
    """
    pid = os.getppid() if start is None else start
    for _ in range(8):
        stat = process_stat(pid)
        if stat is None:
            return pid, "0"
        name, parent, ticks = stat
        if name not in _SHELLS or parent <= 1:
            return pid, ticks
        pid = parent
    stat = process_stat(pid)
    return pid, stat[2] if stat else "0"


def process_run(run_uuid: str | None) -> tuple[str, int, str] | None:
    """(host, pid, start ticks) of a run id that names one process, the bare shim's
    `host:pid:start-ticks` (recorder.current_run); None for a session's run id, which every
    process below the session shares."""
    parts = (run_uuid or "").split(":")
    if len(parts) != 3 or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1]), parts[2]


def run_process_alive(run_uuid: str | None) -> int | None:
    """The pid behind a shim run id when that same process still runs on this host, else None.
    The start time tells a live process from a reused pid."""
    run = process_run(run_uuid)
    if run is None or run[0] != hostname():
        return None
    _, pid, ticks = run
    stat = process_stat(pid)
    return pid if stat is not None and stat[2] == ticks else None


def alive_since(host: str, pid: int, started_ns: int) -> bool:
    """Whether process `pid` of `host` still runs and is the one that ran at `started_ns`.

    A pid taken over since belongs to a process started after the first one ended, which was
    after `started_ns`; the start time from /proc (clock ticks since boot) tells the two apart.
    """
    if host != hostname():
        return False
    began_ns = start_ns(pid)
    return began_ns is not None and began_ns <= started_ns


def start_ns(pid: int) -> int | None:
    """When process `pid` started, in time.time_ns() terms (to a clock tick), or None when it
    does not run or /proc does not say."""
    stat = process_stat(pid)
    if stat is None:
        return None
    try:
        ticks = int(stat[2])
    except ValueError:
        return None
    booted_ns = time.time_ns() - time.clock_gettime_ns(time.CLOCK_BOOTTIME)
    return booted_ns + ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")
