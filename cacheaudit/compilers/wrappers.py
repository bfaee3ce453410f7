"""Wrapper resolution: the binary that really runs behind symlinks and forwarding shell scripts.

`/usr/local/bin/nvcc` is often a shell script that execs the real driver, and `/usr/bin/cc` a
chain of symlinks through `/etc/alternatives`; the identity of a compiler is that of the binary at
the end of the chain, with every hop on the way recorded. Only what can be read for certain is
followed: anything a shell would expand or interpret stops the walk at the script itself.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from cacheaudit.programs import find_program

__all__ = ["Resolution", "resolve", "resolve_wrappers"]

_MAX_HOPS = 40
_MAX_SCRIPT_BYTES = 64 * 1024
_SHELLS = frozenset({"sh", "bash", "dash", "ksh", "mksh", "zsh", "ash"})
_ENV_PROGRAMS = frozenset({"env", "/usr/bin/env", "/bin/env"})
_SET_LINE = re.compile(r"^set(?:\s+(?:[-+][A-Za-z]+|-o\s+\w+))*\s*(?:#.*)?$")
_EXEC_LINE = re.compile(r'^exec\s+(?P<body>.*?)\s+"\$(?:@|\{@\})"\s*(?:#.*)?$')
# Anything a shell would expand or interpret is outside what we read "for certain".
_SAFE_BODY = re.compile(r"""^[A-Za-z0-9_./+=:@%,'" -]+$""")
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class Resolution:
    """Where a walk from a path ended, the hops on the way, and why it stopped early."""

    resolved: str
    chain: tuple[str, ...]
    problem: str | None = None


def _shell_script_target(path: str, search_path: str | None,
                         skip: Callable[[str], bool] | None) -> str | None:
    """The program a pure forwarding shell script execs, or None when that is not certain.

    Only scripts of the form `#!/bin/sh` + comments + `set -e`-style lines + one
    `exec [env NAME=value ...] PROGRAM "$@"` are read; an interpreter other than a POSIX shell
    (hipcc is Perl), any other command, any expansion, or a relative PROGRAM path means the
    script itself is taken as the compiler.
    """
    try:
        with open(path, "rb") as handle:
            if handle.read(2) != b"#!":
                return None
            if os.fstat(handle.fileno()).st_size > _MAX_SCRIPT_BYTES:
                return None
            data = b"#!" + handle.read(_MAX_SCRIPT_BYTES)
    except OSError:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = text.splitlines()
    interpreter = lines[0][2:].split()
    if not interpreter:
        return None
    if interpreter[0] in _ENV_PROGRAMS:
        interpreter = interpreter[1:]
    if not interpreter or os.path.basename(interpreter[0]) not in _SHELLS:
        return None
    if any(not flag.startswith("-") for flag in interpreter[1:]):
        return None
    target: str | None = None
    for line in lines[1:]:
        stripped = line.strip()
        if not stripped or stripped.startswith("#") or _SET_LINE.match(stripped):
            continue
        match = _EXEC_LINE.match(stripped)
        if match is None or target is not None:
            return None
        target = _exec_target(match.group("body"), search_path, skip)
        if target is None:
            return None
    return target


def _exec_target(body: str, search_path: str | None,
                 skip: Callable[[str], bool] | None) -> str | None:
    if not _SAFE_BODY.match(body):
        return None
    try:
        words = shlex.split(body)
    except ValueError:
        return None
    if words and words[0] in _ENV_PROGRAMS:
        words = words[1:]
        while words:
            if _ASSIGNMENT.match(words[0]):
                name, _, value = words[0].partition("=")
                if name == "PATH":
                    search_path = value
                words = words[1:]
            elif words[0] == "-u" and len(words) > 1:
                words = words[2:]
            else:
                break
    if len(words) != 1 or not words[0] or words[0].startswith("-"):
        return None
    program = words[0]
    if "/" in program:
        return program if os.path.isabs(program) else None
    return find_program(program, search_path, skip)


def resolve(path: str, search_path: str | None,
            skip: Callable[[str], bool] | None) -> Resolution:
    """`resolve_wrappers` with the reason a walk ended early (a loop, a missing file)."""
    chain: list[str] = []
    seen_scripts: set[str] = set()
    current = os.path.abspath(path)
    for _ in range(_MAX_HOPS):
        if os.path.islink(current):
            try:
                target = os.readlink(current)
            except OSError as exc:
                return Resolution(os.path.realpath(current), tuple(chain),
                                  f"cannot read symlink {current}: {exc.strerror or exc}")
            chain.append(current)
            current = os.path.join(os.path.realpath(os.path.dirname(current)), target)
            continue
        real = os.path.realpath(current)
        if not os.path.exists(real):
            return Resolution(real, tuple(chain), f"{current} does not exist")
        if real in seen_scripts:
            return Resolution(real, tuple(chain), f"wrapper loop: {real} execs itself again")
        target = _shell_script_target(real, search_path, skip)
        if target is None:
            return Resolution(real, tuple(chain))
        seen_scripts.add(real)
        chain.append(current)
        current = target
    return Resolution(os.path.realpath(current), tuple(chain),
                      f"more than {_MAX_HOPS} symlinks and wrappers")


def resolve_wrappers(path: str, *, search_path: str | None = None,
                     skip: Callable[[str], bool] | None = None) -> tuple[str, tuple[str, ...]]:
    """The binary that really runs when `path` is executed, and the hops to it, outermost first.

    A hop is a symlink (each link of a chain such as `/usr/bin/cc -> /etc/alternatives/cc ->
    /usr/bin/gcc -> gcc-12`, because `update-alternatives` flipping one of them is a classic
    silent compiler change) or a forwarding shell script (see `_shell_script_target`). Bare program
    names in scripts are looked up along `search_path` (None: `os.defpath`) with `skip`. On a loop
    the file where the loop closes is returned; `identify` reports it as an error.
    """
    resolution = resolve(path, search_path, skip)
    return resolution.resolved, resolution.chain
