"""`cacheaudit demo`: the recorder at work on a built-in example, in a temporary directory.

It builds a small kernel through the compiler shim twice, the second time with a flag injected by
`NVCC_APPEND_FLAGS` (or CPATH pointed elsewhere when only g++ is present), and shows what the
ledger holds: the four answers for each compile. Nothing outside the temporary directory is
touched, the user's own ledger included.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass

from cacheaudit.ledger import Ledger, ingest_spool
from cacheaudit.model import CompileRecord
from cacheaudit.shim import install_masquerade

KERNEL = """\
#include "scale.h"
#include <tiles/tile.h>

extern "C" SCALE_QUALIFIER void scale_kernel(float* out, const float* in) {
    out[TILE_INDEX] = in[TILE_INDEX] * SCALE;
}
"""
SCALE_H = "#pragma once\n#ifndef SCALE\n#define SCALE 1.0f\n#endif\n"
TILE_H = "#pragma once\n#define TILE_INDEX 0\n"


@dataclass
class DemoResult:
    workdir: str
    compiler: str
    records: list[CompileRecord]


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def run_demo(workdir: str | None = None, say: Callable[[str], None] = print,
             compiler: str = "auto") -> DemoResult:
    """Compile the example twice through the shim and return what was recorded."""
    workdir = workdir or tempfile.mkdtemp(prefix="cacheaudit-demo-")
    masq = os.path.join(workdir, "shims")
    install_masquerade(masq)
    src = os.path.join(workdir, "src")
    _write(os.path.join(src, "kernel.cu"), KERNEL)
    _write(os.path.join(src, "scale.h"), SCALE_H)
    _write(os.path.join(workdir, "include", "tiles", "tile.h"), TILE_H)
    ledger_path = os.path.join(workdir, "ledger.db")
    env = dict(os.environ, CACHEAUDIT_LEDGER=ledger_path,
               PATH=os.pathsep.join([masq, os.environ.get("PATH", os.defpath)]))
    for variable in ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS", "CPATH", "CPLUS_INCLUDE_PATH"):
        env.pop(variable, None)
    include = os.path.join(workdir, "include")
    if compiler == "auto":
        compiler = "nvcc" if shutil.which("nvcc", path=env["PATH"]) else "g++"
    if compiler == "nvcc":
        base = ["nvcc", "-cubin", "-arch=sm_90", "-DSCALE_QUALIFIER=__global__", f"-I{include}",
                "kernel.cu", "-o"]
        steps = [("first build", {}, "kernel.cubin"),
                 ("NVCC_APPEND_FLAGS=-DSCALE=2.0f", {"NVCC_APPEND_FLAGS": "-DSCALE=2.0f"},
                  "kernel.cubin")]
    else:
        other = os.path.join(workdir, "other-include")
        _write(os.path.join(other, "tiles", "tile.h"), "#pragma once\n#define TILE_INDEX 1\n")
        base = ["g++", "-x", "c++", "-shared", "-fPIC", "-DSCALE_QUALIFIER=", "kernel.cu", "-o"]
        steps = [("first build", {"CPATH": include}, "kernel.so"),
                 ("CPATH pointed elsewhere", {"CPATH": other}, "kernel.so")]
    for label, extra, output in steps:
        say(f"$ {label}: {' '.join(base)} {output}")
        done = subprocess.run([*base, output], cwd=src, env=dict(env, **extra),
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"the demo compile failed:\n{done.stderr}")
    with Ledger.open(ledger_path) as ledger:
        ingest_spool(ledger)
        records = ledger.records()
    return DemoResult(workdir=workdir, compiler=compiler, records=records)
