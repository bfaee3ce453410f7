"""Start-up costs, each against a bare `python -c pass` (whole processes, interleaved A B A B
after a warm-up; the medians of each side):

- the hook on inside a session (`CACHEAUDIT=1` with the environment a session prepared, as every
  Python process below `cacheaudit run` or `pytest --cacheaudit` has it): budget +10 ms;
- the hook on with no session above it (`CACHEAUDIT=1 python -c pass`): the process prepares
  the session (the shims, the compiler settings) and starts the observer of the cache
  entries' opens; reported against the same +10 ms;
- `import cacheaudit`: budget +50 ms;
- `cacheaudit --help`: budget 150 ms in all, the interpreter's start included;
- pytest's start-up with the plugin on (`pytest --cacheaudit --collect-only` of one test)
  against without it, for the record (the 200-test figure is `bench_pytest_plugin`).

The budgets in milliseconds become ratio budgets of the same run's baseline, so that the
report says "within budget" or "OVER BUDGET" on its own.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping

from benchmarks._harness import Ratio, interleaved, report

_OURS = ("CACHEAUDIT", "DG_", "DJ_", "EP_", "NVCC_", "PYTEST_")


def _clean(env: Mapping[str, str], **extra: str) -> dict[str, str]:
    # Without PYTHONDONTWRITEBYTECODE: the warm-up writes the bytecode a user's install has.
    clean = {k: v for k, v in env.items() if not k.startswith(_OURS)
             and k not in ("CXX", "CC", "PYTHONDONTWRITEBYTECODE")}
    clean.update(extra)
    return clean


def _process(argv: list[str], env: Mapping[str, str], cwd: str) -> Callable[[], None]:
    def run() -> None:
        subprocess.run(argv, env=dict(env), cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)

    return run


def _cli() -> list[str]:
    """The console script beside this interpreter (what a user runs), else `-m cacheaudit`."""
    script = os.path.join(os.path.dirname(sys.executable), "cacheaudit")
    if os.path.isfile(script):
        return [sys.executable, script]
    return [sys.executable, "-m", "cacheaudit"]


def _within_ms(name: str, ours: float, baseline: float, added_ms: float) -> Ratio:
    """`ours` may add `added_ms` to `baseline`: the ratio budget of this run."""
    return Ratio(name, ours, baseline, budget=(baseline + added_ms / 1e3) / baseline)


def main(repeat: int = 15) -> None:
    from cacheaudit.session import prepare

    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-startup-")
    try:
        base = _clean(os.environ, CACHEAUDIT_LEDGER=os.path.join(workdir, "ledger.db"),
                      XDG_CACHE_HOME=os.path.join(workdir, "xdg"),
                      TMPDIR=workdir)
        session = prepare(base, ledger=base["CACHEAUDIT_LEDGER"], label="bench")
        inside = dict(session.env)
        root = dict(base, CACHEAUDIT="1")
        bare = _process([sys.executable, "-c", "pass"], base, workdir)
        with open(os.path.join(workdir, "test_one.py"), "w", encoding="utf-8") as handle:
            handle.write("def test_one():\n    pass\n")
        pytest = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                  "--collect-only", "test_one.py"]

        ratios = []
        ours, baseline = interleaved(_process([sys.executable, "-c", "pass"], inside, workdir),
                                     bare, repeat=repeat)
        ratios.append(_within_ms("hook on inside a session / python -c pass", ours, baseline,
                                 10))
        ours, baseline = interleaved(_process([sys.executable, "-c", "pass"], root, workdir),
                                     bare, repeat=repeat)
        ratios.append(_within_ms("hook on, its own session (CACHEAUDIT=1) / python -c pass",
                                 ours, baseline, 10))
        ours, baseline = interleaved(
            _process([sys.executable, "-c", "import cacheaudit"], base, workdir), bare,
            repeat=repeat)
        ratios.append(_within_ms("python -c 'import cacheaudit' / python -c pass", ours,
                                 baseline, 50))
        ours, baseline = interleaved(_process([*_cli(), "--help"], base, workdir), bare,
                                     repeat=repeat)
        ratios.append(Ratio("cacheaudit --help / python -c pass", ours, baseline,
                            budget=0.150 / baseline))
        ours, baseline = interleaved(_process([*pytest, "--cacheaudit"], base, workdir),
                                     _process(pytest, base, workdir), repeat=max(repeat // 3, 3))
        ratios.append(Ratio("pytest --cacheaudit --collect-only / pytest --collect-only", ours,
                            baseline, budget=None))
        session.close()
        report("start-up of the hook, the CLI and the pytest plugin", ratios,
               {"runs each": repeat, "python": sys.version.split()[0],
                "load average": " ".join(f"{v:.2f}" for v in os.getloadavg()),
                "budgets": "hook +10 ms, import +50 ms, --help 150 ms in all"})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 15)
