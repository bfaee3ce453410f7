"""Triton through cacheaudit: real compiles for sm_90 on the CPU (Triton's bundled ptxas), the real
disk cache, the real in-memory cache of @jit functions, no mocks of Triton.

No GPU is needed: `triton.compile(..., target=GPUTarget("cuda", 90, 32))` compiles without a
driver. The @jit path (`JITFunction.warmup`/`run`, the in-memory `device_caches`) asks Triton's
active driver only for the current device, stream and target; `CompileOnlyDriver` answers those
three questions through Triton's own `driver.set_active` seam, and everything it does not answer
(launching) is never reached, since `warmup` does not launch.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed: Triton checks skipped")
tl = pytest.importorskip("triton.language")
torch = pytest.importorskip("torch", reason="torch is needed for the @jit warmup arguments")

from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.driver import DriverBase  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.driver import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from cacheaudit.audit import audit_records, scan  # noqa: E402
from cacheaudit.digest import StateCache, hash_file  # noqa: E402
from cacheaudit.ledger import Ledger, ingest_spool  # noqa: E402
from cacheaudit.model import CacheEntry, CacheLeftover, CompileRecord, CompilerIdentity  # noqa: E402
from cacheaudit.runtimes import layout_for as reader_for  # noqa: E402
from cacheaudit.runtimes import policy_for  # noqa: E402
from cacheaudit.runtimes.triton import policy as recipe  # noqa: E402
from cacheaudit.runtimes.triton.adapter import TritonAdapter  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
             "BLOCK": "constexpr"}
TRITON_DIR = Path(triton.__file__).parent


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0 + 1.0, mask=mask)


def source(block: int = 1024) -> ASTSource:
    return ASTSource(fn=add_kernel, signature=SIGNATURE, constexprs={"BLOCK": block})


class CompileOnlyDriver(DriverBase):
    """Device 0, stream 0, an sm_90 target: what JITFunction.run asks of a driver before it
    launches. Installed with Triton's own `driver.set_active`."""

    @classmethod
    def is_active(cls) -> bool:
        return True

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("no launcher without a GPU")

    def get_current_target(self) -> GPUTarget:
        return TARGET

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")

    def get_benchmarker(self) -> None:
        raise NotImplementedError("no benchmarking without a GPU")

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private Triton cache and ledger; FP fusion set explicitly (Triton 3.9 warns when unset)."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(tmp_path / "ledger.db"))
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")
    for name in ("DISABLE_LLVM_OPT", "TRITON_ALWAYS_COMPILE", "CACHEAUDIT_RUN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path


@pytest.fixture
def adapter(env: Path) -> Iterator[TritonAdapter]:
    """A fresh adapter, installed; uninstalled afterwards whatever the test did."""
    before = dict(vars(knobs.compilation))
    run = JITFunction.__dict__["run"]
    hooked = TritonAdapter()
    hooked.install()
    yield hooked
    hooked.uninstall()
    assert JITFunction.__dict__["run"] is run
    assert ("listener" in vars(knobs.compilation)) == ("listener" in before)


@pytest.fixture
def jit_driver() -> Iterator[None]:
    previous = driver._active
    driver.set_active(CompileOnlyDriver())
    yield
    driver._active = previous


def records(tmp_path: Path) -> list[CompileRecord]:
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ingest_spool(ledger)
        return ledger.records()


def warmup(fn: JITFunction, block: int = 1024) -> Any:
    x = torch.empty(block, dtype=torch.float32)
    if fn is add_kernel:
        return fn.warmup(x, x, x, block, BLOCK=block, grid=(1,))
    return fn.warmup(x, x, block, BLOCK=block, grid=(1,))


# --------------------------------------------------------------------------------------------
# Import hygiene
# --------------------------------------------------------------------------------------------

def test_importing_the_triton_modules_does_not_import_triton():
    probe = ("import sys, cacheaudit.runtimes.triton.adapter, cacheaudit.runtimes.triton.policy, "
             "cacheaudit.runtimes.triton.layout; print('triton' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == "False"


# --------------------------------------------------------------------------------------------
# Compiles and disk hits
# --------------------------------------------------------------------------------------------

def test_compile_then_disk_hit_with_the_same_key(adapter: TritonAdapter, env: Path):
    first = triton.compile(source(), target=TARGET)
    # triton.compile has no in-memory layer: the second call is a real disk lookup.
    second = triton.compile(source(), target=TARGET)
    adapter.flush()
    compiled, hit = records(env)
    assert (compiled.event, hit.event) == ("compile", "disk-hit")
    assert compiled.key == hit.key == first.hash == second.hash
    assert compiled.kernel == hit.kernel == "add_kernel"
    entry = env / "cache" / recipe.base32_name(first.hash)
    assert compiled.entry == hit.entry == str(entry)
    cubin = entry / "add_kernel.cubin"
    assert [o.path for o in compiled.outputs] == [str(cubin)]
    assert compiled.outputs[0].digest == hit.outputs[0].digest == hash_file(str(cubin))
    assert compiled.exit_code == 0 and compiled.observer == "adapter:triton"
    # The ptxas Triton uses for sm_90 (the bundled "ptxas-blackwell"), with its identity.
    assert compiled.compiler is not None
    assert compiled.compiler.path == str(TRITON_DIR / "backends" / "nvidia" / "bin" /
                                         "ptxas-blackwell")
    assert "release" in compiled.compiler.version_line and compiled.compiler.digest
    assert hit.compiler == compiled.compiler
    assert compiled.env["TRITON_DEFAULT_FP_FUSION"] == "1"
    # Effective options: the environment chose enable_fp_fusion, the caller the rest.
    argv = {t.text.split("=", 1)[0]: t for t in compiled.effective_argv}
    assert argv["enable_fp_fusion"].text == "enable_fp_fusion=True"
    assert argv["enable_fp_fusion"].origin == "env:TRITON_DEFAULT_FP_FUSION"
    assert argv["num_warps"].origin == "options"
    assert argv["TRITON_DEFAULT_FP_FUSION"].text == "TRITON_DEFAULT_FP_FUSION=true"
    # The key's parts compose the entry's hash, and the extern libraries are the tracked set.
    assert compiled.extra["key_parts"]["verified"] is True
    libdevice = os.path.realpath(TRITON_DIR / "backends" / "nvidia" / "lib" / "libdevice.10.bc")
    assert compiled.tracked == (libdevice,)
    assert compiled.graph is not None and compiled.graph.paths == (libdevice,)
    assert [s.path for s in compiled.sources] == [__file__]
    # A hit is lean: only what ties it to its entry.
    assert set(hit.extra) <= {"run_uuid"} and hit.graph is None and hit.effective_argv == ()


def test_repeated_hits_share_a_record_until_the_environment_changes(
        adapter: TritonAdapter, env: Path, monkeypatch: pytest.MonkeyPatch):
    kernel = triton.compile(source(), target=TARGET)
    for _ in range(3):
        triton.compile(source(), target=TARGET)
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", "/nonexistent/ptxas")  # Triton falls back
    triton.compile(source(), target=TARGET)
    adapter.flush()
    compiled, first, second = records(env)
    assert (first.event, first.extra["repeats"], first.key) == ("disk-hit", 2, kernel.hash)
    assert first.started_ns < first.extra["last_ns"] < second.started_ns
    assert "repeats" not in second.extra
    assert second.env["TRITON_PTXAS_BLACKWELL_PATH"] == "/nonexistent/ptxas"
    assert second.compiler == compiled.compiler  # the bundled ptxas, as Triton fell back to it


def test_nothing_observed_under_cacheaudit_disable_is_recorded(
        adapter: TritonAdapter, env: Path, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as patch:
        patch.setenv("CACHEAUDIT_DISABLE", "1")
        triton.compile(source(512), target=TARGET)
        triton.compile(source(512), target=TARGET)
    # The write comes later, with the variable gone: what was seen under it stays unrecorded.
    triton.compile(source(256), target=TARGET)
    triton.compile(source(512), target=TARGET)
    adapter.flush()
    assert [(r.event, r.key) for r in records(env)] == [
        ("compile", triton.compile(source(256), target=TARGET).hash),
        ("disk-hit", triton.compile(source(512), target=TARGET).hash)]


def test_a_new_process_hits_the_disk_entry(env: Path):
    """Activation before triton's import, the atexit flush, and a disk hit in a new process."""
    script = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from cacheaudit import runtimes; runtimes.activate(['triton'])\n"
        "import triton, test_triton as t\n"
        "print(triton.compile(t.source(), target=t.TARGET).hash)\n")
    tests = str(Path(__file__).parent)
    hashes = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script, tests], capture_output=True,
                              text=True, env=dict(os.environ), timeout=300)
        assert done.returncode == 0, done.stderr
        hashes.append(done.stdout.split()[-1])
    found = records(env)
    assert [r.event for r in found] == ["compile", "disk-hit"]
    assert found[0].key == found[1].key == hashes[0] == hashes[1]
    assert found[0].pid != found[1].pid


