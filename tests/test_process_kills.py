"""Kills of real cacheaudit processes while a child of theirs runs: nothing may stay behind.

Every case starts real processes (the shim in a masquerade directory, a `cacheaudit scan`),
waits until cacheaudit's own child (a dependency pass, a `--version` probe) runs, and kills the
parent by SIGINT, SIGTERM or SIGKILL (of it alone, or of its whole process group). Then, after
a settle time of at most `SETTLE_S` (SIGKILL'd processes are reaped by init asynchronously):

- no process whose command line or working directory lies under the test's tmp path is left
  (`/proc` is read; the slow compiler is a wrapper the user configured, under that path, so its
  `sleep` and the real compiler's cc1plus count too);
- no cacheaudit temporary directory is left under the test's TMPDIR, or, after SIGKILL, the
  next cacheaudit process sweeps it (shown).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import GXX, ShimEnv, clean_env, needs_gxx, reliability_figure

SETTLE_S = 3.0
"""How long a killed group may take to disappear from /proc (init reaps SIGKILL'd orphans)."""



def _script(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def slow_gxx(directory: Path, *, seconds: str = "${SLOW:-1}", version_hang: bool = False
             ) -> Path:
    """The user's own compiler wrapper: sleeps, then runs g++; a dependency pass (`-M`) sleeps
    `$SLOW_PASS` (10 s: longer than `SETTLE_S`, so that a pass left behind is seen). It stops
    its sleep when told to stop (a well-behaved compiler: what it started dies with it), so
    whatever is left after a kill is cacheaudit's. With `version_hang`, `--version` never
    answers while `$HANG` is set."""
    hang = ('if [ "$1" = --version ] && [ -n "$HANG" ]; then sleep 60 & wait $!; fi\n'
            if version_hang else "")
    return _script(directory / "g++", f"""\
        stop() {{ kill $! 2>/dev/null; trap - "$1"; kill -s "$1" $$; }}
        trap 'stop TERM' TERM; trap 'stop INT' INT; trap 'stop HUP' HUP
        delay={seconds}
        case " $* " in *" -M "*) delay=${{SLOW_PASS:-10}};; esac
        {hang}sleep $delay &
        wait $!
        exec {GXX} "$@"
        """)


def processes_under(path: Path) -> list[str]:
    """Processes (not zombies) whose command line or working directory mentions `path`."""
    text = str(path).encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        try:
            # Bytes: another test's working directory may not be UTF-8.
            cwd = os.readlink(os.fsencode(f"/proc/{pid}/cwd"))
        except OSError:
            cwd = b""
        if state != "Z" and (text in cmdline or text in cwd):
            found.append(f"{pid}: {cmdline.decode(errors='replace').strip()} (cwd {cwd.decode()})")
    return found


def settled(path: Path) -> list[str]:
    """`processes_under(path)`, once it is empty or `SETTLE_S` has passed."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        left = processes_under(path)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def temp_dirs(tmpdir: Path) -> list[str]:
    return sorted(n for n in os.listdir(tmpdir) if n.startswith("cacheaudit-"))


def wait_for(predicate, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def pass_running(marker: str) -> bool:
    """Whether a dependency pass (`-M -MF`) under `marker` runs now."""
    return any(" -M -MF " in line for line in processes_under(Path(marker)))


def next_run_sweeps(tmpdir: Path, env: dict[str, str]) -> list[str]:
    """What is left after the next `cacheaudit` command (any: each sweeps TMPDIR; the user's
    `cacheaudit report` after a build, here)."""
    subprocess.run([sys.executable, "-m", "cacheaudit", "report"], env=env, capture_output=True,
                   timeout=120, check=False)
    return temp_dirs(tmpdir)


# ------------------------------------------------------------------------------------ the shim


def _shim_compile(shim_env: ShimEnv, src: Path, env: dict[str, str], **kwargs) -> subprocess.Popen:
    return subprocess.Popen(["g++", "-c", "k.cpp", "-o", "k.o"], cwd=src, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, **kwargs)


@pytest.fixture
def slow_shim(shim_env: ShimEnv, tmp_path: Path) -> tuple[ShimEnv, Path, dict[str, str]]:
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cpp").write_text('#include <vector>\nint k() { return 1; }\n')
    env = dict(shim_env.env)
    env["CACHEAUDIT_REAL_GXX"] = str(slow_gxx(tmp_path / "userbin"))
    return shim_env, src, env


def _shim_group_kills(slow_shim, tmp_path: Path, kills: int) -> None:
    shim_env, src, env = slow_shim
    tmpdir = Path(env["TMPDIR"])
    rng = random.Random(1313)
    during_a_pass = 0
    for kill in range(kills):
        process = _shim_compile(shim_env, src, env, start_new_session=True)
        if kill % 2:
            # Every other kill lands inside the dependency pass (it sleeps `$SLOW_PASS`, 10 s),
            # however long the shim took to start on a loaded machine.
            assert wait_for(lambda: pass_running(str(src))), "the dependency pass never started"
            time.sleep(rng.uniform(0.0, 0.5))
        else:
            # The others land anywhere from the shim's start-up on.
            time.sleep(rng.uniform(0.05, 1.6))
        during_a_pass += pass_running(str(src))
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        process.stderr.close()
        left = settled(tmp_path)
        assert left == [], f"left running after SIGKILL of the shim's group: {left}"
    left_after_kills = temp_dirs(tmpdir)
    # The next cacheaudit command sweeps what the killed ones left (their owners are dead).
    swept = next_run_sweeps(tmpdir, env)
    assert swept == [], f"not swept: {swept}"
    assert during_a_pass >= kills // 2, "at least half the kills must hit a running dependency pass"
    assert settled(tmp_path) == []
    reliability_figure("kills", f"SIGKILL of the shim's process group during a dependency pass "
                                f"({kills} kills)", kills=kills,
                       kills_while_a_pass_ran=during_a_pass, processes_left=0,
                       temp_dirs_swept_by_next_run=len(left_after_kills), temp_dirs_left=0)


@needs_gxx
def test_sigkill_of_the_shims_group_leaves_no_process_and_the_next_shim_sweeps(
        slow_shim, tmp_path: Path):
    _shim_group_kills(slow_shim, tmp_path, kills=10)


@needs_gxx
@pytest.mark.slow
def test_many_sigkills_of_the_shims_group_leave_nothing(slow_shim, tmp_path: Path):
    _shim_group_kills(slow_shim, tmp_path, kills=30)


@needs_gxx
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_to_the_shim_alone_during_the_pass_leaves_nothing(
        slow_shim, tmp_path: Path, sig: int):
    """The signal goes to the shim's pid only (`kill PID`), not to its group: the shim forwards
    it to the compile and ends its own children; SIGKILL leaves that to the watchdog."""
    shim_env, src, env = slow_shim
    tmpdir = Path(env["TMPDIR"])
    env["SLOW"] = "3"
    process = _shim_compile(shim_env, src, env)
    assert wait_for(lambda: pass_running(str(src))), "the dependency pass never started"
    os.kill(process.pid, sig)
    process.wait(timeout=30)
    assert process.returncode == -sig, process.stderr.read()
    process.stderr.close()
    if sig == signal.SIGKILL:
        # The user's compile (not cacheaudit's child) is orphaned as with any killed parent:
        # end it the way its own user would, then look for cacheaudit's leftovers.
        for line in processes_under(tmp_path):
            if " -M -MF " not in line and "cacheaudit-watchdog" not in line:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(line.split(":")[0]), signal.SIGTERM)
    left = settled(tmp_path)
    assert left == [], f"left running after {signal.Signals(sig).name} of the shim: {left}"
    dirs = temp_dirs(tmpdir)
    if sig == signal.SIGKILL:
        dirs = next_run_sweeps(tmpdir, env)
    assert dirs == [], f"temporary directories left: {dirs}"
    reliability_figure("kills", f"{signal.Signals(sig).name} of the shim alone during a "
                                "dependency pass", kills=1, processes_left=0, temp_dirs_left=0)


@needs_gxx
def test_sigterm_during_a_hanging_version_probe_ends_the_shim_at_once_with_the_true_duration(
        shim_env: ShimEnv, tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cpp").write_text("int k() { return 1; }\n")
    env = dict(shim_env.env)
    env["CACHEAUDIT_REAL_GXX"] = str(slow_gxx(tmp_path / "userbin", seconds="${SLOW:-5}",
                                              version_hang=True))
    # A first compile, without the hang, makes the ledger: the one under test only adds to it.
    assert _shim_compile(shim_env, src, dict(env, SLOW="0", SLOW_PASS="0")).wait(60) == 0
    env["HANG"] = "1"
    started = time.monotonic()
    process = _shim_compile(shim_env, src, env)
    assert wait_for(lambda: any("--version" in line for line in processes_under(tmp_path)))
    time.sleep(0.3)
    signalled = time.monotonic()
    os.kill(process.pid, signal.SIGTERM)
    # The probe and the compile go first (the shim then writes the record and dies).
    assert wait_for(lambda: not [line for line in processes_under(tmp_path)
                                 if "--version" in line or "-o k.o" in line], timeout=1.0)
    killed = time.monotonic()
    process.wait(timeout=30)
    ended = time.monotonic()
    assert process.returncode == -signal.SIGTERM, process.stderr.read()
    process.stderr.close()
    assert ended - signalled < 1.0, f"the shim took {ended - signalled:.2f} s to die"
    assert settled(tmp_path) == []
    assert temp_dirs(Path(env["TMPDIR"])) == []
    record = max(shim_env.records(), key=lambda r: r.started_ns)  # the one signalled
    assert record.signal == signal.SIGTERM
    # The compile ran from the shim's start until the signal: that, not the probe's 10 s.
    assert record.duration_ns / 1e9 < signalled - started + 0.5, record.duration_ns
    assert "--version" in (record.compiler.error or ""), record.compiler
    reliability_figure("kills", "SIGTERM of the shim while --version hangs",
                       kills=1, processes_left=0, temp_dirs_left=0,
                       seconds_to_kill_probe_and_compile=round(killed - signalled, 2),
                       seconds_to_die=round(ended - signalled, 2),
                       recorded_duration_s=round(record.duration_ns / 1e9, 2))


@needs_gxx
@pytest.mark.parametrize("query", [False, True], ids=["compile", "version query"])
def test_a_compiler_that_cannot_be_executed_exits_126_and_a_missing_one_127(
        shim_env: ShimEnv, tmp_path: Path, query: bool):
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cpp").write_text("int k() { return 1; }\n")
    garbage = tmp_path / "userbin" / "g++"
    garbage.parent.mkdir()
    garbage.write_bytes(b"\x00\x01 not a program\n")  # no shebang, no ELF header: ENOEXEC
    garbage.chmod(0o755)
    args = ["--version"] if query else ["-c", "k.cpp", "-o", "k.o"]
    done = shim_env.run(["g++", *args], cwd=src, env={"CACHEAUDIT_REAL_GXX": str(garbage)})
    assert done.returncode == 126, done.stderr
    assert b"Exec format error" in done.stderr
    missing = shim_env.run(["g++", *args], cwd=src,
                           env={"CACHEAUDIT_REAL_GXX": str(tmp_path / "nowhere" / "g++")})
    assert missing.returncode == 127, missing.stderr


# ------------------------------------------------------------------------------------ the scan


def deepjit_root(root: Path, compiler: Path) -> Path:
    """A committed DeepJIT entry (g++ mode) built before any recording: a scan reconstructs its
    inputs with a dependency pass of `compiler`, the user's own wrapper."""
    entry = root / "cache" / ("kernel." + "0" * 32)
    entry.mkdir(parents=True)
    build = root / "tmp" / "BUILD"
    build.mkdir(parents=True)
    (entry / "kernel.cu").write_text("#include <vector>\nint k() { return 1; }\n")
    (entry / "kernel.so").write_bytes(b"\x7fELF" + bytes(60))
    (entry / "meta.json").write_text(json.dumps({
        "command": f"{compiler} -x c++ {build}/kernel.cu -fPIC -shared -o {build}/kernel.so",
        "config": {"python_library_root": str(root), "extra_signature": "",
                   "include_dirs": [], "include_prefixes": ["k/"]},
        "compiler_info": {"path": str(compiler), "version": "g++ (test) 12\n"},
        "compiler_options": {}}))
    (entry / ".committed").write_bytes(b"")
    return entry


def _scan(env: dict[str, str], root: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cacheaudit", "scan", "--json", "--fail-on",
                             "never", str(root)], env=env, cwd=root,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@needs_gxx
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_to_a_scan_during_reconstruction_leaves_no_process_or_temp_dir(
        tmp_path: Path, sig: int):
    env = clean_env(tmp_path)
    userbin = tmp_path / "userbin"
    compiler = slow_gxx(userbin)
    # The user's configuration names the wrapper too (PATH first), however the scan resolves
    # the compiler it runs.
    env["PATH"] = os.pathsep.join([str(userbin), env["PATH"]])
    root = tmp_path / "dj"
    deepjit_root(root, compiler)
    env["SLOW_PASS"] = "30"
    process = _scan(env, root)
    assert wait_for(lambda: pass_running(str(root))), process.stderr.read1()
    _signal_and_check(process, sig, tmp_path, env, "a scan", "during a reconstruction pass",
                      "the killed scan's reconstruction directory")


def _signal_and_check(process: subprocess.Popen, sig: int, tmp_path: Path, env: dict[str, str],
                      what: str, when: str, killed_leaves: str) -> None:
    """Send `sig` to a cacheaudit command (`what`) while its child runs, then check its exit
    status, that no process is left, and that its temporary directories are gone (after a
    SIGKILL: swept by the next command)."""
    time.sleep(0.2)
    os.kill(process.pid, sig)
    process.wait(timeout=30)
    stderr = process.stderr.read().decode(errors="replace")
    process.stderr.close()
    expected = {signal.SIGINT: 130, signal.SIGTERM: 128 + signal.SIGTERM,
                signal.SIGKILL: -signal.SIGKILL}[sig]
    assert process.returncode == expected, stderr
    name = signal.Signals(sig).name
    left = settled(tmp_path)
    assert left == [], f"left running after {name} of {what}: {left}"
    tmpdir = Path(env["TMPDIR"])
    dirs = temp_dirs(tmpdir)
    if sig == signal.SIGKILL:
        assert dirs, killed_leaves  # swept next
        dirs = next_run_sweeps(tmpdir, env)
    assert dirs == [], f"temporary directories left: {dirs}"
    reliability_figure("kills", f"{name} of {what} {when}", kills=1, processes_left=0,
                       temp_dirs_left=0)


# ---------------------------------------------------------------------------- the rebuild oracle


def _verify(env: dict[str, str], entry: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "cacheaudit", "verify", "--yes", str(entry)],
                            env=env, cwd=entry, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@needs_gxx
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL],
                         ids=["SIGINT", "SIGTERM", "SIGKILL"])
