"""What the adapters share: activation, post-import hooks, deactivation, fork safety, helpers.

Real interpreters (subprocesses where a process-wide state is at stake: `-W error`, the import
system, fork), real runtimes where one is needed (NVRTC compiles to sm_90 cubins, no GPU), real
ledgers.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cacheaudit import adapter, runtimes
from cacheaudit.ledger import Ledger


def _python(code: str, *args: str, env: dict[str, str] | None = None,
            flags: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *flags, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, timeout=300, env=env)


def _nvrtc_problem() -> str | None:
    try:
        from cuda.bindings import nvrtc

        return None if int(nvrtc.nvrtcVersion()[0]) == 0 else "nvrtcVersion failed"
    except Exception as exc:  # noqa: BLE001 - any failure means: no NVRTC here
        return f"{type(exc).__name__}: {exc}"


_NVRTC = _nvrtc_problem()
needs_nvrtc = pytest.mark.skipif(_NVRTC is not None, reason=f"libnvrtc cannot load: {_NVRTC}")


# ------------------------------------------------------------------------------ activation


def test_the_runtime_table_names_each_adapters_runtime() -> None:
    for declared in runtimes.specs():
        if declared.adapter is not None:
            name = declared.package.rsplit(".", 1)[-1]
            assert runtimes.adapter(name).module == declared.adapter_imports
    assert runtimes.available() == ["deepgemm", "torch_ext", "triton", "nvrtc", "cuda_core",
                                    "flashinfer", "inductor"]


def test_activation_imports_no_adapter_until_its_runtime_is_imported() -> None:
    done = _python("""
        import json, sys
        from cacheaudit import adapter, runtimes
        armed = runtimes.activate()
        def adapters():
            return sorted(m for m in sys.modules
                          if m.startswith("cacheaudit.runtimes.") and m.endswith(".adapter"))
        before = adapters()
        import json.tool  # any import passes the hook's finder
        still = adapters()
        print(json.dumps([armed, before, still]))
    """)
    assert done.returncode == 0, done.stderr
    armed, before, still = json.loads(done.stdout)
    assert armed == ["deepgemm", "torch_ext", "triton", "nvrtc", "cuda_core",
                     "flashinfer", "inductor"]
    assert before == still == []


@needs_nvrtc
def test_importing_a_runtime_imports_and_installs_its_adapter() -> None:
    done = _python("""
        import json, sys
        from cacheaudit import adapter, runtimes
        runtimes.activate()
        from cuda.bindings import nvrtc
        from cacheaudit.runtimes.nvrtc.adapter import ADAPTER
        print(json.dumps([ADAPTER.installed(),
                          "cacheaudit.runtimes.triton.adapter" in sys.modules]))
    """)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [True, False]


def test_an_unknown_adapter_is_reported_not_raised() -> None:
    done = _python("""
        from cacheaudit import adapter, runtimes
        print(runtimes.activate(["nvrtc", "no_such_runtime"]))
    """, flags=("-W", "error"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['nvrtc']"
    assert "no adapter named 'no_such_runtime'" in done.stderr


def test_a_failing_hook_never_breaks_the_import_even_under_warnings_as_errors(
        tmp_path: Path) -> None:
    (tmp_path / "some_runtime.py").write_text("VALUE = 42\n")
    done = _python("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from cacheaudit import importhooks

        def broken(module):
            raise RuntimeError("the adapter broke")

        importhooks.when_imported("some_runtime", broken)
        import some_runtime
        print(some_runtime.VALUE)
    """, str(tmp_path), flags=("-W", "error"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "42"
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("cacheaudit:")]
    assert len(lines) == 1 and "could not hook some_runtime" in lines[0]
    assert "the adapter broke" in lines[0]


# ------------------------------------------------------------------------------ deactivation


