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
    assert shown.stdout.rstrip().endswith("cacheaudit: 1 recorded compile")
    assert f"{header_tree / 'src' / 'k.cpp'}: kernel k, compile at " in shown.stdout
    assert "g++" in shown.stdout
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


@pytest.mark.parametrize("columns", [80, 200])
def test_demo_table_names_the_stale_header(columns: int):
    """The demo's narration at the terminal's width: wrapped between words, never cut (an
    80-column terminal once lost every sentence's end, the verdict "stale" with them); a line
    over the width is one that carries a path longer than half of it, whole."""
    shown = cacheaudit("demo", "--compiler", "g++", env=dict(os.environ, COLUMNS=str(columns)))
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "disk-hit" in out and "CA101" in out and "tile.h" in out
    words = " ".join(out.split())
    assert "a fresh compile gives different bytes: stale" in words, out
    assert "how that was established." in words, out
    for line in out.splitlines():
        assert len(line) <= columns or any(len(w) > columns // 2 for w in line.split()), line


# ------------------------------------------------------------------ recorded text, bad input


def _ledger_with(path: Path, *records: object) -> None:
    from cacheaudit.ledger import Ledger, RunInfo

    with Ledger.open(str(path)) as ledger:
        ledger.add_records(records, RunInfo(run_uuid="r", label="test"))  # type: ignore[arg-type]


def _compile(record_id: str | None = None, **changes: object) -> object:
    from cacheaudit.ledger import new_record_id
    from cacheaudit.model import ArgToken, CompileRecord

    values: dict[str, object] = dict(
        record_id=record_id or new_record_id(), event="compile", started_ns=1_700_000_000 * 10**9,
        runtime="deepjit", kernel="gemm", argv=("-DTAG=[/x]",),
        effective_argv=(ArgToken("-DTAG=[/x]"), ArgToken("-DY=[bold]", "env:NVCC_APPEND_FLAGS")),
        test_id="tests/test_k.py::test_k[fp16-128]", exit_code=0, observer="shim:nvcc")
    values.update(changes)
    return CompileRecord(**values)  # type: ignore[arg-type]


def test_report_prints_recorded_text_literally(tmp_path: Path):
    _ledger_with(tmp_path / "l.db", _compile(notes=("odd [red]note[/red]",)))
    shown = cacheaudit("report", "--ledger", str(tmp_path / "l.db"),
                       env=dict(os.environ, COLUMNS="200"))
    assert shown.returncode == 0, shown.stderr
    assert "tests/test_k.py::test_k[fp16-128]" in shown.stdout
    assert "-DTAG=[/x]" in shown.stdout and "+ -DY=[bold]" in shown.stdout
    assert "odd [red]note[/red]" in shown.stdout


def test_report_says_how_many_of_how_many_it_shows(tmp_path: Path):
    """`--limit` cuts the list: the summary says so instead of passing 2 for all."""
    _ledger_with(tmp_path / "l.db", *(_compile(kernel=f"k{n}", started_ns=(1_700_000_000 + n)
                                               * 10**9) for n in range(3)))
    shown = cacheaudit("report", "--ledger", str(tmp_path / "l.db"), "--limit", "2",
                       env=dict(os.environ, COLUMNS="200"))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.rstrip().splitlines()[-1] == (
        "cacheaudit: the last 2 of 3 recorded compiles shown (--limit 3 shows them all)")
    assert "deepjit kernel k1" in shown.stdout and "deepjit kernel k0" not in shown.stdout
    every = cacheaudit("report", "--ledger", str(tmp_path / "l.db"), "--quiet")
    assert every.stdout == "cacheaudit: 3 recorded compiles\n"


def test_report_on_an_empty_file_asks_for_a_scan(tmp_path: Path):
    (tmp_path / "empty.db").touch()
    shown = cacheaudit("report", "--ledger", str(tmp_path / "empty.db"))
    assert shown.returncode == ExitCode.USAGE
    assert shown.stderr.strip().splitlines() == [
        f"cacheaudit: error: {tmp_path / 'empty.db'} is empty or not a cacheaudit ledger yet; "
        "run `cacheaudit scan` or record into it first"]


def test_explain_takes_a_record_id_prefix_literally_and_names_an_ambiguous_one(tmp_path: Path):
    ledger = tmp_path / "l.db"
    _ledger_with(ledger, _compile("ab12" + "0" * 28), _compile("ab34" + "0" * 28))
    env = dict(os.environ, HOME=str(tmp_path))
    both = cacheaudit("explain", "ab", "--ledger", str(ledger), env=env)
    assert both.returncode == ExitCode.USAGE
    assert "'ab' matches 2 records; give more of the record id" in both.stderr
    one = cacheaudit("explain", "ab3", "--ledger", str(ledger), "--json", env=env)
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["record"]["record_id"] == "ab34" + "0" * 28
    # `_` is a character of the id here, not LIKE's any-character.
    wild = cacheaudit("explain", "a_1", "--ledger", str(ledger), env=env)
    assert wild.returncode == ExitCode.USAGE and "no entry path" in wild.stderr


def test_an_output_file_that_cannot_be_written_is_a_usage_error(tmp_path: Path):
    env = dict(os.environ, CACHEAUDIT_LEDGER=str(tmp_path / "l.db"), HOME=str(tmp_path))
    snap = cacheaudit("snapshot", "--timeout", "5", "-o", str(tmp_path / "no" / "x.md"), env=env)
    assert snap.returncode == ExitCode.USAGE
    assert snap.stderr.strip().splitlines() == [
        f"cacheaudit: error: cannot write {tmp_path / 'no' / 'x.md'}: "
        f"no directory {tmp_path / 'no'}"]
    marker = tmp_path / "ran"
    run = cacheaudit("run", "--report-json", str(tmp_path / "no" / "r.json"), "--",
                     sys.executable, "-c", f"open({str(marker)!r}, 'w')", env=env)
    assert run.returncode == ExitCode.USAGE and "cannot write" in run.stderr
    assert not marker.exists()  # refused before the command ran, not after


def test_run_keeps_the_command_status_when_the_audit_fails(tmp_path: Path):
    ledger = tmp_path / "l.db"
    env = dict(os.environ, CACHEAUDIT_LEDGER=str(ledger), HOME=str(tmp_path))
    clobber = (f"import os\nfor s in ('', '-wal', '-shm'):\n"
               f"    if os.path.exists({str(ledger)!r} + s): os.remove({str(ledger)!r} + s)\n"
               f"open({str(ledger)!r}, 'w').write('not a ledger')\nraise SystemExit(5)\n")
    done = cacheaudit("run", "--fail-on", "error", "--", sys.executable, "-c", clobber, env=env)
    assert done.returncode == 5, done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if ln.startswith("cacheaudit:")]
    assert line.startswith("cacheaudit: warning: the audit failed, the command's exit status "
                           "stands: LedgerError")