def test_a_signal_to_verify_during_a_compile_leaves_no_process_or_temp_dir(
        tmp_path: Path, sig: int):
    env = clean_env(tmp_path)
    tmpdir = Path(env["TMPDIR"])
    userbin = tmp_path / "userbin"
    compiler = slow_gxx(userbin)
    env["PATH"] = os.pathsep.join([str(userbin), env["PATH"]])  # the compiler the oracle runs
    entry = deepjit_root(tmp_path / "dj", compiler)
    env["SLOW"] = "30"
    process = _verify(env, entry)
    assert wait_for(lambda: any("kernel.so" in line and str(tmpdir) in line
                                for line in processes_under(tmpdir))), process.stderr.read1()
    _signal_and_check(process, sig, tmp_path, env, "verify", "during a compile",
                      "the killed oracle's private directory")


@needs_gxx
def test_a_dependency_pass_over_its_memory_limit_costs_the_graph_never_the_compile(
        shim_env: ShimEnv, tmp_path: Path):
    """The user's wrapper grows to 6 GiB in the dependency pass only (a stand-in for cc1plus
    reading /dev/urandom): the pass fails at its address-space limit, the compile (no limit of
    cacheaudit's) succeeds and its record says why it has no graph."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "k.cpp").write_text("int k() { return 1; }\n")
    # 6 GiB of address space, reserved and never touched: quick without a limit.
    grow = "import mmap; mmap.mmap(-1, 6 << 30)"
    wrapper = _script(tmp_path / "userbin" / "g++", f"""\
        case " $* " in *" -M "*) {sys.executable} -c '{grow}' || exit 1;; esac
        exec {GXX} "$@"
        """)
    done = shim_env.run(["g++", "-c", "k.cpp", "-o", "k.o"], cwd=src,
                        env={"CACHEAUDIT_REAL_GXX": str(wrapper)})
    assert done.returncode == 0, done.stderr
    assert (src / "k.o").stat().st_size > 0
    [record] = shim_env.records()
    assert record.exit_code == 0 and record.graph is None
    [note] = [n for n in record.notes if n.startswith("dependency pass failed")]
    assert "Cannot allocate memory" in note, record.notes
    # The same wrapper outside cacheaudit (no limit): the allocation succeeds.
    bare = subprocess.run([str(wrapper), "-M", "k.cpp"], cwd=src, capture_output=True,
                          env=shim_env.bare_env(), timeout=120)
    assert bare.returncode == 0, bare.stderr
