"""Exit statuses and the command line's own conventions (`--version`, `-h`, choices, a closed
pipe), what a scan that found nothing says, and the record ids `report` shows for `explain`.
Real subprocesses; the bad-input cases are in test_bad_input.py, with their table in docs/cli.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_input import _OWN, ROOT

from cacheaudit.exceptions import ExitCode

from support import needs_gxx
from truth_table import Project

pytest_plugins = ["pytester"]

FOREIGN_PYPROJECT = '[tool.black\nline-length = 99\n'
"""Another tool's pyproject.toml with a syntax error, and no [tool.cacheaudit]."""


def _env(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_OWN)}
    env.update({"HOME": str(tmp / "home"), "XDG_CACHE_HOME": str(tmp / "xdg"),
                "XDG_CONFIG_HOME": str(tmp / "config"), "TMPDIR": str(tmp),
                "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    env.update(extra)
    (tmp / "home").mkdir(exist_ok=True)
    return env


def cacheaudit(tmp: Path, *args: str, cwd: Path | None = None,
               **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          text=True, env=_env(tmp, **extra), cwd=cwd or tmp, timeout=300)


def test_version_and_the_short_help_option(tmp_path: Path):
    from importlib.metadata import version

    shown = cacheaudit(tmp_path, "--version")
    assert (shown.returncode, shown.stdout) == (0, f"cacheaudit {version('cacheaudit')}\n")
    for args in (["-h"], ["scan", "-h"], ["shim", "install", "-h"]):
        helped = cacheaudit(tmp_path, *args)
        assert helped.returncode == 0 and helped.stdout.startswith("Usage: cacheaudit"), args


def test_help_shows_the_choices_of_options_that_have_them(tmp_path: Path):
    scan = cacheaudit(tmp_path, "scan", "-h", COLUMNS="200").stdout
    assert "<full|concise|json|markdown|github|sarif>" in scan
    assert "<error|warning|info|never>" in scan
    assert "<error|warning|info|never>" in cacheaudit(tmp_path, "run", "-h", COLUMNS="200").stdout
    assert "<auto|nvcc|g++>" in cacheaudit(tmp_path, "demo", "-h", COLUMNS="200").stdout


@pytest.mark.parametrize("args", [["-h"], ["report", "--json"], ["report", "--ledger", "l.db"],
                                  ["scan", "--allow-empty"]])
def test_a_closed_pipe_exits_141_without_a_word(tmp_path: Path, args: list[str]):
    """`cacheaudit report | head -0`: the reader is gone before the first write. Python ignores
    SIGPIPE, so the write raises BrokenPipeError (before: click's exit 1, the findings code)."""
    if "l.db" in args:
        _records(tmp_path / "l.db", 3)  # the table has something to print
    child = subprocess.Popen([sys.executable, "-m", "cacheaudit", *args], env=_env(tmp_path),
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # long before the interpreter has started
    err = child.stderr.read().decode()
    assert child.wait(timeout=300) == ExitCode.BROKEN_PIPE == 141, err
    assert "Traceback" not in err and "Exception ignored" not in err, err


@pytest.mark.parametrize("command", [["snapshot", "--timeout", "5"], ["report"],
                                     ["run", "--", sys.executable, "-c", "pass"],
                                     ["scan", "--allow-empty"]])
def test_a_broken_pyproject_of_other_tools_is_a_warning(tmp_path: Path, command: list[str]):
    work = tmp_path / "work"
    work.mkdir()
    (work / "pyproject.toml").write_text(FOREIGN_PYPROJECT)
    done = cacheaudit(tmp_path, *command, cwd=work)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stderr.splitlines() if "pyproject.toml" in line]
    assert warnings == [f"cacheaudit: warning: {work / 'pyproject.toml'}: not valid TOML at "
                        "line 1, column 12; it has no [tool.cacheaudit], so it is skipped"]


@needs_gxx
def test_the_command_line_fail_on_beats_an_invalid_one_in_the_file(tmp_path: Path):
    project = Project(tmp_path / "p", "gxx")
    project.setup()
    project.once()
    (project.root / "third" / "cutlite" / "detail.h").write_text(
        "#pragma once\n#define DETAIL 4\n")  # untracked: the entry is stale (CA101)
    (project.root / "pyproject.toml").write_text('[tool.cacheaudit]\nfail-on = "sometimes"\n')
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "cacheaudit", "scan", str(project.cache), *a], text=True,
        capture_output=True, env=project.env, cwd=project.root, timeout=300)
    refused = run()
    assert refused.returncode == ExitCode.USAGE
    assert f"{project.root / 'pyproject.toml'}: [tool.cacheaudit] fail-on" in refused.stderr
    assert run("--fail-on", "never").returncode == ExitCode.CLEAN
    judged = run("--fail-on", "error", "--json")
    assert judged.returncode == ExitCode.FINDINGS, judged.stderr
    assert str(project.root / "third" / "cutlite" / "detail.h") in {
        f["subject"] for f in json.loads(judged.stdout)["findings"] if f["code"] == "CA101"}


