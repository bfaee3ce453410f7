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

A scan's forked workers (`ForkedMap`: copies of this process, no exec) follow the same rules
by other means: each leads a group of its own, has PR_SET_PDEATHSIG, leaves only through
`os._exit`, and is killed and reaped when its pool is closed, on every path.

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
from collections.abc import Callable, Iterator, Mapping, Sequence
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
        self.forked: set[int] = set()
        """Pids of the workers `ForkedMap` started and has not reaped."""
        self.pool_fds: set[int] = set()
        """This process's ends of the live `ForkedMap`s' pipes (and selectors), which a worker
        of another pool closes: a task pipe held open there would never end for its own."""
        self.stopping = False

    def forget_after_fork(self) -> None:
        # A forked copy of this process (multiprocessing) did not start these: it must neither
        # kill them nor keep their watchdogs' pipes open.
        for watched in self.live.values():
            if watched.write_end is not None:
                with contextlib.suppress(OSError):
                    os.close(watched.write_end)
        self.live = {}
        self.forked = set()
        self.pool_fds = set()
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
    for pid in list(_children.forked):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


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


# ------------------------------------------------------------------ forked workers


@dataclass(frozen=True)
class Failed:
    """A task `forked_map` did not deliver: its work raised (`why` names the error), or the
    worker that took it ended first. The caller does it in-process instead (fail open)."""

    why: str


