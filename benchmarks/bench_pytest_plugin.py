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


def main(repeat: int = 5) -> None:
    workdir = tempfile.mkdtemp(prefix="cacheaudit-bench-pytest-")
    try:
        with open(os.path.join(workdir, "test_many.py"), "w", encoding="utf-8") as handle:
            handle.write(TESTS)
        env = dict(os.environ, CACHEAUDIT_LEDGER=os.path.join(workdir, "ledger.db"))
        base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_many.py"]

        def bare() -> None:
            subprocess.run(base, cwd=workdir, env=env, check=True, capture_output=True)

        def plugin() -> None:
            subprocess.run([*base, "--cacheaudit"], cwd=workdir, env=env, check=True,
                           capture_output=True)

        ours, baseline = interleaved(plugin, bare, repeat=repeat)
        report("pytest plugin on 200 tests that compile nothing",
               [Ratio("pytest --cacheaudit / pytest", ours, baseline, budget=1.05)],
               {"tests": 200, "runs each": repeat,
                "load average": " ".join(f"{v:.2f}" for v in os.getloadavg())})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 5)
