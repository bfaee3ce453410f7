"""FlashInfer's JIT: the workspace reader and the policy, against real ninja builds.

Two kinds of build, judged the same way:

- a replica of FlashInfer's build (`write_module` below, in our own words from flashinfer-python
  0.7.4 `jit/cpp_ext.py` `generate_ninja_build_for_op`, lines 252-401, and `run_ninja`, 411-445):
  the same build.ninja variables, rules and absolute outputs, in the same workspace layout
  (`jit/env.py` 66-70, 382-397), run by the real ninja with the real g++. It needs no
  flashinfer and takes about a second, so it runs by default;
- a real FlashInfer build (`flashinfer.jit.gen_jit_spec(...).build_and_load` path, through
  `JitSpecNvcc.build`), with nvcc for sm_90a, marked slow and skipped where flashinfer, nvcc or
  the CUDA runtime library is missing. No GPU is needed: the module's host function is loaded
  with ctypes (libcuda is dropped by the linker's --as-needed; a stub on
  FLASHINFER_EXTRA_LDFLAGS satisfies `-lcuda`).

Ground truth: the value the served library computes against the value a build into an empty
workspace computes (nvcc's objects and libraries are not byte-reproducible: measured, the same
module built three times, twice in one workspace, gave three digests; so the value is the
oracle, not the digest).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.audit import scan
from cacheaudit.digest import StateCache
from cacheaudit.ledger import Ledger
from cacheaudit.model import CacheEntry, CacheLeftover, Finding
from cacheaudit.runtimes import layout_for

from support import GCC, GXX, NVCC, clean_env

VENV_BIN = os.path.dirname(sys.executable)
NINJA = shutil.which("ninja", path=os.pathsep.join([VENV_BIN, os.environ.get("PATH", "")]))
needs_ninja = pytest.mark.skipif(NINJA is None or GXX is None, reason="needs ninja and g++")

VERSION = "0.7.4"
ARCHS = "90a"  # FLASHINFER_CUDA_ARCH_LIST=9.0 (env.py:382-391 through CompilationContext)


def _cuda_home() -> Path | None:
    """The toolkit FlashInfer compiles with: CUDA_HOME, else /usr/local/cuda, else the one above
    nvcc, where it holds the runtime library the link edge names (-lcudart)."""
    candidates = [os.environ.get("CUDA_HOME"), "/usr/local/cuda"]
    if NVCC is not None:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(NVCC))))
    for candidate in candidates:
        if candidate and (Path(candidate) / "lib64" / "libcudart.so").exists() and (
                Path(candidate) / "bin" / "nvcc").exists():
            return Path(candidate)
    return None


CUDA_HOME = _cuda_home()


# ------------------------------------------------------------------------------ the replica

ROOT = Path(__file__).resolve().parents[1]
REPLICA_PACKAGE = ROOT / "fixtures" / "flashinfer_replica"

# Runs in a new process, as a job would: FlashInfer's own entry point (`build_and_load`: the AOT
# library if the package has one, else build.ninja written when its text changed and ninja run
# in cached_ops/<name>/), then what the library's `value()` returns. The replica package
# (fixtures/flashinfer_replica, after flashinfer-python 0.7.4) stands in for flashinfer.
REPLICA_DRIVER = r"""
import json, sys
from flashinfer.jit import core
name, sources, includes, system = json.loads(sys.argv[1])
spec = core.gen_jit_spec(name, sources, extra_include_paths=includes,
                         system_include_paths=system)
