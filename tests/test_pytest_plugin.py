"""The pytest plugin, run for real with pytester in subprocesses (the plugin changes the process
environment, starts adapters and combines xdist ledgers: only a real session shows that)."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

from support import GXX

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parent.parent

# A project whose tests use the reference runtime through the shim: the session points the
# runtime's compiler setting at the shim, so every compile is recorded.
CONFTEST = f"""
import os, sys
sys.path.insert(0, {str(ROOT)!r})
import pytest

@pytest.fixture(scope="session")
def tree(tmp_path_factory):
    root = tmp_path_factory.getbasetemp() / "shared-tree"
    (root / "inc" / "mylib").mkdir(parents=True, exist_ok=True)
    (root / "third" / "cutlite").mkdir(parents=True, exist_ok=True)
    api = root / "inc" / "mylib" / "api.cuh"
    if not api.exists():
        api.write_text("#pragma once\\n#include <cutlite/tile.h>\\n#define API 1\\n")
        (root / "third" / "cutlite" / "tile.h").write_text("#pragma once\\n#define TILE 4\\n")
    return root

@pytest.fixture
def runtime(tree, monkeypatch):
    import shutil
    from fixtures.minijit import Config, Runtime
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tree / "cache"))
    # The reference runtime's g++ mode runs JIT_NVCC_COMPILER as its C++ compiler: the g++
    # first on PATH, which in a cacheaudit session is the shim's.
    monkeypatch.setenv("DG_JIT_NVCC_COMPILER", shutil.which("g++"))
    return Runtime(Config(str(tree), "DG", include_dirs=[str(tree / "inc"), str(tree / "third")],
                          include_prefixes=["mylib/"]), backend="gxx")
"""

SOURCE = '"#include <mylib/api.cuh>\\nint value() {{ return API + TILE + {n}; }}\\n"'

STALE_SUITE = f"""
def test_a_builds(runtime):
    assert runtime.compile("gemm", {SOURCE.format(n=0)}).event == "compile"

def test_b_edits_an_untracked_header(tree):
    (tree / "third" / "cutlite" / "tile.h").write_text("#pragma once\\n#define TILE 8\\n")

def test_c_hits_the_stale_entry(runtime):
    assert runtime.compile("gemm", {SOURCE.format(n=0)}).event == "disk-hit"