def test_a_cache_invalidating_variable_makes_a_new_disk_entry(adapter: TritonAdapter, env: Path,
                                                              monkeypatch: pytest.MonkeyPatch):
    """Where there is no in-memory layer, the disk key covers the variable: no finding."""
    first = triton.compile(source(), target=TARGET)
    monkeypatch.setenv("DISABLE_LLVM_OPT", "1")
    second = triton.compile(source(), target=TARGET)
    adapter.flush()
    found = records(env)
    assert [r.event for r in found] == ["compile", "compile"]
    assert first.hash != second.hash
    assert found[1].extra["env_in_key"] == {"DISABLE_LLVM_OPT": "true",
                                            "TRITON_DEFAULT_FP_FUSION": "true"}
    assert audit_records(found) == []


# --------------------------------------------------------------------------------------------
# The in-memory layer
# --------------------------------------------------------------------------------------------

def test_env_change_served_from_memory_is_recorded_and_flagged(
        adapter: TritonAdapter, env: Path, jit_driver: None, monkeypatch: pytest.MonkeyPatch):
    add_kernel.device_caches.clear()
    first = warmup(add_kernel)
    assert warmup(add_kernel) is first  # a memory hit, same environment: nothing recorded
    adapter.flush()
    assert [r.event for r in records(env)] == ["compile"]

    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    served = warmup(add_kernel)
    # Triton's behaviour, unchanged by the adapter: the stale kernel, fused, from memory.
    assert served is first and served.metadata.enable_fp_fusion is True
    assert warmup(add_kernel) is first  # the same drift again: recorded once
    found = records(env)
    assert [r.event for r in found] == ["compile", "memory-hit"]
    memory = found[1]
    assert memory.key == first.hash and memory.entry == found[0].entry
    assert memory.extra["env_drift"] == {"TRITON_DEFAULT_FP_FUSION": ["true", "false"]}
    assert memory.outputs[0].digest == found[0].outputs[0].digest
    [finding] = audit_records(found)
    assert (finding.code, finding.subject) == ("CA202", "TRITON_DEFAULT_FP_FUSION")
    assert (finding.recorded, finding.current) == ("TRITON_DEFAULT_FP_FUSION=true",
                                                   "TRITON_DEFAULT_FP_FUSION=false")
    assert "in-memory" in finding.message and "#8350" in finding.how

    # A fresh in-memory state looks up the disk with the new key: a new, correct compile.
    add_kernel.device_caches.clear()
    fresh = warmup(add_kernel)
    assert fresh.metadata.enable_fp_fusion is False and fresh.hash != first.hash
    adapter.flush()
    assert [r.event for r in records(env)][-1] == "compile"