_FRAME = "<IQ"
"""A worker's frame header: the task's index and its pickle's length (0: the worker took the
task, so that a worker that dies is known to leave it undone)."""
_TASK = "<I"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class ForkedMap:
    """`work(0)`, ..., `work(count - 1)`, run in up to `workers` forked copies of this process,
    their results read back in index order (`results`); a task that raised, or whose worker
    died, comes back as `Failed` (never retried here). Use it as a context manager: leaving
    it kills and reaps every worker still running.

    The workers follow this module's rules for children, adapted to a fork without an exec:
    each leads a process group of its own (Ctrl-C at a terminal reaches only this process,
    which then kills them), has PR_SET_PDEATHSIG (SIGKILL: the kernel kills it however this
    process dies; a fork needs no watchdog, since nothing execs in between), and `kill_all`
    takes them too. A worker that returns from `work` or fails leaves through `os._exit`,
    never into the caller's code. Tasks go out on one pipe (each worker takes the next index
    when it is free), results come back on a pipe per worker as pickles: nothing touches the
    disk. `poll` reads what has come back without waiting, so that a caller busy with other
    work keeps the workers' pipes from filling (a full pipe stops its worker).

    `work` runs in a copy of this process made at the fork: what it reads of the parent's
    state is the state at that moment, and what it changes there stays in the worker. It must
    not use what cannot cross a fork (an SQLite connection opened before it: open another)."""

    def __init__(self, work: Callable[[int], Any], count: int, workers: int) -> None:
        import gc
        import pickle
        import selectors
        import struct

        self._pickle, self._struct = pickle, struct
        self.count = max(count, 0)
        self._header = struct.calcsize(_FRAME)
        self._done: dict[int, Any] = {}
        self._delivered = 0
        """Results in (`Failed` ones too)."""
        self._started: dict[int, int] = {}
        """Worker pid -> the read end of its result pipe, while it is open."""
        self._taken: dict[int, set[int]] = {}
        self._buffers: dict[int, bytearray] = {}
        self._selector = selectors.DefaultSelector()
        self._events = selectors.EVENT_READ, selectors.EVENT_WRITE
        self._tasks_write = -1
        self._written = 0
        """Task indices written to the workers so far (`0 .. _written - 1`)."""
        self._claimed = 0
        if self.count == 0:
            return
        if _children.stopping:  # `kill_all` ran: no new processes, the caller works alone
            workers = 0
        _load_prctl()
        parent = os.getpid()
        tasks_read, self._tasks_write = os.pipe()
        _children.pool_fds.update((self._tasks_write, self._selector.fileno()))
        try:
            # Objects the workers never change are shared with them page for page; frozen,
            # the collector of neither side walks them (each walk would copy the pages).
            gc.freeze()
            try:
                for _ in range(min(workers, self.count)):
                    inherited = list(_children.pool_fds)  # this pool's and any other's
                    read_end, write_end = os.pipe()
                    try:
                        pid = os.fork()
                    except OSError:
                        os.close(read_end)
                        os.close(write_end)
                        break
                    if pid == 0:  # the worker: never returns from here
                        status = 70
                        try:
                            os.close(read_end)
                            for other in inherited:
                                with contextlib.suppress(OSError):
                                    os.close(other)
                            _become_worker(parent)
                            _serve(work, tasks_read, write_end, pickle, struct)
                            status = 0
                        finally:
                            os._exit(status)
                    os.close(write_end)
                    with contextlib.suppress(OSError):  # the worker sets it too: a race
                        os.setpgid(pid, pid)
                    self._started[pid] = read_end
                    _children.pool_fds.add(read_end)
                    self._taken[pid] = set()
                    self._buffers[pid] = bytearray()
                    _children.forked.add(pid)
                    self._selector.register(read_end, selectors.EVENT_READ, pid)
            finally:
                gc.unfreeze()
        finally:
            os.close(tasks_read)
        self._feed()

    def __enter__(self) -> ForkedMap:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill and reap every worker still running; close the pipes."""
        self._close_tasks()
        for pid, read_end in list(self._started.items()):
            self._forget(pid, read_end, kill=True)
        if self._selector.get_map() is not None:
            _children.pool_fds.discard(self._selector.fileno())
            self._selector.close()

    def poll(self) -> bool:
        """Read what the workers have sent without waiting; whether every result is in."""
        while self._started and self._pump(0):
            pass
        return not self._started or self._delivered >= self.count

    def stop(self) -> list[int]:
        """Hand out no more tasks: the indices no worker was given, for the caller to do
        elsewhere (those given are done as before). A task is given to the workers only when
        one is free to take it, so that most of the work can still be shared out."""
        self.poll()
        undone = list(range(self._written, self.count))
        self.count = self._written
        self._close_tasks()
        return undone

    def get(self, index: int, meanwhile: Callable[[], object] | None = None) -> Any:
        """Task `index`'s result (or `Failed`), waiting for it; while waiting, `meanwhile` is
        called every few milliseconds (another pool's `poll`)."""
        while index not in self._done:
            if not self._started:  # every worker has ended: what none delivered is undone
                return Failed("no worker delivered it")
            self._pump(None if meanwhile is None else 0.005)
            if meanwhile is not None:
                meanwhile()
        return self._done.pop(index)

    def results(self, meanwhile: Callable[[], object] | None = None) -> Iterator[Any]:
        """Every task's result (or `Failed`), in index order, waiting for each in turn."""
        index = 0
        while index < self.count:
            yield self.get(index, meanwhile)
            index += 1

    def _pump(self, timeout: float | None) -> bool:
        """One round of the selector: frames read, then tasks given. Whether any was ready."""
        ready = self._selector.select(timeout)
        for key, _events in ready:
            self._read(key.data, key.fd)
        self._feed()
        return bool(ready)

    def _feed(self) -> None:
        """Keep one task waiting in the pipe for the next free worker (and no more: what is
        not given yet can still go elsewhere, `stop`); end the pipe after the last."""
        if self._tasks_write < 0:
            return
        if self._written < self.count and self._written - self._claimed < 1:
            # 4 bytes into a pipe holding at most 4 more: never blocks, always whole.
            os.write(self._tasks_write, self._struct.pack(_TASK, self._written))
            self._written += 1
        if self._written >= self.count:
            self._close_tasks()

    def _close_tasks(self) -> None:
        if self._tasks_write >= 0:
            os.close(self._tasks_write)
            _children.pool_fds.discard(self._tasks_write)
            self._tasks_write = -1

    def _read(self, pid: int, fd: int) -> None:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            status = self._forget(pid, fd, kill=False)
            for index in self._taken.pop(pid, ()):
                self._done[index] = Failed(f"the worker that took it ended ({status})")
                self._delivered += 1
            return
        buffer = self._buffers[pid]
        buffer += chunk
        header, struct = self._header, self._struct
        while len(buffer) >= header:
            index, size = struct.unpack_from(_FRAME, buffer)
            if size == 0:
                self._taken[pid].add(index)
                self._claimed += 1
                del buffer[:header]
                continue
            if len(buffer) < header + size:
                break
            ok, value = self._pickle.loads(buffer[header:header + size])
            del buffer[:header + size]
            self._taken[pid].discard(index)
            self._done[index] = value if ok else Failed(value)
            self._delivered += 1

    def _forget(self, pid: int, fd: int, kill: bool) -> str:
        with contextlib.suppress(KeyError, ValueError):
            self._selector.unregister(fd)
        with contextlib.suppress(OSError):
            os.close(fd)
        _children.pool_fds.discard(fd)
        self._started.pop(pid, None)
        return _end_worker(pid, kill=kill)


def forked_map(work: Callable[[int], Any], count: int, workers: int) -> Iterator[Any]:
    """`ForkedMap(work, count, workers)`'s results in index order, as a generator: close it
    (`contextlib.closing`) on every path, which kills and reaps the workers still running."""
    with ForkedMap(work, count, workers) as pool:
        yield from pool.results()


def _become_worker(parent: int) -> None:
    """A forked worker's first steps: its own group, death with its parent, default signals."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the line above took effect
        os._exit(137)
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    # The parent's handlers (the command line's SIGTERM) are the parent's business.
    for which in (signal.SIGINT, signal.SIGTERM):
        signal.signal(which, signal.SIG_DFL)
    _lower(resource.RLIMIT_CORE, 0)


def _serve(work: Callable[[int], Any], tasks: int, out: int, pickle: Any, struct: Any) -> None:
    """Take task indices until none is left; write each one's result back, pickled."""
    task_size = struct.calcsize(_TASK)
    while True:
        taken = os.read(tasks, task_size)
        if len(taken) != task_size:  # end of the tasks (writes and reads of 4 bytes are atomic)
            return
        (index,) = struct.unpack(_TASK, taken)
        _write_all(out, struct.pack(_FRAME, index, 0))
        try:
            payload = pickle.dumps((True, work(index)), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001 - the parent does the task itself
            payload = pickle.dumps((False, f"{type(exc).__name__}: {exc}"))
        _write_all(out, struct.pack(_FRAME, index, len(payload)) + payload)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _end_worker(pid: int, kill: bool = True) -> str:
    """Reap a forked worker, killed first with `kill` (else it is ending: its pipe closed);
    how it ended, in words."""
    if pid not in _children.forked:
        return "already reaped"
    _children.forked.discard(pid)
    try:
        if kill:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return "reaped elsewhere"
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.WEXITSTATUS(status)}"
