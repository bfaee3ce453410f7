"""Key arithmetic the DeepSeek runtimes share: DeepJIT's and DeepGEMM's digest finaliser, and the
runtime pid that their build directories are named after."""

from __future__ import annotations

import os
import re

from cacheaudit.model import CompileRecord

_MASK_64 = (1 << 64) - 1


def split_mix(value: int) -> int:
    """SplitMix64's finaliser, which DeepJIT's `FNV1a` and DeepGEMM's `get_hex_digest` both apply
    to each 64-bit lane before printing it."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK_64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK_64
    return value ^ (value >> 31)


# `get_uuid()` of DeepJIT (utils/uuid.hpp) and DeepGEMM (csrc/utils/system.hpp), which DeepEP
# copies: "<pid>-<8 hex>-<8 hex>-<8 hex>", the runtime's own pid first.
_BUILD_DIRECTORY = re.compile(r"([0-9]+)-[0-9a-f]{8}-[0-9a-f]{8}-[0-9a-f]{8}")


def build_directory_pid(record: CompileRecord) -> int | None:
    """The pid of the runtime that ran this compile, from the name of its build directory
    `<root>/tmp/<pid>-<hex>-<hex>-<hex>/`: DeepJIT compiles in it (`cd <dir> && nvcc ...`),
    DeepGEMM and DeepEP name its `kernel.cu` and binary on the command line. The runtime named
    the directory after its own process, so the pid survives the shell and the shim between
    them; None when neither the working directory nor an argument lies in such a directory."""
    candidates = [record.cwd] + [os.path.dirname(t) for t in record.argv if t.startswith("/")]
    for directory in candidates:
        match = _BUILD_DIRECTORY.fullmatch(os.path.basename(directory))
        if match is not None and os.path.basename(os.path.dirname(directory)) == "tmp":
            return int(match.group(1))
    return None