def test_a_variable_set_after_the_compile_is_drift_too(adapter: TritonAdapter, env: Path,
                                                       jit_driver: None,
                                                       monkeypatch: pytest.MonkeyPatch):
    scale_kernel.device_caches.clear()
    warmup(scale_kernel)
    monkeypatch.setenv("DISABLE_LLVM_OPT", "1")
    warmup(scale_kernel)
    memory = [r for r in records(env) if r.event == "memory-hit"]
    assert [r.extra["env_drift"] for r in memory] == [{"DISABLE_LLVM_OPT": [None, "true"]}]
    [finding] = audit_records(memory)
    assert finding.recorded == "(unset)" and finding.current == "DISABLE_LLVM_OPT=true"


def test_a_drift_served_under_cacheaudit_disable_is_not_recorded(
        adapter: TritonAdapter, env: Path, jit_driver: None, monkeypatch: pytest.MonkeyPatch):
    scale_kernel.device_caches.clear()
    warmup(scale_kernel)
    monkeypatch.setenv("DISABLE_LLVM_OPT", "1")
    with monkeypatch.context() as patch:
        patch.setenv("CACHEAUDIT_DISABLE", "1")
        warmup(scale_kernel)
    adapter.flush()
    assert [r.event for r in records(env)] == ["compile"]
    # Out of the opted-out stretch, the same drift is checked again, and recorded.
    warmup(scale_kernel)
    assert [r.event for r in records(env)] == ["compile", "memory-hit"]


