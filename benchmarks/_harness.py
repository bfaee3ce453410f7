"""Timing helpers shared by the benchmarks: interleaved runs, medians with their spread, and
the reports that `python -m benchmarks` gathers into one table and one JSON.

A benchmark module calls `interleaved` (contender and baseline alternating, after a warm-up),
builds `Ratio`s from what it returns, and hands them to `report`. Run alone
(`python -m benchmarks.bench_verify`) a report is printed and written under benchmarks/results/;
under the runner it is also collected for the run's table (`configure`, `collected`).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cacheaudit.model import IncludeGraph

RESULTS = os.path.join(os.path.dirname(__file__), "results")

_settings: dict[str, Any] = {"quick": False, "results": RESULTS}
_collected: list[dict[str, Any]] = []

# The per-pair ratios of recent `interleaved` calls, by the two medians they returned: a
# `Ratio` built from those medians (`Ratio(name, *interleaved(...))`, as every module does)
# finds its spread here without a change to its call.
_pairs_by_medians: dict[tuple[float, float], list[float]] = {}


class Skipped(Exception):
    """A benchmark that cannot run here (a tool or package missing): the run goes on."""


def configure(*, quick: bool | None = None, results: str | None = None) -> None:
    """Set by the runner: `quick` (fewer repeats, the smaller sizes) and the results folder."""
    if quick is not None:
        _settings["quick"] = quick
    if results is not None:
        _settings["results"] = results


def quick() -> bool:
    """Whether this run is a quick one (`python -m benchmarks --quick`)."""
    return bool(_settings["quick"])


def results_dir() -> str:
    return str(_settings["results"])


def collected() -> list[dict[str, Any]]:
    """The reports made in this process so far, as written to JSON."""
    return list(_collected)


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return (values[0], values[0]) if values else (float("nan"), float("nan"))
    low, _median, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, high


@dataclass
class Ratio:
    """Contender over baseline: the medians, and the spread of the per-pair ratios (each A over
    the B run beside it) when the figure comes from interleaved pairs."""

    name: str
    ours_s: float
    baseline_s: float
    budget: float | None
    q1: float | None = None
    """The first quartile of the per-pair ratios (None: no pairs known)."""
    q3: float | None = None
    low: float | None = None
    """The smallest per-pair ratio."""
    high: float | None = None
    pairs: int = 0
    unit: str = "s"
    """What `ours_s` and `baseline_s` hold: seconds (shown as ms), or another unit shown as is
    (a rate, a size) when the figure is not a time."""
    per_pair: list[float] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.per_pair:
            self.per_pair = list(_pairs_by_medians.get((self.ours_s, self.baseline_s), ()))
        if self.per_pair and self.q1 is None:
            self.q1, self.q3 = _quartiles(self.per_pair)
            self.low, self.high = min(self.per_pair), max(self.per_pair)
            self.pairs = len(self.per_pair)

    @classmethod
    def from_pairs(cls, name: str, ours: Sequence[float], baseline: Sequence[float],
                   budget: float | None) -> Ratio:
        """From the samples of interleaved runs, paired in order."""
        per_pair = [a / b for a, b in zip(ours, baseline, strict=True) if b > 0]
        return cls(name, statistics.median(ours), statistics.median(baseline), budget,
                   per_pair=per_pair)

    @property
    def ratio(self) -> float:
        return self.ours_s / self.baseline_s

    @property
    def verdict(self) -> str:
        if self.budget is None:
            return "info"
        return "within budget" if self.ratio <= self.budget else "OVER BUDGET"

    def spread(self) -> str:
        if self.q1 is None or self.q3 is None:
            return ""
        return (f"IQR {self.q1:.3f}..{self.q3:.3f}, min..max {self.low:.3f}..{self.high:.3f},"
                f" {self.pairs} pairs")

    def _value(self, value: float) -> str:
        return f"{value * 1e3:10.2f} ms" if self.unit == "s" else f"{value:10.4g} {self.unit}"

    def line(self) -> str:
        budget = f"budget {self.budget:.2f}x" if self.budget else "no budget"
        spread = f" [{self.spread()}]" if self.q1 is not None else ""
        return (f"{self.name:<58} {self._value(self.ours_s)} / {self._value(self.baseline_s)}"
                f" = {self.ratio:5.3f}x{spread}  ({budget}: {self.verdict})")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("per_pair")
        return dict(data, ratio=self.ratio, verdict=self.verdict)


def median_time(action: Callable[[], object], repeat: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        action()
    samples = []
    for _ in range(repeats(repeat)):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def repeats(repeat: int) -> int:
    """`repeat`, or a fifth of it (at least 3) in a quick run."""
    return max(3, repeat // 5) if quick() else repeat


def interleaved_samples(ours: Callable[[], object], baseline: Callable[[], object], repeat: int,
                        warmup: int = 1) -> tuple[list[float], list[float]]:
    """The times of alternating runs (B A B A ... after `warmup` of each), in pairs."""
    for _ in range(warmup):
        baseline()
        ours()
    ours_samples: list[float] = []
    base_samples: list[float] = []
    for index in range(repeats(repeat)):
        # Which side goes first alternates too: a side that always ran second would always
        # find the caches the other left warm.
        order = ((baseline, base_samples), (ours, ours_samples))
        for action, samples in (order if index % 2 == 0 else order[::-1]):
            start = time.perf_counter()
            action()
            samples.append(time.perf_counter() - start)
    return ours_samples, base_samples


def interleaved(ours: Callable[[], object], baseline: Callable[[], object], repeat: int,
                warmup: int = 1) -> tuple[float, float]:
    """Medians of alternating runs, so that drift in machine load hits both sides alike; a
    `Ratio` made of the two medians carries the spread of the per-pair ratios."""
    ours_samples, base_samples = interleaved_samples(ours, baseline, repeat, warmup)
    medians = (statistics.median(ours_samples), statistics.median(base_samples))
    _pairs_by_medians[medians] = [a / b for a, b in zip(ours_samples, base_samples, strict=True)
                                  if b > 0]
    return medians


def peak_rss_mib() -> float:
    """This process's peak resident set so far, in MiB (Linux reports KiB, macOS bytes)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def report(title: str, ratios: list[Ratio], facts: dict[str, object] | None = None, *,
           curves: dict[str, dict[str, Any]] | None = None) -> None:
    """Print a benchmark's figures and write them as JSON under the results folder.

    `curves` names growth curves for the plots: name -> {"x": label, "y": label, "points":
    [[x, y], ...], "budget": y or None, "log": bool}."""
    print(f"\n== {title} ==")
    for fact, value in (facts or {}).items():
        print(f"   {fact}: {value}")
    for ratio in ratios:
        print("   " + ratio.line())
    data = {"title": title, "machine": platform.platform(), "cpus": os.cpu_count(),
            "facts": facts or {}, "ratios": [r.to_dict() for r in ratios],
            "curves": curves or {}}
    _collected.append(data)
    folder = results_dir()
    os.makedirs(folder, exist_ok=True)
    slug = title.lower().replace(" ", "-").replace("/", "-")
    with open(os.path.join(folder, f"{slug}.json"), "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, default=str)


def reference_graph(workdir: str) -> tuple[IncludeGraph, str]:
    """The include graph of the CUTLASS reference TU from the compiler's own `-M` pass (nvcc,
    else g++), with settled file states, and the CUTLASS include directory."""
    from cacheaudit.digest import StateCache
    from cacheaudit.graph import graph_from_depfile
    from fixtures import reference_tu

    include = reference_tu.cutlass_include()
    compiler = shutil.which("nvcc") or shutil.which("g++")
    if include is None or compiler is None:
        raise Skipped("needs the nvidia-cutlass wheel and nvcc (or g++)")
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