print(json.dumps({"value": spec.build_and_load().value(), "library": str(spec.jit_library_path)}))
"""


def module_dir(base: Path, name: str) -> Path:
    """cached_ops/<name> of the workspace under FLASHINFER_WORKSPACE_BASE=`base`."""
    return base / ".cache" / "flashinfer" / VERSION / ARCHS / "cached_ops" / name


class Replica:
    """A source including one `-I` header and one `-isystem` header (`.cpp`, or `.cu` for the
    nvcc scenarios), a workspace, a ledger."""

    name = "fi_scale"

    def __init__(self, root: Path, suffix: str = ".cpp") -> None:
        self.root = root
        self.base = root / "ws"
        self.ledger = root / "ledger.db"
        for sub in ("src", "inc", "sysinc", "ws"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.source = root / "src" / f"scale{suffix}"
        self.header = root / "inc" / "scale.h"
        self.system_header = root / "sysinc" / "offset.h"
        self.source.write_text('#include "scale.h"\n#include <offset.h>\n'
                               "#ifndef EXTRA\n#define EXTRA 0\n#endif\n"
                               'extern "C" int value() { return SCALE * 100 + OFFSET + EXTRA; }\n')
        self.header.write_text("#define SCALE 2\n")
        self.system_header.write_text("#define OFFSET 7\n")
        aged(self.source, self.header, self.system_header)
        self.env = clean_env(root)
        self.env["PATH"] = os.pathsep.join([VENV_BIN, self.env.get("PATH", "")])
        self.env["PYTHONPATH"] = os.pathsep.join(
            [str(REPLICA_PACKAGE), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.env["FLASHINFER_WORKSPACE_BASE"] = str(self.base)
        self.env["FLASHINFER_CUDA_ARCH_LIST"] = "9.0"
        if suffix == ".cu" and CUDA_HOME is not None:
            self.env["CUDA_HOME"] = str(CUDA_HOME)
            self.env["LD_LIBRARY_PATH"] = str(CUDA_HOME / "lib64")

    @property
    def directory(self) -> Path:
        return module_dir(self.base, self.name)

    def argv(self) -> list[str]:
        return [sys.executable, "-c", REPLICA_DRIVER, json.dumps(
            [self.name, [str(self.source)], [str(self.root / "inc")],
             [str(self.root / "sysinc")]])]

    def run(self, *, recorded: bool = True, env: dict[str, str] | None = None,
            base: Path | None = None, report: Path | None = None) -> tuple[int, str]:
        """One process asking for the module (under `cacheaudit run` when `recorded`, its JSON
        report written to `report`): the value its library computes and what cacheaudit
        printed."""
        argv = self.argv()
        if recorded:
            argv = [sys.executable, "-m", "cacheaudit", "run", "--ledger", str(self.ledger),
                    "--fail-on", "never",
                    *(("--report-json", str(report)) if report else ()), "--", *argv]
        run_env = dict(env or self.env)
        if base is not None:
            run_env["FLASHINFER_WORKSPACE_BASE"] = str(base)
        done = subprocess.run(argv, env=run_env, cwd=self.root, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stdout + done.stderr
        line = next(x for x in done.stdout.splitlines() if x.startswith("{"))
        return json.loads(line)["value"], done.stdout + done.stderr

    def fresh_value(self, env: dict[str, str] | None = None) -> int:
        """Ground truth: the same module built into an empty workspace, unrecorded."""
        base = self.root / "fresh"
        shutil.rmtree(base, ignore_errors=True)
        return self.run(recorded=False, env=env, base=base)[0]

    def plugin(self, value: int, env: dict[str, str] | None = None) -> str:
        """`pytest --cacheaudit --cacheaudit-fail-on=error` of a test that asks FlashInfer for
        the module in the pytest process and gets `value` (the adapter's disk hit, there): the
        session passes its test and fails on a finding. Returns its output."""
        suite = self.root / "suite"
        suite.mkdir(exist_ok=True)
        (suite / "test_served.py").write_text(
            "import json\n"
            f"ARGV = {self.argv()!r}\n"
            "from flashinfer.jit import core\n"
            "def test_served():\n"
            "    name, sources, includes, system = json.loads(ARGV[-1])\n"
            "    spec = core.gen_jit_spec(name, sources, extra_include_paths=includes,\n"
            "                             system_include_paths=system)\n"
            f"    assert spec.build_and_load().value() == {value}\n")
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               "--cacheaudit", "--cacheaudit-fail-on=error", "test_served.py"],
                              capture_output=True, text=True, cwd=suite, timeout=300,
                              env=dict(env or self.env, CACHEAUDIT_LEDGER=str(self.ledger)))
        assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
        assert "1 passed" in done.stdout, done.stdout[-3000:]
        return done.stdout

    def scan(self, env: dict[str, str] | None = None) -> list[Finding]:
        with Ledger.open(str(self.ledger)) as ledger:
            return scan([str(self.base / ".cache" / "flashinfer")], env or self.env,
                        ledger=ledger).findings

    def records(self) -> list[Any]:
        with Ledger.open(str(self.ledger)) as ledger:
            return list(ledger.records())

    def scan_cli(self, env: dict[str, str] | None = None) -> tuple[int, list[dict[str, Any]]]:
        """A later `cacheaudit scan` of the workspace, in its own process."""
        done = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--json",
                               "--ledger", str(self.ledger), "--fail-on", "error",
                               str(self.base / ".cache" / "flashinfer")],
                              capture_output=True, text=True, env=env or self.env, timeout=300)
        assert done.returncode in (0, 1), done.stderr
        return done.returncode, json.loads(done.stdout)["findings"]


def aged(*paths: Path, seconds: float = 3600.0) -> None:
    """Date files back, as a wheel's files are: its build time, long before the object."""
    stamp = time.time_ns() - int(seconds * 1e9)
    for path in paths:
        os.utime(path, ns=(stamp, stamp))


def _codes(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings}


@pytest.fixture
def replica(tmp_path: Path) -> Replica:
    return Replica(tmp_path)


# ------------------------------------------------------------------------------ the reader


@needs_ninja
def test_reader_reads_a_module_where_flashinfer_lays_it_out(replica: Replica):
    value, _ = replica.run(recorded=False)
    assert value == 207
    cache_dir = replica.base / ".cache" / "flashinfer"
    # What FlashInfer keeps beside its modules is no entry: locks, the prebuild's ninja file,
    # generated sources, downloaded cubins. A module directory without build.ninja is a
    # leftover.
    jit_dir = cache_dir / VERSION / ARCHS / "cached_ops"
    (jit_dir / "tmp").mkdir(exist_ok=True)  # the module's lock is there already
    (jit_dir / "tmp" / "fi_scale.lock").write_text("")
    (jit_dir / "tmp" / "flashinfer_jit.ninja").write_text(
        "ninja_required_version = 1.3\nsubninja x/build.ninja\n")
    (cache_dir / VERSION / ARCHS / "generated").mkdir()
    (cache_dir / "cubins").mkdir()
    (jit_dir / "never_written").mkdir()

    layout = layout_for("flashinfer")
    assert layout is not None
    assert layout.default_roots({"FLASHINFER_WORKSPACE_BASE": str(replica.base),
                                 "HOME": "/nowhere"}) == [str(cache_dir)]
    assert layout.default_roots({"HOME": "/home/u"}) == ["/home/u/.cache/flashinfer"]
    for level in (cache_dir, cache_dir / VERSION, cache_dir / VERSION / ARCHS, jit_dir,
                  jit_dir / "fi_scale"):
        assert layout.is_root(str(level)), level
    assert not layout.is_root(str(replica.root / "src"))

    found = list(layout.read(str(cache_dir), StateCache()))
    [entry] = [e for e in found if isinstance(e, CacheEntry)]
    [leftover] = [e for e in found if isinstance(e, CacheLeftover)]
    assert leftover.path == str(jit_dir / "never_written")
    directory = jit_dir / "fi_scale"
    assert entry.path == str(directory) and entry.kernel == "fi_scale"
    assert (entry.meta["version"], entry.meta["archs"]) == (VERSION, ARCHS)
    # The binary is the object the source's compile wrote; the library is in the meta.
    assert entry.binary is not None and entry.binary.path == str(directory / "src_scale.o")
    assert entry.meta["library"] == str(directory / "fi_scale.so")
    assert entry.source is not None and entry.source.path == str(replica.source)
    assert entry.problems == ()
    # -MMD: the -I header is in the deps log, the -isystem one is not.
    [deps] = entry.meta["deps"].values()
    assert str(replica.header) in deps and str(replica.system_header) not in deps
    # A module directory scanned on its own is the same entry.
    [alone] = list(layout.read(str(directory), StateCache()))
    assert isinstance(alone, CacheEntry) and alone.key == entry.key


def test_the_workspace_without_an_arch_level_is_read_too(tmp_path: Path):
    """No FLASHINFER_CUDA_ARCH_LIST and no GPU: no archs, and pathlib drops the level
    (<version>/cached_ops)."""
    directory = tmp_path / ".cache" / "flashinfer" / VERSION / "cached_ops" / "m"
    directory.mkdir(parents=True)
    (directory / "build.ninja").write_text(
        "rule link\n  command = c++ $in -o $out\n"
        f"build {directory}/m.so: link {directory}/a.o\ndefault {directory}/m.so\n")
    layout = layout_for("flashinfer")
    assert layout is not None
    [entry] = list(layout.read(str(tmp_path / ".cache" / "flashinfer"), StateCache()))
    assert isinstance(entry, CacheEntry)
    assert (entry.meta["version"], entry.meta["archs"]) == (VERSION, "")
    assert any("m.so, which is missing" in p for p in entry.problems)


# ------------------------------------------------------------------------------ the truth table


@needs_ninja
def test_replica_header_reinstalled_with_an_older_mtime_is_ca103(replica: Replica):
    """A reinstall writes a header's new bytes with the wheel's old mtime: ninja's no-op keeps
    the old library; `cacheaudit run`, `pytest --cacheaudit` and a later scan name the header."""
    first, _ = replica.run()
    replica.header.write_text("#define SCALE 3\n")
    aged(replica.header, seconds=1800)  # newer bytes, still older than the object
    served, told = replica.run()
    fresh = replica.fresh_value()
    assert (first, served, fresh) == (207, 207, 307)  # stale: served != fresh
    assert f"{replica.header}: CA103" in told, told
    plugin = replica.plugin(207)
    assert f"{replica.header}: CA103 error" in plugin, plugin[-3000:]
    [stale] = [f for f in replica.scan() if f.code == "CA103"]
    assert stale.subject == str(replica.header)
    assert stale.entry == str(module_dir(replica.base, "fi_scale"))


@needs_ninja
def test_replica_isystem_header_of_a_cpp_object_is_ca101(replica: Replica):
    """A `.cpp` object's depfile comes from -MMD, which lists no -isystem header (and every
    include root FlashInfer adds itself is -isystem): an edit with a new mtime goes unseen too.
    The shim's include graph has the header; `cacheaudit run`, `pytest --cacheaudit` and a
    later scan name it."""
    first, _ = replica.run()
    replica.system_header.write_text("#define OFFSET 8\n")
    served, told = replica.run()
    assert (first, served, replica.fresh_value()) == (207, 207, 208)  # stale
    assert f"{replica.system_header}: CA101" in told, told
    # `pytest --cacheaudit` of a test served the same library in-process fails the session on
    # the header (the adapter's disk hit, in the pytest process).
    plugin = replica.plugin(207)
    assert f"{replica.system_header}: CA101 error" in plugin, plugin[-3000:]
    [stale] = [f for f in replica.scan() if f.code == "CA101"]
    assert stale.subject == str(replica.system_header)
    assert stale.entry == str(module_dir(replica.base, "fi_scale"))


@needs_ninja
def test_replica_header_edited_with_a_new_mtime_is_rebuilt_and_clean(replica: Replica):
    """The control: an edit ninja sees (a newer mtime) rebuilds, and nothing is flagged."""
    first, _ = replica.run()
    replica.header.write_text("#define SCALE 3\n")
    served, told = replica.run()
    assert (first, served, replica.fresh_value()) == (207, 307, 307)
    assert "CA103" not in told
    assert not _codes(replica.scan()) & {"CA101", "CA103", "CA104", "CA501"}


# ------------------------------------------------------------------------------ the adapter


def _build_lines(path: Path) -> dict[str, str]:
    """build.ninja's top-level variables (name = value)."""
    lines = {}
    for line in path.read_text().splitlines():
        name, equals, value = line.partition(" = ")
        if equals and not line.startswith(" "):
            lines[name] = value
    return lines


@needs_ninja
def test_the_adapter_records_builds_and_no_op_hits_with_the_module_name(replica: Replica):
    """`JitSpecNvcc.build` wrapped: the first process's build is a compile of module fi_scale
    with what it wrote, the second's ninja no-op a disk hit of the same module and entry; the
    shim's record of the object's compile (with its include graph) stays the entry's build. The
    launcher is the only line recording changes in build.ninja: the nvcc line, the compiler
    path and the link edge are FlashInfer's own."""
    assert replica.run()[0] == 207
    recorded_build = _build_lines(replica.directory / "build.ninja")
    assert replica.run()[0] == 207
    ours = [r for r in replica.records() if r.runtime == "flashinfer" and r.kernel == "fi_scale"
            and r.record_id and r.extra.get("module") == "fi_scale"]
    assert [r.event for r in ours] == ["compile", "disk-hit"]
    built, hit = ours
    directory = str(replica.directory)
    assert built.entry == hit.entry == directory
    obj = str(replica.directory / "src_scale.o")
    assert obj in built.extra["written"] and str(replica.directory / "fi_scale.so") in \
        built.extra["written"]
    assert str(replica.header) in (hit.tracked or ())  # ninja's deps log: the -I header
    assert [o.path for o in built.outputs] == [str(replica.directory / "fi_scale.so")]
    [shim] = [r for r in replica.records() if any(o.path == obj for o in r.outputs)]
    assert shim.graph is not None and shim.entry == directory  # the scan tied it to the entry

    # The launcher: build.ninja of an unrecorded build differs in that one line.
    plain = replica.root / "plain"
    assert replica.run(recorded=False, base=plain)[0] == 207
    unrecorded = _build_lines(module_dir(plain, "fi_scale") / "build.ninja")
    changed = {k for k in recorded_build.keys() | unrecorded.keys()
               if recorded_build.get(k) != unrecorded.get(k)}
    assert changed == {"nvcc_launcher"}, changed
    assert recorded_build["nvcc"] == unrecorded["nvcc"] == "$cuda_home/bin/nvcc"
    assert unrecorded["nvcc_launcher"] == ""
    assert os.path.basename(recorded_build["nvcc_launcher"]) == "cacheaudit-shim"


@needs_ninja
def test_a_variable_on_the_command_line_rebuilds_and_stays_clean(replica: Replica):
    """The control for the environment: FLASHINFER_EXTRA_CFLAGS is written onto build.ninja,
    so a new value rebuilds (ninja compares command lines), and nothing is flagged."""
    assert replica.run()[0] == 207
    env = dict(replica.env, FLASHINFER_EXTRA_CFLAGS="-DEXTRA=3")
    served, told = replica.run(env=env)
    assert (served, replica.fresh_value(env)) == (210, 210)
    assert "error" not in told.split("cacheaudit:")[-1].split("\n")[0], told
    assert not _codes(replica.scan(env)) & {"CA101", "CA103", "CA201", "CA202", "CA301"}


STEPS_DRIVER = r"""
import ctypes, json, os, sys
from flashinfer.jit import core
name, sources, includes, system, steps = json.loads(sys.argv[1])
spec = core.gen_jit_spec(name, sources, extra_include_paths=includes,
                         system_include_paths=system)
for step in steps:
    if step[0] == "build":
        spec.build()
    elif step[0] == "write":  # in place: the same inode, the mtime put back an hour
        _, path, text = step
        stamp = os.stat(path).st_mtime_ns
        with open(path, "w") as handle:
            handle.write(text)
        os.utime(path, ns=(stamp, stamp))
    elif step[0] == "relink":  # a symlink retargeted as `ln -sfn` does: a new one renamed over
        _, link, target = step
        os.symlink(target, link + ".new")
        os.replace(link + ".new", link)
print(json.dumps({"value": ctypes.CDLL(str(spec.jit_library_path)).value()}))
"""


def _hits_in_one_process(replica: Replica, change: list[Any]) -> tuple[int, list[Any], str]:
    """One process under `cacheaudit run` asking for the module five times, `change` made
    between the third and the fourth (the adapter watches the tracked files from the second
    hit on, and no longer stats them while nothing moved): the value its library gives, the
    process's FlashInfer disk-hit records, and what cacheaudit printed."""
    steps = [["build"]] * 3 + [change] + [["build"]] * 2
    argv = [sys.executable, "-m", "cacheaudit", "run", "--ledger", str(replica.ledger),
            "--fail-on", "never", "--", sys.executable, "-c", STEPS_DRIVER, json.dumps(
                [replica.name, [str(replica.source)], [str(replica.root / "inc")],
                 [str(replica.root / "sysinc")], steps])]
    done = subprocess.run(argv, env=replica.env, cwd=replica.root, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    value = json.loads(next(x for x in done.stdout.splitlines() if x.startswith("{")))["value"]
    runs = {r.run_uuid for r in replica.records() if r.extra.get("module") == replica.name}
    hits = [r for r in replica.records() if r.event == "disk-hit"
            and r.extra.get("module") == replica.name]
    latest = max(runs, key=lambda run: min(r.started_ns for r in replica.records()
                                           if r.run_uuid == run))
    return value, [r for r in hits if r.run_uuid == latest], done.stdout + done.stderr


def _header_digest(record: Any, path: Path) -> str | None:
    return next(s.digest for s in record.sources if s.path == str(path))


@needs_ninja
def test_a_header_changed_between_hits_of_one_process_is_seen(replica: Replica):
    """A serving process asks for the module again and again; the adapter stats the tracked
    files at the first two hits and then only when a watched directory saw a change. The header
    is rewritten in place after the third hit with its mtime put back (a reinstall's), so ninja
    has no work to do and the old library is served (ground truth: 207, where an empty
    workspace gives 307): the fourth hit is recorded anew with the header's new digest, the
    second and third counted on it; the run names the header (CA103)."""
    change = ["write", str(replica.header), "#define SCALE 3\n"]
    assert replica.run()[0] == 207  # the build, in a process of its own
    value, hits, told = _hits_in_one_process(replica, change)
    assert (value, replica.fresh_value()) == (207, 307)
    before, after = hits
    assert before.extra.get("hits_not_recorded") is None
    assert after.extra.get("hits_not_recorded") == 2
    assert _header_digest(before, replica.header) != _header_digest(after, replica.header)
    assert f"{replica.header}: CA103" in told, told[-3000:]


@needs_ninja
def test_hits_of_one_process_with_nothing_changed_are_one_record(replica: Replica):
    """The control: five hits of an unchanged module in one process are one record (the other
    four counted on it), and nothing is flagged."""
    assert replica.run()[0] == 207
    value, hits, told = _hits_in_one_process(replica, ["build"])
    assert value == 207
    [hit] = hits
    assert hit.extra.get("hits_not_recorded") is None  # counted, not yet written: see below
    assert "CA103" not in told and "CA101" not in told, told[-3000:]


def _aot_package(root: Path, replica: Replica, value: int) -> Path:
    """A copy of the replica package holding an AOT library of fi_scale (an older build: its
    value is `value`), as a wheel with prebuilt modules ships it (data/aot/<name>/<name>.so)."""
    copy = root / "site"
    shutil.copytree(REPLICA_PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    aot = copy / "flashinfer" / "data" / "aot" / "fi_scale" / "fi_scale.so"
    aot.parent.mkdir(parents=True)
    source = root / "aot.cpp"
    source.write_text(f'extern "C" int value() {{ return {value}; }}\n')
    subprocess.run([GXX or "g++", "-shared", "-fPIC", "-o", str(aot), str(source)], check=True)
    return copy


@needs_ninja
def test_an_aot_library_shadowing_a_jit_module_is_ca105(replica: Replica):
    """An AOT library of the module's name beside the package is what `build_and_load`
    returns, with no build and no check (core.py:577-611): the JIT module's sources compute
    207, the process runs the AOT's 999. The run, a later scan and its JSON name the AOT
    library on the module's entry."""
    assert replica.run()[0] == 207
    site = _aot_package(replica.root, replica, 999)
    env = dict(replica.env, PYTHONPATH=os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    aot = site / "flashinfer" / "data" / "aot" / "fi_scale" / "fi_scale.so"
    served, told = replica.run(env=env)
    assert (served, replica.fresh_value()) == (999, 207)  # ground truth: the JIT sources' value
    assert f"{aot}: CA105" in told, told
    status, findings = replica.scan_cli(env)
    assert status == 1
    assert [(f["subject"], f["entry"]) for f in findings if f["code"] == "CA105"] == [
        (str(aot), str(replica.directory))]
    # Control: without the AOT library nothing shadows the module.
    assert "CA105" not in {f["code"] for f in replica.scan_cli()[1]}


# ------------------------------------------------------------------------------ nvcc


def _nvcc_replica(root: Path) -> Replica:
    replica = Replica(root, ".cu")
    replica.env["LD_LIBRARY_PATH"] = str(CUDA_HOME / "lib64") if CUDA_HOME else ""
    return replica


needs_nvcc = pytest.mark.skipif(NVCC is None or CUDA_HOME is None or NINJA is None,
                                reason="needs nvcc, a CUDA toolkit with libcudart and ninja")


@needs_nvcc
@pytest.mark.nvcc
def test_nvcc_append_flags_is_served_stale_and_named(tmp_path: Path):
    """NVCC_APPEND_FLAGS is read by nvcc itself, never written onto build.ninja: ninja's
    no-op serves the library built without it. The run's disk hit (the adapter's), `pytest
    --cacheaudit` of a test served it and a later scan name the variable and its value."""
    replica = _nvcc_replica(tmp_path)
    assert replica.run()[0] == 207
    env = dict(replica.env, NVCC_APPEND_FLAGS="-DEXTRA=1")
    report = tmp_path / "run.json"
    served, _ = replica.run(env=env, report=report)
    assert (served, replica.fresh_value(env)) == (207, 208)  # stale
    ran = json.loads(report.read_text())
    assert (ran["activity"]["compiles"], ran["activity"]["disk_hits"]) == (0, 1)
    [drift] = [f for f in ran["findings"] if f["code"] == "CA202"]
    assert (drift["subject"], drift["entry"]) == ("NVCC_APPEND_FLAGS", str(replica.directory))
    assert "-DEXTRA=1" in drift["current"]
    plugin = replica.plugin(207, env)
    assert "NVCC_APPEND_FLAGS: CA202 error" in plugin, plugin[-3000:]
    findings = replica.scan(env)
    assert ("NVCC_APPEND_FLAGS", "-DEXTRA=1") in {(f.subject, f.current) for f in findings
                                                   if f.code in ("CA201", "CA202")}


@needs_nvcc
@pytest.mark.slow
@pytest.mark.nvcc
def test_cuda_home_symlink_retargeted_to_another_toolkit_is_ca301(tmp_path: Path):
    """build.ninja holds `cuda_home` as text: a CUDA_HOME symlink moved to another toolkit keeps
    the command lines, ninja's no-op serves the old toolkit's build. The shim recorded the
    real binary behind $cuda_home/bin/nvcc; the run, `pytest --cacheaudit` of a test served it
    and a later scan name the compiler."""
    assert CUDA_HOME is not None
    replica = _nvcc_replica(tmp_path)
    real = Path(os.path.realpath(CUDA_HOME))
    # Another toolkit: the same tree, with an nvcc that predefines another value (as two
    # releases' nvcc differ in what they define and generate).
    other = tmp_path / "cuda-other"
    (other / "bin").mkdir(parents=True)
    for item in real.iterdir():
        if item.name != "bin":
            os.symlink(item, other / item.name)
    for item in (real / "bin").iterdir():
        if item.name != "nvcc":
            os.symlink(item, other / "bin" / item.name)
    nvcc = other / "bin" / "nvcc"
    nvcc.write_text(f'#!/bin/sh\nexec {real}/bin/nvcc -DEXTRA=5 "$@"\n')
    nvcc.chmod(0o755)
    link = tmp_path / "cuda"
    os.symlink(real, link)
    replica.env["CUDA_HOME"] = str(link)
    assert replica.run()[0] == 207
    link.unlink()
    os.symlink(other, link)
    served, told = replica.run()
    assert (served, replica.fresh_value()) == (207, 212)  # stale
    compiler = str(link / "bin" / "nvcc")
    assert f"{compiler}: CA301" in told, told
    plugin = replica.plugin(207)
    assert f"{compiler}: CA301 error" in plugin, plugin[-3000:]
    [drift] = [f for f in replica.scan() if f.code == "CA301"]
    assert (drift.subject, drift.entry) == (compiler, str(replica.directory))
    assert str(nvcc) in (drift.current or "")


# ------------------------------------------------------------------------------ the allowlist


def test_flashinfer_nvcc_flags_pass_the_allowlist_and_fatbinary_options_stay_refused():
    """FlashInfer's default nvcc flags (flashinfer-python 0.7.4 jit/core.py:775-805, with the
    arch and include flags build.ninja adds) may reach an nvcc cacheaudit runs: `-Xfatbin=
    -compress-all` only compresses what fatbinary packs. Any other fatbinary option stays
    refused."""
    from cacheaudit.compilers import screen_options

    flags = ["--generate-dependencies-with-compile", "-MF", "m.cuda.o.d",
             "-isystem", "/site/flashinfer/data/include", "-I/site/flashinfer/data/cccl",
             "--compiler-options=-fPIC", "--expt-relaxed-constexpr", "-std=c++17",
             "--threads=1", "-use_fast_math", "-Xfatbin=-compress-all", "--compress-mode=size",
             "-DFLASHINFER_ENABLE_F16", "-DNDEBUG", "-O3",
             "-gencode=arch=compute_90a,code=sm_90a", "-c", "m.cu", "-o", "m.cuda.o"]
    for purpose in ("dependency", "compile"):
        screened = screen_options("nvcc", flags, purpose)
        assert screened.refused is None, (purpose, screened.refused)
        assert "-Xfatbin=-compress-all" in screened.args
    for other in ("-Xfatbin=-o/tmp/x", "-Xfatbin=-compress-all,-o/tmp/x",
                  "--fatbin-options=--create=/tmp/x"):
        refused = screen_options("nvcc", ["-c", "m.cu", other], "compile").refused
        assert refused is not None and refused[0] == other, other


# ------------------------------------------------------------------------------ real FlashInfer

HAVE_FLASHINFER = importlib.util.find_spec("flashinfer") is not None


needs_flashinfer = pytest.mark.skipif(
    not HAVE_FLASHINFER or CUDA_HOME is None or NINJA is None or GCC is None,
    reason="needs flashinfer (extra 'flashinfer'), a CUDA toolkit with libcudart and ninja")

FLASHINFER_DRIVER = r"""
import ctypes, json, sys
from pathlib import Path
from flashinfer.jit import core
spec = core.gen_jit_spec("fi_scale", [Path(sys.argv[1])], extra_include_paths=[Path(sys.argv[2])])
spec._timed_build()  # build_and_load without tvm_ffi's load: the module exports no FFI function
print(json.dumps({"value": ctypes.CDLL(str(spec.jit_library_path)).scale_factor(),
                  "library": str(spec.jit_library_path)}))
"""


class RealModule:
    """A one-kernel FlashInfer JIT module whose header is in an extra include dir (-I)."""

    def __init__(self, root: Path) -> None:
        assert CUDA_HOME is not None
        self.root = root
        self.ledger = root / "ledger.db"
        for sub in ("src", "inc", "stub", "ws"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.source = root / "src" / "scale.cu"
        self.header = root / "inc" / "scale.h"
        self.source.write_text(
            '#include "scale.h"\n'
            "__global__ void scale_kernel(float* x) { x[threadIdx.x] *= SCALE_FACTOR; }\n"
            'extern "C" int scale_factor() { return SCALE_FACTOR; }\n')
        self.header.write_text("#pragma once\n#define SCALE_FACTOR 2\n")
        aged(self.source, self.header)
        # No driver here: a stub libcuda.so satisfies the link edge's -lcuda.
        (root / "stub" / "cuda.c").write_text("int cuInit(unsigned flags) { return 0; }\n")
        subprocess.run([GCC or "gcc", "-shared", "-fPIC", "-o", str(root / "stub" / "libcuda.so"),
                        str(root / "stub" / "cuda.c")], check=True)
        self.env = clean_env(root)
        self.env.update({
            "PATH": os.pathsep.join([VENV_BIN, self.env.get("PATH", "")]),
            "FLASHINFER_WORKSPACE_BASE": str(root / "ws"),
            "FLASHINFER_CUDA_ARCH_LIST": "9.0",
            "CUDA_HOME": str(CUDA_HOME),
            "FLASHINFER_EXTRA_LDFLAGS": f"-L{root / 'stub'}",
            "FLASHINFER_JIT_BUILD_LOG": str(root / "builds.jsonl"),
            "LD_LIBRARY_PATH": os.pathsep.join([str(root / "stub"), str(CUDA_HOME / "lib64")]),
        })

    def run(self, *, recorded: bool = True, base: Path | None = None) -> tuple[dict[str, Any],
                                                                               str]:
        argv = [sys.executable, "-c", FLASHINFER_DRIVER, str(self.source), str(self.root / "inc")]
        if recorded:
            argv = [sys.executable, "-m", "cacheaudit", "run", "--ledger", str(self.ledger),
                    "--fail-on", "never", "--", *argv]
        env = dict(self.env)
        if base is not None:
            env["FLASHINFER_WORKSPACE_BASE"] = str(base)
        done = subprocess.run(argv, env=env, cwd=self.root, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        line = next(x for x in done.stdout.splitlines() if x.startswith("{"))
        return json.loads(line), done.stdout + done.stderr

    def scan(self) -> list[Finding]:
        with Ledger.open(str(self.ledger)) as ledger:
            return scan([str(self.root / "ws" / ".cache" / "flashinfer")], self.env,
                        ledger=ledger).findings


@needs_flashinfer
@pytest.mark.slow
@pytest.mark.nvcc
def test_flashinfer_header_reinstalled_with_an_older_mtime_is_ca103(tmp_path: Path):
    module = RealModule(tmp_path)
    first, _ = module.run()
    served_library = Path(first["library"])
    assert served_library == module_dir(tmp_path / "ws", "fi_scale") / "fi_scale.so"
    built = served_library.stat().st_mtime_ns
    module.header.write_text("#pragma once\n#define SCALE_FACTOR 3\n")
    aged(module.header, seconds=1800)
    again, told = module.run()
    assert served_library.stat().st_mtime_ns == built  # ninja: no work to do
    fresh, _ = module.run(recorded=False, base=tmp_path / "fresh")
    assert (first["value"], again["value"], fresh["value"]) == (2, 2, 3)
    assert str(module.header) in told and "CA103" in told
    [stale] = [f for f in module.scan() if f.code == "CA103"]
    assert stale.subject == str(module.header)
    assert stale.entry == str(served_library.parent)
    # FLASHINFER_JIT_BUILD_LOG has a line per build, the no-op included (core.py:111-138).
    log = [json.loads(x) for x in (tmp_path / "builds.jsonl").read_text().splitlines()]
    assert [x["name"] for x in log] == ["fi_scale"] * 3
    # The adapter saw both recorded builds of the real JitSpecNvcc.build with the module's
    # name; nvcc ran through the launcher, build.ninja's nvcc line is FlashInfer's own.
    with Ledger.open(str(module.ledger)) as ledger:
        records = list(ledger.records())
    assert [r.event for r in records if r.observer == "adapter:flashinfer"] == [
        "compile", "disk-hit"]
    assert {r.kernel for r in records if r.observer == "adapter:flashinfer"} == {"fi_scale"}
    lines = _build_lines(served_library.parent / "build.ninja")
    assert lines["nvcc"] == "$cuda_home/bin/nvcc"
    assert os.path.basename(lines["nvcc_launcher"]) == "cacheaudit-shim"
    [nvcc] = [r for r in records if r.observer.startswith("shim:") and r.compiler is not None
              and r.compiler.kind == "nvcc"]
    assert nvcc.compiler.path == str(CUDA_HOME / "bin" / "nvcc") and nvcc.graph is not None


@needs_flashinfer
@pytest.mark.slow
@pytest.mark.nvcc
def test_flashinfer_unchanged_module_is_a_clean_no_op(tmp_path: Path):
    module = RealModule(tmp_path)
    first, _ = module.run()
    again, told = module.run()
    assert first["value"] == again["value"] == 2
    assert "CA103" not in told
    assert not _codes(module.scan()) & {"CA101", "CA103", "CA104", "CA501"}


FLASHINFER_CPP_DRIVER = r"""
import ctypes, json, sys
from pathlib import Path
from flashinfer.jit import core
spec = core.gen_jit_spec("fi_offset", [Path(sys.argv[1])])
spec._timed_build()
print(json.dumps({"value": ctypes.CDLL(str(spec.jit_library_path)).offset(),
                  "library": str(spec.jit_library_path)}))
"""


@needs_flashinfer
@pytest.mark.slow
def test_flashinfer_isystem_header_of_a_cpp_object_is_ca101(tmp_path: Path):
    """The real FlashInfer: a `.cpp` object's depfile comes from `-MMD` (cpp_ext.py:312), which
    lists no `-isystem` header, and every include root FlashInfer adds is `-isystem`
    (cpp_ext.py:176-177). Here the root is `$cuda_home/include` of a CUDA_HOME of the test's
    own (bin and lib64 the toolkit's), so that no installed file is edited: the header gets a
    new mtime and ninja still has no work to do. `cacheaudit run` of the served process and a
    later scan name the header, from the shim's include graph of the object's compile."""
    module = RealModule(tmp_path)
    cuda = tmp_path / "cuda"
    (cuda / "include").mkdir(parents=True)
    for part in ("bin", "lib64"):
        (cuda / part).symlink_to(CUDA_HOME / part)
    header = cuda / "include" / "fi_offset.h"
    header.write_text("#pragma once\n#define OFFSET 7\n")
    source = tmp_path / "src" / "offset.cpp"
    source.write_text('#include <fi_offset.h>\nextern "C" int offset() { return OFFSET; }\n')
    aged(header, source)
    module.env["CUDA_HOME"] = str(cuda)

    def run(recorded: bool = True, base: Path | None = None) -> tuple[dict[str, Any], str]:
        argv = [sys.executable, "-c", FLASHINFER_CPP_DRIVER, str(source)]
        if recorded:
            argv = [sys.executable, "-m", "cacheaudit", "run", "--ledger", str(module.ledger),
                    "--fail-on", "never", "--", *argv]
        env = dict(module.env, **({"FLASHINFER_WORKSPACE_BASE": str(base)} if base else {}))
        done = subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-4000:]
        line = next(x for x in done.stdout.splitlines() if x.startswith("{"))
        return json.loads(line), done.stdout + done.stderr

    first, told_first = run()
    library = Path(first["library"])
    assert library == module_dir(tmp_path / "ws", "fi_offset") / "fi_offset.so"
    # The object's depfile has no line for the header: ninja does not track it.
    assert "-isystem $cuda_home/include" in (library.parent / "build.ninja").read_text()
    built = library.stat().st_mtime_ns
    header.write_text("#pragma once\n#define OFFSET 8\n")  # an edit: a new mtime
    served, told = run()
    assert library.stat().st_mtime_ns == built  # ninja: no work to do
    fresh, _ = run(recorded=False, base=tmp_path / "fresh")
    assert (first["value"], served["value"], fresh["value"]) == (7, 7, 8)
    assert f"{header}: CA101" not in told_first
    assert f"{header}: CA101" in told, told[-3000:]
    [stale] = [f for f in module.scan() if f.code == "CA101"]
    assert (stale.subject, stale.entry) == (str(header), str(library.parent))


def test_an_aot_library_beside_the_package_is_noted_as_what_flashinfer_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """try_load returns an AOT library before any build (core.py:577-611): the JIT module of
    the same name is never loaded, and the entry says which library wins."""
    import importlib

    from cacheaudit.runtimes.flashinfer import layout as flashinfer_layout

    package = tmp_path / "site" / "flashinfer"
    aot = package / "data" / "aot" / "m" / "m.so"
    aot.parent.mkdir(parents=True)
    (package / "__init__.py").write_text("raise ImportError('never imported by a scan')\n")
    aot.write_bytes(b"\x7fELF")
    directory = tmp_path / "ws" / ".cache" / "flashinfer" / VERSION / "cached_ops" / "m"
    directory.mkdir(parents=True)
    (directory / "build.ninja").write_text(
        "name = m\nrule link\n  command = c++ $in -o $out\n"
        f"build {directory}/m.so: link {directory}/a.o\ndefault {directory}/m.so\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    flashinfer_layout._package_locations.cache_clear()
    try:
        entry = flashinfer_layout.read_module_dir(str(directory), str(directory), StateCache())
    finally:
        flashinfer_layout._package_locations.cache_clear()
    assert entry.meta["aot_library"] == str(aot)
    assert "flashinfer" not in sys.modules or sys.modules["flashinfer"].__file__ != str(
        package / "__init__.py")


def test_a_directory_of_many_subdirectories_is_no_workspace_level(tmp_path: Path):
    """Asked whether another runtime's cache of many entries is FlashInfer's, the reader does
    not list it to its end: a level above cached_ops holds a handful of versions or arch
    lists, so one with more than LEVELS_MAX subdirectories is none, even where one of them
    holds a module; the same module under a real workspace level is found."""
    from cacheaudit.runtimes.flashinfer import layout as flashinfer_layout

    crowd = tmp_path / "crowd"
    for n in range(flashinfer_layout.LEVELS_MAX + 1):
        (crowd / f"entry{n:04d}").mkdir(parents=True)
    module = crowd / "entry0000" / "cached_ops" / "m"
    module.mkdir(parents=True)
    (module / "build.ninja").write_text("rule cc\n  command = c++ $in -o $out\n")
    reader = flashinfer_layout.LAYOUT
    assert not reader.is_root(str(crowd))
    shutil.rmtree(crowd / f"entry{flashinfer_layout.LEVELS_MAX:04d}")
    assert reader.is_root(str(crowd)), "a level of LEVELS_MAX subdirectories is still one"
