"""`python -m benchmarks`: the runner's table and JSON, and the spread a Ratio carries. No
timed assertion: only what the run wrote and how the figures relate to each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks import _harness

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_ratio_of_interleaved_runs_carries_the_spread_of_its_pairs():
    calls: list[str] = []
    ratio = _harness.Ratio("b / a", *_harness.interleaved(
        lambda: calls.append("ours"), lambda: calls.append("base"), repeat=6, warmup=1),
        budget=None)
    # Warm-up B A, then six pairs, each side going first in turn.
    assert calls[:2] == ["base", "ours"]
    assert calls[2:6] == ["base", "ours", "ours", "base"]
    assert len(calls) == 14
    assert ratio.pairs == 6
    assert ratio.low <= ratio.q1 <= ratio.q3 <= ratio.high
    fields = ratio.to_dict()
    assert {"q1", "q3", "low", "high", "pairs", "ratio", "verdict"} <= set(fields)


def test_a_ratio_made_by_hand_has_no_spread():
    ratio = _harness.Ratio("x", 2.0, 1.0, budget=1.5)
    assert (ratio.q1, ratio.pairs, ratio.verdict) == (None, 0, "OVER BUDGET")
    assert "IQR" not in ratio.line()


@pytest.mark.slow
def test_the_runner_writes_the_table_and_a_json_with_the_environment(tmp_path):
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--only", "verify", "--results",
         str(results)], cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    run = json.loads((results / "results.json").read_text())
    env = run["environment"]
    for name in ("cpus", "load_average", "python", "g++", "nvcc", "torch", "triton",
                 "cacheaudit_rev", "when"):
        assert name in env, name
    assert env["cpus"] == os.cpu_count()
    assert run["quick"] is True
    [module] = run["modules"]
    assert module["module"] == "verify"
    if module["status"] == "skipped":  # no CUTLASS wheel or compiler here: said, not failed
        assert module["why"], module
        return
    assert module["status"] == "ok", module
    assert module["peak_rss_mib"] > 0
    [reported] = module["reports"]
    assert reported["title"] == "graph verification"
    for ratio in reported["ratios"]:
        assert ratio["pairs"] >= 3, ratio
        assert ratio["low"] <= ratio["q1"] <= ratio["q3"] <= ratio["high"], ratio
        assert ratio["ratio"] == pytest.approx(ratio["ours_s"] / ratio["baseline_s"])
    table = (results / "results.md").read_text()
    assert "| graph verification | verify, nothing changed / bare os.stat loop |" in table
    assert (results / "modules" / "verify.json").exists()


def test_an_unknown_benchmark_is_refused_with_the_names_there_are(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--only", "nosuch", "--results", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 2
    assert "no benchmark nosuch" in done.stderr and "ledger" in done.stderr
    assert not (tmp_path / "results.json").exists()
