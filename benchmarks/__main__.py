"""`python -m benchmarks`: every benchmarks/bench_*.py module's `main()`, one table, one JSON.

Each module runs in a process of its own (its imports, its peak memory and its failures stay
its own). A module that needs what is missing here (raises `Skipped`, exits with a message, or
cannot import a package) is reported as "skipped: why" and the run goes on. The results folder
gets `results.json` (every report, with the core count, the load and the tool versions),
`results.md` (the table) and one JSON per report.

    python -m benchmarks                       # everything
    python -m benchmarks --quick --only ledger # fewer repeats, the smaller sizes
    python -m benchmarks --plot                # the growth curves of the last run, as PNG
    python -m benchmarks --docs                # run all, then the table and PNGs into docs/
    python -m benchmarks --plot --docs         # the last run's table and PNGs into docs/
"""

from __future__ import annotations

import argparse
import datetime
import glob
import importlib
import inspect
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import traceback
from importlib import metadata
from typing import Any

from benchmarks import _harness

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DOCS = os.path.join(ROOT, "docs")


def discover() -> list[str]:
    """The benchmark modules' short names (bench_ledger.py -> ledger), sorted."""
    return sorted(os.path.basename(path)[len("bench_"):-len(".py")]
                  for path in glob.glob(os.path.join(HERE, "bench_*.py")))


def _first_line(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    # nvcc names its release on a later line; g++ and ccache on the first.
    releases = [line for line in lines if "release" in line]
    return (releases or lines or [None])[0]


def _package(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What the figures depend on: the machine, its load, and the tools' versions."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    rev = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return {
        "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg")
        else None,
        "machine": platform.platform(),
        "python": platform.python_version(),
        "g++": _first_line(["g++", "--version"]),
        "nvcc": _first_line(["nvcc", "--version"]),
        "ccache": _first_line([_ccache() or "ccache", "--version"]),
        "torch": _package("torch"),
        "triton": _package("triton"),
        "sqlite": __import__("sqlite3").sqlite_version,
        "cacheaudit": _package("cacheaudit"),
        "cacheaudit_rev": None if rev is None else rev + ("+dirty" if dirty else ""),
    }


def _ccache() -> str | None:
    """ccache along PATH, else the one a wheel put beside this Python (the `bench` extra)."""
    found = shutil.which("ccache")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "ccache")
    return beside if os.access(beside, os.X_OK) else None


def _call_main(module: Any) -> None:
    main = module.main
    if "quick" in inspect.signature(main).parameters:
        main(quick=_harness.quick())
    else:
        main()


def run_one(name: str, results: str, quick: bool) -> int:
    """Run one module's `main()` here (the runner's child) and write what came of it."""
    _harness.configure(quick=quick, results=results)
    started = time.perf_counter()
    outcome: dict[str, Any] = {"module": name, "status": "ok"}
    try:
        _call_main(importlib.import_module(f"benchmarks.bench_{name}"))
    except _harness.Skipped as exc:
        outcome.update(status="skipped", why=str(exc))
    except ModuleNotFoundError as exc:
        outcome.update(status="skipped", why=f"needs {exc.name}: {exc}")
    except SystemExit as exc:
        if exc.code in (None, 0):
            pass
        elif isinstance(exc.code, str):  # the modules' `sys.exit("needs ...")`
            outcome.update(status="skipped", why=exc.code)
        else:
            outcome.update(status="failed", why=f"exit status {exc.code}")
    except Exception as exc:  # noqa: BLE001 (a failed benchmark is reported; the run goes on)
        traceback.print_exc()
        outcome.update(status="failed", why=f"{type(exc).__name__}: {exc}")
    if outcome["status"] != "ok":
        print(f"\n== {name}: {outcome['status']}: {outcome['why']} ==")
    outcome.update(seconds=round(time.perf_counter() - started, 2),
                   peak_rss_mib=round(_harness.peak_rss_mib(), 1), reports=_harness.collected())
    os.makedirs(os.path.join(results, "modules"), exist_ok=True)
    with open(os.path.join(results, "modules", f"{name}.json"), "w", encoding="utf-8") as handle:
        json.dump(outcome, handle, indent=2, default=str)
    return 0


