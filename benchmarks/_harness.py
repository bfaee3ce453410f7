"""Timing helpers shared by the benchmarks: medians of repeated runs and ratio lines."""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from cacheaudit.digest import StateCache
from cacheaudit.graph import graph_from_depfile
from cacheaudit.model import IncludeGraph
from fixtures import reference_tu

RESULTS = os.path.join(os.path.dirname(__file__), "results")


@dataclass
class Ratio:
    name: str
    ours_s: float
    baseline_s: float
    budget: float | None

    @property
    def ratio(self) -> float:
        return self.ours_s / self.baseline_s

    @property
    def verdict(self) -> str:
        if self.budget is None:
            return "info"
        return "within budget" if self.ratio <= self.budget else "OVER BUDGET"

    def line(self) -> str:
        budget = f"budget {self.budget:.2f}x" if self.budget else "no budget"
        return (f"{self.name:<58} {self.ours_s * 1e3:10.2f} ms / {self.baseline_s * 1e3:10.2f} ms"
                f" = {self.ratio:5.3f}x  ({budget}: {self.verdict})")


def median_time(action: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        action()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def interleaved(ours: Callable[[], object], baseline: Callable[[], object], repeat: int,
                warmup: int = 1) -> tuple[float, float]:
    """Medians of alternating runs, so that drift in machine load hits both sides alike."""
    for _ in range(warmup):
        baseline()
        ours()
    ours_samples, base_samples = [], []
    for _ in range(repeat):
        for action, samples in ((baseline, base_samples), (ours, ours_samples)):
            start = time.perf_counter()
            action()
            samples.append(time.perf_counter() - start)
    return statistics.median(ours_samples), statistics.median(base_samples)


def report(title: str, ratios: list[Ratio], facts: dict[str, object] | None = None) -> None:
    print(f"\n== {title} ==")
    for fact, value in (facts or {}).items():
        print(f"   {fact}: {value}")
    for ratio in ratios:
        print("   " + ratio.line())
    os.makedirs(RESULTS, exist_ok=True)
    slug = title.lower().replace(" ", "-").replace("/", "-")
    with open(os.path.join(RESULTS, f"{slug}.json"), "w", encoding="utf-8") as handle:
        json.dump({"title": title, "machine": platform.platform(), "cpus": os.cpu_count(),
                   "facts": facts or {},
                   "ratios": [dict(asdict(r), ratio=r.ratio, verdict=r.verdict) for r in ratios]},
                  handle, indent=2)


def reference_graph(workdir: str) -> tuple[IncludeGraph, str]:
    """The include graph of the CUTLASS reference TU from the compiler's own `-M` pass (nvcc,
    else g++), with settled file states, and the CUTLASS include directory."""
    include = reference_tu.cutlass_include()
    compiler = shutil.which("nvcc") or shutil.which("g++")
    if include is None or compiler is None:
        sys.exit("needs the nvidia-cutlass wheel and nvcc (or g++)")
    source = reference_tu.write_source(workdir)
    depfile = os.path.join(workdir, "reference.d")
    flags = (reference_tu.nvcc_flags(include) if compiler.endswith("nvcc")
             else ["-std=c++17", "-x", "c++", "-D__CUDACC__", "-I", include])
    subprocess.run([compiler, *flags, "-M", "-MF", depfile, source], check=True,
                   capture_output=True)
    with open(depfile, encoding="utf-8") as handle:
        _sources, graph = graph_from_depfile(handle.read(), workdir, [source],
                                             StateCache(window_ns=0),
                                             f"{os.path.basename(compiler)} -M")
    return graph, include
