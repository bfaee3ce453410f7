"""`cacheaudit evict` on real torch.utils.cpp_extension builds (g++ through ninja, see
test_torch_ext.py): the stale build directory goes whole, so that the next `load()` in a new
process rebuilds from the sources (the library alone would be relinked from stale objects), and
a build directory whose lock a process holds is left alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from test_torch_ext import Project, needs_torch

from cacheaudit.exceptions import ExitCode

from support import valid_document


def evict(project: Project, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", "evict", str(project.ext), *args,
                           "--ledger", str(project.ledger)], capture_output=True, text=True,
                          env=project.env, cwd=project.root, timeout=300)


@needs_torch
def test_evict_rebuilds_a_stale_extension_and_leaves_a_locked_one_alone(tmp_path: Path):
    project = Project(tmp_path / "p")
    [first] = project.run(project.load())
    assert first["value"] == 1100
    project.sysconst.write_text("#define SYS_CONST 200\n")  # -isystem: ninja never sees it
    [served] = project.run(project.load())
    assert served["value"] == 1100, "torch rebuilt by itself: the scenario no longer holds"
    fresh_root = Project(tmp_path / "fresh")
    fresh_root.sysconst.write_text("#define SYS_CONST 200\n")
    [fresh] = fresh_root.run(fresh_root.load())
    assert fresh["value"] == 1200, "the truth: a fresh build answers 1200"

    counted = subprocess.run([sys.executable, "-m", "cacheaudit", "stats", str(project.ext),
                              "--json", "--ledger", str(project.ledger)], capture_output=True,
                             env=project.env, cwd=project.root, timeout=300)
    [row] = [t for t in valid_document(counted.stdout, "stats")["tallies"] if t["entries"]]
    on_disk = sum(p.lstat().st_size for p in project.build_dir.rglob("*") if not p.is_dir())
    assert (row["runtime"], row["entries"], row["bytes"]) == ("torch-ext", 1, on_disk), row
    assert (row["compiles"], row["disk_hits"], row["memory_hits"], row["stale"]) == (
        1, 1, 0, 1), row

    lock = project.build_dir / "lock"
    with open(lock, "w"):  # a build in progress holds its FileBaton open
        held = evict(project)
        assert held.returncode == ExitCode.FINDINGS, held.stdout + held.stderr
        shown = " ".join(held.stdout.split())  # the block, as wrapped at the width, unwrapped
        assert f"{project.build_dir}: skipped (CA101 " in shown and \
            f"finding CA101 {project.sysconst}" in shown, held.stdout
        assert "holds its lock" in shown, held.stdout
        assert (project.build_dir / "build.ninja").exists()
    lock.unlink()

    done = evict(project)
    assert done.returncode == ExitCode.CLEAN, done.stdout + done.stderr
    shown = " ".join(done.stdout.split())
    assert f"{project.build_dir}: evicted (CA101 " in shown and \
        f"finding CA101 {project.sysconst}" in shown, done.stdout
    assert not os.path.lexists(project.build_dir)
    before = len(project.records())
    [rebuilt] = project.run(project.load())
    assert rebuilt["value"] == fresh["value"] == 1200, "the rebuilt library is not a fresh one"
    assert [r.event for r in project.records()[before:]] == ["compile"]