def _cell(value: float | None, digits: int = 3) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def table(run: dict[str, Any]) -> str:
    """The run as a Markdown table: one row per figure, then the modules that did not run."""
    env = run["environment"]
    lines = [f"Run of {env['when']} at {env['cacheaudit_rev']}, {env['cpus']} cores, load average"
             f" {env['load_average']} at the start{', quick' if run['quick'] else ''}.",
             "Tools: " + ", ".join(f"{k} {env[k]}" for k in
                                  ("python", "g++", "nvcc", "ccache", "torch", "triton", "sqlite")
                                  if env.get(k)) + ".", "",
             "| benchmark | figure | contender | baseline | ratio | spread (IQR; min..max)"
             " | budget | verdict |", "|---|---|---:|---:|---:|---|---:|---|"]
    notes = []
    for module in run["modules"]:
        if module["status"] != "ok":
            notes.append(f"- `{module['module']}`: {module['status']}: {module['why']}")
        for rep in module.get("reports", []):
            for r in rep["ratios"]:
                unit = r.get("unit", "s")

                def shown(value: float, unit: str = unit) -> str:
                    return f"{value * 1e3:.2f} ms" if unit == "s" else f"{value:,.4g} {unit}"

                spread = "" if r.get("q1") is None else (
                    f"{r['q1']:.3f}..{r['q3']:.3f}; {r['low']:.3f}..{r['high']:.3f}")
                budget = "" if r["budget"] is None else f"{r['budget']:.2f}x"
                lines.append(f"| {rep['title']} | {r['name']} | {shown(r['ours_s'])} |"
                             f" {shown(r['baseline_s'])} | {r['ratio']:.3f}x | {spread} |"
                             f" {budget} | {r['verdict']} |")
    if notes:
        lines += ["", "Not run:", *notes]
    return "\n".join(lines) + "\n"


