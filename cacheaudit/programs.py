"""Finding a program on PATH as execvp would: stdlib only, so that the shim can hand a query
(`nvcc --version`, `g++ -dumpversion`) to the real compiler without importing anything else of
cacheaudit (`compilers` re-exports these for everyone else)."""

from __future__ import annotations

import os
import stat as stat_module

# Annotations only: the query path imports neither `typing` nor `collections`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

_STAND_IN_DIGITS = 10
"""A recording session's stand-in name for a compiler setting (`shim.stand_in_name`): ten
lower-case hex digits, a dash, the name."""
_HEX = frozenset("0123456789abcdef")


def compiler_name(name: str) -> str:
    """The compiler a masquerade name stands for: `ad4942f9e9-nvcc` (a session's stand-in for
    a compiler setting) is nvcc; a plain name is itself."""
    digits, dash, rest = name[:_STAND_IN_DIGITS], name[_STAND_IN_DIGITS:_STAND_IN_DIGITS + 1], \
        name[_STAND_IN_DIGITS + 1:]
    if dash == "-" and rest and len(digits) == _STAND_IN_DIGITS and _HEX.issuperset(digits):
        return rest
    return name


def is_executable_file(path: str) -> bool:
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat_module.S_ISREG(st.st_mode) and os.access(path, os.X_OK)


def find_program(name: str, path: str | None,
                 skip: Callable[[str], bool] | None = None) -> str | None:
    """The first executable regular file called `name` along `path`, as execvp would find it.

    `skip(directory)` jumps over PATH entries (the shim passes its own masquerade directory, as
    ccache does, so that looking up `nvcc` from inside the shim never finds the shim again). The
    directory is given as written in PATH, with an empty entry meaning ".". `path=None` means the
    default search path of a process without PATH (`os.defpath`). A name containing a slash is not
    searched: it is returned unchanged when it names an executable file.
    """
    if not name:
        return None
    if "/" in name:
        return name if is_executable_file(name) else None
    for directory in (os.defpath if path is None else path).split(os.pathsep):
        directory = directory or "."
        if skip is not None and skip(directory):
            continue
        candidate = os.path.join(directory, name)
        if is_executable_file(candidate):
            return os.path.abspath(candidate)
    return None