def test_without_memory_observation_run_is_left_alone(env: Path):
    original = JITFunction.__dict__["run"]
    hooked = TritonAdapter()
    hooked.observe_memory = False
    hooked.install()
    try:
        assert JITFunction.__dict__["run"] is original
        assert hooked.installed()
    finally:
        hooked.uninstall()


# --------------------------------------------------------------------------------------------
# Chaining, idempotence, restoring, failing open
# --------------------------------------------------------------------------------------------

def test_a_listener_installed_before_keeps_being_called(env: Path):
    seen: list[tuple[str, bool]] = []

    def theirs(*, src: Any, metadata: Any, metadata_group: Any, times: Any,
               cache_hit: bool) -> str:
        seen.append((metadata["hash"], cache_hit))
        return "theirs"

    knobs.compilation.listener = theirs
    try:
        hooked = TritonAdapter()
        hooked.install()
        assert knobs.compilation.listener is not theirs
        kernel = triton.compile(source(), target=TARGET)
        triton.compile(source(), target=TARGET)
        assert seen == [(kernel.hash, False), (kernel.hash, True)]
        # Whatever theirs returns comes back through ours.
        assert knobs.compilation.listener(src=None, metadata={"hash": kernel.hash},
                                          metadata_group=kernel.metadata_group, times=None,
                                          cache_hit=True) == "theirs"
        hooked.uninstall()
        assert knobs.compilation.listener is theirs
        # Repeated hits of one entry under one environment share a record.
        compiled, hit = records(env)
        assert (compiled.event, hit.event, hit.extra["repeats"]) == ("compile", "disk-hit", 1)
    finally:
        del knobs.compilation.listener


def test_install_twice_is_a_no_op(adapter: TritonAdapter, env: Path):
    listener, run = knobs.compilation.listener, JITFunction.__dict__["run"]
    adapter.install()
    assert knobs.compilation.listener is listener and JITFunction.__dict__["run"] is run
    triton.compile(source(), target=TARGET)
    adapter.flush()
    assert [r.event for r in records(env)] == ["compile"]


def test_uninstall_restores_exactly(env: Path):
    assert "listener" not in vars(knobs.compilation)
    original = JITFunction.__dict__["run"]
    hooked = TritonAdapter()
    hooked.install()
    assert hooked.installed() and JITFunction.__dict__["run"] is not original
    hooked.uninstall()
    assert not hooked.installed()
    assert "listener" not in vars(knobs.compilation) and knobs.compilation.listener is None
    assert JITFunction.__dict__["run"] is original
    triton.compile(source(), target=TARGET)
    assert not (env / "ledger.db").exists()


def test_a_listener_chained_on_top_survives_uninstall(env: Path):
    hooked = TritonAdapter()
    hooked.install()
    ours = knobs.compilation.listener
    calls = []

    def on_top(**kwargs: Any) -> Any:
        calls.append(kwargs["cache_hit"])
        return ours(**kwargs)

    knobs.compilation.listener = on_top
    try:
        hooked.uninstall()
        assert knobs.compilation.listener is on_top  # theirs stays; ours passes through
        triton.compile(source(), target=TARGET)
        assert calls == [False]
        assert not (env / "ledger.db").exists()
    finally:
        del knobs.compilation.listener