"""


@pytest.fixture
def project(pytester: pytest.Pytester, tmp_path: Path,
            monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(tmp_path / "ledger.db"))
    # The inner session audits the known runtimes' default roots too; Inductor's lies under
    # $TMPDIR (torchinductor_<user>), where another torch job on this machine may have left one.
    (tmp_path / "tmp").mkdir(exist_ok=True)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    # This suite may itself run under xdist: the inner sessions must not think they are workers.
    for name in ("PYTEST_ADDOPTS", "CACHEAUDIT", "CACHEAUDIT_RUN", "CACHEAUDIT_SHIMS",
                 "CACHEAUDIT_TEST_ID", "CACHEAUDIT_RUN_LABEL", "PYTEST_XDIST_WORKER",
                 "PYTEST_XDIST_WORKER_COUNT", "PYTEST_XDIST_TESTRUNUID"):
        monkeypatch.delenv(name, raising=False)
    return pytester


def _records(ledger: Path) -> list[tuple[str, str, str]]:
    conn = sqlite3.connect(ledger)
    try:
        return conn.execute("SELECT record_uuid, event, coalesce(test_id, '') FROM records"
                            ).fetchall()
    finally:
        conn.close()


def test_off_unless_asked_for(project: pytest.Pytester, tmp_path: Path):
    project.makepyfile(test_one="def test_nothing():\n    pass\n")
    result = project.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    assert "= cacheaudit =" not in result.stdout.str().replace("=" * 3, "=")
    assert not (tmp_path / "ledger.db").exists()


def test_stale_hit_is_reported_with_the_tests_and_fails_the_session(
        project: pytest.Pytester, tmp_path: Path):
    project.makepyfile(test_stale=STALE_SUITE)
    result = project.runpytest_subprocess("--cacheaudit", "--cacheaudit-fail-on=error", "-v",
                                          "-p", "no:randomly")
    result.assert_outcomes(passed=3)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    out = result.stdout.str()
    assert "= cacheaudit =" in out.replace("=" * 3, "=")
    # The section is `cacheaudit scan`'s: a block per finding, located at the edited header,
    # naming the tests the entry was served to, then the summary.
    result.stdout.fnmatch_lines(["*/third/cutlite/tile.h: CA101 error*",
                                 "    served to test_stale.py::test_a_builds,*",
                                 "cacheaudit: *error*: *CA101*",
                                 "*failing the session (--cacheaudit-fail-on=error)*",
                                 "*environment snapshot for a bug report: *"])
    assert ("served to test_stale.py::test_a_builds, test_stale.py::test_c_hits_the_stale_entry"
            in " ".join(out.split()))
    snapshot = (tmp_path / "cacheaudit-snapshot.md").read_text()
    assert snapshot.startswith("## cacheaudit snapshot") and "CA101" in snapshot
    # Without --cacheaudit-fail-on the default still fails on errors; with never it does not.
    again = project.runpytest_subprocess("--cacheaudit", "--cacheaudit-fail-on=never")
    assert again.ret == pytest.ExitCode.OK


def test_a_start_up_hook_session_is_reported_once_by_the_plugin(
        project: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    """`CACHEAUDIT=1 pytest --cacheaudit`: the start-up hook prepares the session in the pytest
    process and would audit it at exit; the plugin reports the run, the hook stays quiet."""
    project.makepyfile(test_stale=STALE_SUITE)
    monkeypatch.setenv("CACHEAUDIT", "1")
    result = project.runpytest_subprocess("--cacheaudit", "--cacheaudit-fail-on=never",
                                          "-p", "no:randomly")
    result.assert_outcomes(passed=3)
    out = result.stdout.str() + result.stderr.str()
    assert "third/cutlite/tile.h" in out, out
    # The hook's exit report writes "cacheaudit: CA101 error: <file>: ..." on stderr.
    assert "cacheaudit: CA101" not in out, out


def test_every_record_once_under_xdist(project: pytest.Pytester, tmp_path: Path):
    tests = "\n".join(
        f"def test_kernel_{n}(runtime):\n"
        f"    assert runtime.compile('k{n}', {SOURCE.format(n=n)}).event == 'compile'\n"
        for n in range(8))
    project.makepyfile(test_many=tests)
    result = project.runpytest_subprocess("--cacheaudit", "-n", "4")
    result.assert_outcomes(passed=8)
    records = _records(tmp_path / "ledger.db")
    assert len(records) == 8 and len({r[0] for r in records}) == 8
    assert {r[2] for r in records} == {f"test_many.py::test_kernel_{n}" for n in range(8)}
    # The workers' own ledgers were combined and removed.
    assert not list(tmp_path.glob("ledger.db.gw*"))
    # Each g++ compile went through the shim and is the runtime's build: counted as both.
    assert ("8 compiles, 0 disk hits, 0 memory hits, 8 compiler invocations through the shim; "
            "8 entries judged" in " ".join(result.stdout.str().split()))


def test_fixture_and_marker(project: pytest.Pytester, tmp_path: Path):
    project.makepyfile(test_fixture=f"""
import pytest

def test_compiles_and_asserts(runtime, cacheaudit):
    runtime.compile("fx", {SOURCE.format(n=1)})
    [record] = cacheaudit.records()
    assert record.event == "compile" and record.test_id.endswith("test_compiles_and_asserts")
    cacheaudit.assert_no_stale_hits()

@pytest.mark.no_cacheaudit
def test_excluded(runtime, cacheaudit):
    runtime.compile("fy", {SOURCE.format(n=2)})
    assert cacheaudit.records() == []
