"""Compiler kinds: the driver family (nvcc, gcc, clang, hipcc) a compiler name belongs to.

The kind decides how an argv is expanded and parsed; it is read from the basename only, as the
drivers themselves behave by name.
"""

from __future__ import annotations

import os
import re

__all__ = ["compiler_kind"]

_KIND_RE = re.compile(
    r"^(?:.*-)?(?P<name>nvcc|hipcc|clang\+\+|clang|g\+\+|gcc|c\+\+|cc)"
    r"(?:-\d+(?:\.\d+)*)?(?:\.exe|\.pl|\.bin)?$")
_KIND_OF = {"nvcc": "nvcc", "hipcc": "hipcc", "clang": "clang", "clang++": "clang",
            "gcc": "gcc", "g++": "gcc", "cc": "gcc", "c++": "gcc"}


def compiler_kind(name: str) -> str:
    """The driver family of a compiler name, from its basename only.

    Drivers behave by name (ccache hashes the basename for that reason), and a triplet prefix or
    a version suffix (`x86_64-linux-gnu-g++-12`, `clang++-18`) does not change the family. Tools
    that merely share a prefix (`gcc-ar-12`, `clang-tidy`) are "unknown".
    """
    match = _KIND_RE.match(os.path.basename(name))
    return _KIND_OF[match.group("name")] if match else "unknown"
