"""The compiler shim: stands in for nvcc, g++, gcc, c++, clang++, hipcc and records each compile.

It is installed as a masquerade directory of symlinks (`cacheaudit shim install DIR`) or named
directly in a runtime's compiler setting (`DG_JIT_NVCC_COMPILER=DIR/nvcc`). For each compile it
starts the real compiler with the user's stdin, stdout and stderr untouched, runs the compiler's
own dependency pass concurrently (measured on the CUTLASS reference TU: free in wall-clock on two
cores, where `-MD` in the same invocation cost 18%; see docs/design.md), and while both run it
works out the compiler identity, the effective argv and the environment. After the compile it
hashes the include graph and the outputs and writes one record to the ledger.

Transparency is the first rule: the same bytes on stdout and stderr, the same exit status, the
same death by signal, `--version` byte-identical (DeepJIT hashes it), and a compile that runs and
succeeds even when recording fails; that failure is reported once on stderr.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from cacheaudit.switches import (
    DISABLE_VARIABLE,
    MARKER,
    flag_set,
    is_masquerade_dir,
)

if TYPE_CHECKING:
    from cacheaudit.recorder import ShimRecorder

# What a masquerade directory holds: every name below, each a symlink to the shim, and a marker
# file that tells any shim (and `cacheaudit shim install`) that the directory is ours.
MASQUERADE_NAMES = ("nvcc", "gcc", "g++", "cc", "c++", "clang", "clang++", "hipcc")

# Set in the real compiler's environment: a shim reached from inside a compile (nvcc calling
# a masqueraded g++ by absolute path) hands straight through instead of recording twice.
ACTIVE_VARIABLE = "CACHEAUDIT_SHIM_ACTIVE"

# Calls that compile nothing: handed straight to the compiler before any of cacheaudit is imported
# (torch runs `c++ -dumpversion`-style probes, DeepJIT hashes `nvcc --version`).
_QUERY_FLAGS = frozenset({"--version", "-V", "-v", "-dumpversion", "-dumpfullversion",
                          "-dumpmachine", "--help", "-h", "--list-gpu-arch", "--list-gpu-code"})

_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT,
                      signal.SIGUSR1, signal.SIGUSR2)
_MAX_DEPTH = 8


def is_query(argv: Sequence[str]) -> bool:
    """Only version/help queries: nothing to record."""
    return bool(argv) and all(token in _QUERY_FLAGS for token in argv)


class ShimError(Exception):
    """The shim cannot even start the real compiler; exits like a shell that found no program."""


def _shim_targets() -> set[str]:
    """Real paths that are this shim, so that a lookup can never land on itself."""
    targets = {os.path.realpath(sys.argv[0])}
    main = sys.modules.get("__main__")
    if main is not None and getattr(main, "__file__", None):
        targets.add(os.path.realpath(main.__file__))  # type: ignore[arg-type]
    return targets


def strip_masquerade_dirs(path_value: str) -> str:
    return os.pathsep.join(d for d in path_value.split(os.pathsep) if not is_masquerade_dir(d))




def stand_in_name(value: str, family: str) -> str:
    """The masquerade name for a compiler setting that names something other than a bare
    family name: unique to the value, and ending in a name the shim can tell the kind of."""
    import xxhash

    from cacheaudit.compilers import compiler_kind

    base = os.path.basename(value)
    digest = xxhash.xxh64_hexdigest(value.encode("utf-8", "surrogateescape"))[:10]
    return f"{digest}-{base if compiler_kind(base) != 'unknown' else family}"


def real_variable(name: str) -> str:
    """The override variable for a name: `g++` gives CACHEAUDIT_REAL_GXX."""
    cleaned = name.upper().replace("+", "X").replace("-", "_").replace(".", "_")
    return f"CACHEAUDIT_REAL_{cleaned}"


def lookup_variable(name: str) -> str:
    """The variable holding a filled-in setting's lookup order (`CompilerSetting.lookup()`,
    joined by os.pathsep): `nvcc` gives CACHEAUDIT_LOOKUP_NVCC."""
    return real_variable(name).replace("CACHEAUDIT_REAL_", "CACHEAUDIT_LOOKUP_", 1)


def resolve_lookup(order: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The compiler a runtime would take by `order` (`CompilerSetting.default`'s rules) in `env`,
    never one of ours; None when no candidate applies."""
    from cacheaudit.programs import find_program

    path_value = env.get("PATH", os.defpath)
    for candidate in order:
        if candidate.startswith("$"):
            variable, _, rest = candidate[1:].partition("/")
            home = env.get(variable)
            if home:
                return os.path.join(home, rest) if rest else home
        elif os.sep not in candidate:
            found = find_program(candidate, path_value, is_masquerade_dir)
            if found:
                return found
        elif os.path.exists(candidate):
            return candidate
    return None


