"""The pytest plugin's cost on a 200-test suite that compiles nothing, against the same suite
without it, in one run (whole `pytest` processes, interleaved; the median of each side).

The plugin's fixed costs are the session setup (a masquerade directory, the environment), one
environment change around each test, and the audit at the end; the figure says what they add to
a suite of quick tests. Budget: 1.05x. What bounds it is the import of what the session needs
before the first test (the session's compiler settings, the specs and their roots modules for
the observer, the ledger where one exists) and the audit package at the end: docs/pytest.md, "Cost".
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile

from benchmarks._harness import Ratio, interleaved, report

TESTS = "\n".join(f"def test_{n}():\n    assert {n} + 1 > {n}\n" for n in range(200))


def main(repeat: int = 11) -> None:
    """Eleven pairs: with five, one slow pair of these ~0.6 s sessions moved the ratio from
    0.92x to 1.18x between two quiet runs."""
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-pytest-")
    try:
        with open(os.path.join(workdir, "test_many.py"), "w", encoding="utf-8") as handle:
            handle.write(TESTS)
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_many.py"]
        # The budget's figure: no runtime's cache root (the temporary and cache directories are
        # the benchmark's own). Beside it, for the record, the same in this machine's own
        # environment, where a root that exists (an Inductor cache under $TMPDIR, say) makes
        # the session load that runtime's reader to watch its entries.
        isolated = dict(os.environ, CACHEAUDIT_LEDGER=os.path.join(workdir, "ledger.db"),
                        TMPDIR=workdir, XDG_CACHE_HOME=os.path.join(workdir, "xdg"))
        own = dict(os.environ, CACHEAUDIT_LEDGER=os.path.join(workdir, "own-ledger.db"))
        ratios = []
        for label, env, budget in (("pytest --cacheaudit / pytest", isolated, 1.05),
                                   ("the same with this machine's cache roots", own, None)):

            def bare(env: dict[str, str] = env) -> None:
                subprocess.run(base, cwd=workdir, env=env, check=True, capture_output=True)

            def plugin(env: dict[str, str] = env) -> None:
                subprocess.run([*base, "--cacheaudit"], cwd=workdir, env=env, check=True,
                               capture_output=True)

            ours, baseline = interleaved(plugin, bare, repeat=repeat)
            ratios.append(Ratio(label, ours, baseline, budget=budget))
        report("pytest plugin on 200 tests that compile nothing", ratios,
               {"tests": 200, "runs each": repeat,
                "load average": " ".join(f"{v:.2f}" for v in os.getloadavg())})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
