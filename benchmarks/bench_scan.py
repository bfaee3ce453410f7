"""`cacheaudit scan` over DeepJIT entries that share one CUTLASS include graph, at 10^3, 10^4
and 10^5 entries (10^3 only in a quick run).

Budgets (DESIGN.md, issue 16): under 2 s warm at 10,000 entries and under 10 s at 100,000, with
the cost linear in the entries: the seconds per entry at the largest size at most those at
10,000 (a fixed cost makes a small scan dearer per entry, never cheaper, so only growth beyond
linear can fail it). 1,000 entries have no budget of their own; its figure shows the fixed
cost. Memory bounded: peak RSS of this process after each size, which only grows.

The cache and the ledger are built synthetically but in the real formats: entry directories
as DeepJIT writes them (kernel.cu, kernel.cubin, meta.json, .committed), and one compile record
per entry holding the 873-file graph of the reference TU, captured from a real `nvcc -M` (or
`g++ -M`) run. The sizes grow one cache: the entries of 10^3 are among those of 10^4. "Warm"
is a later scan in a new auditor: the page cache and the ledger's seen-state memo are warm, no
in-process memo is.

Baseline: the floor any scan pays, interleaved with the warm scans (A B A B): walking the
same entry directories and reading every file in them (`os.scandir`, `open`, `read`).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import xxhash

from benchmarks._harness import (
    Ratio,
    interleaved_samples,
    peak_rss_mib,
    quick,
    reference_graph,
    report,
)
from cacheaudit.audit import AuditOptions, scan
from cacheaudit.ledger import Ledger, RunInfo, new_record_id
from cacheaudit.model import ArgToken, CompileRecord, CompilerIdentity, FileState, IncludeGraph

BUDGET_S = 10.0
"""Seconds for a warm scan of 100,000 entries."""
BUDGETS_S = {10_000: 2.0, 100_000: BUDGET_S}
"""Seconds for a warm scan, by entries (DESIGN.md's performance budgets)."""


def build(workdir: str, start: int, count: int,
          shared: tuple[IncludeGraph, str] | None = None) -> tuple[str, str]:
    """Entries `start` .. `start + count` of the cache under `workdir` and their records."""
    graph, include = shared if shared is not None else reference_graph(workdir)
    root = os.path.join(workdir, "dj")
    compiler = CompilerIdentity(invoked="nvcc", path="/usr/local/bin/nvcc",
                                resolved="/usr/local/cuda/bin/nvcc", kind="nvcc",
                                version_text="Cuda compilation tools, release 13.0, V13.0.88\n",
                                digest="0" * 32)
    options = {"arch": "90a", "optimize_level": "3", "use_fast_math": False,
               "ptxas_verbose": False, "ptxas_register_usage_level": 10,
               "check_no_spills": False, "check_no_local_memory": False,
               "with_line_info": False, "dump_ptx": False, "dump_sass": False,
               "nvcc_flags": ["-std=c++20"], "extra_nvcc_flags": [], "post_hook": None}
    meta = json.dumps({
        "command": f"nvcc {root}/tmp/x/kernel.cu --cubin --output-file "
                   f"{root}/tmp/x/kernel.cubin --include-path {include}",
        "config": {"python_library_root": workdir, "extra_signature": "",
                   "include_dirs": [include], "include_prefixes": ["deep_gemm/"]},
        "compiler_info": {"path": compiler.path, "version": compiler.version_text},
        "compiler_options": options})
    flags = (ArgToken(f"--include-path={include}"),)

    def records() -> Iterator[CompileRecord]:
        for n in range(start, start + count):
            tag, key = f"gemm_{n}", xxhash.xxh3_128_hexdigest(str(n).encode())
            entry = os.path.join(root, "cache", f"{tag}.{key}")
            # The compile starts before its binary is written: a scan ties an entry only to a
            # compile that started before the entry was published.
            started_ns = time.time_ns()
            os.makedirs(entry)
            source = f"#include <cute/tensor.hpp>\n// kernel {n}\nint k{n};\n"
            binary = f"ELF cubin of kernel {n}".encode()
            for name, body in (("kernel.cu", source.encode()), ("kernel.cubin", binary),
                               ("meta.json", meta.encode()), (".committed", b"")):
                with open(os.path.join(entry, name), "wb") as handle:
                    handle.write(body)
            yield CompileRecord(
                record_id=new_record_id(), event="compile", started_ns=started_ns,
                compiler=compiler, effective_argv=flags,
                sources=(FileState(os.path.join(root, "tmp", "x", "kernel.cu"), True,
                                   len(source), 1, 1, n,
                                   xxhash.xxh3_128_hexdigest(source.encode())),),
                graph=graph, exit_code=0, observer="bench",
                outputs=(FileState(os.path.join(root, "tmp", "x", "kernel.cubin"), True,
                                   len(binary), 1, 1, n, xxhash.xxh3_128_hexdigest(binary)),))

    ledger_path = os.path.join(workdir, "ledger.db")
    with Ledger.open(ledger_path) as ledger:
        ledger.add_records_in_batches(records(), RunInfo(run_uuid="bench", label="bench"))
    return root, ledger_path


def bare_walk(root: str) -> int:
    """The floor: every entry directory listed and every file in it read."""
    count = 0
    with os.scandir(os.path.join(root, "cache")) as entries:
        for entry in entries:
            with os.scandir(entry.path) as files:
                for item in files:
                    with open(item.path, "rb") as handle:
                        handle.read()
            count += 1
    return count


def timed_scan(root: str, ledger_path: str) -> tuple[float, int, int]:
    # The identity of the recorded compiler is looked up once; keep it out of the loop by
    # scanning in an environment where the path does not resolve differently.
    start = time.perf_counter()
    with Ledger.open(ledger_path) as ledger:
        result = scan([root], dict(os.environ), ledger=ledger,
                      options=AuditOptions(reconstruct=False))
    return time.perf_counter() - start, len(result.entries), len(result.findings)


def main(quick_run: bool | None = None) -> None:
    is_quick = quick() if quick_run is None else quick_run
    sizes = [1_000] if is_quick else [1_000, 10_000, 100_000]
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-scan-")
    ratios, facts = [], {}
    curves: dict[str, dict[str, Any]] = {
        "scan warm": {"x": "entries", "y": "seconds", "points": [], "budget": None},
        "scan per entry": {"x": "entries", "y": "ms per entry", "points": [], "log": False,
                           "budget": BUDGET_S / 100_000 * 1e3},
        "scan peak RSS": {"x": "entries", "y": "MiB", "points": []},
    }
    try:
        shared = reference_graph(workdir)
        built, root, ledger_path = 0, "", ""
        per_entry: dict[int, float] = {}
        for size in sizes:
            started = time.perf_counter()
            root, ledger_path = build(workdir, built, size - built, shared)
            build_s, built = time.perf_counter() - started, size
            first, entries, findings = timed_scan(root, ledger_path)
            warm_samples, walk_samples = interleaved_samples(
                lambda r=root, p=ledger_path: timed_scan(r, p), lambda r=root: bare_walk(r),
                repeat=3 if size < 100_000 else 2, warmup=0)
            warm = statistics.median(warm_samples)
            rss = peak_rss_mib()
            ratios.append(Ratio.from_pairs(f"warm scan of {size:,} / bare walk and read",
                                           warm_samples, walk_samples, budget=None))
            if size in BUDGETS_S:
                ratios.append(Ratio(f"warm scan of {size:,} / {BUDGETS_S[size]:g} s", warm,
                                    BUDGETS_S[size], budget=1.0))
            per_entry[size] = warm / size
            facts[f"{size:,} entries"] = (
                f"warm {warm:.2f} s ({warm / size * 1e3:.3f} ms an entry), first {first:.2f} s,"
                f" {findings} findings over {entries} entries, peak RSS {rss:.0f} MiB,"
                f" built in {build_s:.1f} s")
            curves["scan warm"]["points"].append([size, warm])
            curves["scan per entry"]["points"].append([size, warm / size * 1e3])
            curves["scan peak RSS"]["points"].append([size, rss])
        if 10_000 in per_entry and max(per_entry) > 10_000:
            largest = max(per_entry)
            ratios.append(Ratio(f"seconds an entry at {largest:,} / at 10,000 (linear: at most"
                                " 1)", per_entry[largest], per_entry[10_000], budget=1.0))
        report("scan of entries sharing one graph", ratios, facts, curves=curves)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(quick_run="--quick" in sys.argv)