def find_real_compiler(name: str, env: Mapping[str, str]) -> str:
    """The compiler this shim stands in for: CACHEAUDIT_REAL_<NAME>; else, for a setting the
    session filled in, the runtime's own lookup order (CACHEAUDIT_LOOKUP_<NAME>) in this
    compile's environment; else `name` on PATH past us."""
    from cacheaudit.programs import compiler_name, find_program

    own = _shim_targets()
    explicit = env.get(real_variable(name))
    lookup = None if explicit else env.get(lookup_variable(name))
    candidates: list[str | None] = []
    if explicit:
        candidates.append(find_program(explicit, env.get("PATH", os.defpath), is_masquerade_dir))
    elif lookup:
        candidates.append(resolve_lookup(lookup.split(os.pathsep), env))
    else:
        # A stand-in link whose variable a runtime scrubbed: the compiler's own name is the best
        # guess left.
        name = compiler_name(name)
        candidates.append(find_program(name, env.get("PATH", os.defpath), is_masquerade_dir))
        if name == "nvcc":
            # Runtimes find nvcc through CUDA_HOME as often as through PATH.
            for root in (env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"):
                if root:
                    candidates.append(find_program(os.path.join(root, "bin", "nvcc"), None))
    for candidate in candidates:
        if candidate and os.path.realpath(candidate) not in own:
            return candidate
    where = (real_variable(name) if explicit else lookup_variable(name) if lookup else "PATH")
    raise ShimError(f"cannot find the real {name} (looked in {where}, skipping shim directories)")


@dataclass(frozen=True)
class Invocation:
    name: str
    argv: tuple[str, ...]


def _invocation(argv: Sequence[str]) -> Invocation:
    """`nvcc ARGS` through a masquerade symlink, or `cacheaudit-shim nvcc ARGS` called directly."""
    name = os.path.basename(argv[0]) if argv else "cacheaudit-shim"
    rest = tuple(argv[1:])
    if name.startswith("cacheaudit-shim") or name.startswith("shim.py"):
        if not rest:
            raise ShimError("usage: cacheaudit-shim COMPILER [ARGS...]")
        return Invocation(rest[0], rest[1:])
    return Invocation(name, rest)


def cannot_run_status(exc: OSError) -> int:
    """A shell's status for a program it could not start: 127 when there is none by that name,
    126 when there is one that cannot be executed (no permission, not an executable format, a
    directory, ...)."""
    return 127 if isinstance(exc, (FileNotFoundError, NotADirectoryError)) else 126


def _exec(real: str, argv: Sequence[str], env: Mapping[str, str]) -> NoReturn:
    try:
        os.execve(real, [real, *argv], dict(env))
    except OSError as exc:
        sys.stderr.write(f"cacheaudit-shim: cannot run {real}: {exc.strerror}\n")
        sys.exit(cannot_run_status(exc))


def compiler_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment the real compiler runs in: our directories off PATH, so that it finds the
    real host compiler, and the nesting depth, so that a shim reached anyway hands through."""
    child = dict(env)
    child[ACTIVE_VARIABLE] = str(_depth(env) + 1)
    if "PATH" in child:
        child["PATH"] = strip_masquerade_dirs(child["PATH"])
    return child


def _depth(env: Mapping[str, str]) -> int:
    try:
        return max(0, int(env.get(ACTIVE_VARIABLE, "0")))
    except ValueError:
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    env = dict(os.environ)
    try:
        invocation = _invocation(argv)
        real = find_real_compiler(invocation.name, env)
        if _depth(env) >= _MAX_DEPTH:
            raise ShimError(f"{invocation.name} leads back into the shim {_MAX_DEPTH} times; "
                            f"is {real_variable(invocation.name)} a wrapper that calls the shim?")
    except ShimError as exc:
        sys.stderr.write(f"cacheaudit-shim: {exc}\n")
        return 127
    child_env = compiler_env(env)
    if _depth(env) or flag_set(env, DISABLE_VARIABLE) or is_query(invocation.argv):
        _exec(real, invocation.argv, child_env)
    try:
        from cacheaudit.recorder import ShimRecorder  # imported late: queries never pay for it

        recorder = ShimRecorder.prepare(invocation.name, real, invocation.argv, env)
    except Exception as exc:  # noqa: BLE001 - a bug of ours must not cost the user a compile
        sys.stderr.write(f"cacheaudit: recording failed, the compile is unaffected: "
                         f"{type(exc).__name__}: {exc}\n")
        recorder = None
    if recorder is None:
        _exec(real, invocation.argv, child_env)
    return run_and_record(recorder, real, invocation.argv, child_env)


def run_and_record(recorder: ShimRecorder, real: str, argv: Sequence[str],
                   child_env: Mapping[str, str]) -> int:
    """Run the compile transparently while the recorder works beside it; exit as it exited."""
    from cacheaudit import children, scratch

    # Handlers go in before the compiler starts: a signal that arrives in between is held and
    # handed to the compiler as soon as it exists, never taken by the shim alone.
    forwarder = _Forwarder(children.kill_all)
    # A signal our parent ignores (nohup's SIGHUP) stays ignored: the compiler inherits SIG_IGN
    # from us, as it would from the parent, whereas a handler of ours would be reset by exec.
    previous = {sig: signal.signal(sig, forwarder.receive) for sig in _FORWARDED_SIGNALS
                if signal.getsignal(sig) is not signal.SIG_IGN}
    # The compile's end, noted when it happens: the identity probe may still be running then.
    previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, forwarder.child_changed)
    started_ns = time.time_ns()
    recorder.started_ns = started_ns
    started = time.perf_counter()
    try:
        child = subprocess.Popen([real, *argv], env=child_env)
    except OSError as exc:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.stderr.write(f"cacheaudit-shim: cannot run {real}: {exc.strerror}\n")
        return cannot_run_status(exc)
    forwarder.attach(child)
    workdir: str | None = None
    try:
        try:
            workdir = scratch.make_directory("shim")
            recorder.start(child_env, started_ns, workdir)
        except Exception as exc:  # noqa: BLE001 - the compile is running: never disturb it
            recorder.notes.append(f"recording setup failed: {type(exc).__name__}: {exc}")
        returncode = _wait(child)
        duration_ns = int(((forwarder.exited_at or time.perf_counter()) - started) * 1e9)
        # Ctrl-C while the record is written: the compile's status stands, not a traceback.
        with contextlib.suppress(BaseException):
            forwarder.recording = True
            try:
                recorder.finish(returncode, duration_ns)
            finally:
                forwarder.recording = False
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if recorder.dependency_pass is not None:
            recorder.dependency_pass.kill()
        scratch.remove(workdir)
        # What an earlier shim killed outright left behind (one shim in SWEEP_ONE_IN looks).
        with contextlib.suppress(BaseException):
            scratch.sweep_now_and_then()
    if returncode < 0:
        _die_like(-returncode)
    return returncode


_TERMINATING = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})


class _Interrupted(BaseException):
    """A terminating signal after the compile ended: the recording stops, the status stands.
    A BaseException, as KeyboardInterrupt: the recorder's fail-open handlers (`except
    Exception`: spool the record, report a problem) must not take it for a failure."""


class _Forwarder:
    """Signals sent to the shim, passed on to the compiler; a terminating one also ends
    cacheaudit's own children (the dependency pass, a hanging `--version` probe) at once."""

    def __init__(self, kill_helpers: Callable[[], None]) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []
        self.kill_helpers = kill_helpers
        self.exited_at: float | None = None
        self.recording = False
        """The compile has ended and its record is being written: a terminating signal ends
        that (`_Interrupted`), as Ctrl-C would."""

    def receive(self, sig: int, _frame: object) -> None:
        if sig in _TERMINATING:
            self.kill_helpers()
        if self.child is None:
            self.pending.append(sig)
            return
        with contextlib.suppress(ProcessLookupError):
            self.child.send_signal(sig)
        if self.recording and sig in _TERMINATING:
            raise _Interrupted(f"signal {sig} while the record was written")

    def child_changed(self, _sig: int, _frame: object) -> None:
        """SIGCHLD: when the compile has ended, note the time (it is reaped here; `wait` then
        returns its status at once). Only the compile's pid is asked: no other child is reaped."""
        if self.child is not None and self.exited_at is None and self.child.poll() is not None:
            self.exited_at = time.perf_counter()

    def attach(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        for sig in self.pending:
            self.receive(sig, None)
        self.pending.clear()


def _wait(child: subprocess.Popen[bytes]) -> int:
    while True:
        try:
            return child.wait()
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            continue


def _die_like(sig: int) -> None:
    """End this process by the signal that ended the compiler, as the bare compiler would."""
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    # A signal whose default action is not to terminate (or one blocked by our parent): fall
    # back to the shell convention.
    sys.exit(128 + sig)


def shim_executable() -> str:
    """The `cacheaudit-shim` script of this installation, for masquerade symlinks to point at."""
    beside_python = os.path.join(os.path.dirname(sys.executable), "cacheaudit-shim")
    if os.access(beside_python, os.X_OK):
        return beside_python
    found = shutil.which("cacheaudit-shim")
    if found is None:
        raise ShimError("the cacheaudit-shim script is not installed (reinstall cacheaudit)")
    return os.path.abspath(found)


def install_masquerade(directory: str, names: Sequence[str] | None = None,
                       force: bool = False) -> list[str]:
    """Fill `directory` with compiler names that lead to the shim; returns what was done."""
    from cacheaudit.exceptions import UsageError

    chosen = tuple(names) if names else MASQUERADE_NAMES
    unknown = [n for n in chosen if "/" in n or not n]
    if unknown:
        raise UsageError(f"not a compiler name: {unknown[0]!r}")
    try:
        target = shim_executable()
    except ShimError as exc:
        raise UsageError(str(exc)) from exc
    _make_masquerade_dir(directory)
    done: list[str] = []
    for name in chosen:
        link = os.path.join(directory, name)
        if os.path.lexists(link) and not is_link_to(link, target) and not force:
            raise UsageError(f"{link} exists and is not the shim (use --force to replace it)")
        try:
            link_to_shim(directory, name, target)
        except OSError as exc:
            raise UsageError(f"cannot write {link}: {exc.strerror or exc}") from exc
        done.append(f"{link} -> {target}")
    mark_masquerade_dir(directory)
    return done


def _make_masquerade_dir(directory: str) -> None:
    """The directory and its parents (sessions lay out theirs under the cache directory); a file
    of that name is not replaced, and what cannot be made is a usage error, in one line."""
    from cacheaudit.exceptions import UsageError

    if os.path.lexists(directory) and not os.path.isdir(directory):
        raise UsageError(f"{directory}: not a directory (give a new name, or a directory to "
                         "fill)")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {directory}: {exc.strerror or exc}") from exc


def is_link_to(link: str, target: str) -> bool:
    return os.path.islink(link) and os.path.realpath(link) == os.path.realpath(target)


def link_to_shim(directory: str, name: str, target: str) -> str:
    """`directory/name` -> the shim, replaced atomically: a compile running through the old link
    in another session never sees the name missing."""
    link = os.path.join(directory, name)
    if is_link_to(link, target):
        return link
    staging = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        os.remove(staging)
    os.symlink(target, staging)
    os.replace(staging, link)
    return link


def mark_masquerade_dir(directory: str) -> None:
    marker = os.path.join(directory, MARKER)
    if os.path.isfile(marker):
        return
    staging = f"{marker}.{os.getpid()}.tmp"
    with open(staging, "w", encoding="utf-8") as handle:
        handle.write("This directory holds cacheaudit compiler shims; PATH lookups of the real\n"
                     "compiler skip it.\n")
    os.replace(staging, marker)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
