"""A small multi-kernel job for the `diff` tests: each kernel one real compile through the shim
(g++ or nvcc), its binary left in out/, the whole job recorded as one run of a ledger."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cacheaudit.model import content_digest

from support import ShimEnv

KERNELS = ("k1", "k2", "k3")

HEADER = "#pragma once\n#define SHARED_VALUE 7\n"

BODY = """\
#include <shared.h>
#include <own_{name}.h>
#ifndef X
#define X 0
#endif
"""

CPP = 'extern "C" int {name}_value() {{ return SHARED_VALUE + OWN_VALUE + X; }}\n'
CU = 'extern "C" __global__ void {name}(int* o) {{ o[0] = SHARED_VALUE + OWN_VALUE + X; }}\n'


@dataclass
class Job:
    """Sources under root/src, headers under root/inc, binaries into root/out."""

    root: Path
    compiler: str  # "g++" or "nvcc"

    def setup(self, kernels: Sequence[str] = KERNELS) -> None:
        (self.root / "inc").mkdir(parents=True, exist_ok=True)
        (self.root / "src").mkdir(exist_ok=True)
        (self.root / "out").mkdir(exist_ok=True)
        (self.root / "inc" / "shared.h").write_text(HEADER)
        for name in kernels:
            self.add_kernel(name)

    def add_kernel(self, name: str, own_value: int = 1) -> None:
        (self.root / "inc" / f"own_{name}.h").write_text(
            f"#pragma once\n#define OWN_VALUE {own_value}\n")
        text = BODY.format(name=name) + (CU if self.compiler == "nvcc" else CPP).format(
            name=name)
        (self.root / "src" / f"{name}.{'cu' if self.compiler == 'nvcc' else 'cpp'}").write_text(
            text)

    def binary(self, name: str) -> Path:
        return self.root / "out" / f"{name}.{'cubin' if self.compiler == 'nvcc' else 'o'}"

    def argv(self, name: str) -> list[str]:
        source = f"src/{name}.{'cu' if self.compiler == 'nvcc' else 'cpp'}"
        if self.compiler == "nvcc":
            return ["nvcc", "-cubin", "-arch=sm_90", "-Iinc", "-o", str(self.binary(name)),
                    source]
        return ["g++", "-c", "-O1", "-Iinc", "-o", str(self.binary(name)), source]

    def run(self, shim: ShimEnv, run_id: str, *, ledger: Path | None = None,
            kernels: Sequence[str] = KERNELS,
            env_for: Mapping[str, Mapping[str, str]] | None = None,
            prefix: Sequence[str] = ()) -> dict[str, str]:
        """One run of the job: every kernel compiled through the shim, in order, recorded under
        `run_id` in `ledger` (the shim's own by default). Returns each binary's digest as it
        lies on disk right after its compile (the ground truth)."""
        digests: dict[str, str] = {}
        for name in kernels:
            env = {"CACHEAUDIT_RUN": run_id, **(env_for or {}).get(name, {})}
            if ledger is not None:
                env["CACHEAUDIT_LEDGER"] = str(ledger)
            done = shim.run([*prefix, *self.argv(name)], cwd=self.root, env=env)
            assert done.returncode == 0, done.stderr.decode()
            digests[name] = content_digest(self.binary(name).read_bytes())
        return digests


def cacheaudit(env: Mapping[str, str], *args: str, cwd: Path
               ) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          env=dict(env), cwd=cwd, timeout=300)


def diff_json(env: Mapping[str, str], *args: str, cwd: Path, kind: str = "run-diff",
              exits: tuple[int, ...] = (0, 1)) -> tuple[int, dict[str, Any]]:
    from support import valid_document

    done = cacheaudit(env, "diff", *args, "--format", "json", cwd=cwd)
    assert done.returncode in exits, done.stderr.decode()
    return done.returncode, valid_document(done.stdout, kind)


def by_kernel(document: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {k["kernel"]: k for k in document["kernels"]}


def dumped(document: Any) -> str:
    return json.dumps(document, indent=1)


def clean(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k != "CACHEAUDIT_RUN"}


__all__ = ["KERNELS", "Job", "by_kernel", "cacheaudit", "clean", "diff_json", "dumped", "os"]
