"""The `cacheaudit` command as a user runs it: real subprocesses, real ledgers, exit codes."""

from __future__ import annotations

import json
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
def test_demo_records_both_compiles_with_the_environment_difference(compiler: str):
    shown = cacheaudit("demo", "--json", "--compiler", compiler)
    assert shown.returncode == 0, shown.stderr
    first, second = json.loads(shown.stdout)["records"]
    assert first["options"]["argv"] == second["options"]["argv"]
    assert first["outputs"][0]["digest"] != second["outputs"][0]["digest"]
    if compiler == "nvcc":
        assert second["options"]["injected_by_environment"] == ["-DSCALE=2.0f"]
    else:
        assert first["options"]["environment"]["CPATH"] != second["options"]["environment"][
            "CPATH"]
