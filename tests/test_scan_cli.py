"""`cacheaudit scan` and `cacheaudit explain` as a user runs them, on caches built for real."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cacheaudit.exceptions import ExitCode

from truth_table import Project, _write


@pytest.fixture
def project(tmp_path: Path) -> Project:
    project = Project(tmp_path / "p", "gxx")
    project.setup()
    return project


def cacheaudit(project: Project, *args: str, cwd: Path | None = None,
               **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args],
                          capture_output=True, text=True, env=dict(project.env, **env),
                          cwd=cwd or project.root, timeout=300)


def _stale(project: Project) -> None:
    project.once()
    _write(project.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 4\n")


def test_exit_status_follows_fail_on(project: Project):
    project.once()
    clean = cacheaudit(project, "scan", str(project.cache), "--ledger", str(project.ledger))
    assert clean.returncode == ExitCode.CLEAN, clean.stdout + clean.stderr
    # CA102 (untracked, unchanged) and CA201 (CPATH set) are warnings.
    warned = cacheaudit(project, "scan", str(project.cache), "--fail-on", "warning")
    assert warned.returncode == ExitCode.FINDINGS
    _write(project.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 4\n")
    stale = cacheaudit(project, "scan", str(project.cache))
    assert stale.returncode == ExitCode.FINDINGS
    assert "CA101" in stale.stdout
    assert cacheaudit(project, "scan", str(project.cache), "--fail-on",
                      "never").returncode == ExitCode.CLEAN


def test_formats(project: Project):
    _stale(project)
    as_json = json.loads(cacheaudit(project, "scan", str(project.cache), "--json").stdout)
    assert as_json["counts"]["CA101"] == 1 and as_json["entries"] == 1
    markdown = cacheaudit(project, "scan", str(project.cache), "--format", "markdown").stdout
    detail = project.root / "third" / "cutlite" / "detail.h"
    assert markdown.startswith("## cacheaudit")
    assert f"- **CA101** error `{detail}`" in markdown
    table = cacheaudit(project, "scan", str(project.cache), COLUMNS="200").stdout
    assert "CA101" in table and "detail.h" in table


def test_select_and_ignore(project: Project):
    _stale(project)
    only = json.loads(cacheaudit(project, "scan", str(project.cache), "--json",
                                 "--select", "CA2").stdout)
    assert set(only["counts"]) == {"CA201"}
    without = json.loads(cacheaudit(project, "scan", str(project.cache), "--json",
                                    "--ignore", "CA101,CA102").stdout)
    assert "CA101" not in without["counts"] and "CA102" not in without["counts"]
    bad = cacheaudit(project, "scan", str(project.cache), "--select", "XX9")
    assert bad.returncode == ExitCode.USAGE and "no finding code" in bad.stderr


def test_settings_from_pyproject(project: Project, tmp_path: Path):
    _stale(project)
    work = tmp_path / "work"
    work.mkdir()
    (work / "pyproject.toml").write_text(
        '[tool.cacheaudit]\nfail-on = "never"\nignore = ["CA102"]\n'
        f'paths = ["{project.cache}"]\n')
    done = cacheaudit(project, "scan", "--json", cwd=work)
    assert done.returncode == ExitCode.CLEAN, done.stderr
    report = json.loads(done.stdout)
    assert "CA101" in report["counts"] and "CA102" not in report["counts"]
    # The command line wins over the file.
    assert cacheaudit(project, "scan", "--fail-on", "error", cwd=work).returncode == 1
    (work / "pyproject.toml").write_text('[tool.cacheaudit]\nfail_on = "never"\n')
    bad = cacheaudit(project, "scan", cwd=work)
    assert bad.returncode == ExitCode.USAGE
    assert bad.stderr.strip().count("\n") == 0 and "no setting 'fail_on'" in bad.stderr


def test_not_a_cache_root_is_a_usage_error(project: Project, tmp_path: Path):
    assert cacheaudit(project, "scan", str(tmp_path / "absent")).returncode == ExitCode.USAGE
    done = cacheaudit(project, "scan", str(tmp_path))
    assert done.returncode == ExitCode.USAGE and "not a cache root" in done.stderr


def test_explain_shows_components_and_changes_since_the_previous_compile(project: Project):
    project.once()
    _write(project.root / "inc" / "mylib" / "api.cuh",
           "#pragma once\n#include <cutlite/tile.h>\n#define API_VALUE 7\n")
    answer = project.once()
    cacheaudit(project, "scan", str(project.cache), "--fail-on", "never")  # ties records
    shown = cacheaudit(project, "explain", answer["path"], "--json")
    assert shown.returncode == 0, shown.stderr
    explained = json.loads(shown.stdout)
    assert explained["entry"]["key"] == answer["key"]
    assert explained["key"]["matches"] is True
    labels = [c["label"] for c in explained["key"]["components"]]
    assert "flags" in labels and "  <mylib/api.cuh>" in labels
    assert explained["tracked"]["names"] == {
        "mylib/api.cuh": str(project.root / "inc" / "mylib" / "api.cuh")}
    changed = {(c["component"], c["item"]) for c in explained["changes_since_previous"]}
    assert ("4 inputs", str(project.root / "inc" / "mylib" / "api.cuh")) in changed
    assert ("key", "key") in changed
    table = cacheaudit(project, "explain", answer["path"], COLUMNS="200")
    assert "matches the entry's key" in table.stdout
    assert "changes since the previous compile" in table.stdout


def test_explain_by_key_prefix_and_unknown_target(project: Project):
    answer = project.once()
    shown = cacheaudit(project, "explain", answer["key"][:10], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["entry"]["path"] == answer["path"]
    missing = cacheaudit(project, "explain", "f" * 20)
    assert missing.returncode == ExitCode.USAGE and "no entry path" in missing.stderr


def test_pyproject_ledger_and_paths_hold_for_every_command_from_a_subdirectory(
        project: Project, tmp_path: Path):
    import os

    _stale(project)
    work = tmp_path / "work"
    (work / "sub").mkdir(parents=True)
    cache = os.path.relpath(project.cache, work)  # relative to the pyproject, not to the cwd
    (work / "pyproject.toml").write_text(
        f'[tool.cacheaudit]\nledger = "~/audit.db"\npaths = ["{cache}"]\nfail-on = "never"\n')
    env = {k: v for k, v in project.env.items() if k != "CACHEAUDIT_LEDGER"}
    home = Path(env["HOME"])
    home.mkdir(exist_ok=True)
    mine = home / "audit.db"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                              text=True, env=env, cwd=work / "sub", timeout=300)
        assert done.returncode == ExitCode.CLEAN, (args, done.stderr)
        return done

    run("combine", "--keep", str(project.ledger))
    assert mine.exists() and not (work / "sub" / "~").exists()
    scanned = json.loads(run("scan", "--json").stdout)
    assert scanned["ledger"] == str(mine) and scanned["entries"] == 1
    assert "CA101" in scanned["counts"]
    assert json.loads(run("report", "--json").stdout)["records"]
    snapshot = json.loads(run("snapshot", "--json", "--timeout", "10").stdout)
    assert snapshot["ledger"]["path"] == str(mine) and snapshot["ledger"]["status"] == "ok"


def test_a_default_deepgemm_root_holding_only_a_killed_build_is_scanned(tmp_path: Path):
    """DeepGEMM 2.x's default root (`~/.deep_gemm`, which no DeepJIT reader looks at) after its
    first build was killed: `tmp/<pid>-<rand>/kernel.cu` and no `cache/` yet. The default scan
    finds the root and reports the leftover build; it is not "nothing to scan"."""
    build = tmp_path / "home" / ".deep_gemm" / "tmp" / "4242-0a1b2c3d-0a1b2c3d-0a1b2c3d"
    _write(build / "kernel.cu", "__global__ void k() {}\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "home"),
           "XDG_CACHE_HOME": str(tmp_path / "xdg"), "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--json", "--no-progress",
                           "--ledger", str(tmp_path / "ledger.db"), "--fail-on", "warning"],
                          capture_output=True, text=True, env={**env, "PYTHONPATH": str(
                              Path(__file__).resolve().parent.parent)}, timeout=300)
    assert done.returncode == ExitCode.FINDINGS, done.stderr
    report = json.loads(done.stdout)
    assert [f["code"] for f in report["findings"] if f["subject"] == str(build)] == ["CA402"], \
        report["findings"]
