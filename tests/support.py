"""Helpers shared by the tests: toolchain probes that say why they skip, the shim harness."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.model import CompileRecord

NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")
GCC = shutil.which("gcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: nvcc checks skipped")
needs_gxx = pytest.mark.skipif(GXX is None or GCC is None, reason="g++/gcc is not on PATH")


@dataclass
class ShimEnv:
    """A masquerade directory first on PATH and a private ledger, for real shim subprocesses."""

    bin: Path
    ledger: Path
    env: dict[str, str]

    def run(self, argv: list[str], *, cwd: Path, env: Mapping[str, str] | None = None,
            **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        merged = dict(self.env)
        merged.update(env or {})
        return subprocess.run(argv, cwd=cwd, env=merged, capture_output=True, timeout=300,
                              **kwargs)  # type: ignore[call-overload]

    def bare_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The same environment without the shim on PATH."""
        env = dict(self.env)
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                      if p != str(self.bin))
        env.update(extra or {})
        return env

    def records(self) -> list[CompileRecord]:
        from cacheaudit.ledger import Ledger, ingest_spool

        with Ledger.open(str(self.ledger)) as ledger:
            ingest_spool(ledger)
            return ledger.records()


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "NVCC_", "PYTEST_")) and k not in (
               "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")}
    env["CACHEAUDIT_LEDGER"] = str(tmp_path / "ledger.db")
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


class Blocked(Exception):
    """Raised by `deadline`; not an OSError, which the code under test may rightly catch."""


@contextlib.contextmanager
def deadline(seconds: int = 30) -> Iterator[None]:
    """Fail, instead of hanging the suite, when a read blocks (a FIFO opened without a writer)."""
    def expired(signum: int, frame: Any) -> None:
        # Re-armed: code that swallows the first interruption must not block forever after it.
        signal.alarm(1)
        raise Blocked(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def deepgemm_library(tmp_path: Path) -> Path:
    """A DeepGEMM-2.x-like installed tree: `deep_gemm/include/deep_gemm/common.cuh` (tracked)
    including `cute/tile.hpp` (in no key), the tile dated five seconds back so that an edit in
    the test moves its mtime."""
    library = tmp_path / "deep_gemm"
    (library / "include" / "deep_gemm").mkdir(parents=True)
    (library / "include" / "cute").mkdir(parents=True)
    (library / "include" / "deep_gemm" / "common.cuh").write_text(
        "#pragma once\n#include <cute/tile.hpp>\n#define DG_VALUE 1\n")
    tile = library / "include" / "cute" / "tile.hpp"
    tile.write_text("#pragma once\n#define TILE_VALUE 10\n")
    stamp = time.time_ns() - 5_000_000_000
    os.utime(tile, ns=(stamp, stamp))
    return library


# ------------------------------------------------------------------ the reliability suite's figures

FIGURES_DIR = Path(__file__).resolve().parent.parent / ".reliability"
"""Where reliability tests leave their figures (one JSON file per case, any xdist worker);
tests/conftest.py writes docs/reliability.md from them when the session ends."""


def reliability_figure(section: str, case: str, **figures: Any) -> None:
    """Keep the figures of one reliability case (writers, records, kills, faults, fuzz inputs,
    leaks: whatever the case counted) for docs/reliability.md. `section` groups cases in the
    document ("concurrency", "kills", "faults", "fuzzing", ...); `case` names what was tried,
    as a person would read it. A later run of the same case replaces its figures."""
    import json
    import re

    FIGURES_DIR.mkdir(exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{section}--{case}")[:180]
    path = FIGURES_DIR / f"{name}.json"
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"section": section, "case": case, "figures": figures,
                                     "recorded": time.time()}, default=str))
    os.replace(temporary, path)