def test_a_failing_ledger_changes_nothing_in_triton(env: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capfd: pytest.CaptureFixture[str]):
    bare = triton.compile(source(), target=TARGET)
    blocker = env / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(blocker / "ledger.db"))
    monkeypatch.setenv("TRITON_CACHE_DIR", str(env / "cache2"))
    hooked = TritonAdapter()
    hooked.install()
    try:
        audited = triton.compile(source(), target=TARGET)
        again = triton.compile(source(), target=TARGET)
        hooked.flush()
    finally:
        hooked.uninstall()
    assert audited.hash == again.hash == bare.hash
    assert audited.asm["cubin"] == bare.asm["cubin"]
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("cacheaudit:")]
    assert len(lines) == 1 and "not recorded" in lines[0], lines


def test_garbage_reaching_the_listener_is_swallowed(adapter: TritonAdapter, env: Path,
                                                    capfd: pytest.CaptureFixture[str]):
    """Whatever calls the listener (a third-party caller, a future Triton), cacheaudit's part
    neither raises nor changes the return value."""
    listener = knobs.compilation.listener
    assert listener(src=None, metadata=None, metadata_group=None, times=None,
                    cache_hit=True) is None
    assert listener(src=object(), metadata={"target": "?"}, metadata_group={}, times=None,
                    cache_hit=False) is None
    adapter.flush()
    err = capfd.readouterr().err
    assert err.count("cacheaudit: recording failed") >= 1
    kernel = triton.compile(source(), target=TARGET)  # and Triton still works, recorded
    adapter.flush()
    assert [r.key for r in records(env)] == [kernel.hash]


# --------------------------------------------------------------------------------------------
# The reader and the scan
# --------------------------------------------------------------------------------------------

def test_scan_ties_the_cache_entries_to_the_records(adapter: TritonAdapter, env: Path):
    kernels = [triton.compile(source(block), target=TARGET) for block in (256, 1024)]
    adapter.flush()
    with Ledger.open(str(env / "ledger.db")) as ledger:
        result = scan([str(env / "cache")], dict(os.environ), ledger=ledger)
    assert result.roots == [("triton", str(env / "cache"))]
    assert sorted(e.key for e in result.entries) == sorted(k.hash for k in kernels)
    assert result.matched == 2 and result.leftovers == []
    assert [f for f in result.findings if f.entry] == []


def test_reader_reads_a_real_entry(env: Path):
    kernel = triton.compile(source(), target=TARGET)
    reader = reader_for("triton")
    root = str(env / "cache")
    assert reader.is_root(root)
    [entry] = list(reader.read(root, StateCache()))
    assert isinstance(entry, CacheEntry)
    assert (entry.runtime, entry.kernel, entry.key) == ("triton", "add_kernel", kernel.hash)
    assert entry.binary is not None and entry.binary.path.endswith("add_kernel.cubin")
    assert entry.source is not None and entry.source.path.endswith("add_kernel.source")
    assert entry.meta["hash"] == kernel.hash and entry.problems == ()
    assert "__grp__add_kernel.json" in entry.files


def _entry_dir(env: Path) -> Path:
    triton.compile(source(), target=TARGET)
    [directory] = [d for d in (env / "cache").iterdir() if d.is_dir()]
    return directory


def _read(root: Path) -> tuple[list[CacheEntry], list[CacheLeftover]]:
    items = list(reader_for("triton").read(str(root), StateCache()))
    return ([i for i in items if isinstance(i, CacheEntry)],
            [i for i in items if isinstance(i, CacheLeftover)])


def test_reader_reports_partial_and_corrupt_entries(env: Path):
    directory = _entry_dir(env)
    (directory / "tmp.pid_4242_0b5e3c").mkdir()
    (directory / "__grp__add_kernel.json").unlink()
    (directory / "add_kernel.json").write_text("{not json")
    [entry], [leftover] = _read(env / "cache")
    assert leftover.path.endswith("tmp.pid_4242_0b5e3c") and "never finished" in leftover.reason
    assert any("__grp__add_kernel.json is missing" in p for p in entry.problems)
    assert any("not valid JSON" in p for p in entry.problems)


def test_reader_reports_a_missing_binary_and_a_moved_cache(env: Path):
    directory = _entry_dir(env)
    moved = env / "moved"
    shutil.copytree(env / "cache", moved)
    (directory / "add_kernel.cubin").unlink()
    [entry], _ = _read(env / "cache")
    assert any("add_kernel.cubin is missing" in p for p in entry.problems)
    [copy], _ = _read(moved)
    assert any("outside this entry" in p for p in copy.problems)


