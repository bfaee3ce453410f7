"""Profiling driver for `bench_scan`: builds (once) a DeepJIT cache of N entries sharing the
reference graph under a kept directory, then times a warm scan under cProfile or alone, with
its CPU time and the peak RSS. Not part of `python -m benchmarks`.

    python -m benchmarks.profile_scan DIR [N] [--profile] [--repeat K]
"""

from __future__ import annotations

import cProfile
import os
import pstats
import resource
import sys
import time

from benchmarks._harness import reference_graph
from benchmarks.bench_scan import build
from cacheaudit.audit import AuditOptions, scan
from cacheaudit.ledger import Ledger


def main(argv: list[str]) -> None:
    workdir, size = argv[0], int(argv[1]) if len(argv) > 1 and argv[1].isdigit() else 10_000
    root, ledger_path = os.path.join(workdir, "dj"), os.path.join(workdir, "ledger.db")
    if not os.path.exists(ledger_path):
        os.makedirs(workdir, exist_ok=True)
        build(workdir, 0, size, reference_graph(workdir))
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 1
    profiler = cProfile.Profile() if "--profile" in argv else None
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        if profiler is not None:
            profiler.enable()
        with Ledger.open(ledger_path) as ledger:
            result = scan([root], dict(os.environ), ledger=ledger,
                          options=AuditOptions(reconstruct=False))
        if profiler is not None:
            profiler.disable()
        print(f"{len(result.entries)} entries, {len(result.findings)} findings: wall "
              f"{time.perf_counter() - wall:.2f} s, cpu {time.process_time() - cpu:.2f} s, "
              f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB, "
              f"load {os.getloadavg()[0]:.1f}")
        del result
    if profiler is not None:
        stats = pstats.Stats(profiler).sort_stats("cumulative")
        stats.print_stats(45)
        stats.sort_stats("tottime").print_stats(35)


if __name__ == "__main__":
    main(sys.argv[1:])
