"""The processes cacheaudit starts for its own purposes, killed with it and bounded.

A dependency pass, a `--version` probe, a scan's reconstruction, a rebuild oracle's compile and
a ninja query are cacheaudit's children, not the user's: none may outlive the process that
started it, whatever ends that process (its own exit, an exception, Ctrl-C, SIGTERM, SIGKILL of
it alone or of its whole process group), and none may run or grow without limit.

How (docs/design.md, "Children die with their parent"):

- Each child leads a process group of its own (a new session, `start_new_session`), so that
  one `killpg` takes its grandchildren too (gcc's cc1plus, nvcc's gcc, cicc and ptxas), and so
  that a signal meant for the user's own processes (Ctrl-C at a terminal, a SIGKILL of the
  shim's group) never reaches it by accident; cacheaudit kills it instead.
- A watchdog per child, `/bin/sh` in a session of its own, holds the read end of a pipe whose
  write end only the parent holds. The kernel closes that end however the parent dies, so the
  watchdog's `read` returns, and it kills the child's whole group. When the child ended in
  order, the parent writes `done` first and the watchdog exits without killing anything.
- A child started from the main thread also has PR_SET_PDEATHSIG (SIGKILL), set before it
  execs: it dies with its parent even in the instant before its watchdog runs. The kernel sends
  it when the *thread* that started the child ends, so a child started from another thread (the
  oracle's pool, DeepGEMM's recording thread, which ends at once) has the watchdog alone.
- Limits, set in the child before exec and inherited by its own children: an address-space
  limit (RLIMIT_AS) and no core files. Time is each caller's deadline (`run`'s `timeout`, a
  dependency pass's `wait`), enforced by the parent; the watchdog covers a parent that died.
- From a large process (an in-process adapter inside torch: 230 MiB resident and up), what
  the child must do before it execs is done by util-linux's `prlimit` and `setpriv
  --pdeathsig`, and a shell line that checks the parent, exec'd one after the other, rather
  than by a Python function between fork and exec: Python can then vfork. A fork copies the
  page tables and leaves every page of the parent copy-on-write, and the parent pays a page
  fault for each page it writes afterwards, its own exit included (measured under torch: ~18
  ms for the fork of one `ninja -n` and ~37,000 faults, 100-250 ms; the three execs cost ~2
  ms). Where those programs are missing, or the program to run is not found first, the fork
  path is taken.

`kill_all` kills every child of this process now (a signal handler's business: the shim's on
SIGTERM, the command line's); `start` refuses to start more once it has run. Only cacheaudit's
own helpers come here: the user's compile (the shim's real compiler) and `cacheaudit run`'s
command stay in the user's process group with their usual semantics.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any

GIB = 1 << 30

PASS_ADDRESS_SPACE = 4 * GIB
"""A dependency pass (`-M`, the preprocessor only) or a probe. Measured: nvcc 13.0 `-M` over
the CUTLASS reference TU (fixtures/reference_tu.py) peaks at 175 MiB of address space (cc1plus;
125 MiB resident), nvcc itself at 33 MiB; 4 GiB is over 20 times that. A source that is
/dev/urandom grows cc1plus past 6 GB without this."""

COMPILE_ADDRESS_SPACE = 16 * GIB
"""A rebuild oracle's full compile. Measured: nvcc 13.0 compiling the CUTLASS reference TU to a
cubin peaks at 780 MiB of address space (cicc; 617 MiB resident) and passes under a 2 GiB
limit; 16 GiB leaves room for kernels many times larger."""

_PR_SET_PDEATHSIG = 1
LAUNCH_ABOVE_BYTES = 64 << 20
"""Resident size of this process above which a child is started through the launchers
(vfork) rather than forked; a small process (the shim) forks, which costs it less than three
execs."""
_PARENT_CHECK = '[ "$PPID" = "$0" ] || exit 137; exec "$@"'
"""Run after `setpriv --pdeathsig`: the parent died before the signal was armed (the child was
reparented), or the program runs with it armed."""
# `kill -9 -N` kills process group N; the guard keeps a bad N from ever meaning -1 (every
# process the user may signal) or 0 (the watchdog's own group).
_WATCHDOG = ('IFS= read -r said; [ "$said" = done ] || '
             '{ [ "$1" -gt 1 ] 2>/dev/null && kill -9 "-$1" 2>/dev/null; }')
_SHELL = "/bin/sh"


@dataclass(frozen=True)
class Limits:
    """What a child may use; None leaves that resource as the parent has it."""

    address_space: int | None = PASS_ADDRESS_SPACE
    """Bytes of virtual address space per process (RLIMIT_AS), inherited by its children. Time
    is bounded by the caller's deadline (wall-clock, which a hang on a FIFO also meets)."""