""")
    result = project.runpytest_subprocess("--cacheaudit", "--strict-markers")
    result.assert_outcomes(passed=2)


FIXTURE_SUITE = f"""
def test_a_builds(runtime, cacheaudit):
    assert runtime.compile("gemm", {SOURCE.format(n=0)}).event == "compile"
    cacheaudit.assert_no_stale_hits()

def test_b_edits_an_untracked_header(tree):
    (tree / "third" / "cutlite" / "tile.h").write_text("#pragma once\\n#define TILE 8\\n")

def test_c_hits_the_stale_entry(runtime, cacheaudit):
    assert runtime.compile("gemm", {SOURCE.format(n=0)}).event == "disk-hit"
    cacheaudit.assert_no_stale_hits()
"""


def test_the_fixture_and_the_session_report_agree_on_a_stale_hit(
        project: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A DeepJIT disk hit leaves no record, only a touched `.committed`: the fixture asks the
    same audit of a scope as the session report, with the test's window as the scope."""
    from fixtures.minijit import Config, Runtime

    project.makepyfile(test_stale=FIXTURE_SUITE)
    result = project.runpytest_subprocess("--cacheaudit", "-p", "no:randomly")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*AssertionError: cacheaudit: CA101 *third/cutlite/tile.h "
                                 "(*/cache/cache/gemm.*)*",
                                 "*/third/cutlite/tile.h: CA101 error*",
                                 "    served to test_stale.py::test_a_builds,*",
                                 "cacheaudit: *error*: *CA101*",
                                 "1 compile, 1 disk hit (1 seen by a hit marker or file opens),*"])
    assert ("served to test_stale.py::test_a_builds, test_stale.py::test_c_hits_the_stale_entry"
            in " ".join(result.stdout.str().split()))
    assert "FAILED test_stale.py::test_c_hits_the_stale_entry" in result.stdout.str()
    # Ground truth: a fresh compile of the same source into an empty cache differs from the
    # binary the test was served.
    [tree] = list(Path(project.path).glob("runpytest-0/shared-tree"))
    [served] = list((tree / "cache" / "cache").glob("*/kernel.so"))
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "fresh"))
    monkeypatch.setenv("DG_JIT_NVCC_COMPILER", GXX or "g++")
    fresh = Runtime(Config(str(tree), "DG", include_dirs=[str(tree / "inc"), str(tree / "third")],
                           include_prefixes=["mylib/"]), backend="gxx").compile(
        "gemm", "#include <mylib/api.cuh>\nint value() { return API + TILE + 0; }\n")
    assert fresh.event == "compile"
    assert Path(fresh.binary).read_bytes() != served.read_bytes()


def test_fixture_skips_without_the_plugin(project: pytest.Pytester):
    project.makepyfile(test_skip="def test_it(cacheaudit):\n    pass\n")
    result = project.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*run pytest with --cacheaudit*"])


def test_ini_option_turns_it_on(project: pytest.Pytester, tmp_path: Path):
    project.makeini("[pytest]\naddopts = -p no:cacheprovider\ncacheaudit = true\n")
    project.makepyfile(test_one=f"""
def test_one(runtime):
    runtime.compile("ini", {SOURCE.format(n=3)})
""")
    result = project.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    assert len(_records(tmp_path / "ledger.db")) == 1
    assert json.dumps(result.stdout.str()).count("cacheaudit") >= 1


JUDGE = ("cacheaudit.audit.scope", "cacheaudit.audit.scan", "cacheaudit.audit.checks",
         "cacheaudit.audit.context", "cacheaudit.audit.run")
"""Modules of the judge that a session that compiles nothing and knows no cache root never
needs: `pytest --cacheaudit` on such a suite must stay cheap."""