def run_all(names: list[str], results: str, quick: bool) -> dict[str, Any]:
    os.makedirs(results, exist_ok=True)
    run: dict[str, Any] = {"environment": environment(), "quick": quick, "modules": []}
    for name in names:
        print(f"\n### {name}", flush=True)
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks", "--child", name, "--results", results,
             *(["--quick"] if quick else [])], cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=os.pathsep.join(
                p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)))
        try:
            with open(os.path.join(results, "modules", f"{name}.json"), encoding="utf-8") as f:
                outcome = json.load(f)
        except (OSError, ValueError):
            outcome = {"module": name, "status": "failed", "reports": [],
                       "why": f"its process ended with status {child.returncode}"}
        run["modules"].append(outcome)
    run["environment"]["load_average_end"] = (
        [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None)
    with open(os.path.join(results, "results.json"), "w", encoding="utf-8") as handle:
        json.dump(run, handle, indent=2, default=str)
    text = table(run)
    with open(os.path.join(results, "results.md"), "w", encoding="utf-8") as handle:
        handle.write(text)
    print("\n" + text)
    return run


def plot(run: dict[str, Any], folder: str) -> list[str]:
    """One PNG per growth curve of the run (matplotlib, the `bench` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("--plot needs matplotlib (pip install 'cacheaudit[bench]')", file=sys.stderr)
        return []
    os.makedirs(folder, exist_ok=True)
    written = []
    for module in run["modules"]:
        for rep in module.get("reports", []):
            for name, curve in rep.get("curves", {}).items():
                points = curve["points"]
                figure, axes = plt.subplots(figsize=(6, 4))
                for series, values in _series(points).items():
                    xs, ys = zip(*values, strict=True)
                    axes.plot(xs, ys, marker="o", label=series or None)
                if curve.get("budget") is not None:
                    axes.axhline(curve["budget"], color="red", linestyle="--", label="budget")
                if curve.get("log", True):
                    axes.set_xscale("log")
                    axes.set_yscale("log")
                axes.set_xlabel(curve["x"])
                axes.set_ylabel(curve["y"])
                axes.set_title(name)
                axes.grid(True, which="both", alpha=0.3)
                if axes.get_legend_handles_labels()[0]:
                    axes.legend()
                figure.tight_layout()
                path = os.path.join(folder, re.sub(r"[^a-z0-9]+", "-", name.lower()) + ".png")
                figure.savefig(path, dpi=100)
                plt.close(figure)
                written.append(path)
    return written


def _series(points: list[list[Any]]) -> dict[str, list[tuple[float, float]]]:
    """[[x, y], ...] is one series; [[x, y, "name"], ...] several, by name."""
    series: dict[str, list[tuple[float, float]]] = {}
    for point in points:
        series.setdefault(point[2] if len(point) > 2 else "", []).append((point[0], point[1]))
    return series


def write_docs(run: dict[str, Any]) -> None:
    """The table and the PNGs of `run` into docs/performance.md (between its markers) and
    docs/performance/."""
    pictures = plot(run, os.path.join(DOCS, "performance"))
    page = os.path.join(DOCS, "performance.md")
    with open(page, encoding="utf-8") as handle:
        text = handle.read()
    images = "\n".join(f"![{os.path.basename(p)[:-4]}](performance/{os.path.basename(p)})"
                       for p in sorted(pictures))
    block = f"<!-- results:begin -->\n{table(run)}\n{images}\n<!-- results:end -->"
    text = re.sub(r"<!-- results:begin -->.*<!-- results:end -->", lambda _m: block, text,
                  flags=re.S)
    with open(page, "w", encoding="utf-8") as handle:
        handle.write(text)
    print(f"wrote {page} and {len(pictures)} plots")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", metavar="NAME",
                        help="run only this benchmark (ledger or bench_ledger; repeatable)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer repeats and the smaller sizes only")
    parser.add_argument("--results", default=_harness.RESULTS, metavar="DIR",
                        help="where the table and the JSON go (default benchmarks/results)")
    parser.add_argument("--plot", action="store_true",
                        help="run nothing: plot the growth curves of DIR/results.json into"
                             " DIR/plots (with --docs: its table and plots into docs/)")
    parser.add_argument("--docs", action="store_true",
                        help="run, then write the table and the plots into docs/performance*")
    parser.add_argument("--list", action="store_true", help="name the benchmarks and stop")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    results = os.path.abspath(args.results)
    if args.child:
        return run_one(args.child, results, args.quick)
    known = discover()
    if args.list:
        print("\n".join(known))
        return 0
    if args.plot:
        with open(os.path.join(results, "results.json"), encoding="utf-8") as handle:
            run = json.load(handle)
        if args.docs:
            write_docs(run)
            return 0
        for path in plot(run, os.path.join(results, "plots")):
            print(f"wrote {path}")
        return 0
    names = known
    if args.only:
        wanted = [n.removeprefix("bench_").removesuffix(".py") for n in args.only]
        unknown = [n for n in wanted if n not in known]
        if unknown:
            parser.error(f"no benchmark {', '.join(unknown)} (there are: {', '.join(known)})")
        names = [n for n in known if n in wanted]
    run = run_all(names, results, args.quick)
    if args.docs:
        write_docs(run)
    else:
        for path in plot(run, os.path.join(results, "plots")) if _has_curves(run) else []:
            print(f"wrote {path}")
    return 1 if any(m["status"] == "failed" for m in run["modules"]) else 0


def _has_curves(run: dict[str, Any]) -> bool:
    return any(rep.get("curves") for m in run["modules"] for rep in m.get("reports", []))


if __name__ == "__main__":
    sys.exit(main())
