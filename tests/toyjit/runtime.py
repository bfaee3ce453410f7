"""The toy runtime itself: compile a C++ source with g++ once per key, then serve the cache.

Cache grammar (what `layout.py` reads):

    $TOYJIT_CACHE_DIR/
      toyjit.root                 marker: this directory is a ToyJIT cache
      <kernel>.<key>/             key: 16 hex digits, xxh3-64 of the source + "\\0" + TOYJIT_FLAGS
        kernel.cpp                the source, byte for byte
        command                   the argv the runtime ran, one argument per line
        kernel.o                  the object
"""

from __future__ import annotations

import os
import shutil
import subprocess

import xxhash


def key_of(source: bytes, flags: str) -> str:
    return xxhash.xxh3_64_hexdigest(source + b"\0" + flags.encode())


def compile(name: str, source: str, include_dir: str, env: dict[str, str]) -> tuple[str, str]:
    """(entry directory, "hit" or "compile")."""
    root = env["TOYJIT_CACHE_DIR"]
    os.makedirs(root, exist_ok=True)
    with open(os.path.join(root, "toyjit.root"), "w"):
        pass
    flags = env.get("TOYJIT_FLAGS", "")
    entry = os.path.join(root, f"{name}.{key_of(source.encode(), flags)}")
    if os.path.isdir(entry):
        return entry, "hit"
    os.makedirs(entry)
    with open(os.path.join(entry, "kernel.cpp"), "w") as out:
        out.write(source)
    # The command names the compiler by full path, as DeepJIT's names its nvcc.
    cxx = shutil.which(env.get("TOYJIT_CXX", "g++"), path=env.get("PATH")) or "g++"
    argv = [cxx, "-c", os.path.join(entry, "kernel.cpp"),
            f"-I{include_dir}", *flags.split(), "-o", os.path.join(entry, "kernel.o")]
    subprocess.run(argv, check=True, env=env, cwd=entry)
    with open(os.path.join(entry, "command"), "w") as out:
        out.write("\n".join(argv) + "\n")
    return entry, "compile"