def test_a_session_that_compiles_nothing_and_knows_no_root_reports_without_the_judge(
        project: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The report of a session with no record and no cache root to scan is what the judge says
    of that run, read afterwards from the same ledger; the session got it without importing the
    judge, and kept its tests in the ledger."""
    import os

    from cacheaudit.audit import audit_run
    from cacheaudit.ledger import open_existing
    from cacheaudit.watch import known_roots

    for name in ("HOME", "XDG_CACHE_HOME"):
        (tmp_path / name.lower()).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    # The precondition of the cheap report: no runtime's default cache root exists here.
    assert known_roots(None, os.environ) == [], "a cache root exists: the judge would run"
    modules = tmp_path / "modules.json"
    # The plugin pauses Python's cycle collector for its own start and end
    # (`plain.PausedCollector`): the tests run with it on, and the session leaves it on.
    project.makeconftest(CONFTEST + f"""
import gc, json
def pytest_unconfigure(config):
    with open({str(modules)!r}, "w") as handle:
        json.dump({{"modules": sorted(sys.modules), "collecting": gc.isenabled()}}, handle)
""")
    project.makepyfile(test_quiet="import gc\n" + "".join(
        f"def test_{n}():\n    assert gc.isenabled() and {n} >= 0\n" for n in range(5)))
    result = project.runpytest_subprocess("--cacheaudit")
    result.assert_outcomes(passed=5)
    assert json.loads(modules.read_text())["collecting"], "the session left the collector off"
    imported = set(json.loads(modules.read_text())["modules"])
    assert "cacheaudit.watch" in imported, "the session did not start its observer"
    assert not imported & set(JUDGE), f"imported by the session: {sorted(imported & set(JUDGE))}"
    combine = {"cacheaudit.ledger.combine", "cacheaudit.ledger.combine_sql"}
    assert not imported & combine, f"no worker ledger, yet imported: {sorted(imported & combine)}"
    out = " ".join(result.stdout.str().split())
    run_uuid = re.search(r"in run ([0-9a-f]{32})", out).group(1)
    opened = open_existing(str(tmp_path / "ledger.db"))
    assert opened is not None, "the session wrote no ledger"
    with opened:
        truth = audit_run(opened, run_uuid, os.environ)
        tests = opened.tests(run_uuid)
    assert truth.findings == [] and truth.records == []
    assert f"{truth.summary()} in run {run_uuid}" in out
    assert "cacheaudit: no findings" in out
    assert sorted(w.nodeid for w in tests) == [f"test_quiet.py::test_{n}" for n in range(5)]

    # The next such session finds the ledger made: its end stores the tests and answers
    # without the records' model or the whole ledger (`SessionLedger`), and says the same.
    again = project.runpytest_subprocess("--cacheaudit")
    again.assert_outcomes(passed=5)
    assert json.loads(modules.read_text())["collecting"], "the session left the collector off"
    imported = set(json.loads(modules.read_text())["modules"])
    heavy = {"cacheaudit.model", "cacheaudit.ledger.store", "cacheaudit.ledger.writes"}
    assert not imported & heavy, f"a quiet session's end imported {sorted(imported & heavy)}"
    out = " ".join(again.stdout.str().split())
    second = re.search(r"in run ([0-9a-f]{32})", out).group(1)
    with open_existing(str(tmp_path / "ledger.db")) as ledger:
        truth = audit_run(ledger, second, os.environ)
        tests = ledger.tests(second)
    assert truth.findings == [] and truth.records == [] and second != run_uuid
    assert f"{truth.summary()} in run {second}" in out and "cacheaudit: no findings" in out
    assert sorted(w.nodeid for w in tests) == [f"test_quiet.py::test_{n}" for n in range(5)]


def test_a_session_that_opens_no_known_entry_reports_without_the_judge(
        project: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A cache root known at the start (the ledger keeps it from the session that built its
    entry), its every entry watched and none opened, and no record: the session was served
    nothing from it, and its report is what the judge says of that run afterwards, made
    without importing the judge. The control: a session served that entry (a disk hit, its
    binary opened) runs the judge and counts the hit."""
    import os

    from cacheaudit.audit import audit_run
    from cacheaudit.ledger import open_existing
    from cacheaudit.opens import ObservedOpens
    from cacheaudit.watch import Observation, plan_watch

    for name in ("HOME", "XDG_CACHE_HOME"):
        (tmp_path / name.lower()).mkdir()
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    modules = tmp_path / "modules.json"
    # One tree for the three sessions (each inner session has a base temp of its own).
    conftest = CONFTEST.replace('tmp_path_factory.getbasetemp() / "shared-tree"',
                                f'__import__("pathlib").Path({str(tmp_path / "tree")!r})')
    assert conftest != CONFTEST
    project.makeconftest(conftest + f"""
import json
def pytest_unconfigure(config):
    with open({str(modules)!r}, "w") as handle:
        json.dump(sorted(sys.modules), handle)
""")
    served = f"def test_served(runtime):\n    runtime.compile('k', {SOURCE.format(n=1)})\n"
    project.makepyfile(test_build=served)
    project.runpytest_subprocess("--cacheaudit").assert_outcomes(passed=1)
    with open_existing(str(tmp_path / "ledger.db")) as ledger:
        assert ledger.known_roots(), "the building session's scan kept no root"

    (project.path / "test_build.py").unlink()
    project.makepyfile(test_quiet="".join(f"def test_{n}():\n    assert {n} >= 0\n"
                                          for n in range(5)))
    result = project.runpytest_subprocess("--cacheaudit")
    result.assert_outcomes(passed=5)
    imported = set(json.loads(modules.read_text()))
    assert not imported & set(JUDGE), f"imported by the session: {sorted(imported & set(JUDGE))}"
    out = " ".join(result.stdout.str().split())
    run_uuid = re.search(r"in run ([0-9a-f]{32})", out).group(1)
    # The judge's word on that run, given what the session watched and that its tests (which
    # touch no cache) opened nothing there.
    with open_existing(str(tmp_path / "ledger.db")) as ledger:
        plan = plan_watch(ledger, os.environ)
        assert plan.entries, "the session had no entry to watch"
        truth = audit_run(ledger, run_uuid, os.environ,
                          observation=Observation(plan, ObservedOpens(started_ns=1)))
    assert truth.findings == [] and truth.records == []
    assert f"{truth.summary()} in run {run_uuid}" in out
    assert "cacheaudit: no findings" in out

    (project.path / "test_quiet.py").unlink()
    project.makepyfile(test_served=served)
    result = project.runpytest_subprocess("--cacheaudit")
    result.assert_outcomes(passed=1)
    assert set(JUDGE) <= set(json.loads(modules.read_text())), "the served session skipped it"
    assert "1 disk hit" in " ".join(result.stdout.str().split()), result.stdout.str()


def test_a_misspelt_ini_fail_on_is_a_usage_error(project: pytest.Pytester):
    project.makeini("[pytest]\naddopts = -p no:cacheprovider\ncacheaudit = true\n"
                    "cacheaudit_fail_on = errors\n")
    project.makepyfile(test_one="def test_nothing():\n    pass\n")
    result = project.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*cacheaudit_fail_on = 'errors'*expected one of error, "
                                 "warning, info, never*"])


