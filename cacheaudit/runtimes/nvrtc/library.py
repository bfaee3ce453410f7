"""libnvrtc as loaded into this process: the compiler of NVRTC's records, and its builtins.

NVRTC is a library, not an executable: the compiler identity of a compile record is the libnvrtc
mapped into the process (whichever of libnvrtc.so.13 and libnvrtc.alt.so.13 that is, from
/proc/self/maps; else the one cuda-pathfinder loads), with its content hash and `nvrtcVersion`.
NVRTC's builtin header (`__nv_nvrtc_builtin_header.h`) comes from libnvrtc-builtins, so a trace
naming it is recorded as that library file.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from typing import Any

from cacheaudit.model import CompilerIdentity
from cacheaudit.runtimes.nvrtc.trace import result_code

__all__ = ["builtins_library", "mapped_library", "nvrtc_identity"]

_LIBNVRTC = re.compile(r"^libnvrtc(\.alt)?\.so")
_LIBNVRTC_BUILTINS = re.compile(r"^libnvrtc-builtins(\.alt)?\.so")
_SUCCESS = 0


def mapped_library(pattern: re.Pattern[str]) -> str | None:
    """The first file mapped into this process whose basename matches: the library really
    loaded, whichever of libnvrtc.so.13 and libnvrtc.alt.so.13 that is."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="surrogateescape") as handle:
            for line in handle:
                parts = line.split(None, 5)
                if len(parts) == 6:
                    path = parts[5].rstrip("\n")
                    if path.startswith("/") and pattern.match(os.path.basename(path)):
                        return path
    except OSError:
        return None
    return None


def nvrtc_identity(nvrtc_version: Callable[[], Any] | None) -> CompilerIdentity:
    """libnvrtc as loaded into this process: its path, content hash and the answer of
    `nvrtc_version` (the binding's `nvrtcVersion`); `error` says what could not be told."""
    from cacheaudit.digest import read_state

    error = None
    path = mapped_library(_LIBNVRTC)
    if path is None:
        try:
            from cuda.pathfinder import load_nvidia_dynamic_lib

            path = load_nvidia_dynamic_lib("nvrtc").abs_path
        except Exception as exc:  # noqa: BLE001 - identity is evidence, not a requirement
            error = f"libnvrtc not found: {type(exc).__name__}: {exc}"
    version = ""
    with contextlib.suppress(Exception):
        answer = nvrtc_version()  # type: ignore[misc]
        if result_code(answer) == _SUCCESS:
            version = f"NVRTC {answer[1]}.{answer[2]} (nvrtcVersion)"
    resolved = os.path.realpath(path) if path else ""
    state = read_state(resolved) if resolved else None
    if state is not None and not state.readable:
        error = error or state.error or "libnvrtc is unreadable"
    return CompilerIdentity(
        invoked="libnvrtc", path=path or "", resolved=resolved, kind="nvrtc",
        version_text=version, digest=state.digest if state else None,
        size=state.size if state else -1, mtime_ns=state.mtime_ns if state else 0,
        error=error)


def builtins_library() -> str | None:
    """The libnvrtc-builtins mapped into this process, realpath'd; None when none is."""
    found = mapped_library(_LIBNVRTC_BUILTINS)
    return os.path.realpath(found) if found else None