def test_an_empty_default_root_is_scanned_and_listed_as_the_snapshot_lists_it(tmp_path: Path):
    (tmp_path / "home" / ".deep_gemm").mkdir(parents=True)
    root = str(tmp_path / "home" / ".deep_gemm")
    scanned = cacheaudit(tmp_path, "scan", "--json")
    assert scanned.returncode == 0, scanned.stderr
    assert scanned.stderr.splitlines() == [f"cacheaudit: root {root} (deepgemm): no entries"]
    report = json.loads(scanned.stdout)
    assert report["roots"] == [{"layout": "deepgemm", "root": root}]
    assert report["entries"] == 0
    snapshot = json.loads(cacheaudit(tmp_path, "snapshot", "--json", "--timeout", "5").stdout)
    assert [(c["layout"], c["root"], c["entries"]) for c in snapshot["caches"]] == [
        ("deepgemm", root, 0)]
    table = cacheaudit(tmp_path, "scan", COLUMNS="200")
    assert "0 entries in 1 cache root" in table.stdout


def test_run_passes_where_no_root_exists(tmp_path: Path):
    """`cacheaudit run` audits what the run used: no root, or a variable naming none, is no
    reason to fail the user's command (the scan's guard is the scan's)."""
    done = cacheaudit(tmp_path, "run", "--fail-on", "error", "--", sys.executable, "-c", "pass",
                      DG_JIT_CACHE_DIR=str(tmp_path / "nope"))
    assert done.returncode == 0, done.stderr
    assert "error" not in done.stderr


@needs_gxx
def test_a_variable_naming_a_missing_root_fails_the_guard_with_roots_elsewhere(tmp_path: Path):
    """A real cache exists (DG_JIT_CACHE_DIR's), and EP_JIT_CACHE_DIR names nothing: the scan
    refuses, naming the variable; --allow-empty scans the real one and judges it."""
    project = Project(tmp_path / "p", "gxx")
    project.setup()
    answer = project.once()
    env = dict(project.env, EP_JIT_CACHE_DIR=str(tmp_path / "typo"))
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "cacheaudit", "scan", "--json", *a], text=True,
        capture_output=True, env=env, cwd=project.root, timeout=300)
    refused = run()
    assert refused.returncode == ExitCode.USAGE
    assert refused.stderr.splitlines() == [
        f"cacheaudit: error: EP_JIT_CACHE_DIR={tmp_path / 'typo'}: no such directory, so that "
        "cache was not scanned (fix the variable, or pass --allow-empty)"]
    allowed = run("--allow-empty", "--fail-on", "never")
    assert allowed.returncode == 0, allowed.stderr
    report = json.loads(allowed.stdout)
    assert report["entries"] == 1 and {"layout": "deepjit", "root": str(project.cache)} in (
        report["roots"]), report["roots"]
    assert answer["path"].startswith(str(project.cache))


@needs_gxx
def test_explain_finds_a_key_prefix_in_a_root_the_ledger_knows(tmp_path: Path):
    """The scan remembered the root; explain by key prefix later, without DG_JIT_CACHE_DIR."""
    project = Project(tmp_path / "p", "gxx")
    project.setup()
    answer = project.once()
    scanned = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--fail-on", "never"],
                             capture_output=True, text=True, env=project.env, cwd=project.root,
                             timeout=300)
    assert scanned.returncode == 0, scanned.stderr
    without = {k: v for k, v in project.env.items() if k != "DG_JIT_CACHE_DIR"}
    shown = subprocess.run([sys.executable, "-m", "cacheaudit", "explain", answer["key"][:10],
                            "--json"], capture_output=True, text=True, env=without,
                           cwd=project.root, timeout=300)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["entry"]["path"] == answer["path"]


