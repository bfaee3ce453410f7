"""cacheaudit's own children (`cacheaudit.children`) and temporary directories
(`cacheaudit.scratch`), with real processes: limits, the watchdog, the sweeper's rules."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from cacheaudit import children, scratch

from support import reliability_figure

SETTLE_S = 3.0


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _gone(pids: list[int], timeout: float = SETTLE_S) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_a_child_over_its_address_space_limit_fails_and_one_within_it_runs():
    allocate = [sys.executable, "-c", "bytearray(768 << 20); print('allocated')"]
    small = children.Limits(address_space=512 << 20)
    refused = children.run(allocate, timeout=60, env=os.environ, limits=small)
    assert refused.returncode != 0 and b"MemoryError" in refused.stderr, refused
    fits = children.run(allocate, timeout=60, env=os.environ, limits=children.PASS_LIMITS)
    assert (fits.returncode, fits.stdout) == (0, b"allocated\n"), fits


def test_a_child_past_its_deadline_is_killed_with_its_grandchildren(tmp_path: Path):
    pids = tmp_path / "pids"
    started = time.monotonic()
    done = children.run(["sh", "-c", f"sleep 60 & echo $! > {pids}; wait"], timeout=0.5,
                        env=os.environ)
    assert done.timed_out and time.monotonic() - started < 5
    assert _gone([int(pids.read_text())]), "the grandchild (sleep) outlived the deadline"
    assert children.live() == []


def _parent_script(tmp_path: Path, in_thread: bool) -> str:
    """A Python process that starts a child (sh, with a sleeping grandchild), says their pids,
    and waits to be killed."""
    pids = tmp_path / "pids"
    start = (f"children.start(['sh', '-c', 'sleep 60 & echo $! >> {pids}; wait'], "
             "env=os.environ)")
    launch = ([f"t = threading.Thread(target=lambda: holder.append({start}))", "t.start()",
               "t.join()"] if in_thread else [f"holder.append({start})"])
    return "\n".join([
        "import os, threading, time",
        "from cacheaudit import children",
        "holder = []",
        *launch,
        f"with open({str(pids)!r}, 'a') as out:",
        "    out.write(f'{holder[0].pid}\\n')",
        "time.sleep(60)", ""])


@pytest.mark.parametrize("in_thread", [False, True], ids=["main thread", "ended thread"])
def test_a_sigkilled_parent_takes_its_child_and_grandchild_along(tmp_path: Path,
                                                                 in_thread: bool):
    """SIGKILL of the parent alone: the watchdog kills the child's group. A child started by a
    thread that has ended since runs on until then (PDEATHSIG is not set from other threads)."""
    parent = subprocess.Popen([sys.executable, "-c", _parent_script(tmp_path, in_thread)],
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    pids_file = tmp_path / "pids"
    deadline = time.monotonic() + 30
    while len(pids_file.read_text().split() if pids_file.exists() else []) < 2:
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    pids = [int(p) for p in pids_file.read_text().split()]
    time.sleep(0.3)
    assert all(_alive(p) for p in pids), "the child must run until its parent dies"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _gone(pids), f"left behind by a SIGKILLed parent: {[p for p in pids if _alive(p)]}"
    started_from = "a thread that has ended" if in_thread else "the main thread"
    reliability_figure("kills", f"SIGKILL of a process whose child was started from "
                                f"{started_from}",
                       kills=1, processes_left=0)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every child through the launchers (prlimit, setpriv, sh; Python vforks), as from a
    process over `LAUNCH_ABOVE_BYTES` (an adapter inside torch)."""
    if children._find_launchers() is None:
        pytest.skip("util-linux prlimit and setpriv are not installed: children are forked")
    monkeypatch.setattr(children, "LAUNCH_ABOVE_BYTES", -1)


def test_a_launched_child_has_the_limits_of_a_forked_one(launched: None):
    # RLIMIT_AS in KiB for `ulimit -v`, soft and hard; no core files.
    done = children.run(["sh", "-c", "ulimit -c; ulimit -H -c; ulimit -v; ulimit -H -v"],
                        timeout=60, env=os.environ)
    assert done.returncode == 0, done
    assert done.stdout.split() == [b"0", b"0", *[str(children.PASS_ADDRESS_SPACE >> 10)
                                                 .encode()] * 2], done.stdout
    allocate = [sys.executable, "-c", "bytearray(768 << 20); print('allocated')"]
    refused = children.run(allocate, timeout=60, env=os.environ,
                           limits=children.Limits(address_space=512 << 20))
    assert refused.returncode != 0 and b"MemoryError" in refused.stderr, refused
    fits = children.run(allocate, timeout=60, env=os.environ, limits=children.PASS_LIMITS)
    assert (fits.returncode, fits.stdout) == (0, b"allocated\n"), fits