def test_a_session_that_cannot_start_runs_the_tests_unrecorded(project: pytest.Pytester,
                                                                tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    project.makepyfile(test_one="def test_nothing(cacheaudit):\n    pass\n"
                                "def test_other():\n    pass\n")
    result = project.runpytest_subprocess(
        "--cacheaudit", f"--cacheaudit-ledger={blocker / 'ledger.db'}", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*cacheaudit: recording is off for this session: *a-file*",
                                 "*cacheaudit could not start in this session*"])


def test_an_inherited_worker_environment_runs_the_tests_unrecorded(
        project: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    monkeypatch.setenv("CACHEAUDIT_RUN_LABEL", "pytest")
    project.makepyfile(test_one="import os\n\ndef test_env():\n"
                                "    assert 'CACHEAUDIT_TEST_ID' not in os.environ\n")
    result = project.runpytest_subprocess("--cacheaudit")
    result.assert_outcomes(passed=1)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*recording is off for this session: this pytest inherited "
                                 "an xdist worker's environment*"])
    assert not list(tmp_path.glob("ledger.db*"))


def test_only_environment_tokens_are_called_injected_by_the_environment():
    from cacheaudit.ledger import new_record_id
    from cacheaudit.model import ArgToken, CompileRecord
    from cacheaudit.render import View
    from cacheaudit.render_records import record_block

    record = CompileRecord(
        record_id=new_record_id(), event="compile", started_ns=1, kernel="k",
        effective_argv=(ArgToken("k.cu"), ArgToken("-O3", "file:/tmp/opts.rsp"),
                        ArgToken("-DX=1", "env:NVCC_APPEND_FLAGS")), observer="shim:nvcc")
    lines = {line.text.strip(): line for line in record_block(record, View(width=160))}
    from_file, from_env = lines["+ -O3 (from file:/tmp/opts.rsp)"], lines[
        "+ -DX=1 (from env:NVCC_APPEND_FLAGS)"]
    # Only the environment's token is shown as injected (bold); a response file is argv's.
    assert any("bold" in style for _, _, style in from_env.spans)
    assert not any("bold" in style for _, _, style in from_file.spans)