PASS_LIMITS = Limits()
COMPILE_LIMITS = Limits(address_space=COMPILE_ADDRESS_SPACE)


_prctl: Any = None
_prctl_loaded = False


def _load_prctl() -> None:
    """prctl(2) through ctypes, loaded in the parent before the first fork (and only then: the
    shim pays for ctypes only when it starts a child)."""
    global _prctl, _prctl_loaded
    if _prctl_loaded:
        return
    _prctl_loaded = True
    try:
        import ctypes

        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not glibc/musl Linux: the watchdog still works
        _prctl = None


@dataclass
class _Watched:
    process: subprocess.Popen[Any]
    watchdog: subprocess.Popen[bytes] | None
    write_end: int | None


class _Children:
    """This process's live children, by pid (= their process group)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.live: dict[int, _Watched] = {}
        self.stopping = False

    def forget_after_fork(self) -> None:
        # A forked copy of this process (multiprocessing) did not start these: it must neither
        # kill them nor keep their watchdogs' pipes open.
        for watched in self.live.values():
            if watched.write_end is not None:
                with contextlib.suppress(OSError):
                    os.close(watched.write_end)
        self.live = {}
        self.lock = threading.Lock()
        self.stopping = False


_children = _Children()
os.register_at_fork(after_in_child=_children.forget_after_fork)


def _prepare_child(parent: int, limits: Limits, death_signal: bool) -> None:
    """Runs in the child between fork and exec: only calls that cannot block or deadlock."""
    if death_signal and _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above took effect
            os._exit(137)
    _lower(resource.RLIMIT_CORE, 0)
    if limits.address_space is not None:
        _lower(resource.RLIMIT_AS, limits.address_space)


_launchers: tuple[str, str, str] | bool | None = False
"""(prlimit, setpriv, sh), found once; None where one is missing."""


def _find_launchers() -> tuple[str, str, str] | None:
    global _launchers
    if _launchers is False:
        import shutil

        found = tuple(shutil.which(name, path=os.defpath + ":/usr/sbin:/sbin")
                      for name in ("prlimit", "setpriv"))
        _launchers = (None if None in found or not os.access(_SHELL, os.X_OK)
                      else (str(found[0]), str(found[1]), _SHELL))
    return _launchers  # type: ignore[return-value]


def _resident_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as handle:
            return int(handle.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def _launched(argv: Sequence[str], env: Mapping[str, str], cwd: str | None, parent: int,
              limits: Limits, death_signal: bool) -> list[str] | None:
    """`argv` behind the launchers that do what `_prepare_child` does, for a large process (see
    the module's doc); None to fork instead: a small process, no launchers, or a program that
    is not found as an absolute path here (Popen then raises its own error for it)."""
    if _resident_bytes() <= LAUNCH_ABOVE_BYTES:
        return None
    launchers = _find_launchers()
    if launchers is None or not argv:
        return None
    prlimit, setpriv, shell = launchers
    program = str(argv[0])
    if os.sep in program:
        path: str | None = program if os.path.isabs(program) else None
    else:
        import shutil

        path = shutil.which(program, path=env.get("PATH", os.defpath))
    if (path is None or not os.path.isabs(path) or not os.path.isfile(path)
            or not os.access(path, os.X_OK)):
        return None
    if cwd is not None and not os.path.isdir(cwd):
        return None  # Popen raises about the directory
    line = [prlimit, "--core=0:0"]
    if limits.address_space is not None:
        value = _lowered(resource.RLIMIT_AS, limits.address_space)
        line.append(f"--as={value}:{value}")
    if death_signal:
        line += [setpriv, "--pdeathsig", "KILL", "--", shell, "-c", _PARENT_CHECK, str(parent)]
    return [*line, path, *(str(a) for a in argv[1:])]


def _lowered(which: int, value: int) -> int:
    """`value`, no higher than the limit inherited (`_lower`'s rule)."""
    _, current_hard = resource.getrlimit(which)
    return value if current_hard == resource.RLIM_INFINITY else min(value, current_hard)


def _lower(which: int, value: int) -> None:
    """Set a limit no higher than the one inherited (an unprivileged process cannot raise it)."""
    _, current_hard = resource.getrlimit(which)
    hard = value if current_hard == resource.RLIM_INFINITY else min(value, current_hard)
    soft = hard
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(which, (soft, hard))


def start(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None,
          stdin: int | IO[Any] | None = subprocess.DEVNULL,
          stdout: int | IO[Any] | None = None, stderr: int | IO[Any] | None = None,
          limits: Limits = PASS_LIMITS, text: bool = False) -> subprocess.Popen[Any]:
    """Start a child of cacheaudit's own: its own process group, watched, within `limits`.

    Raises what Popen raises (OSError for a program that cannot be run), and InterruptedError
    once `kill_all` has run. The caller ends it with `finish`, on every path (`finally`).
    """
    parent = os.getpid()
    death_signal = threading.current_thread() is threading.main_thread()
    launched = _launched(argv, env, cwd, parent, limits, death_signal)
    if launched is None:
        _load_prctl()
    with _children.lock:
        if _children.stopping:
            raise InterruptedError("cacheaudit is stopping: no new child processes")
        if launched is not None:
            # No preexec_fn: Python vforks (see the module's doc).
            process = subprocess.Popen(
                launched, cwd=cwd, env=dict(env), stdin=stdin, stdout=stdout, stderr=stderr,
                start_new_session=True, text=text)
        else:
            process = subprocess.Popen(
                list(argv), cwd=cwd, env=dict(env), stdin=stdin, stdout=stdout,
                stderr=stderr, start_new_session=True, text=text,
                preexec_fn=lambda: _prepare_child(parent, limits, death_signal))
        watched = _Watched(process, None, None)
        _children.live[process.pid] = watched
    watched.watchdog, watched.write_end = _watch(process.pid)
    return process


def _watch(group: int) -> tuple[subprocess.Popen[bytes] | None, int | None]:
    """The watchdog of `group`; (None, None) where none can start (PDEATHSIG still holds)."""
    if group <= 1:
        raise ValueError(f"not a child's process group: {group}")
    try:
        read_end, write_end = os.pipe()
    except OSError:
        return None, None
    try:
        watchdog = subprocess.Popen(
            [_SHELL, "-c", _WATCHDOG, "cacheaudit-watchdog", str(group)], stdin=read_end,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            env={"PATH": os.defpath})
    except (OSError, subprocess.SubprocessError):
        os.close(write_end)
        return None, None
    finally:
        os.close(read_end)
    return watchdog, write_end


def finish(process: subprocess.Popen[Any]) -> None:
    """Kill what is left of the child's group, reap the child, release its watchdog. Safe to
    call twice, and on a child that ended long ago."""
    with _children.lock:
        watched = _children.live.pop(process.pid, None)
    if process.returncode is None:
        # Not reaped yet: the group id cannot have been reused.
        kill_group(process.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)
    else:
        # Reaped: a group left behind (a daemonised grandchild) still holds the id, which the
        # kernel hands to no new process meanwhile.
        kill_group(process.pid)
    if watched is None:
        return
    if watched.write_end is not None:
        with contextlib.suppress(OSError):
            os.write(watched.write_end, b"done\n")
        with contextlib.suppress(OSError):
            os.close(watched.write_end)
        watched.write_end = None
    if watched.watchdog is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            watched.watchdog.wait(timeout=5)


def kill_group(group: int) -> None:
    """SIGKILL to process group `group`, a child's own (its pid): never 0 (our own group) or 1."""
    if group <= 1 or group == os.getpgrp():
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)


def kill_all() -> None:
    """Kill every live child's group now and start no more. Safe in a signal handler: no lock
    is waited for (the handler may interrupt a `start` holding it) and nothing is reaped."""
    _children.stopping = True
    for group in list(_children.live):
        kill_group(group)


def live() -> list[int]:
    """The pids (= process groups) of this process's children that `finish` has not ended."""
    return list(_children.live)


@dataclass(frozen=True)
class Completed:
    """What `run` saw: the exit status (negative: the signal), both streams, whether the
    deadline ended it."""

    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False


def run(argv: Sequence[str], *, timeout: float, env: Mapping[str, str], cwd: str | None = None,
        limits: Limits = PASS_LIMITS, merge_stderr: bool = False) -> Completed:
    """Run a child to its end or its deadline, its output captured (stdin: /dev/null). Raises
    OSError where it cannot start; a child past `timeout` is killed with its group and the
    result says so."""
    process = start(argv, env=env, cwd=cwd, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, limits=limits)
    try:
        try:
            out, err = process.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            kill_group(process.pid)
            timed_out = True
            try:
                out, err = process.communicate(timeout=5)
            except subprocess.TimeoutExpired:  # the pipes held open by a process that left
                out, err = b"", b""
    finally:
        finish(process)
    return Completed(process.returncode, out or b"", err or b"", timed_out)