@needs_nvrtc
def test_deactivate_switches_off_an_adapter_another_tool_wrapped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.bindings import nvrtc

    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    ledger = tmp_path / "ledger.db"
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(ledger))
    monkeypatch.delenv("CACHEAUDIT_RUN", raising=False)
    original = nvrtc.nvrtcCompileProgram

    def compile_once() -> int:
        err, prog = nvrtc.nvrtcCreateProgram(
            b'extern "C" __global__ void k(int* o) { o[0] = 1; }\n', b"k.cu", 0, [], [])
        assert int(err) == 0
        try:
            return int(nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=sm_90"])[0])
        finally:
            nvrtc.nvrtcDestroyProgram(prog)

    runtimes.activate(["nvrtc"])
    ours = nvrtc.nvrtcCompileProgram
    calls = []

    def theirs(*args: object) -> object:
        calls.append(args)
        return ours(*args)

    nvrtc.nvrtcCompileProgram = theirs
    try:
        ADAPTER.install()  # still installed under theirs: not a second wrapper
        assert nvrtc.nvrtcCompileProgram is theirs
        assert compile_once() == 0
        runtimes.deactivate()
        assert nvrtc.nvrtcCompileProgram is theirs  # theirs stays on top
        assert compile_once() == 0
    finally:
        runtimes.deactivate()
        nvrtc.nvrtcCompileProgram = original
    assert len(calls) == 2
    with Ledger.open(str(ledger)) as opened:
        # The first compile only: after deactivate, ours under theirs passes calls through.
        assert [r.event for r in opened.records()] == ["compile"]


# ------------------------------------------------------------------------------ fork


def test_a_child_forked_while_locks_are_held_can_take_them(tmp_path: Path) -> None:
    done = _python("""
        import json, os, sys, threading
        from cacheaudit import importhooks, recorder
        from cacheaudit.runtimes.torch_ext import adapter as torch_ext
        from cacheaudit.runtimes.nvrtc import adapter as nvrtc
        from cacheaudit.runtimes.cuda_core import adapter as cuda_core
        from cacheaudit.ledger import RunInfo, new_record_id
        from cacheaudit.model import CompileRecord

        locks = {
            "adapters": lambda: importhooks._lock,
            "recorder": lambda: recorder._HELD._lock,
            "nvrtc": lambda: nvrtc.ADAPTER._lock,
            "torch_ext": lambda: torch_ext.ADAPTER._lock,
            "cuda_core": lambda: cuda_core.ADAPTER._lock,
            "cuda_core hits": lambda: cuda_core._RECORDER.lock,
        }
        held, release = threading.Event(), threading.Event()

        def hold():
            taken = [get() for get in locks.values()]
            for lock in taken:
                lock.acquire()
            held.set()
            release.wait()
            for lock in taken:
                lock.release()

        holder = threading.Thread(target=hold)
        holder.start()
        held.wait()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            free = {name: get().acquire(timeout=5) for name, get in locks.items()}
            record = CompileRecord(record_id=new_record_id(), event="compile", started_ns=1,
                                   runtime="nvrtc", kernel="child")
            for lock in (recorder._HELD._lock,):
                lock.release()
            free["write"] = recorder.write_held([record], RunInfo(run_uuid="child", label="t"),
                                                sys.argv[1]) is None
            os.write(write, json.dumps(free).encode())
            os._exit(0)
        release.set()
        holder.join()
        _, status = os.waitpid(pid, 0)
        os.close(write)
        print(os.read(read, 65536).decode())
    """, str(tmp_path / "ledger.db"))
    assert done.returncode == 0, done.stderr
    free = json.loads(done.stdout)
    assert free == {"adapters": True, "recorder": True, "nvrtc": True, "torch_ext": True,
                    "cuda_core": True, "cuda_core hits": True, "write": True}
    with Ledger.open(str(tmp_path / "ledger.db")) as opened:
        assert [r.kernel for r in opened.records()] == ["child"]


# ------------------------------------------------------------------------------ helpers


def test_patches_restore_exactly_and_leave_what_was_wrapped_since() -> None:
    class Base:
        def inherited(self) -> str:
            return "base"

    class Owner(Base):
        def own(self) -> str:
            return "own"

    original_own = Owner.__dict__["own"]
    patches = [adapter.apply_patch(Owner, "own", lambda self: "ours"),
               adapter.apply_patch(Owner, "inherited", lambda self: "ours")]
    assert Owner().own() == Owner().inherited() == "ours"
    assert adapter.restore_patches(patches) == []
    assert Owner.__dict__["own"] is original_own
    assert "inherited" not in Owner.__dict__ and Owner().inherited() == "base"

    patch = adapter.apply_patch(Owner, "own", lambda self: "ours")
    Owner.own = lambda self: "theirs"  # type: ignore[method-assign]
    assert adapter.restore_patches([patch]) == ["Owner.own"]
    assert Owner().own() == "theirs"


def test_one_report_per_kind_of_problem(capfd: pytest.CaptureFixture[str]) -> None:
    log = adapter.ProblemLog("demo adapter")
    for _ in range(3):
        log("OSError: disk full")
        log("ValueError: bad")
    log("anything", kind="install")
    log("anything else", kind="install")
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("cacheaudit:")]
    assert len(lines) == 3
    assert all("demo adapter: " in ln for ln in lines)


def test_jsonable_keeps_the_evidence_readable() -> None:
    @dataclasses.dataclass
    class Target:
        backend: str
        arch: int

    value = {"target": Target("cuda", 90), "libs": (("libdevice", Path("/x/l.bc")),),
             "raw": b"-O3", "other": range(2)}
    assert adapter.jsonable(value) == {"target": {"backend": "cuda", "arch": 90},
                                        "libs": [["libdevice", "/x/l.bc"]], "raw": "-O3",
                                        "other": "range(0, 2)"}
    json.dumps(adapter.jsonable(value))


def test_an_environment_snapshot_is_shared_until_the_environment_changes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = adapter.environ_snapshot()
    assert adapter.environ_snapshot() is first
    monkeypatch.setenv("CACHEAUDIT_DISABLE", "1")
    off = adapter.environ_snapshot()
    assert off is not first and off.disabled and not first.disabled
    monkeypatch.setenv("CACHEAUDIT_DISABLE", "0")
    assert not adapter.environ_snapshot().disabled
    text, _compile_env = adapter.environ_text(adapter.environ_snapshot())
    assert text["CACHEAUDIT_DISABLE"] == "0"