def test_a_launched_child_runs_the_program_named_with_its_arguments(launched: None,
                                                                    tmp_path: Path):
    done = children.run(["printf", "%s|", "a b", "-n", "$HOME"], timeout=60, env=os.environ,
                        cwd=str(tmp_path))
    assert (done.returncode, done.stdout) == (0, b"a b|-n|$HOME|"), done
    with pytest.raises(FileNotFoundError):
        children.run(["cacheaudit-no-such-program"], timeout=60, env=os.environ)
    with pytest.raises(FileNotFoundError):
        children.run(["true"], timeout=60, env=os.environ, cwd=str(tmp_path / "missing"))


def test_a_launched_child_dies_with_its_sigkilled_parent_without_a_watchdog(tmp_path: Path):
    """PDEATHSIG as `setpriv` arms it: the parent's watchdog is disabled, so only the signal
    can take the child (and, through it, nothing else: the grandchild is the watchdog's)."""
    if children._find_launchers() is None:
        pytest.skip("util-linux prlimit and setpriv are not installed: children are forked")
    pids = tmp_path / "pids"
    script = "\n".join([
        "import os, time",
        "from cacheaudit import children",
        "children.LAUNCH_ABOVE_BYTES = -1",
        "children._watch = lambda group: (None, None)",
        "process = children.start(['sleep', '60'], env=os.environ)",
        f"open({str(pids)!r}, 'w').write(str(process.pid))",
        "time.sleep(60)", ""])
    parent = subprocess.Popen([sys.executable, "-c", script],
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    deadline = time.monotonic() + 30
    while not (pids.exists() and pids.read_text()):
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    child = int(pids.read_text())
    time.sleep(0.3)
    assert _alive(child), "the launched child (sleep) must run until its parent dies"
    program, *arguments = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[:2]
    assert (os.path.basename(program), arguments) == (b"sleep", [b"60"]), \
        "the launchers exec the program itself, in the same process"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _gone([child]), "a launched child outlived its SIGKILLed parent"


def test_kill_all_ends_every_child_and_refuses_new_ones():
    process = children.start(["sleep", "60"], env=os.environ)
    try:
        children.kill_all()
        assert process.wait(timeout=5) == -signal.SIGKILL
        with pytest.raises(InterruptedError):
            children.start(["true"], env=os.environ)
    finally:
        children.finish(process)
        children._children.stopping = False  # this test process goes on starting children


# ------------------------------------------------------------------------------- temporary dirs


def _dead_pid() -> tuple[int, str]:
    """The pid and start ticks (with our pid namespace) of a process that has ended."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid, f"12345n{scratch.pid_namespace()}"


def test_the_sweep_removes_a_dead_owners_directory_only(tmp_path: Path):
    mine = scratch.make_directory("shim", str(tmp_path))
    pid, ticks = _dead_pid()
    dead = tmp_path / f"cacheaudit-shim-p{pid}t{ticks}-abc"
    (dead / "inner").mkdir(parents=True)
    (dead / "inner" / "deps.d").write_text("x")
    # Our pid with another start time: a process that had our pid before us.
    reused = tmp_path / f"cacheaudit-scan-p{os.getpid()}t1n{scratch.pid_namespace()}-abc"
    reused.mkdir()
    # A dead-looking owner of another pid namespace (a container sharing TMPDIR): not ours.
    elsewhere = tmp_path / f"cacheaudit-shim-p{pid}t1n1-abc"
    elsewhere.mkdir()
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / f"cacheaudit-shim-p{pid}t{ticks}-link"
    link.symlink_to(target)
    unrelated = tmp_path / "cacheaudit-notes"
    unrelated.mkdir()
    removed = scratch.sweep(str(tmp_path))
    assert sorted(removed) == sorted([str(dead), str(reused)])
    assert os.path.isdir(mine), "a live owner's directory is kept"
    assert link.is_symlink() and target.is_dir(), "a symlink is neither followed nor removed"
    assert unrelated.is_dir(), "a name without an owner is not cacheaudit's to sweep"
    assert elsewhere.is_dir(), "an owner in another pid namespace cannot be told dead here"
    scratch.remove(mine)


def test_a_temporary_directory_is_removed_when_its_block_raises(tmp_path: Path):
    with pytest.raises(KeyboardInterrupt), scratch.temporary_directory("scan", str(tmp_path)) as d:
        Path(d, "deps.d").write_text("x")
        assert scratch.owner_alive(os.path.basename(d)) is True
        raise KeyboardInterrupt
    assert os.listdir(tmp_path) == []


def test_threads_may_start_children_concurrently():
    results: list[int] = []

    def one() -> None:
        results.append(children.run(["true"], timeout=30, env=os.environ).returncode)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [0] * 8 and children.live() == []


# ------------------------------------------------------------------------------- forked workers


def _work(index: int) -> tuple[int, int]:
    """A task for `forked_map`: 3 raises, 5 kills its worker, the rest say who did them."""
    if index == 3:
        raise ValueError("three is refused")
    if index == 5:
        os._exit(9)
    return index, os.getpid()


def test_forked_map_yields_in_order_and_hands_back_what_it_did_not_do():
    import contextlib

    with contextlib.closing(children.forked_map(_work, 40, 2)) as results:
        got = list(results)
    assert [r[0] for r in got if isinstance(r, tuple)] == [i for i in range(40) if i not in (3, 5)]
    assert got[3] == children.Failed("ValueError: three is refused"), got[3]
    assert isinstance(got[5], children.Failed) and "exit status 9" in got[5].why, got[5]
    workers = {r[1] for r in got if isinstance(r, tuple)}
    # Done in the workers, never here; a worker that died is not replaced (the caller does
    # what it left), the other does the rest.
    assert os.getpid() not in workers and 1 <= len(workers) <= 2, workers
    assert children._children.forked == set(), "every worker is reaped"


def test_closing_forked_map_early_kills_its_workers(tmp_path: Path):
    pids = tmp_path / "pids"

    def slow(index: int) -> int:
        if index:
            with open(pids, "a") as out:
                out.write(f"{os.getpid()}\n")
            time.sleep(60)
        return index

    started = time.monotonic()
    with children.ForkedMap(slow, 4, 2) as pool:
        assert pool.get(0) == 0
        deadline = time.monotonic() + 30
        # Tasks are given out as workers take them: `poll` keeps them going meanwhile.
        while len(pids.read_text().split() if pids.exists() else []) < 2:
            assert time.monotonic() < deadline
            assert not pool.poll()
            time.sleep(0.05)
    assert time.monotonic() - started < 30
    left = [int(p) for p in pids.read_text().split()]
    assert not any(_alive(p) for p in left), f"workers left running: {left}"
    assert children._children.forked == set()


def test_a_stopped_forked_map_hands_back_what_it_gave_no_worker(tmp_path: Path):
    release = tmp_path / "release"

    def held(index: int) -> int:
        # Every task after the first waits for the release: the workers stay busy, so how
        # much is given out does not depend on how the scheduler treats them.
        deadline = time.monotonic() + 30
        while index and not release.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        return index

    with children.ForkedMap(held, 40, 2) as pool:
        assert pool.get(0) == 0
        undone = pool.stop()
        release.touch()
        given = [pool.get(index) for index in range(1, pool.count)]
    # A task is given when a worker is free for it (one waits in the pipe): the rest never.
    assert undone == list(range(len(given) + 1, 40)) and len(undone) >= 40 - 4, undone
    assert given == list(range(1, len(given) + 1)), given


def test_a_sigkilled_parent_takes_its_forked_workers_along(tmp_path: Path):
    """SIGKILL of the parent alone: PR_SET_PDEATHSIG kills the workers, which lead groups of
    their own (a kill of the parent's group would not reach them)."""
    pids = tmp_path / "pids"
    script = "\n".join([
        "import contextlib, os, time",
        "from cacheaudit import children",
        "def work(index):",
        f"    with open({str(pids)!r}, 'a') as out:",
        "        out.write(f'{os.getpid()}\\n')",
        "    time.sleep(60)",
        "with contextlib.closing(children.forked_map(work, 2, 2)) as results:",
        "    list(results)", ""])
    parent = subprocess.Popen([sys.executable, "-c", script],
                              env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    deadline = time.monotonic() + 30
    while len(pids.read_text().split() if pids.exists() else []) < 2:
        assert time.monotonic() < deadline and parent.poll() is None
        time.sleep(0.05)
    workers = [int(p) for p in pids.read_text().split()]
    assert all(_alive(p) for p in workers), "the workers must run until their parent dies"
    assert all(os.getpgid(p) == p for p in workers), "each worker leads a group of its own"
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _gone(workers), f"left behind by a SIGKILLed parent: {[p for p in workers if _alive(p)]}"
