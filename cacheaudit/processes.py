"""Processes on this host: who asked for a compile, and whether it still runs.

A JIT runtime's in-memory caches live exactly as long as its process, so "is the process that
compiled this still running?" is the question behind in-memory staleness (CA106).
"""

from __future__ import annotations

import os
import socket

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
    a shell. Its start time tells a live process from a reused pid later (CA106).
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


def run_process_alive(run_uuid: str | None) -> int | None:
    """The pid behind a shim run id (`host:pid:start-ticks`) when that same process still runs on
    this host, else None. The start time tells a live process from a reused pid."""
    if not run_uuid or run_uuid.count(":") != 2:
        return None
    host, pid_text, ticks = run_uuid.split(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return None
    stat = process_stat(int(pid_text))
    return int(pid_text) if stat is not None and stat[2] == ticks else None