def _section_text(out: str) -> str:
    """The session's `cacheaudit` section: its separator line up to pytest's final line."""
    lines = out.splitlines()
    [start] = [n for n, line in enumerate(lines) if re.fullmatch(r"=+ cacheaudit =+", line)]
    end = next((n for n in range(start + 1, len(lines)) if lines[n].startswith("=")),
               len(lines))
    return "".join(line + "\n" for line in lines[start:end])


@pytest.mark.parametrize("columns", (80, 160))
def test_the_terminal_section_golden(project: pytest.Pytester, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch,
                                     request: pytest.FixtureRequest, columns: int):
    """The session's section as a person reads it at 80 and 160 columns, from a real session
    that builds, edits an untracked header and is served the stale entry."""
    from test_render_golden import _paths_whole, _short_tmp, check_golden

    from fixtures.minijit import Config, Runtime

    # A short directory of a fixed length for the session's files: where lines wrap must not
    # depend on pytest's numbered temporary directories.
    short = Path(_short_tmp())
    request.addfinalizer(lambda: shutil.rmtree(short, ignore_errors=True))
    project.makepyfile(test_stale=STALE_SUITE)
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.setenv("TZ", "UTC")
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(short / "ledger.db"))
    # The last --basetemp wins over the one pytester gives.
    result = project.runpytest_subprocess("--cacheaudit", "--cacheaudit-fail-on=never",
                                          "-p", "no:randomly", f"--basetemp={short / 'b'}")
    result.assert_outcomes(passed=3)
    section = _section_text(result.stdout.str())
    tree = short / "b" / "shared-tree"
    [entry] = list((tree / "cache" / "cache").iterdir())
    header = tree / "third" / "cutlite" / "tile.h"
    # Ground truth: a fresh compile of the same source into an empty cache differs from the
    # binary the session's last test was served, which is the entry the section names.
    monkeypatch.setenv("DG_JIT_CACHE_DIR", str(tmp_path / "fresh"))
    monkeypatch.setenv("DG_JIT_NVCC_COMPILER", GXX or "g++")
    fresh = Runtime(Config(str(tree), "DG", include_dirs=[str(tree / "inc"), str(tree / "third")],
                           include_prefixes=["mylib/"]), backend="gxx").compile(
        "gemm", "#include <mylib/api.cuh>\nint value() { return API + TILE + 0; }\n")
    assert fresh.event == "compile"
    assert Path(fresh.binary).read_bytes() != (entry / "kernel.so").read_bytes()
    assert f"{header}: CA101 error" in section, section
    assert not _paths_whole(section, [str(header), str(entry)]), section
    # The summary last: after every finding's block.
    assert section.index("\ncacheaudit: 1 error, ") > section.rindex("    docs "), section
    shown = section.replace(str(short), "<tmp>")
    shown = re.sub(r"\b[0-9a-f]{32}\b", "<32 hex>", shown)
    shown = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", "<time>", shown)
    check_golden(f"pytest-section-{columns}", shown)
