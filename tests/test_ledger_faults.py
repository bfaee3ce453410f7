"""The ledger under faults, and private by default (issue 13, items 5-8), for real: real SQLite
files, real shim subprocesses (`shim_env`), another process holding the ledger's write lock, a
disk that is really full (a size-limited tmpfs in a user and mount namespace), a read-only
mount, and credentials in a compile's argv and in its parent's command line.

Each case leaves its figures for docs/reliability.md (`support.reliability_figure`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.ledger import Ledger, RunInfo, spool_dir, spool_record
from cacheaudit.model import CompileRecord

from support import GXX, ShimEnv, needs_gxx, reliability_figure

HF = "hf_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7"
GHP = "ghp_" + "Zz9Yy8Xx7Ww6Vv5Uu4Tt3Ss2Rr1Qq0Pp9Oo8"
SECRETS = (HF, GHP, HF[3:], GHP[4:])
"""The credentials, and their bodies without the prefix that gives their shape away."""


def cacheaudit(*args: str, env: dict[str, str], cwd: Path | None = None,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=timeout)


class Locker:
    """Another process holding the ledger's write lock (`BEGIN EXCLUSIVE`) for `seconds`."""

    def __init__(self, ledger: Path, seconds: float) -> None:
        code = textwrap.dedent(f"""
            import sqlite3, sys, time
            db = sqlite3.connect({str(ledger)!r}, isolation_level=None)
            db.execute("BEGIN EXCLUSIVE")
            print("locked", flush=True)
            time.sleep({seconds})
            db.execute("COMMIT")
        """)
        self.process = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout is not None
        assert self.process.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)

    def finish(self) -> float:
        """Wait for the holder to commit on its own; how long that took from now."""
        started = time.monotonic()
        self.process.wait(timeout=120)
        return time.monotonic() - started


def _compile_args(tree: Path, name: str) -> list[str]:
    return ["-c", "-I../inc", "k.cpp", "-o", f"../out/{name}.o"]


def _timed(run: object) -> tuple[float, subprocess.CompletedProcess[bytes]]:
    started = time.monotonic()
    done = run()  # type: ignore[operator]
    return time.monotonic() - started, done


def _records(ledger: Path) -> list[CompileRecord]:
    with Ledger.open(str(ledger), create=False) as opened:
        return opened.records()


def _spooled(ledger: Path) -> list[str]:
    directory = spool_dir(str(ledger))
    return sorted(os.listdir(directory)) if os.path.isdir(directory) else []


# ------------------------------------------------------------------ a busy ledger


def _locked_compile(shim_env: ShimEnv, header_tree: Path, lock_s: float, case: str) -> None:
    env = {"CPATH": str(header_tree / "cpath")}
    src = header_tree / "src"
    bare_s, bare = _timed(lambda: shim_env.run(
        [GXX, *_compile_args(header_tree, "bare")], cwd=src, env=shim_env.bare_env(env)))
    assert bare.returncode == 0, bare.stderr
    Ledger.open(str(shim_env.ledger)).close()
    locker = Locker(shim_env.ledger, lock_s)
    try:
        shim_s, done = _timed(lambda: shim_env.run(
            ["g++", *_compile_args(header_tree, "k")], cwd=src, env=env))
        assert done.returncode == 0 and (header_tree / "out" / "k.o").exists(), done.stderr
        # Truth: the object the shim's compile wrote is the bare compile's.
        assert (header_tree / "out" / "k.o").read_bytes() == (
            header_tree / "out" / "bare.o").read_bytes()
        [line] = done.stderr.decode().splitlines()
        spooled_now = [n for n in _spooled(shim_env.ledger) if n.endswith(".json")]
        assert len(spooled_now) == 1, _spooled(shim_env.ledger)
        assert "is busy" in line and f"spooled to {spool_dir(str(shim_env.ledger))}" in line
        # A reader while the lock is still held: it waits a while, then says so in one line.
        waited_s, report = _timed(lambda: cacheaudit(
            "report", "--json", "--ledger", str(shim_env.ledger), env=shim_env.env))
        assert report.returncode == 0, report.stderr
        assert "is busy" in report.stderr and "1 spooled record(s)" in report.stderr
        assert json.loads(report.stdout)["records"] == [] if isinstance(
            json.loads(report.stdout), dict) else json.loads(report.stdout) == []
        # The holder keeps its lock for the whole time and commits on its own.
        locker.finish()
    finally:
        locker.release()
    # The next writer folds the spooled record in along with its own.
    again = shim_env.run(["g++", *_compile_args(header_tree, "k2")], cwd=src, env=env)
    assert again.returncode == 0 and again.stderr == b"", again.stderr
    records = _records(shim_env.ledger)
    outputs = sorted(os.path.basename(o.path) for r in records for o in r.outputs)
    assert outputs == ["k.o", "k2.o"], outputs
    assert _spooled(shim_env.ledger) == []
    # Read again: nothing twice.
    report = cacheaudit("report", "--json", "--ledger", str(shim_env.ledger), env=shim_env.env)
    assert report.returncode == 0 and report.stderr == "", report.stderr
    assert len({r.record_id for r in _records(shim_env.ledger)}) == 2
    assert shim_s - bare_s < 2.0, (shim_s, bare_s)
    reliability_figure("faults", case, lock_held_s=lock_s, bare_compile_s=round(bare_s, 3),
                       shim_compile_s=round(shim_s, 3), reader_waited_s=round(waited_s, 3),
                       records_spooled=1, records_ingested=1, records_lost=0,
                       records_duplicated=len(records) - len({r.record_id for r in records}))


@needs_gxx
def test_a_compile_beside_a_ledger_locked_for_8_s_is_spooled_at_once(
        shim_env: ShimEnv, header_tree: Path):
    _locked_compile(shim_env, header_tree, 8.0, "compile beside a ledger locked 8 s")


@needs_gxx
@pytest.mark.slow
def test_a_compile_beside_a_ledger_locked_for_30_s_is_spooled_at_once(
        shim_env: ShimEnv, header_tree: Path):
    _locked_compile(shim_env, header_tree, 30.0, "compile beside a ledger locked 30 s")


def test_an_in_process_writer_spools_instead_of_waiting_on_a_busy_ledger(tmp_path: Path):
    from cacheaudit import recorder

    ledger = tmp_path / "ledger.db"
    Ledger.open(str(ledger)).close()
    env = {"CACHEAUDIT_LEDGER": str(ledger), "CACHEAUDIT_RUN": "in-process"}
    locker = Locker(ledger, 10.0)
    try:
        waited_s, problem = _timed(lambda: recorder.record_event(
            runtime="toy", kernel="k", event="memory-hit", observer="adapter:toy", env=env))
        assert problem is not None and "is busy" in problem and "spooled to" in problem
        second_s, problem = _timed(lambda: recorder.record_event(
            runtime="toy", kernel="k2", event="memory-hit", observer="adapter:toy", env=env))
        assert problem is not None and "spooled to" in problem
    finally:
        locker.release()
    assert waited_s < 1.0 and second_s < 1.0, (waited_s, second_s)
    assert recorder.record_event(runtime="toy", kernel="k3", event="memory-hit",
                                 observer="adapter:toy", env=env) is None
    recorder._HELD.close()
    kernels = sorted(r.kernel or "" for r in _records(ledger))
    assert kernels == ["k", "k2", "k3"] and _spooled(ledger) == []
    reliability_figure("faults", "in-process writer beside a locked ledger",
                       first_write_s=round(waited_s, 3), second_write_s=round(second_s, 3),
                       records_spooled=2, records_ingested=2, records_lost=0)


def _project(tmp_path: Path) -> object:
    from truth_table import Project

    made = Project(tmp_path / "p", "gxx")
    made.root.mkdir()
    made.setup()
    made.env.pop("XDG_CONFIG_HOME", None)  # the sealing secret lives under the project's HOME
    return made


@needs_gxx
def test_a_scan_beside_a_busy_ledger_waits_once_and_says_so_in_one_line(tmp_path: Path):
    p: Any = _project(tmp_path)
    served = p.once()
    assert served["digest"] == p.fresh()  # truth: fresh
    unlocked = p.scan()
    locker = Locker(p.ledger, 60.0)
    try:
        took_s, done = _timed(lambda: p.scan_process(str(p.cache)))
    finally:
        locker.release()
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    def verdicts(scanned: dict[str, Any]) -> list[tuple[str, str, str]]:
        return sorted((f["code"], f["subject"], f["entry"] or "") for f in scanned["findings"])

    # The same verdicts as without the lock, none of them an error (truth: fresh).
    assert report["entries"] == 1 and verdicts(report) == verdicts(unlocked), report
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    busy = [line for line in done.stderr.splitlines() if "is busy" in line]
    assert len(busy) == 1 and "nothing this command learnt is kept" in busy[0], done.stderr
    # One wait of the readers' patience (5 s), not one per write.
    assert took_s < 15, took_s
    reliability_figure("faults", "scan beside a ledger locked 60 s", scan_s=round(took_s, 3),
                       busy_lines=len(busy), entries=report["entries"])


# ------------------------------------------------------------------ a full disk


_FULL_DISK = textwrap.dedent("""
    import os, subprocess, sys, json
    disk, ledger, tree, shim_env = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", disk], check=True)
    from cacheaudit.ledger import Ledger
    Ledger.open(ledger).close()
    locker = subprocess.Popen([sys.executable, "-c",
        "import sqlite3,sys,time; db=sqlite3.connect(sys.argv[1], isolation_level=None);"
        "db.execute('BEGIN EXCLUSIVE'); print('locked', flush=True); time.sleep(3)", ledger],
        stdout=subprocess.PIPE, text=True)
    assert locker.stdout.readline().strip() == "locked"
    filler = os.open(os.path.join(disk, "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(filler, b"x" * 4096)
    except OSError:
        os.close(filler)
    done = subprocess.run(["g++", "-c", "-I../inc", "k.cpp", "-o", "../out/k.o"],
                          cwd=os.path.join(tree, "src"), env=shim_env, capture_output=True)
    locker.kill()
    left = sorted(os.path.relpath(os.path.join(d, n), disk)
                  for d, _, names in os.walk(disk) for n in names)
    print(json.dumps({"rc": done.returncode, "stderr": done.stderr.decode(), "left": left,
                      "object": os.path.exists(os.path.join(tree, "out", "k.o"))}))
""")


def _user_namespaces() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "true"], capture_output=True)
    return probe.returncode == 0


@needs_gxx
@pytest.mark.skipif(not _user_namespaces(), reason="no user namespaces (unshare -rm): a full "
                    "tmpfs cannot be mounted without root")