def test_ctrl_c_exits_130(tmp_path: Path):
    import signal

    fake = tmp_path / "bin"
    fake.mkdir()
    started = tmp_path / "probe-started"
    # A GPU probe that hangs: the snapshot is interrupted while it waits for it.
    (fake / "nvidia-smi").write_text(f"#!/bin/sh\ntouch {started}\nexec sleep 60\n")
    (fake / "nvidia-smi").chmod(0o755)
    env = dict(os.environ, PATH=f"{fake}{os.pathsep}{os.environ['PATH']}", HOME=str(tmp_path),
               CACHEAUDIT_LEDGER=str(tmp_path / "l.db"))
    returncode, err = _signalled_once_started(["snapshot", "--timeout", "120"], env, started,
                                              signal.SIGINT)
    # typer before 0.13 turns Ctrl-C into Abort, later ones into a silent exit 130: both end
    # as 130, the shell's convention, and never as a usage error.
    assert returncode == ExitCode.INTERRUPTED == 130, err
    assert "Traceback" not in err and "aborted" not in err


def test_sigterm_to_run_reaches_its_command_and_its_status_stands(tmp_path: Path):
    import signal

    started, seen = tmp_path / "started", tmp_path / "seen"
    job = (f"trap 'echo got-term > {seen}; exit 42' TERM; touch {started}; "
           "i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done")
    env = dict(os.environ, CACHEAUDIT_LEDGER=str(tmp_path / "l.db"), HOME=str(tmp_path))
    returncode, err = _signalled_once_started(["run", "--", "sh", "-c", job], env, started,
                                              signal.SIGTERM)
    assert seen.read_text().strip() == "got-term", "the command (sh) never got SIGTERM"
    assert returncode == 42, err


def _signalled_once_started(args: list[str], env: dict[str, str], started: Path,
                            sig: int) -> tuple[int, str]:
    """`cacheaudit ARGS` in a process of its own, sent `sig` once `started` exists (or it
    ended, or two minutes passed): its exit status and stderr."""
    import time

    child = subprocess.Popen([sys.executable, "-m", "cacheaudit", *args], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not started.exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.05)
    child.send_signal(sig)
    _out, err = child.communicate(timeout=60)
    return child.returncode, err


def test_a_signal_before_the_command_exists_is_held_and_handed_to_it():
    # `cacheaudit run` installs its forwarder before it starts the command: a signal that lands
    # while Popen runs is kept, then sent to the command as soon as there is one. SIGUSR1, not
    # SIGTERM: a terminating signal also ends this process's own children and refuses new ones
    # (`children.kill_all`), which would stop every later test of this worker that starts one.
    import signal

    from cacheaudit.shimrun import SignalForwarder

    forwarder = SignalForwarder()
    forwarder.receive(signal.SIGUSR1, None)
    command = subprocess.Popen(["sleep", "30"])
    try:
        forwarder.attach(command)
        assert command.wait(timeout=30) == -signal.SIGUSR1, "the held signal never reached sleep"
    finally:
        command.kill()
        command.wait()


def test_demo_without_a_compiler_is_a_usage_error_and_leaves_nothing(tmp_path: Path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, PATH=str(empty), TMPDIR=str(scratch), HOME=str(tmp_path))
    shown = cacheaudit("demo", "--compiler", "g++", env=env)
    assert shown.returncode == ExitCode.USAGE, shown.stderr
    assert shown.stderr.strip().splitlines() == [
        "cacheaudit: error: the demo needs g++ (or nvcc) on PATH to build its kernel"]
    assert list(scratch.iterdir()) == []
