"""The rebuild oracle (`cacheaudit verify`, `scan --verify`), run for real on real caches.

Every verdict is checked against the ground truth of the truth table: the same request in a new
process against an empty cache (`Project.fresh`), compared byte for byte with what the cache
serves. The oracle itself runs as a user runs it: `python -m cacheaudit` in a subprocess, with
the project's environment, real compilers, a real ledger.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from cacheaudit.exceptions import ExitCode

from support import needs_gxx, needs_nvcc
from truth_table import SOURCE, Project, _write

pytestmark = needs_gxx


def cacheaudit(*args: str, env: dict[str, str],
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


def xxh3(path: str | Path) -> str:
    return xxhash.xxh3_128_hexdigest(Path(path).read_bytes())


@pytest.fixture
def project(tmp_path: Path) -> Project:
    made = Project(tmp_path / "p", "gxx")
    made.root.mkdir()
    made.setup()
    made.env.pop("XDG_CONFIG_HOME", None)  # the sealing secret lives under the project's HOME
    return made


def verify(p: Project, *args: str, **changes: str | None) -> tuple[int, dict[str, Any], str]:
    done = cacheaudit("verify", *args, "--json", "--ledger", str(p.ledger),
                      "--fail-on", "error", env=p._env(changes), cwd=p.root)
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    return done.returncode, report, done.stderr


def scan(p: Project, *args: str, **changes: str | None) -> tuple[int, dict[str, Any], str]:
    done = cacheaudit("scan", str(p.cache), *args, "--json", "--ledger", str(p.ledger),
                      "--fail-on", "error", "--no-progress", env=p._env(changes), cwd=p.root)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout), done.stderr


def outcomes(report: dict[str, Any]) -> dict[str, str]:
    return {os.path.basename(v["entry"]): v["outcome"] for v in report["verdicts"]}


def private_dirs(p: Project) -> list[str]:
    return sorted(n for n in os.listdir(p.root / "tmp") if n.startswith("cacheaudit-verify-"))


def processes_naming(text: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        if text.encode() in cmdline:
            found.append(int(pid))
    return found


# ------------------------------------------------------------------------------ the demo


def _demo(tmp_path: Path, compiler: str) -> tuple[dict[str, Any], dict[str, str]]:
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "NVCC_", "DG_", "PYTEST_", "XDG_CONFIG"))}
    env.update(HOME=str(home), CACHEAUDIT_LEDGER=str(tmp_path / "mine.db"),
               TMPDIR=str(tmp_path))
    shown = cacheaudit("demo", "--json", "--keep", "--compiler", compiler, env=env)
    assert shown.returncode == 0, shown.stderr
    demo, _ = json.JSONDecoder().raw_decode(shown.stdout)
    work = demo["workdir"]
    # The demo's own environment, as a user of its cache would have it (CPATH left unset).
    env.update(HOME=work, CACHEAUDIT_LEDGER=os.path.join(work, "ledger.db"),
               DG_JIT_CACHE_DIR=os.path.join(work, "cache"),
               DG_JIT_NVCC_COMPILER=os.path.join(work, "shims",
                                                 "nvcc" if compiler == "nvcc" else "g++"),
               PATH=os.pathsep.join([os.path.join(work, "shims"), env["PATH"]]))
    return demo, env


@pytest.mark.parametrize("compiler", ["g++", pytest.param("nvcc", marks=needs_nvcc)])
def test_verify_on_the_demo_cache_finds_nothing_before_the_edit_and_ca403_after(
        compiler: str, tmp_path: Path):
    from cacheaudit.demo import TILE_H

    demo, env = _demo(tmp_path, compiler)
    work = Path(demo["workdir"])
    first, edited, _ = demo["steps"]
    [entry] = list((work / "cache" / "cache").iterdir())
    binary = next(p for p in entry.iterdir() if p.name in ("kernel.so", "kernel.cubin"))
    # Ground truth: the cached binary is the first request's compile; after the edit of the
    # untracked tile.h the runtime served it again while a fresh compile gives other bytes.
    assert first["event"] == "compile" and xxh3(binary) == first["binary"]
    assert edited["event"] == "disk-hit" and edited["stale"] is True

    # The demo leaves tile.h edited: the oracle proves the entry stale, naming it.
    done = cacheaudit("verify", "--json", env=env)
    assert done.returncode == ExitCode.FINDINGS, done.stderr
    report = json.loads(done.stdout)
    [finding] = report["findings"]
    assert finding["code"] == "CA403" and finding["subject"] == str(entry)
    assert finding["recorded"].startswith(f"xxh3 {first['binary']}")
    assert finding["current"].startswith(f"xxh3 {edited['fresh']}")  # the fresh compile's
    assert "recorded compile" in finding["how"]  # the shim recorded the build: its command
    assert f"will run for {entry}" in done.stderr

    # Before the edit (tile.h as it was), a fresh compile gives the cached bytes: nothing.
    _write(work / "third_party" / "cutlite" / "tile.h", TILE_H)
    done = cacheaudit("verify", str(entry), "--json", env=env)
    assert done.returncode == ExitCode.CLEAN, done.stderr
    report = json.loads(done.stdout)
    assert report["findings"] == [] and outcomes(report) == {entry.name: "identical"}
    assert [n for n in os.listdir(tmp_path) if n.startswith("cacheaudit-verify-")] == []


# ------------------------------------------------------------------------------ truth table


def test_a_stale_entry_is_proven_different_and_a_fresh_one_identical(project: Project):
    p = project
    p.once()
    unchanged = p.once()
    assert unchanged["event"] == "disk-hit" and unchanged["digest"] == p.fresh()  # truth
    code, report, stderr = verify(p)
    assert code == ExitCode.CLEAN, stderr
    assert report["findings"] == []
    assert outcomes(report) == {os.path.basename(unchanged["path"]): "identical"}

    _write(p.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 2\n")
    served = p.once()
    fresh = p.fresh()
    assert served["event"] == "disk-hit" and served["digest"] != fresh  # truth: stale
    code, report, stderr = verify(p, served["path"])
    assert code == ExitCode.FINDINGS, stderr
    [finding] = report["findings"]
    assert (finding["code"], finding["subject"]) == ("CA403", served["path"])
    assert finding["recorded"].startswith(f"xxh3 {served['digest']}")
    assert finding["current"].startswith(f"xxh3 {fresh}")
    assert private_dirs(p) == []


def test_scan_verify_proves_an_environment_change_after_an_unrecorded_build(project: Project):
    p = project
    built = p.once(CACHEAUDIT_DISABLE="1")  # before cacheaudit was installed: no record
    assert built["event"] == "compile"
    env_b = str(p.root / "envB")

    # Unchanged: CPATH as at the build. The scan can only warn; the oracle proves it fresh.
    assert p.fresh() == built["digest"]  # truth
    code, report, _ = scan(p)
    assert [f["code"] for f in report["findings"] if f["severity"] == "error"] == []
    code, report, stderr = scan(p, "--verify")
    assert code == ExitCode.CLEAN, stderr
    # What stays are warnings about what a future edit would do, each saying it was proven.
    assert {f["code"] for f in report["findings"]} == {"CA201", "CA102"}
    [ca201] = [f for f in report["findings"] if f["code"] == "CA201"]
    assert ca201["subject"] == "CPATH" and "1 entry proven identical" in ca201["message"]
    [ca102] = [f for f in report["findings"] if f["code"] == "CA102"]
    assert ca102["entry"] == built["path"] and "rebuild oracle: a fresh compile gives the " \
        "cached binary byte for byte" in ca102["message"]
    assert f"{built['path']}: identical" in stderr

    # CPATH now names another envconst.h: the runtime would serve the old binary.
    served = p.once(CPATH=env_b, CACHEAUDIT_DISABLE="1")
    fresh = p.fresh(CPATH=env_b)
    assert served["event"] == "disk-hit" and served["digest"] != fresh  # truth: stale
    code, report, _ = scan(p, CPATH=env_b)
    assert code == ExitCode.CLEAN  # the scan alone: a warning
    assert next(f for f in report["findings"] if f["subject"] == "CPATH")["code"] == "CA201"
    assert not [f for f in report["findings"] if f["severity"] == "error"]
    code, report, stderr = scan(p, "--verify", CPATH=env_b)
    assert code == ExitCode.FINDINGS, stderr
    [proof] = [f for f in report["findings"] if f["code"] == "CA403"]
    assert proof["subject"] == served["path"]
    assert proof["recorded"].startswith(f"xxh3 {served['digest']}")
    assert proof["current"].startswith(f"xxh3 {fresh}")
    assert "layout's command" in proof["how"] and "current environment" in proof["how"]
    assert private_dirs(p) == []


def test_ca404_for_a_compiler_named_by_the_configuration_that_embeds_the_time(
        project: Project):
    p = project
    clock = p.wrapper("g++", 'exec REAL -DEXTRA="1$(date +%N)" "$@"\n')
    built = p.once(CACHEAUDIT_DISABLE="1", DG_JIT_NVCC_COMPILER=str(clock))
    # Truth: two fresh compiles of the same inputs give different binaries.
    assert p.fresh(DG_JIT_NVCC_COMPILER=str(clock)) != p.fresh(DG_JIT_NVCC_COMPILER=str(clock))
    code, report, stderr = verify(p, DG_JIT_NVCC_COMPILER=str(clock))
    assert code == ExitCode.CLEAN, stderr  # a warning: the bytes prove nothing either way
    [finding] = report["findings"]
    assert (finding["code"], finding["subject"]) == ("CA404", built["path"]), finding
    assert finding["recorded"] != finding["current"]
    assert f"&& {clock} " in stderr  # the compiler the configuration names

    # The cache's own command names the clock wrapper too; with the configuration naming none,
    # the oracle runs the g++ on PATH, never the program the cache names: a fresh, plain
    # compile (EXTRA 0) differs from the cached one, and two such builds agree.
    code, report, stderr = verify(p, DG_JIT_NVCC_COMPILER=None)
    assert str(clock) not in stderr.split("will run")[1]
    assert [f["code"] for f in report["findings"]] == ["CA403"]


def test_unsealed_or_foreign_ledger_commands_run_only_with_yes(project: Project):
    p = project
    served = p.once()
    assert served["digest"] == p.fresh()  # truth: fresh
    key = p.root / "home" / ".config" / "cacheaudit" / "seal.key"
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700
    code, report, _ = verify(p)
    assert code == ExitCode.CLEAN and outcomes(report) == {
        os.path.basename(served["path"]): "identical"}

    # Another user's secret (a ledger copied from their machine): refused, then accepted.
    mine = key.read_bytes()
    key.write_bytes(os.urandom(32))
    code, report, stderr = verify(p)
    assert code == ExitCode.UNTRUSTED and report == {}
    [line] = stderr.strip().splitlines()[-1:]
    assert line.startswith("cacheaudit: error: 1 of the commands") and "--yes" in line
    # Which secret sealed it is not known: the line names the one it checked with, no owner.
    assert "sealed with another secret (key " in line and f"than the one at {key} (key " in line
    assert "another user's secret" not in line
    code, report, stderr = verify(p, "--yes")
    assert code == ExitCode.CLEAN, stderr
    assert outcomes(report) == {os.path.basename(served["path"]): "identical"}
    key.write_bytes(mine)

    # A record's command changed in the SQLite file after it was written.
    with sqlite3.connect(p.ledger) as db:
        argv_id, body = db.execute(
            "SELECT b.id, b.body FROM records r JOIN blobs b ON b.id = r.argv_id "
            "WHERE r.event = 'compile' AND b.body LIKE '%kernel.cu%'").fetchone()
        changed = [*json.loads(body), "-DEXTRA=7"]
        db.execute("UPDATE blobs SET body = ? WHERE id = ?", (json.dumps(changed), argv_id))
    code, report, stderr = verify(p)
    assert code == ExitCode.UNTRUSTED, stderr
    assert "changed after it was written" in stderr
    assert "-DEXTRA=7" not in stderr.split("cacheaudit: error:")[0]  # nothing was run
    done = cacheaudit("verify", "--dry-run", "--ledger", str(p.ledger), env=p.env)
    assert done.returncode == 0 and "-DEXTRA=7" in done.stdout and "needs --yes" in done.stdout
    code, report, stderr = verify(p, "--yes")
    # The changed command builds another binary: run, and judged as what it builds.
    assert "-DEXTRA=7" in stderr and [f["code"] for f in report["findings"]] == ["CA403"]


def test_a_secret_under_another_xdg_config_home_is_named_not_called_another_users(
        project: Project):
    """Only XDG_CONFIG_HOME differs between recording and verifying: the record was sealed
    with this user's own secret, under the default place; the refusal says so and which
    setting points elsewhere, and claims no other user."""
    from cacheaudit import seal

    p = project
    p.once()
    recorded_with = p.root / "home" / ".config" / "cacheaudit" / "seal.key"
    assert recorded_with.exists()
    other = p.root / "elsewhere"
    # A secret of this user's under the other directory too, as a compile recorded there makes.
    assert seal.user_key({"XDG_CONFIG_HOME": str(other)}) is not None
    code, report, stderr = verify(p, XDG_CONFIG_HOME=str(other))
    assert code == ExitCode.UNTRUSTED and report == {}, stderr
    [line] = stderr.strip().splitlines()[-1:]
    assert f"it was not sealed with the secret at {other / 'cacheaudit' / 'seal.key'}, but " \
           f"with this user's secret at {recorded_with}, where XDG_CONFIG_HOME={other} does " \
           "not point" in line, line
    assert "another user" not in line and "--yes" in line

    # No secret at all under the other directory: said so, and where the one that sealed it is.
    (other / "cacheaudit" / "seal.key").unlink()
    code, _, stderr = verify(p, XDG_CONFIG_HOME=str(other))
    assert code == ExitCode.UNTRUSTED, stderr
    [line] = stderr.strip().splitlines()[-1:]
    assert f"there is no sealing secret at {other / 'cacheaudit' / 'seal.key'} to check it " \
           f"with, but with this user's secret at {recorded_with}" in line, line
    assert "another user" not in line
    # As recorded, it checks out.
    code, _, stderr = verify(p)
    assert code == ExitCode.CLEAN, stderr


def test_a_seal_key_others_can_read_is_no_secret(tmp_path: Path):
    """The seal key is made 0600 in a 0700 directory under umask 022; once others can read it,
    it vouches for nothing: no record is sealed with it and none checks out against it, so the
    oracle asks (`--yes`) before running their commands."""
    from cacheaudit import seal
    from cacheaudit.model import CompileRecord

    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "HOME": str(tmp_path / "home")}
    record = CompileRecord(record_id="r" * 32, event="compile", started_ns=1,
                           argv=("-c", "k.cpp"), cwd=str(tmp_path))
    umask = os.umask(0o022)
    try:
        sealed = seal.sealed(record, env)  # the first recorded compile creates the key
    finally:
        os.umask(umask)
    key = Path(seal.key_path(env))
    assert key.stat().st_mode & 0o777 == 0o600 and key.parent.stat().st_mode & 0o777 == 0o700
    assert seal.check(sealed, seal.user_key(env, create=False)).trusted
    key.chmod(0o644)
    assert seal.user_key(env) is None
    assert not seal.check(sealed, seal.user_key(env, create=False)).trusted
    assert not seal.sealed(record, env).seal


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_ledger_file_of_another_user_runs_only_with_yes(project: Project):
    p = project
    p.once()
    os.chown(p.ledger, 65534, 65534)
    code, _, stderr = verify(p)
    assert code == ExitCode.UNTRUSTED and "belongs to another user (uid 65534)" in stderr
    code, report, stderr = verify(p, "--yes")
    assert code == ExitCode.CLEAN, stderr
    assert list(outcomes(report).values()) == ["identical"]


# ------------------------------------------------------------------------------ bounds


def test_a_compile_past_its_timeout_is_killed_and_leaves_nothing(project: Project):
    p = project
    p.once()
    slow = p.wrapper("g++", 'sleep 57.25\nexec REAL "$@"\n')
    code, report, stderr = verify(p, "--timeout", "2", DG_JIT_NVCC_COMPILER=str(slow))
    assert code == ExitCode.CLEAN, stderr  # unverified is a warning
    [finding] = report["findings"]
    assert finding["code"] == "CA501" and "longer than 2 s and was killed" in finding["message"]
    assert processes_naming("57.25") == [] and processes_naming(str(slow)) == []
    assert private_dirs(p) == []


def test_ctrl_c_kills_the_compiles_and_removes_the_private_directories(project: Project):
    p = project
    p.once()
    started = p.root / "started"
    slow = p.wrapper("g++", f'touch {started}\nsleep 58.25\nexec REAL "$@"\n')
    oracle = subprocess.Popen(
        [sys.executable, "-m", "cacheaudit", "verify", "--ledger", str(p.ledger)],
        env=p._env({"DG_JIT_NVCC_COMPILER": str(slow)}), cwd=p.root,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert started.exists() and private_dirs(p)
    oracle.send_signal(signal.SIGINT)
    _, stderr = oracle.communicate(timeout=60)
    assert oracle.returncode == ExitCode.INTERRUPTED, stderr
    assert processes_naming("58.25") == [] and private_dirs(p) == []


def test_sample_is_deterministic_and_says_which(project: Project):
    p = project
    for n in range(4):
        p.once(SOURCE.replace("void gemm", f"// variant {n}\nvoid gemm"))
    runs = [cacheaudit("verify", "--sample", "2", "--seed", str(seed), "--dry-run", "--json",
                       "--ledger", str(p.ledger), env=p.env) for seed in (7, 7)]
    chosen = [[c["entry"] for c in json.loads(r.stdout)["commands"]] for r in runs]
    assert len(chosen[0]) == 2 and chosen[0] == chosen[1]
    assert "sampled 2 of 4 entries (seed 7)" in runs[0].stderr
    assert all(os.path.basename(e) in runs[0].stderr for e in chosen[0])
    assert private_dirs(p) == []


def test_binaries_that_differ_only_in_their_build_directory_are_not_stale(project: Project):
    p = project
    served = p.once(DG_JIT_WITH_LINEINFO="1")  # g++ -g: the build directory is in the binary
    fresh = p.fresh(DG_JIT_WITH_LINEINFO="1")
    build_dir = json.loads(Path(served["path"], "meta.json").read_text())["command"].split()[3]
    build_dir = os.path.dirname(build_dir)  # <root>/tmp/<pid>-<uuid>, renamed away since
    assert f"{p.cache}/tmp/" in build_dir and build_dir.encode() in Path(
        served["binary"]).read_bytes()
    # Truth: a fresh compile differs byte for byte, only because it built elsewhere.
    assert fresh != served["digest"]
    code, report, stderr = verify(p, DG_JIT_WITH_LINEINFO="1")
    assert code == ExitCode.CLEAN, stderr
    assert report["findings"] == []
    [verdict] = report["verdicts"]
    assert verdict["outcome"] == "identical-but-paths" and build_dir in verdict["note"]

    # Masking hides only the paths: an edited untracked header is still proven stale.
    _write(p.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 2\n")
    assert p.fresh(DG_JIT_WITH_LINEINFO="1") != served["digest"]
    code, report, _ = verify(p, DG_JIT_WITH_LINEINFO="1")
    assert [(f["code"], f["subject"]) for f in report["findings"]] == [("CA403", served["path"])]