def test_a_full_disk_leaves_no_spool_temporary_and_says_what_happened(
        shim_env: ShimEnv, header_tree: Path, tmp_path: Path):
    disk = tmp_path / "disk"
    disk.mkdir()
    ledger = disk / "ledger.db"
    env = dict(shim_env.env, CACHEAUDIT_LEDGER=str(ledger), CPATH=str(header_tree / "cpath"))
    script = tmp_path / "full_disk.py"
    script.write_text(_FULL_DISK)
    done = subprocess.run(["unshare", "-rm", sys.executable, str(script), str(disk), str(ledger),
                           str(header_tree), json.dumps(env)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["rc"] == 0 and seen["object"], seen
    [line] = seen["stderr"].splitlines()
    assert "not recorded: no space left on device writing " + spool_dir(str(ledger)) in line
    assert "record lost" not in line and "spooled to" not in line
    temporaries = [n for n in seen["left"] if n.endswith(".tmp") or "spool" in n]
    assert temporaries == [], seen["left"]
    assert set(seen["left"]) <= {"filler", "ledger.db", "ledger.db-wal", "ledger.db-shm"}
    reliability_figure("faults", "record spooled onto a full disk (tmpfs, ENOSPC)",
                       records_refused_by_the_full_disk=1, said_not_recorded=1,
                       temporaries_left=len(temporaries))


def test_temporaries_of_dead_writers_are_swept_and_a_live_one_is_kept(tmp_path: Path):
    ledger = tmp_path / "ledger.db"
    Ledger.open(str(ledger)).close()
    record = CompileRecord(record_id="a" * 32, event="compile", started_ns=1, observer="shim:g++")
    spool_record(str(ledger), record, RunInfo(run_uuid="r", label="shim"))
    directory = Path(spool_dir(str(ledger)))
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = socket.gethostname()
    old = time.time() - 60
    gone = [directory / f".{'b' * 32}.{host}.{dead.pid}.tmp",  # this version's name
            directory / f"{'c' * 32}.json.{dead.pid}.tmp",  # the 0-byte leftover of before
            directory / f".{'d' * 32}.elsewhere.{os.getpid()}.tmp"]  # another host's, old
    for path in gone:
        path.write_bytes(b"")
    os.utime(gone[0], (old, old))
    os.utime(gone[1], (old, old))
    os.utime(gone[2], (old - 7200, old - 7200))
    live = directory / f".{'e' * 32}.{host}.{os.getpid()}.tmp"
    live.write_bytes(b"{")
    done = cacheaudit("report", "--json", "--ledger", str(ledger), env=dict(os.environ))
    assert done.returncode == 0, done.stderr
    assert sorted(os.listdir(directory)) == [live.name]
    assert [r.record_id for r in _records(ledger)] == ["a" * 32]
    reliability_figure("faults", "spool temporaries of dead writers swept",
                       swept=len(gone), kept_live=1, records_ingested=1)


# ------------------------------------------------------------------ private by default


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@needs_gxx
def test_ledger_wal_spool_and_snapshot_are_private_under_umask_022(
        shim_env: ShimEnv, header_tree: Path, tmp_path: Path):
    import sqlite3

    home = tmp_path / "home"  # made by the user: left as it is
    home.mkdir(mode=0o755)
    os.chmod(home, 0o755)
    ledger = home / "made" / "by" / "cacheaudit" / "ledger.db"
    env = {"CACHEAUDIT_LEDGER": str(ledger), "CPATH": str(header_tree / "cpath")}
    src = header_tree / "src"
    previous = os.umask(0o022)
    try:
        first = shim_env.run(["g++", *_compile_args(header_tree, "k")], cwd=src, env=env)
        assert first.returncode == 0 and first.stderr == b"", first.stderr
        # A reader in a transaction keeps the WAL and SHM files after the next compile.
        holder = sqlite3.connect(ledger, isolation_level=None)
        holder.execute("BEGIN")
        holder.execute("SELECT count(*) FROM records").fetchone()
        second = shim_env.run(["g++", *_compile_args(header_tree, "k2")], cwd=src, env=env)
        assert second.returncode == 0 and second.stderr == b"", second.stderr
        files = [ledger, Path(f"{ledger}-wal"), Path(f"{ledger}-shm")]
        assert all(f.exists() for f in files), os.listdir(ledger.parent)
        locker = Locker(ledger, 10.0)
        try:
            third = shim_env.run(["g++", *_compile_args(header_tree, "k3")], cwd=src, env=env)
        finally:
            locker.release()
        assert third.returncode == 0 and b"spooled to" in third.stderr, third.stderr
        spool = Path(spool_dir(str(ledger)))
        files += list(spool.iterdir())
        directories = [ledger.parent, ledger.parent.parent, ledger.parent.parent.parent, spool]
        exposed = {str(f): oct(_mode(f)) for f in files if _mode(f) & 0o077}
        exposed.update({str(d): oct(_mode(d)) for d in directories if _mode(d) != 0o700})
        snapshot = tmp_path / "snapshot.md"
        shown = cacheaudit("snapshot", "--output", str(snapshot), "--timeout", "5",
                           env=dict(shim_env.env, **env))
        assert shown.returncode == 0, shown.stderr
        files.append(snapshot)
        if _mode(snapshot) & 0o077:
            exposed[str(snapshot)] = oct(_mode(snapshot))
        holder.close()
    finally:
        os.umask(previous)
    assert len(files) == 5 and exposed == {}, exposed
    assert _mode(home) == 0o755  # the user's own directory is never changed
    reliability_figure("faults", "new ledger, WAL, SHM, spool and snapshot under umask 022",
                       files_checked=len(files), directories_checked=len(directories),
                       readable_by_others=len(exposed))


@needs_gxx
def test_credentials_in_argv_and_the_parent_command_are_stored_nowhere(
        shim_env: ShimEnv, header_tree: Path):
    import sqlite3

    env = {"CPATH": str(header_tree / "cpath")}
    src = header_tree / "src"
    holder_ready = Ledger.open(str(shim_env.ledger))
    holder_ready.close()
    # A reader in a transaction keeps the WAL on disk, to be read too.
    holder = sqlite3.connect(shim_env.ledger, isolation_level=None)
    holder.execute("BEGIN")
    holder.execute("SELECT count(*) FROM records").fetchone()
    # The runtime: a Python process whose own command carries a token, compiling with one.
    parent = ("import subprocess, sys; "
              "sys.exit(subprocess.run(sys.argv[4:]).returncode)")
    done = shim_env.run([sys.executable, "-c", parent, f"--github-token={GHP}", "--password",
                         "hunter2-is-my-password", "g++", f"-DHF_TOKEN={HF}",
                         "-DAPI_KEY=hunter2-api", "-DX=1", *_compile_args(header_tree, "k")],
                        cwd=src, env=env)
    assert done.returncode == 0 and done.stderr == b"", done.stderr
    [record] = _records(shim_env.ledger)
    # Truth: the compile ran with the real words, the record keeps them redacted and says where.
    assert record.argv[:3] == ("-DHF_TOKEN=<redacted>", "-DAPI_KEY=<redacted>", "-DX=1")
    assert record.redacted_argv == (0, 1)
    with Ledger.open(str(shim_env.ledger), create=False) as opened:
        [run] = opened.runs().values()
    assert run.command is not None and "--github-token=<redacted>" in run.command
    assert run.command[run.command.index("--password") + 1] == "<redacted>"
    ledger_bytes = b"".join(Path(f"{shim_env.ledger}{s}").read_bytes()
                            for s in ("", "-wal") if Path(f"{shim_env.ledger}{s}").exists())
    assert Path(f"{shim_env.ledger}-wal").stat().st_size > 0
    outputs = {
        "report": cacheaudit("report", "--ledger", str(shim_env.ledger), env=shim_env.env),
        "report --json": cacheaudit("report", "--json", "--graph", "--ledger",
                                    str(shim_env.ledger), env=shim_env.env),
        "scan": cacheaudit("scan", "--json", "--allow-empty", "--ledger", str(shim_env.ledger),
                           env=dict(shim_env.env, HOME=str(header_tree))),
        "explain": cacheaudit("explain", record.record_id, "--json", "--ledger",
                              str(shim_env.ledger), env=shim_env.env),
    }
    holder.close()
    assert {n: o.returncode for n, o in outputs.items()} == dict.fromkeys(outputs, 0), {
        n: o.stderr for n, o in outputs.items()}
    assert "<redacted>" in outputs["report --json"].stdout
    assert "<redacted>" in outputs["explain"].stdout, outputs["explain"].stderr
    secrets = [b"hunter2", *(s.encode() for s in SECRETS)]
    found = [f"ledger: {s!r}" for s in secrets if s in ledger_bytes]
    for name, shown in outputs.items():
        text = (shown.stdout + shown.stderr).encode()
        found += [f"{name}: {s!r}" for s in secrets if s in text]
    assert found == []
    reliability_figure("faults", "credentials in argv and the parent's command",
                       secrets_planted=3, places_searched=2 + len(outputs),
                       secrets_found=len(found))


# ------------------------------------------------------------------ a read-only ledger


_READ_ONLY_MOUNT = ("mount --bind \"$1\" \"$1\" && mount -o remount,bind,ro \"$1\" && "
                    "shift && exec \"$@\"")


def _read_only_runner(directory: Path) -> list[str]:
    """How to run a command that finds `directory` read-only: chmod where that binds (not
    root), else a read-only bind mount in a user and mount namespace."""
    if os.geteuid() != 0:
        for path in directory.iterdir():
            os.chmod(path, 0o444)
        os.chmod(directory, 0o555)
        return []
    if not _user_namespaces():
        pytest.skip("root ignores file modes, and no user namespace for a read-only mount")
    return ["unshare", "-rm", "sh", "-c", _READ_ONLY_MOUNT, "sh", str(directory)]


@needs_gxx
def test_a_read_only_ledger_is_read_and_nothing_is_written(
        shim_env: ShimEnv, header_tree: Path, tmp_path: Path):
    env = {"CPATH": str(header_tree / "cpath")}
    done = shim_env.run(["g++", *_compile_args(header_tree, "k")], cwd=header_tree / "src",
                        env=env)
    assert done.returncode == 0, done.stderr
    [record] = _records(shim_env.ledger)
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    ledger = shelf / "ledger.db"
    shutil.copy(shim_env.ledger, ledger)
    spool_record(str(ledger), CompileRecord(record_id="f" * 32, event="compile", started_ns=1,
                                            observer="shim:g++"), RunInfo("r", "shim"))
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in shelf.rglob("*")}
    prefix = _read_only_runner(shelf)
    try:
        def run(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([*prefix, sys.executable, "-m", "cacheaudit", *args,
                                   "--ledger", str(ledger)], capture_output=True, text=True,
                                  env=dict(shim_env.env, HOME=str(tmp_path)), timeout=120)

        shown = {"report": run("report", "--json"),
                 "explain": run("explain", record.record_id, "--json"),
                 "scan": run("scan", "--json", "--allow-empty")}
    finally:
        if os.geteuid() != 0:
            os.chmod(shelf, 0o755)
    failed = {name: s.stderr for name, s in shown.items() if s.returncode not in (0, 1)}
    assert failed == {}, "\n".join(f"{n}: {e}" for n, e in failed.items())
    report = json.loads(shown["report"].stdout)
    listed = report["records"] if isinstance(report, dict) else report
    assert record.record_id in json.dumps(listed)
    assert record.record_id in shown["explain"].stdout
    for name in ("report", "scan"):
        assert "is read-only" in shown[name].stderr, (name, shown[name].stderr)
    assert "1 spooled record(s)" in shown["report"].stderr
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in shelf.rglob("*")}
    assert after == before
    reliability_figure("faults", "read-only ledger read by report, explain, scan",
                       commands=len(shown), commands_failed=len(failed),
                       files_written=len(set(after.items()) ^ set(before.items())))


# ------------------------------------------------------------------ the oracle and redaction


@needs_gxx
def test_verify_refuses_a_command_stored_redacted_with_ca501(tmp_path: Path):
    import dataclasses
    import sqlite3

    from cacheaudit import seal
    from cacheaudit.ledger.redact import redact_record

    from truth_table import Project

    p = Project(tmp_path / "p", "gxx")
    p.root.mkdir()
    p.setup()
    p.env.pop("XDG_CONFIG_HOME", None)  # the sealing secret lives under the project's HOME
    served = p.once()
    assert served["digest"] == p.fresh()  # truth: the entry is fresh
    with Ledger.open(str(p.ledger)) as opened:
        [built] = [r for r in opened.records()
                   if r.event == "compile" and any("kernel.cu" in a for a in r.argv)]
        runs = opened.runs()
    # The same compile as a recorder stores it when its argv carries a token: redacted, sealed.
    with_token = dataclasses.replace(built, argv=(*built.argv, f"-DHF_TOKEN={HF}"), seal=None)
    stored = seal.sealed(redact_record(with_token), p.env)
    assert stored.redacted_argv == (len(built.argv),) and stored.seal
    with sqlite3.connect(p.ledger) as db:
        db.execute("DELETE FROM records WHERE record_uuid = ?", (built.record_id,))
    with Ledger.open(str(p.ledger)) as opened:
        opened.add_records([stored], runs[str(built.run_uuid)])
    done = cacheaudit("verify", "--json", "--ledger", str(p.ledger), "--fail-on", "never",
                      env=p.env, cwd=p.root)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    codes = {(f["code"], os.path.basename(f["subject"])) for f in report["findings"]}
    assert codes == {("CA501", os.path.basename(served["path"]))}, report["findings"]
    [finding] = report["findings"]
    assert "a redacted argument cannot be rebuilt" in finding["message"]
    assert HF not in done.stdout + done.stderr
    reliability_figure("faults", "verify of a command stored redacted",
                       rebuilt=0, refused_ca501=1, false_ca403=0)


@needs_gxx
@pytest.mark.parametrize("how", ["variable", "pyproject"])
def test_the_documented_opt_out_keeps_the_command_line_verbatim(
        shim_env: ShimEnv, header_tree: Path, how: str):
    ledger = shim_env.ledger
    env = dict(shim_env.env, CPATH=str(header_tree / "cpath"),
               XDG_CACHE_HOME=str(header_tree / "xdg"))
    compile_argv = ["g++", f"-DHF_TOKEN={HF}", *_compile_args(header_tree, "k")]
    if how == "variable":
        done = shim_env.run(compile_argv, cwd=header_tree / "src",
                            env={**env, "CACHEAUDIT_REDACT_ARGV": "0"})
    else:
        (header_tree / "src" / "pyproject.toml").write_text(
            "[tool.cacheaudit]\nredact-argv = false\n")
        done = shim_env.run([sys.executable, "-m", "cacheaudit", "run", "--ledger", str(ledger),
                             "--", *compile_argv], cwd=header_tree / "src", env=env)
    assert done.returncode == 0, done.stderr
    [record] = [r for r in _records(ledger) if r.event == "compile"]
    assert record.argv[0] == f"-DHF_TOKEN={HF}" and record.redacted_argv == ()


_ARGV_CASES = [
    # (word, the word before it, as stored)
    (f"-DHF_TOKEN={HF}", None, "-DHF_TOKEN=<redacted>"),
    ("-DAPI_KEY=abc123", None, "-DAPI_KEY=<redacted>"),
    (f"--github-token={GHP}", None, "--github-token=<redacted>"),
    ("--token=abc", None, "--token=<redacted>"),
    ("hunter2", "--password", "<redacted>"),
    ("MY_SECRET=1", "-D", "MY_SECRET=<redacted>"),
    ("GITHUB_TOKEN=abc", None, "GITHUB_TOKEN=<redacted>"),
    ("CUDA_VISIBLE_DEVICES=0", None, "CUDA_VISIBLE_DEVICES=0"),
    ("-Xcompiler=-DAPI_KEY=zz", None, "-Xcompiler=-DAPI_KEY=<redacted>"),
    (f"--define-macro=X={HF}", None, "--define-macro=X=<redacted>"),
    ("sk-" + "a" * 40, None, "<redacted>"),
    ("AKIA" + "ABCDEFGHIJKLMNOP", None, "<redacted>"),
    ("xoxb-" + "1" * 12, None, "<redacted>"),
    ("github_pat_" + "b" * 30, None, "<redacted>"),
    # Kept: flags, paths, cache keys, an option's value that is another option.
    ("-O3", None, "-O3"), ("-DX=1", None, "-DX=1"), ("--std=c++17", None, "--std=c++17"),
    ("-gencode=arch=compute_90,code=sm_90", None, "-gencode=arch=compute_90,code=sm_90"),
    ("-DCACHE_KEY=3", None, "-DCACHE_KEY=3"), ("-DTOKENIZERS=1", None, "-DTOKENIZERS=1"),
    ("-O2", "--password", "-O2"), ("-I/usr/include", None, "-I/usr/include"),
]


@pytest.mark.parametrize(("word", "after", "stored"), _ARGV_CASES)
def test_argv_words_are_redacted_by_the_environment_s_rules(word: str, after: str | None,
                                                            stored: str):
    from cacheaudit.envvars import redact, redact_argv

    words = [after, word] if after else [word]
    kept, changed = redact_argv(words)
    assert kept[-1] == stored
    assert changed == ((len(words) - 1,) if stored != word else ())
    if "=" in word and not word.startswith("-") and after is None:
        name, value = word.split("=", 1)
        assert kept[-1] == f"{name}={redact(name, value)}"  # one rule for both


@needs_gxx
def test_a_run_report_keeps_no_credential_and_is_private(shim_env: ShimEnv, header_tree: Path):
    report_json = header_tree / "r.json"
    env = dict(shim_env.env, CPATH=str(header_tree / "cpath"),
               XDG_CACHE_HOME=str(header_tree / "xdg"))
    previous = os.umask(0o022)
    try:
        done = shim_env.run([sys.executable, "-m", "cacheaudit", "run", "--ledger",
                             str(shim_env.ledger), "--report-json", str(report_json), "--",
                             "g++", f"-DHF_TOKEN={HF}", f"-DGH={GHP}",
                             *_compile_args(header_tree, "k")], cwd=header_tree / "src", env=env)
    finally:
        os.umask(previous)
    assert done.returncode == 0, done.stderr
    assert (header_tree / "out" / "k.o").exists()  # truth: the compile ran as asked
    written = report_json.read_text()
    assert json.loads(written)["argv"][:3] == [
        "g++", "-DHF_TOKEN=<redacted>", "-DGH=<redacted>"]
    shown = done.stdout + done.stderr + written.encode()
    ledger_bytes = shim_env.ledger.read_bytes()
    found = [s for s in SECRETS if s.encode() in shown or s.encode() in ledger_bytes]
    assert found == [] and _mode(report_json) == 0o600, (found, oct(_mode(report_json)))
    reliability_figure("faults", "credentials in a `cacheaudit run` command and its report",
                       secrets_planted=2, secrets_found=len(found),
                       report_mode=oct(_mode(report_json)))