def _records(ledger: Path, count: int) -> list[str]:
    from cacheaudit.ledger import Ledger, RunInfo, new_record_id
    from cacheaudit.model import CompileRecord

    ids = [new_record_id() for _ in range(count)]
    records = [CompileRecord(record_id=ids[n], event="compile",
                             started_ns=(1_700_000_000 + n) * 10**9, runtime="deepjit",
                             kernel=f"k{n}", argv=("-O2",)) for n in range(count)]
    with Ledger.open(str(ledger)) as opened:
        opened.add_records(records, RunInfo(run_uuid="r", label="test"))
    return ids


def test_report_says_how_many_it_shows_and_the_ids_explain_takes(tmp_path: Path):
    ledger = tmp_path / "l.db"
    ids = _records(ledger, 3)
    shown = cacheaudit(tmp_path, "report", "--limit", "2", "--ledger", str(ledger),
                       COLUMNS="200")
    assert shown.returncode == 0, shown.stderr
    assert "the last 2 of 3 recorded compiles shown (--limit 3 shows them all)" in shown.stdout
    printed = re.findall(r"^    record +([0-9a-f]+)$", shown.stdout, re.MULTILINE)
    assert printed == [ids[1], ids[2]]  # the newest two, newest last
    printed = [record_id[:12] for record_id in printed]  # a prefix is what explain takes
    explained = cacheaudit(tmp_path, "explain", printed[0], "--json", "--ledger", str(ledger))
    assert explained.returncode == 0, explained.stderr
    assert json.loads(explained.stdout)["record"]["record_id"] == ids[1]
    every = cacheaudit(tmp_path, "report", "--ledger", str(ledger), COLUMNS="200").stdout
    assert "3 recorded compiles" in every and "shown" not in every


def test_every_exit_status_is_documented_with_a_test_that_exists():
    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("## Exit status"):text.index("### Bad input")]
    rows = re.findall(r"^\| (\d+) \|.*\| (`test_.*)\|$", table, re.MULTILINE)
    documented = {int(status) for status, _ in rows}
    assert documented == {value for name, value in vars(ExitCode).items() if name.isupper()}
    for status, cell in rows:
        for path, name in re.findall(r"`(test_\w+\.py)::(test_\w+)`", cell):
            assert f"\ndef {name}(" in (ROOT / "tests" / path).read_text(), (status, path, name)


def test_the_configured_ledger_directory_is_made_and_a_typed_one_refused(tmp_path: Path):
    """`ledger = ".cacheaudit/ledger.db"` in a fresh checkout: made as needed; the same path
    given with --ledger (a typo is typed) is refused, and nothing is created."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "pyproject.toml").write_text('[tool.cacheaudit]\nledger = ".cacheaudit/ledger.db"\n')
    done = cacheaudit(tmp_path, "scan", "--allow-empty", cwd=work)
    assert done.returncode == 0, done.stderr
    assert (work / ".cacheaudit" / "ledger.db").exists(), done.stderr
    typed = cacheaudit(tmp_path, "scan", "--allow-empty", "--ledger",
                       str(tmp_path / "typo" / "l.db"), cwd=work)
    assert typed.returncode == ExitCode.USAGE
    assert typed.stderr.splitlines() == [
        f"cacheaudit: error: --ledger {tmp_path / 'typo' / 'l.db'}: no directory "
        f"{tmp_path / 'typo'} (create it, or fix the path)"]
    assert not (tmp_path / "typo").exists()


def test_the_pytest_plugin_passes_where_no_root_exists(pytester: pytest.Pytester,
                                                       tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch):
    """The plugin audits what the session used, as `run` does: a suite that compiles nothing,
    with a cache variable naming a missing directory, passes under --cacheaudit-fail-on=error."""
    for name in [n for n in os.environ if n.startswith(_OWN)]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(tmp_path / "ledger.db"))
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "nope"))
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    pytester.makepyfile(test_one="def test_nothing():\n    pass\n")
    result = pytester.runpytest_subprocess("--cacheaudit", "--cacheaudit-fail-on=error")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK
