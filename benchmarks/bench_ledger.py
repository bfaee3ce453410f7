"""The ledger at scale: records written in batches, and one kernel's history read back, at
10^4, 10^5 and 10^6 records (10^6 not in a quick run).

Budgets (issue 16, DESIGN.md): at least 50,000 records/s written in batches; one kernel's history
(`cacheaudit report --kernel K`: the newest 50 of its records and their count) in under 10 ms;
a hit record under 200 bytes (the ledger file's size over its records, indexes included, after
the close's checkpoint; a compile's bytes are reported beside it, with no budget).

Two shapes of record, both as observers write them:

- hits: a disk hit of a DeepJIT entry (runtime, kernel, key, entry; no files of its own), what
  a ledger of a long-lived fleet is mostly made of: every process that loads a kernel adds one;
- compiles: a compile of a kernel with its own source and binary (two file states, two small
  graphs of their own) and the include graph every kernel shares.

The baseline of each write is the floor: SQLite inserting the same rows, prepared beforehand,
into a table of the same columns with no index, in the same batches (what storing the records
costs before any interning or indexing). The read is timed against its budget. Peak RSS is
the benchmark process's (`resource.getrusage`), after each size.
"""

from __future__ import annotations

import glob
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

import xxhash

from benchmarks._harness import Ratio, peak_rss_mib, quick, report
from cacheaudit.ledger import Ledger, RunInfo, new_record_id
from cacheaudit.ledger.batching import chunked
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    GraphFile,
    IncludeGraph,
)

WRITE_BUDGET_PER_S = 50_000
READ_BUDGET_S = 0.010
HIT_BYTES_BUDGET = 200
KERNELS = 1_000
"""Distinct kernel names: a million records is a thousand records of each kernel's history."""

COMPILER = CompilerIdentity(
    invoked="nvcc", path="/usr/local/bin/nvcc", resolved="/usr/local/cuda/bin/nvcc", kind="nvcc",
    version_text="Cuda compilation tools, release 13.0, V13.0.88\n", digest="0" * 32)
SHARED_GRAPH = IncludeGraph(tuple(
    GraphFile(FileState(f"/opt/cutlass/include/cute/h{i}.hpp", True, 1000 + i, 1, 1, i,
                        xxhash.xxh3_128_hexdigest(str(i).encode())),
              f"/opt/cutlass/include/cute/h{i}.hpp") for i in range(200)), "nvcc -M")
FLAGS = (ArgToken("--include-path=/opt/cutlass/include"), ArgToken("-std=c++20"),
         ArgToken("--gpu-architecture=sm_90a"))
START_NS = 1_750_000_000_000_000_000


def hit_records(start: int, count: int) -> Iterator[CompileRecord]:
    for n in range(start, start + count):
        kernel = n % KERNELS
        key = xxhash.xxh3_128_hexdigest(str(kernel).encode())
        yield CompileRecord(
            record_id=new_record_id(), event="disk-hit", started_ns=START_NS + n * 1000,
            runtime="deepjit", kernel=f"gemm_{kernel}", key=key,
            entry=f"/cache/deep_gemm/cache/kernel.gemm_{kernel}.{key}", pid=1000 + n // 100,
            host="node0", observer="adapter:deepjit")


def compile_records(start: int, count: int) -> Iterator[CompileRecord]:
    for n in range(start, start + count):
        kernel = n % KERNELS
        digest = xxhash.xxh3_128_hexdigest(str(n).encode())
        yield CompileRecord(
            record_id=new_record_id(), event="compile", started_ns=START_NS + n * 1000,
            runtime="deepjit", kernel=f"gemm_{kernel}", key=digest,
            entry=f"/cache/deep_gemm/cache/kernel.gemm_{kernel}.{digest}", compiler=COMPILER,
            effective_argv=FLAGS, env={"DG_JIT_DEBUG": "0"},
            sources=(FileState(f"/tmp/dg/{n}/kernel.cu", True, 600, n, n, n, digest),),
            graph=SHARED_GRAPH, exit_code=0, duration_ns=3_000_000_000, pid=1000 + n // 100,
            host="node0", observer="shim:nvcc",
            outputs=(FileState(f"/tmp/dg/{n}/kernel.cubin", True, 60_000, n, n, n,
                               digest[::-1]),))


SHAPES = {"hits": hit_records, "compiles": compile_records}


def _floor_rows(records: Iterable[CompileRecord]) -> Iterator[tuple[object, ...]]:
    return ((r.record_id, r.event, r.runtime, r.kernel, r.key, r.entry, r.started_ns,
             r.duration_ns, r.pid, r.host, r.observer,
             r.sources[0].path if r.sources else None, r.sources[0].digest if r.sources else None,
             r.outputs[0].path if r.outputs else None, r.outputs[0].digest if r.outputs else None)
            for r in records)


def floor_write(path: str, records: Iterable[CompileRecord], batch: int) -> float:
    """Seconds for bare SQLite to take the same values, batch by batch, unindexed (the time
    to make the records is not counted)."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute(f"CREATE TABLE records ({', '.join(f'c{i}' for i in range(15))})")
    seconds = 0.0
    for part in chunked(records, batch):
        rows = list(_floor_rows(part))
        start = time.perf_counter()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(f"INSERT INTO records VALUES ({', '.join('?' * 15)})", rows)
        conn.execute("COMMIT")
        seconds += time.perf_counter() - start
    conn.close()
    return seconds


def ledger_write(path: str, records: Iterable[CompileRecord], batch: int) -> float:
    """Seconds for `add_records_in_batches`, batch by batch (making the records not counted:
    each batch is made before its clock starts)."""
    seconds = 0.0
    with Ledger.open(path) as ledger:
        run = RunInfo(run_uuid="bench", label="bench")
        for part in chunked(records, batch):
            start = time.perf_counter()
            ledger.add_records_in_batches(part, run, batch_size=batch)
            seconds += time.perf_counter() - start
    return seconds


def history_read(path: str, kernels: int = 20) -> tuple[float, int]:
    """The median time of one kernel's history as `cacheaudit report --kernel` reads it, in a
    ledger opened once (the first read, which loads the shared parts, is not counted)."""
    samples, shown = [], 0
    with Ledger.open(path, create=False) as ledger:
        ledger.recent_records(kernel="gemm_0", limit=50)
        for n in range(1, kernels + 1):
            start = time.perf_counter()
            found = ledger.recent_records(kernel=f"gemm_{n * 37 % KERNELS}", limit=50)
            ledger.count_records(kernel=f"gemm_{n * 37 % KERNELS}")
            samples.append(time.perf_counter() - start)
            shown = len(found)
    return statistics.median(samples), shown


def main(quick_run: bool | None = None, batch: int = 10_000) -> None:
    is_quick = quick() if quick_run is None else quick_run
    sizes = [10_000, 100_000] if is_quick else [10_000, 100_000, 1_000_000]
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-ledger-")
    ratios, facts = [], {"batch": batch, "kernels": KERNELS}
    curves: dict[str, dict[str, Any]] = {
        "ledger writes": {"x": "records", "y": "records/s", "points": [],
                          "budget": WRITE_BUDGET_PER_S},
        "ledger history read": {"x": "records", "y": "ms", "points": [],
                                "budget": READ_BUDGET_S * 1e3},
        "ledger peak RSS": {"x": "records", "y": "MiB", "points": []},
        "ledger bytes a record": {"x": "records", "y": "bytes", "points": [],
                                  "budget": HIT_BYTES_BUDGET},
    }
    try:
        for shape, make in SHAPES.items():
            for size in sizes:
                base = os.path.join(workdir, f"{shape}-{size}")
                floor_s = floor_write(base + "-floor.db", make(0, size), batch)
                ours_s = ledger_write(base + ".db", make(0, size), batch)
                rate = size / ours_s
                read_s, shown = history_read(base + ".db")
                rss = peak_rss_mib()
                ratios.append(Ratio(f"{shape}: write {size:,} / bare SQLite, no index", ours_s,
                                    floor_s, budget=None))
                ratios.append(Ratio(f"{shape}: write {size:,}, time per record / 20 us",
                                    ours_s / size, 1 / WRITE_BUDGET_PER_S, budget=1.0))
                ratios.append(Ratio(f"{shape}: history of a kernel at {size:,} / 10 ms", read_s,
                                    READ_BUDGET_S, budget=1.0))
                per_record = os.path.getsize(base + ".db") / size
                ratios.append(Ratio(f"{shape}: bytes a record at {size:,} / 200 B", per_record,
                                    HIT_BYTES_BUDGET, budget=1.0 if shape == "hits" else None,
                                    unit="B"))
                facts[f"{shape} {size:,}"] = (
                    f"{rate:,.0f} records/s, history {read_s * 1e3:.2f} ms ({shown} shown),"
                    f" peak RSS {rss:.0f} MiB, file {per_record * size / 2**20:.0f} MiB")
                for curve, y in (("ledger writes", rate), ("ledger history read", read_s * 1e3),
                                 ("ledger peak RSS", rss), ("ledger bytes a record", per_record)):
                    curves[curve]["points"].append([size, y, shape])
                for leftover in glob.glob(base + "*"):
                    os.remove(leftover)
        report("ledger at scale", ratios, facts, curves=curves)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    import sys

    main(quick_run="--quick" in sys.argv)
