"""The shim's compile: started first, recorded beside it, ended as the compiler ended.

`cacheaudit.shim` hands a call here once it knows the call may compile. The compiler starts at
once (`_spawn`: with the user's stdin, stdout and stderr and every descriptor the shim inherited,
as an `exec` would leave them: make's jobserver pipes reach it), before anything else of
cacheaudit is imported. Then, while it runs: the rest of the installation (`site`, when the
launcher started Python without it), the recorder, the effective argv, the dependency pass, the
compiler's identity (memoised per binary: `compilers.FileMemo`) and the hashes of every file the
pass lists. After the compile only the outputs are hashed, the inputs' states checked, and one
record written.

A compile that turns out to record nothing (a query the shim's first step did not know) just
runs to its end: the shim exits as it exited.
"""

from __future__ import annotations

# `signal` without its enums: `signal` imports `enum`, which costs more than a fork, and the
# compile starts after this import.
import _signal as signal
import os
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from typing import Protocol

    from cacheaudit.recorder import ShimRecorder

    class Signalled(Protocol):
        """What a signal is forwarded to: the shim's `Compile`, `cacheaudit run`'s `Popen`."""

        def send_signal(self, sig: int) -> None: ...

        def poll(self) -> int | None: ...

_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                      signal.SIGUSR1, signal.SIGUSR2)
_TERMINATING = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
# Python ignores these at start-up; a compiler started by a shell has them at their default
# (subprocess's restore_signals does the same).
_DEFAULT_IN_COMPILER = (signal.SIGPIPE, signal.SIGXFSZ)


def cannot_run_status(exc: OSError) -> int:
    """A shell's status for a program it could not start: 127 when there is none by that name,
    126 when there is one that cannot be executed (no permission, not an executable format, a
    directory, ...)."""
    return 127 if isinstance(exc, (FileNotFoundError, NotADirectoryError)) else 126