def test_reader_skips_launcher_stubs_and_autotune_results(env: Path):
    root = env / "cache"
    stub = root / recipe.base32_name("ab" * 32)
    stub.mkdir(parents=True)
    (stub / "cuda_utils.cpython-311-x86_64-linux-gnu.so").write_bytes(b"\x7fELF")
    tuned = root / recipe.base32_name("cd" * 32)
    tuned.mkdir()
    (tuned / "add_kernel.autotune.json").write_text("{}")
    assert not reader_for("triton").is_root(str(root))
    assert _read(root) == ([], [])


def test_default_roots_follow_knobs_cache():
    reader = reader_for("triton")
    assert reader.default_roots({"TRITON_CACHE_DIR": "/c", "TRITON_HOME": "/t"}) == ["/c"]
    assert reader.default_roots({"TRITON_HOME": "/t", "HOME": "/h"}) == ["/t/.triton/cache"]
    assert reader.default_roots({"HOME": "/h"}) == ["/h/.triton/cache"]
    assert reader.default_roots({"TRITON_CACHE_DIR": ""}) == []


# --------------------------------------------------------------------------------------------
# The policy, checked against Triton itself
# --------------------------------------------------------------------------------------------

def test_env_normalisation_matches_triton(monkeypatch: pytest.MonkeyPatch):
    from triton._C.libtriton import get_cache_invalidating_env_vars

    for name in recipe.INVALIDATING:
        monkeypatch.delenv(name, raising=False)
    for value in ("0", "1", "true", "OFF", "On", "False", "yes", "2", " 1", "", "/a path"):
        monkeypatch.setenv("DISABLE_LLVM_OPT", value)
        monkeypatch.setenv("MLIR_DUMP_PATH", value.upper())
        assert get_cache_invalidating_env_vars() == recipe.invalidating_env(os.environ), value


def test_registry_knows_every_cache_invalidating_variable_of_this_triton():
    header = (TRITON_DIR / "include" / "triton" / "Tools" / "Sys" / "GetEnv.h").read_text()
    block = header.split("CACHE_INVALIDATING_ENV_VARS", 1)[1].split("};", 1)[0]
    names = {line.strip().strip('",') for line in block.splitlines()
             if line.strip().startswith('"')}
    assert names and names <= set(recipe.INVALIDATING)


def test_recomputed_key_equals_the_entry_key(adapter: TritonAdapter, env: Path):
    kernel = triton.compile(source(), target=TARGET)
    adapter.flush()
    [compiled] = records(env)
    [entry], _ = _read(env / "cache")
    check = policy_for("triton").check_key(entry, compiled)
    assert check.recomputed == kernel.hash and check.matches(entry.key) is True
    # Without the recorded parts the key cannot be recomputed, and the note says why.
    assert policy_for("triton").check_key(entry, None).recomputed is None


def test_extern_library_edited_in_process(adapter: TritonAdapter, env: Path,
                                          monkeypatch: pytest.MonkeyPatch):
    """Triton hashes libdevice once per process (file_hash is an lru_cache): a compile after an
    edit is keyed with the old content (CA106 from the records); the scan sees the tracked file
    changed while the compiling process (this one) still runs."""
    libdevice = env / "libdevice.10.bc"
    shutil.copy(TRITON_DIR / "backends" / "nvidia" / "lib" / "libdevice.10.bc", libdevice)
    monkeypatch.setenv("TRITON_LIBDEVICE_PATH", str(libdevice))
    triton.compile(source(256), target=TARGET)
    with open(libdevice, "ab") as handle:
        handle.write(b"\0" * 16)
    triton.compile(source(512), target=TARGET)
    adapter.flush()
    found = records(env)
    [memoised] = audit_records(found)
    assert (memoised.code, memoised.subject) == ("CA106", str(libdevice))
    assert memoised.record_id == found[1].record_id
    with Ledger.open(str(env / "ledger.db")) as ledger:
        result = scan([str(env / "cache")], dict(os.environ), ledger=ledger)
    stale = [f for f in result.findings if f.code == "CA106"]
    assert {f.subject for f in stale} == {str(libdevice)} and all(f.inferred for f in stale)
    assert not [f for f in result.findings if f.code == "CA103"]


