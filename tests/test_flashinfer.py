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


# ------------------------------------------------------------------------------ the replica

# Runs in a new process, as a job would: writes the module's build.ninja when its text changed
# (FlashInfer's write_if_different), runs ninja in the module's directory, loads the library
# with ctypes and prints what `value()` returns.
REPLICA_DRIVER = r"""
import ctypes, json, os, subprocess, sys
spec = json.loads(sys.argv[1])
os.makedirs(spec["dir"], exist_ok=True)
path = os.path.join(spec["dir"], "build.ninja")
old = open(path).read() if os.path.exists(path) else None
if old != spec["text"]:
    with open(path, "w") as handle:
        handle.write(spec["text"])
subprocess.run(["ninja", "-v", "-C", spec["dir"], "-f", path], check=True,
               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
print(json.dumps({"value": ctypes.CDLL(spec["library"]).value()}))
"""


def module_dir(base: Path, name: str) -> Path:
    """cached_ops/<name> of the workspace under FLASHINFER_WORKSPACE_BASE=`base`."""
    return base / ".cache" / "flashinfer" / VERSION / ARCHS / "cached_ops" / name


def write_module(base: Path, name: str, sources: list[Path], include_dirs: list[Path],
                 system_dirs: list[Path]) -> dict[str, str]:
    """The build.ninja FlashInfer writes for a module of C++ sources (the variables, the
    `compile` rule with -MMD, the `link` rule, one object per source named
    <parent>_<stem>.o, the library as the default target, all outputs absolute), and where it
    goes. `cxx` is `c++`, resolved on PATH by ninja's shell, as when $CXX is unset."""
    directory = module_dir(base, name)
    common = [f"-I{d}" for d in include_dirs] + [f"-isystem {d}" for d in system_dirs]
    lines = [
        "ninja_required_version = 1.3",
        f"name = {name}",
        "cuda_home = /usr/local/cuda",
        "cxx = c++",
        "nvcc = $cuda_home/bin/nvcc",
        "cxx_launcher = ",
        "nvcc_launcher = ",
        "",
        "common_cflags = " + " $\n    ".join(common),
        "cflags = $common_cflags $\n    -fPIC $\n    -std=c++17 $\n    -O2",
        "post_cflags =",
        "ldflags = -shared",
        "",
        "rule compile",
        "  command = $cxx_launcher $cxx -MMD -MF $out.d $cflags -c $in -o $out $post_cflags",
        "  depfile = $out.d",
        "  deps = gcc",
        "",
        "rule link",
        "  command = $cxx $in $ldflags -o $out",
        "",
    ]
    objects = []
    for source in sources:
        obj = directory / f"{source.parent.name}_{source.stem}.o"
        objects.append(str(obj))
        lines.append(f"build {obj}: compile {source}")
    library = directory / f"{name}.so"
    lines += ["", f"build {library}: link " + " ".join(objects), f"default {library}", ""]
    return {"dir": str(directory), "text": "\n".join(lines), "library": str(library)}


class Replica:
    """A source including one `-I` header and one `-isystem` header, a workspace, a ledger."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.base = root / "ws"
        self.ledger = root / "ledger.db"
        for sub in ("src", "inc", "sysinc", "ws"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.source = root / "src" / "scale.cpp"
        self.header = root / "inc" / "scale.h"
        self.system_header = root / "sysinc" / "offset.h"
        self.source.write_text('#include "scale.h"\n#include <offset.h>\n'
                               'extern "C" int value() { return SCALE * 100 + OFFSET; }\n')
        self.header.write_text("#define SCALE 2\n")
        self.system_header.write_text("#define OFFSET 7\n")
        aged(self.source, self.header, self.system_header)
        self.env = clean_env(root)
        self.env["PATH"] = os.pathsep.join([VENV_BIN, self.env.get("PATH", "")])
        self.env["FLASHINFER_WORKSPACE_BASE"] = str(self.base)

    def spec(self, base: Path | None = None) -> dict[str, str]:
        return write_module(base or self.base, "fi_scale", [self.source],
                            [self.root / "inc"], [self.root / "sysinc"])

    def run(self, *, recorded: bool = True) -> tuple[int, str]:
        """One process asking for the module (under `cacheaudit run` when `recorded`): the
        value its library computes and what cacheaudit printed."""
        argv = [sys.executable, "-c", REPLICA_DRIVER, json.dumps(self.spec())]
        if recorded:
            argv = [sys.executable, "-m", "cacheaudit", "run", "--ledger", str(self.ledger),
                    "--fail-on", "never", "--", *argv]
        done = subprocess.run(argv, env=self.env, cwd=self.root, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        line = next(x for x in done.stdout.splitlines() if x.startswith("{"))
        return json.loads(line)["value"], done.stdout + done.stderr

    def fresh_value(self) -> int:
        """Ground truth: the same module built into an empty workspace."""
        base = self.root / "fresh"
        shutil.rmtree(base, ignore_errors=True)
        spec = write_module(base, "fi_scale", [self.source], [self.root / "inc"],
                            [self.root / "sysinc"])
        done = subprocess.run([sys.executable, "-c", REPLICA_DRIVER, json.dumps(spec)],
                              env=self.env, cwd=self.root, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])["value"]  # type: ignore[no-any-return]

    def scan(self) -> list[Finding]:
        with Ledger.open(str(self.ledger)) as ledger:
            return scan([str(self.base / ".cache" / "flashinfer")], self.env,
                        ledger=ledger).findings


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
    (jit_dir / "tmp").mkdir()
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
    the old library, and the scan names the header."""
    first, _ = replica.run()
    replica.header.write_text("#define SCALE 3\n")
    aged(replica.header, seconds=1800)  # newer bytes, still older than the object
    served, told = replica.run()
    fresh = replica.fresh_value()
    assert (first, served, fresh) == (207, 207, 307)  # stale: served != fresh
    assert str(replica.header) in told and "CA103" in told
    [stale] = [f for f in replica.scan() if f.code == "CA103"]
    assert stale.subject == str(replica.header)
    assert stale.entry == str(module_dir(replica.base, "fi_scale"))


@needs_ninja
def test_replica_isystem_header_of_a_cpp_object_is_ca101(replica: Replica):
    """A `.cpp` object's depfile comes from -MMD, which lists no -isystem header (and every
    include root FlashInfer adds itself is -isystem): an edit with a new mtime goes unseen too.
    The shim's include graph has the header; the scan names it."""
    first, _ = replica.run()
    replica.system_header.write_text("#define OFFSET 8\n")
    served, told = replica.run()
    assert (first, served, replica.fresh_value()) == (207, 207, 208)  # stale
    assert str(replica.system_header) in told and "CA101" in told
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


# ------------------------------------------------------------------------------ real FlashInfer

HAVE_FLASHINFER = importlib.util.find_spec("flashinfer") is not None


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
