"""Promises about the package itself: cheap to import, pinned where the machines need it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_import_cacheaudit_pulls_in_no_gpu_framework():
    probe = ("import sys, cacheaudit, cacheaudit.cli, cacheaudit.shim, cacheaudit.recorder; "
             "print(' '.join(m for m in ('torch', 'triton', 'cuda', 'cupy', 'numpy', "
             "'sqlite_utils') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    # sqlite-utils (which probes numpy) stays off the shim's and the CLI's import path too.
    assert done.stdout.strip() == ""


def test_extras_pin_what_these_machines_need():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    assert "torch==2.13.0" in extras["torch"]
    assert "nvidia-cuda-nvrtc==13.0.*" in extras["nvrtc"]
    for needed in ("pytest", "pytest-xdist", "hypothesis", "nvidia-cutlass"):
        assert any(r.startswith(needed) for r in extras["test"]), needed
    assert set(project["scripts"]) == {"cacheaudit", "cacheaudit-shim"}


def test_ci_runs_the_readme_test_command_verbatim():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    command = next(line.strip() for line in ci.splitlines()
                   if "pytest" in line and not line.lstrip().startswith("#"))
    assert command in readme
