"""The rebuild oracle's compiles: one entry's command moved into a private directory, run in
its own process group with a timeout and a memory limit, killed with the oracle
(`cacheaudit.audit.verify` plans and judges them)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from cacheaudit import children
from cacheaudit.audit.checks.rebuild import first_error_line
from cacheaudit.audit.execution import SOURCE_LIMIT
from cacheaudit.digest import read_file
from cacheaudit.model import CacheEntry, CompileRecord

BINARY_LIMIT = 1 << 30
"""The largest binary compared: a cubin or host object is megabytes."""


@dataclass
class Rebuild:
    """One entry's compile, to be run again in a private directory."""

    entry: CacheEntry
    compiler: str
    args: list[str]
    """The argv after the compiler, as recorded (paths under `build_dir` moved at run time)."""
    cwd: str
    build_dir: str
    """The directory the original compile built in: replaced by a private one."""
    output: str
    """The binary the original compile wrote (under `build_dir`)."""
    kind: str
    """The compiler's kind (`compilers.compiler_kind`)."""
    env: dict[str, str]
    origin: str
    """Where the command comes from, in words."""
    notes: list[str] = field(default_factory=list)
    needs_yes: str | None = None
    """Why the command runs only with --yes (a record this user did not seal); None when not."""
    env_changes: str = ""
    """How `env` differs from the caller's environment, as `env` arguments."""
    record: CompileRecord | None = None
    """The compile the scan ties to the entry (observed or reconstructed), for its key and its
    process."""
    drift: list[str] = field(default_factory=list)
    """The compile-affecting variables whose value now differs from the recorded one, each as
    `NAME (recorded V, now W)`."""

    def under(self) -> str:
        """The environment the rebuild ran under, in words."""
        if self.drift:
            return ("under the current environment, which differs from the recorded one in "
                    + "; ".join(self.drift))
        if self.record is not None and not self.record.reconstructed:
            return "under the current environment, as recorded in every compile-affecting variable"
        return "under the current environment"

    def command_in(self, directory: str) -> tuple[list[str], str, str]:
        """(argv, cwd, output) with the build directory moved to `directory`."""
        moved = re.compile(re.escape(self.build_dir) + r"(?=/|$)")
        args = [moved.sub(lambda _m: directory, a) for a in self.args]
        return [self.compiler, *args], moved.sub(lambda _m: directory, self.cwd), \
            moved.sub(lambda _m: directory, self.output)

    def shown(self, directory: str = "<private dir>") -> str:
        argv, cwd, _ = self.command_in(directory)
        prefix = f"env {self.env_changes} " if self.env_changes else ""
        return f"cd {shlex.quote(cwd)} && {prefix}{shlex.join(argv)}"



class Processes:
    """Compiles running now, each a child of cacheaudit's own (`cacheaudit.children`: its own
    process group, within `children.COMPILE_LIMITS`, killed with the oracle however it ends)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: set[int] = set()
        self.stopping = False

    def start(self, argv: list[str], cwd: str, env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self.stopping:
                raise InterruptedError("the oracle is stopping")
            process = children.start(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, limits=children.COMPILE_LIMITS)
            self._groups.add(process.pid)
            return process

    def end(self, process: subprocess.Popen[bytes]) -> None:
        children.finish(process)  # whatever the compiler left running in its group
        with self._lock:
            self._groups.discard(process.pid)

    def kill_all(self) -> None:
        with self._lock:
            self.stopping = True
            groups = list(self._groups)
        for group in groups:
            children.kill_group(group)


def private_dir(parent: str, length: int) -> str:
    """A new directory under `parent` whose path is `length` characters long where it can be
    (the recorded build directory's length), so that a path the compiler embeds in the binary
    can be masked without moving any other byte."""
    base = tempfile.mkdtemp(prefix="b", dir=parent)
    room = length - len(base) - 1
    if room < 1:
        return os.path.join(base, "b")
    parts = [("b" * min(room - i, 200)) for i in range(0, room, 201)]
    return os.path.join(base, *parts) if all(parts) else os.path.join(base, "b")


@dataclass
class Built:
    binary: bytes | None
    directory: str
    problem: str = ""
    failed: str | None = None
    """The compiler's first error line when it ran and exited non-zero (the inputs no longer
    build); None when it succeeded or could not be run at all."""


def build(rebuild: Rebuild, parent: str, processes: Processes, timeout: float,
           map_back: bool = False) -> Built:
    """The binary (or the problem) of one fresh compile in a new private directory;
    `map_back` has gcc or clang write the recorded build directory wherever the binary names
    its own (`-ffile-prefix-map`), as the original compile did."""
    directory = private_dir(parent, len(rebuild.build_dir))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    source = rebuild.entry.source
    assert source is not None
    with open(os.path.join(directory, os.path.basename(source.path)), "wb") as copy:
        copy.write(read_file(source.path, SOURCE_LIMIT))
    argv, cwd, output = rebuild.command_in(directory)
    if map_back:
        argv.insert(1, f"-ffile-prefix-map={directory}={rebuild.build_dir}")
    try:
        process = processes.start(argv, cwd, rebuild.env)
    except OSError as exc:
        return Built(None, directory, f"cannot run {argv[0]}: {exc.strerror or exc}")
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        children.kill_group(process.pid)
        process.communicate()
        return Built(None, directory,
                      f"the compile took longer than {timeout:g} s and was killed")
    finally:
        processes.end(process)
    if process.returncode != 0:
        text = out.decode("utf-8", "replace").replace(directory, "<private dir>")
        problem = f"the compile failed (exit {process.returncode}): {text.strip()[-300:]}"
        # Killed by a signal (negative status): the machine's doing, not the inputs'.
        return Built(None, directory, problem, failed=first_error_line(text)
                      if process.returncode > 0 else None)
    try:
        return Built(read_file(output, BINARY_LIMIT), directory)
    except OSError as exc:
        return Built(None, directory, f"the compile wrote no readable "
                                       f"{os.path.basename(output)} ({exc.strerror or exc})")