def test_ptxas_version_text_is_keyed_its_binary_is_not():
    policy = policy_for("triton")
    old = CompilerIdentity(invoked="ptxas", path="/p", resolved="/p", kind="unknown",
                           version_text="Cuda compilation tools, release 13.4, V13.4.59\n",
                           digest="a")
    assert policy.compiler_change_in_key(old, CompilerIdentity(
        **{**old.to_dict(), "host": None, "wrappers": (), "version_text": "release 13.5"}))
    assert not policy.compiler_change_in_key(old, CompilerIdentity(
        **{**old.to_dict(), "host": None, "wrappers": (), "digest": "b"}))


def test_ptxas_replaced_in_place_is_compiler_drift(adapter: TritonAdapter, env: Path,
                                                   monkeypatch: pytest.MonkeyPatch):
    """Only `ptxas --version` enters the key: a different binary with the same version text
    (patched in place here) keeps every entry a hit."""
    ptxas = env / "bin" / "ptxas-blackwell"
    ptxas.parent.mkdir()
    shutil.copy(TRITON_DIR / "backends" / "nvidia" / "bin" / "ptxas-blackwell", ptxas)
    monkeypatch.setenv("TRITON_PTXAS_BLACKWELL_PATH", str(ptxas))
    triton.compile(source(128), target=TARGET)
    adapter.flush()
    [compiled] = records(env)
    assert compiled.compiler is not None and compiled.compiler.path == str(ptxas)
    with open(ptxas, "ab") as handle:
        handle.write(b"\0patched")
    with Ledger.open(str(env / "ledger.db")) as ledger:
        result = scan([str(env / "cache")], dict(os.environ), ledger=ledger)
    [drift] = [f for f in result.findings if f.code == "CA301"]
    assert drift.subject == str(ptxas) and drift.recorded != drift.current


def test_scan_in_another_ptxas_environment_is_environment_drift(adapter: TritonAdapter, env: Path):
    triton.compile(source(128), target=TARGET)
    adapter.flush()
    scan_env = dict(os.environ, TRITON_PTXAS_BLACKWELL_PATH="/opt/other/ptxas")
    with Ledger.open(str(env / "ledger.db")) as ledger:
        result = scan([str(env / "cache")], scan_env, ledger=ledger)
    codes = {(f.code, f.subject) for f in result.findings}
    assert ("CA202", "TRITON_PTXAS_BLACKWELL_PATH") in codes
    assert ("CA201", "TRITON_PTXAS_BLACKWELL_PATH") in codes


# --------------------------------------------------------------------------------------------
# Review fixes (policy): the audit's environment, mistyped metadata
# --------------------------------------------------------------------------------------------

def test_check_key_judges_the_environment_it_is_given_not_the_process(
        env: Path, monkeypatch: pytest.MonkeyPatch):
    triton.compile(source(), target=TARGET)
    [entry], _ = _read(env / "cache")
    policy = policy_for("triton")
    as_built = dict(os.environ)
    monkeypatch.setenv("DISABLE_LLVM_OPT", "1")  # this process differs from the build

    def now_part(given: dict[str, str]) -> list[str]:
        return [c.value for c in policy.check_key(entry, None, env=given).components
                if c.label.startswith("cache-invalidating environment (now")]

    assert now_part(as_built) == []
    [part] = now_part(dict(as_built, MLIR_ENABLE_TIMING="1"))
    assert "MLIR_ENABLE_TIMING" in part and "DISABLE_LLVM_OPT" not in part


def test_mistyped_extern_libs_in_the_metadata_name_no_file(env: Path):
    import json

    directory = _entry_dir(env)
    meta_path = directory / "add_kernel.json"
    meta = json.loads(meta_path.read_text())
    meta["extern_libs"] = 5
    meta_path.write_text(json.dumps(meta))
    [entry], _ = _read(env / "cache")
    policy = policy_for("triton")
    assert policy.tracked(entry, None).paths == frozenset()
    assert policy.check_key(entry).recomputed is None