class Compile:
    """The user's compile: a child started by `_spawn`, reaped by pid only (cacheaudit's own
    children are reaped by theirs)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self.ended_at: float | None = None
        """`time.perf_counter()` when its end was first seen: its duration stays its own
        when the recording outlasts it."""

    def _ended(self, status: int) -> None:
        self.returncode = os.waitstatus_to_exitcode(status)
        self.ended_at = time.perf_counter()

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.returncode  # reaped by the other of `wait` and the SIGCHLD handler
            if pid:
                self._ended(status)
        return self.returncode

    @property
    def running(self) -> bool:
        return self.poll() is None

    def wait(self) -> int:
        while self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, 0)
            except ChildProcessError:
                if self.returncode is None:  # pragma: no cover - nothing else reaps it
                    raise
                break
            if pid and self.returncode is None:
                self._ended(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # once reaped, its pid may be another process's
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                return


def compile_and_record(name: str, real: str, argv0: str, argv: Sequence[str],
                       env: Mapping[str, str], child_env: Mapping[str, str]) -> int:
    """Run the compile transparently while the recorder works beside it; exit as it exited."""
    # Handlers go in before the compiler starts: a signal that arrives in between is held and
    # handed to the compiler as soon as it exists, never taken by the shim alone.
    forwarder = SignalForwarder()
    previous = forwarder.install(_FORWARDED_SIGNALS)
    # The compile's end, noted when it happens: the recording may still be busy then.
    previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, forwarder.child_changed)
    started_ns = time.time_ns()
    started = time.perf_counter()
    try:
        child = Compile(_spawn(real, [argv0, *argv], child_env))
    except OSError as exc:
        restore_handlers(previous)
        sys.stderr.write(f"cacheaudit-shim: cannot run {real}: {exc.strerror}\n")
        return cannot_run_status(exc)
    forwarder.attach(child)
    beside = _Beside()
    returncode = -1
    try:
        beside.run(name, real, argv, env, child_env, started_ns, child)
        returncode = child.wait()
        duration_ns = int(((child.ended_at or time.perf_counter()) - started) * 1e9)
        recorder = beside.recorder
        if recorder is not None:
            # Ctrl-C while the record is written: the compile's status stands, not a traceback.
            forwarder.recording = True
            try:
                recorder.finish(returncode, duration_ns)
            except BaseException:  # noqa: BLE001 - the compile's status is all that counts
                pass
            finally:
                forwarder.recording = False
    finally:
        restore_handlers(previous)
        beside.close()
    if returncode < 0:
        _die_like(-returncode)
    _end_now(returncode)
    return returncode


def _end_now(status: int) -> None:
    """Exit with the compile's status without the interpreter's teardown: the record is written
    (or spooled), the scratch directory removed, every file of ours closed, and what is left is
    freeing the modules the recording loaded one by one, 10-15 ms that the build would wait for
    (docs/performance.md, "Fixed costs"). The exit functions still run (an adapter's, coverage's);
    a thread that is not a daemon gets the ordinary exit, which waits for it."""
    threading = sys.modules.get("threading")
    if threading is not None and any(
            thread.is_alive() and not thread.daemon and thread is not threading.main_thread()
            for thread in threading.enumerate()):
        return
    import atexit
    import contextlib

    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing to lose
                stream.flush()
        os._exit(status)


class _Beside:
    """What the shim does while the compile runs; every failure a note or one line on stderr."""

    def __init__(self) -> None:
        self.recorder: ShimRecorder | None = None
        self.workdir: str | None = None

    def run(self, name: str, real: str, argv: Sequence[str], env: Mapping[str, str],
            child_env: Mapping[str, str], started_ns: int, child: Compile) -> None:
        try:
            _load_site()
            from cacheaudit.recorder import ShimRecorder

            recorder = ShimRecorder.prepare(name, real, argv, env)
        except Exception as exc:  # noqa: BLE001 - a bug of ours must not cost the user a compile
            sys.stderr.write(f"cacheaudit: recording failed, the compile is unaffected: "
                             f"{type(exc).__name__}: {exc}\n")
            return
        if recorder is None:
            return
        self.recorder = recorder
        recorder.started_ns = started_ns
        try:
            from cacheaudit import scratch

            self.workdir = scratch.make_directory("shim")
            recorder.start(child_env, started_ns, self.workdir)
            recorder.collect_inputs(lambda: child.running)
            recorder.ready_to_write()
        except Exception as exc:  # noqa: BLE001 - the compile is running: never disturb it
            recorder.notes.append(f"recording setup failed: {type(exc).__name__}: {exc}")

    def close(self) -> None:
        if self.recorder is not None and self.recorder.dependency_pass is not None:
            self.recorder.dependency_pass.kill()
        if self.recorder is not None:
            from cacheaudit.recorder import close_held

            close_held()  # its WAL checkpointed, however the shim then ends
        if "cacheaudit.scratch" not in sys.modules:
            return  # nothing was recorded: nothing of ours to remove or sweep
        from cacheaudit import scratch

        scratch.remove(self.workdir)
        import contextlib

        # What an earlier shim killed outright left behind (one shim in SWEEP_ONE_IN looks).
        with contextlib.suppress(BaseException):
            scratch.sweep_now_and_then()


def _spawn(real: str, argv: list[str], env: Mapping[str, str]) -> int:
    """Start the compiler as an `exec` from a shell would: every descriptor the shim inherited
    (make's jobserver pipes), the signals the shim's parent ignored still ignored, the rest at
    their default. Returns its pid; raises OSError as exec did.

    Fork and exec rather than `posix_spawn`, whose glibc child leaves glibc's internal signals
    32 and 33 ignored (a compiler's SigIgn would then differ from the bare one's), or
    subprocess, whose import costs more than the fork. The exec's failure comes back through a
    close-on-exec pipe: nothing read means the compiler runs."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child, until exec
        try:
            os.close(read_end)
            for sig in _DEFAULT_IN_COMPILER:
                signal.signal(sig, signal.SIG_DFL)
            os.execve(real, argv, env)
        except OSError as exc:
            os.write(write_end, str(exc.errno or 0).encode())
        finally:
            os._exit(127)
    os.close(write_end)
    failure = b""
    try:
        while chunk := os.read(read_end, 32):
            failure += chunk
    finally:
        os.close(read_end)
    if failure:
        os.waitpid(pid, 0)
        number = int(failure)
        raise OSError(number, os.strerror(number), real)
    return pid


def _load_site() -> None:
    """The launcher starts Python without `site` (a query needs none of it); the recorder needs
    the installation's packages (xxhash), so `site` runs now, as it would have at start-up."""
    if sys.flags.no_site and "site" not in sys.modules:
        import site

        site.main()


def restore_handlers(previous: dict[int, object]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)  # type: ignore[arg-type]


def kill_own_children() -> None:
    """End cacheaudit's own children (the dependency pass, a `--version` probe, a scan's
    reconstruction), if any. Safe in a signal handler."""
    # A signal can land while `cacheaudit.children` is still being imported: that module is in
    # `sys.modules` without `kill_all` yet, and has started no child.
    kill_all = getattr(sys.modules.get("cacheaudit.children"), "kill_all", None)
    if kill_all is not None:
        kill_all()


class _Interrupted(BaseException):
    """A terminating signal after the compile ended: the recording stops, the status stands.
    A BaseException, as KeyboardInterrupt: the recorder's fail-open handlers (`except
    Exception`: spool the record, report a problem) must not take it for a failure."""


class SignalForwarder:
    """Signals sent to the shim (or to `cacheaudit run`), passed on to the user's process (the
    compiler, the command); a terminating one also ends cacheaudit's own children (the
    dependency pass, a hanging `--version` probe) at once. Installed before that process
    starts: a signal in between is held and handed to it by `attach`."""

    def __init__(self) -> None:
        self.child: Signalled | None = None
        self.pending: list[int] = []
        self.recording = False
        """The compile has ended and its record is being written: a terminating signal ends
        that (`_Interrupted`), as Ctrl-C would."""

    def receive(self, sig: int, _frame: object) -> None:
        # The compiler is told first: nothing of cacheaudit's own may stand between the signal
        # and the user's compile.
        if self.child is None:
            self.pending.append(sig)
        else:
            self.child.send_signal(sig)
        if sig in _TERMINATING:
            kill_own_children()
            if self.recording and self.child is not None:
                raise _Interrupted(f"signal {sig} while the record was written")

    def child_changed(self, _sig: int, _frame: object) -> None:
        """SIGCHLD: when the compile has ended, note the time (it is reaped here; `wait` then
        returns its status at once). Only the compile's pid is asked: no other child is reaped."""
        if self.child is not None:
            self.child.poll()

    def install(self, signals: Sequence[int]) -> dict[int, object]:
        """This forwarder as the handler of `signals`, but of none that this process ignores
        (nohup's SIGHUP): the child inherits SIG_IGN from us, as it would from our parent,
        whereas a handler of ours is reset by exec. Returns the handlers it replaced (for
        `restore_handlers`)."""
        return {sig: signal.signal(sig, self.receive) for sig in signals
                if signal.getsignal(sig) != signal.SIG_IGN}

    def attach(self, child: Signalled) -> None:
        self.child = child
        for sig in self.pending:
            self.receive(sig, None)
        self.pending.clear()


def _die_like(sig: int) -> None:
    """End this process by the signal that ended the compiler, as the bare compiler would."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    # A signal whose default action is not to terminate (or one blocked by our parent): fall
    # back to the shell convention.
    sys.exit(128 + sig)
