"""cuda.core's hit path with the adapter installed, against the same path without it.

`Program.compile(cache=...)` served from a FileStreamProgramCache (disk hit, budget: at most
1.05x the runtime alone) and from an InMemoryProgramCache (memory hit, no budget). Rounds of 100
calls alternate installed and not, so that load drift hits both sides alike; the figure is the
ratio of the medians.
"""

from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time

from benchmarks._harness import Ratio, report

SOURCE = 'extern "C" __global__ void k(int* o) { o[0] = 1; }\n'


def main(rounds: int = 200, calls: int = 100) -> None:
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-cuda-core-")
    os.environ["CACHEAUDIT_LEDGER"] = os.path.join(workdir, "ledger.db")
    try:
        from cuda.core import Program, ProgramOptions
        from cuda.core.utils import FileStreamProgramCache, InMemoryProgramCache

        from cacheaudit.runtimes.cuda_core.adapter import ADAPTER
    except ImportError as exc:
        sys.exit(f"needs cuda.core: {exc}")
    try:
        program = Program(SOURCE, "c++", options=ProgramOptions(arch="sm_90", name="kernel.cu"))
        disk = FileStreamProgramCache(os.path.join(workdir, "program-cache"))
        memory = InMemoryProgramCache()
        program.compile("cubin", cache=disk)
        program.compile("cubin", cache=memory)

        def per_call(cache: object) -> float:
            start = time.perf_counter()
            for _ in range(calls):
                program.compile("cubin", cache=cache)
            return (time.perf_counter() - start) / calls

        ratios = []
        for label, cache, budget in (("disk hit", disk, 1.05), ("memory hit", memory, None)):
            ours, bare = [], []
            for index in range(rounds):
                for installed in ((False, True) if index % 2 else (True, False)):
                    (ADAPTER.install if installed else ADAPTER.uninstall)()
                    (ours if installed else bare).append(per_call(cache))
            ADAPTER.uninstall()
            ratios.append(Ratio(f"cuda.core {label}, adapter / runtime alone",
                                statistics.median(ours), statistics.median(bare), budget))
        report("cuda.core program cache hits", ratios,
               {"rounds": rounds, "calls per round": calls})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
