"""The `cacheaudit` command as a user runs it: real subprocesses, real ledgers, exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cacheaudit.cli import app
from cacheaudit.exceptions import ExitCode

from support import ShimEnv, needs_gxx, needs_nvcc


def cacheaudit(*args: str, env: dict[str, str] | None = None,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=300)


@needs_gxx
def test_report_json_has_the_four_answers(shim_env: ShimEnv, header_tree: Path):
    extra = {"CPATH": str(header_tree / "cpath"), "CACHEAUDIT_RUNTIME": "torch-ext"}
    done = shim_env.run(["g++", "-shared", "-fPIC", "-I../inc", "k.cpp", "-o", "../out/k.so"],
                        cwd=header_tree / "src", env=extra)
    assert done.returncode == 0, done.stderr
    shown = cacheaudit("report", "--json", "--ledger", str(shim_env.ledger))
    assert shown.returncode == 0, shown.stderr
    [record] = json.loads(shown.stdout)["records"]
    assert record["runtime"] == "torch-ext" and record["kernel"] == "k"
    assert record["compiler"]["kind"] == "gcc"                       # 1. which compiler
    assert record["options"]["environment"]["CPATH"] == str(header_tree / "cpath")  # 2.
    assert record["event"] == "compile"                              # 3. fresh or cached
    # 4. which inputs: our four headers and the compiler's implicit stdc-predef.h
    assert record["inputs"]["graph"]["file_count"] == 5
    assert "files" not in record["inputs"]["graph"]
    with_graph = json.loads(cacheaudit("report", "--json", "--graph", "--ledger",
                                       str(shim_env.ledger)).stdout)["records"][0]
    listed = {f["path"] for f in with_graph["inputs"]["graph"]["files"]}
    assert str(header_tree / "cpath" / "envconst.h") in listed


@needs_gxx
def test_report_table_names_kernel_compiler_and_injected_environment(
        shim_env: ShimEnv, header_tree: Path):
    shim_env.run(["g++", "-c", "-I../inc", "k.cpp", "-o", "../out/k.o"], cwd=header_tree / "src",
                 env={"CPATH": str(header_tree / "cpath")})
    shown = cacheaudit("report", env=dict(shim_env.env, COLUMNS="200"))
    assert shown.returncode == 0, shown.stderr
    assert "1 recorded compile(s)" in shown.stdout
    assert ":k" in shown.stdout and "g++" in shown.stdout
    assert f"CPATH={header_tree / 'cpath'}" in shown.stdout


def test_report_on_a_missing_ledger_says_so_and_creates_nothing(tmp_path: Path):
    shown = cacheaudit("report", "--ledger", str(tmp_path / "none.db"))
    assert shown.returncode == ExitCode.CLEAN
    assert "nothing has been recorded" in shown.stderr
    assert not (tmp_path / "none.db").exists()


def test_bad_ledger_is_one_line_and_exit_2(tmp_path: Path):
    bad = tmp_path / "bad.db"
    bad.write_text("not sqlite")
    shown = cacheaudit("report", "--ledger", str(bad))
    assert shown.returncode == ExitCode.USAGE
    assert shown.stderr.strip().splitlines() == [
        f"cacheaudit: error: {bad} is not a cacheaudit ledger (not an SQLite file)"]
    assert "Traceback" not in shown.stderr


def test_usage_errors_exit_2():
    assert cacheaudit("no-such-command").returncode == ExitCode.USAGE
    assert cacheaudit("report", "--limit", "many").returncode == ExitCode.USAGE
    assert cacheaudit("demo", "--compiler", "icc").returncode == ExitCode.USAGE


def test_every_command_has_help():
    import typer

    command = typer.main.get_command(app)

    def walk(group, prefix):
        for name, sub in group.commands.items():
            yield [*prefix, name], sub
            if hasattr(sub, "commands"):
                yield from walk(sub, [*prefix, name])

    for path, sub in walk(command, []):
        assert (sub.help or "").strip(), f"`cacheaudit {' '.join(path)}` has no help"
        shown = cacheaudit(*path, "--help")
        assert shown.returncode == 0 and "Usage" in shown.stdout


@pytest.mark.parametrize("compiler", ["g++", pytest.param("nvcc", marks=needs_nvcc)])
def test_demo_shows_a_stale_hit_and_names_its_causes(compiler: str, tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    env = dict(os.environ, HOME=str(home), CACHEAUDIT_LEDGER=str(tmp_path / "mine.db"))
    shown = cacheaudit("demo", "--json", "--compiler", compiler, env=env)
    assert shown.returncode == 0, shown.stderr
    demo = json.loads(shown.stdout)
    first, edited, injected = demo["steps"]
    assert first["event"] == "compile"
    # The runtime served its old binary twice, and a fresh compile proves both stale.
    assert edited["event"] == injected["event"] == "disk-hit"
    assert edited["binary"] == injected["binary"] == first["binary"]
    assert edited["stale"] is True and injected["stale"] is True
    errors = {(f["code"], f["subject"].rsplit("/", 1)[-1]) for f in demo["findings"]
              if f["severity"] == "error"}
    assert ("CA101", "tile.h") in errors
    assert ("CA202", "NVCC_APPEND_FLAGS" if compiler == "nvcc" else "CPATH") in errors
    # The user's own ledger and home are untouched, and the temporary directory is gone.
    assert not (tmp_path / "mine.db").exists() and list(home.iterdir()) == []
    assert not os.path.exists(demo["workdir"])


def test_demo_table_names_the_stale_header():
    shown = cacheaudit("demo", "--compiler", "g++", env=dict(os.environ, COLUMNS="200"))
    assert shown.returncode == 0, shown.stderr
    assert "disk-hit" in shown.stdout and "CA101" in shown.stdout and "tile.h" in shown.stdout
