"""The audit of a scope, run as a user runs it: `cacheaudit run --fail-on error -- python job.py`
fails when the job was served a stale entry and passes on the same job with nothing changed,
for each runtime that can run here; the counts agree between the summary, the JSON and the
records; a job's own environment is the evidence (CA202); the opens observer leaves nothing
behind.

Ground truth in every scenario: the same job, unrecorded, into an empty cache (a fresh compile);
a served binary that differs from it is a stale hit, one that equals it is not.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from cacheaudit.ledger import Ledger, new_record_id
from cacheaudit.model import CompileRecord
from cacheaudit.opens import OpenObserver

from support import GXX, NVCC, clean_env, deepgemm_library, needs_gxx, needs_nvcc

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"(\d+) compiles?, (\d+) disk hits?(?: \((\d+) seen[^)]*\))?, "
                     r"(\d+) memory hits?, (\d+) compiler invocations? through the shim; "
                     r"(\d+) entr(?:y|ies) judged")


def _digest(path: str) -> str:
    return xxhash.xxh3_128_hexdigest(Path(path).read_bytes())


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = clean_env(tmp_path)
    env = {k: v for k, v in env.items()
           if not k.startswith(("DG_", "DJ_", "EP_")) and k != "TORCH_EXTENSIONS_DIR"}
    # The reference runtimes' g++ mode runs JIT_NVCC_COMPILER as its C++ compiler; a session
    # points the setting at a shim that hands over to exactly this g++.
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               DG_JIT_NVCC_COMPILER=GXX or "g++",
               PYTHONPATH=os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]), **extra)
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


class Job:
    """A job script and the `cacheaudit run` around it."""

    def __init__(self, tmp_path: Path, script: str, env: dict[str, str]) -> None:
        self.tmp = tmp_path
        self.path = tmp_path / "job.py"
        self.path.write_text(textwrap.dedent(script))
        self.env = env
        self.ledger = tmp_path / "ledger.db"
        self.runs = 0

    def run(self, **extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any],
                                         dict[str, Any]]:
        """(the run, the job's answer, the --report-json)."""
        self.runs += 1
        report = self.tmp / f"report-{self.runs}.json"
        done = subprocess.run(
            [sys.executable, "-m", "cacheaudit", "run", "--ledger", str(self.ledger),
             "--fail-on", "error", "--report-json", str(report), "--",
             sys.executable, str(self.path)],
            env={**self.env, **extra}, cwd=self.tmp, capture_output=True, text=True,
            timeout=600)
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        assert lines, done.stdout + done.stderr
        answer = json.loads(lines[-1])
        return done, answer, json.loads(report.read_text())

    def fresh(self, cache_variable: str, **extra: str) -> dict[str, Any]:
        """The ground truth: the job unrecorded, into an empty cache."""
        empty = self.tmp / f"fresh-{self.runs}-{time.time_ns()}"
        done = subprocess.run([sys.executable, str(self.path)],
                              env={**self.env, cache_variable: str(empty),
                                   "CACHEAUDIT_DISABLE": "1", **extra},
                              cwd=self.tmp, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        answer: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
        assert answer["event"] == "compile"
        return answer

    def records(self) -> list[Any]:
        with Ledger.open(str(self.ledger)) as ledger:
            return ledger.records()


def _summary(stderr: str) -> tuple[int, ...]:
    match = SUMMARY.search(" ".join(stderr.split()))  # rich wraps the line on a narrow stderr
    assert match is not None, stderr
    compiles, disk, unrecorded, memory, invocations, judged = match.groups()
    return (int(compiles), int(disk), int(unrecorded or 0), int(memory), int(invocations),
            int(judged))


def _agree(done: subprocess.CompletedProcess[str], report: dict[str, Any]) -> dict[str, int]:
    """The human summary and the JSON say the same counts."""
    counts: dict[str, int] = report["activity"]
    assert _summary(done.stderr) == (
        counts["compiles"], counts["disk_hits"], counts["disk_hits_unrecorded"],
        counts["memory_hits"], counts["invocations"], counts["entries_judged"]), done.stderr
    assert report["events"] == {"compile": counts["compiles"], "disk-hit": counts["disk_hits"],
                                "memory-hit": counts["memory_hits"]}
    assert report["summary"] in " ".join(done.stderr.split())
    return counts


def _stale(report: dict[str, Any], code: str, subject: str) -> dict[str, Any]:
    found = [f for f in report["findings"] if f["code"] == code and f["subject"] == subject]
    assert found, [(f["code"], f["subject"]) for f in report["findings"]]
    return found[0]


def _assert_seen_stale_disk_hit(job: Job, first: dict[str, Any], edited: Path) -> None:
    """After `edited` (in no key) changed: the job's next run is served `first`'s entry from
    disk, a fresh compile differs (the ground truth), and `cacheaudit run --fail-on error`
    fails with a CA101 naming the file and the entry, seen (not "may have been served")."""
    stale, served, report = job.run()
    assert served["event"] == "disk-hit" and served["path"] == first["path"]
    assert served["digest"] != job.fresh("DG_JIT_CACHE_DIR")["digest"], \
        "a fresh compile equals the served binary: the scenario is not stale"
    assert stale.returncode == 1, stale.stderr
    finding = _stale(report, "CA101", str(edited))
    assert finding["entry"] == first["path"]
    assert "may have been served" not in finding["message"]  # seen, not inferred
    assert _agree(stale, report)["disk_hits"] == 1


def _without_findings(report: dict[str, Any]) -> dict[str, Any]:
    """A report for an assertion's message: what it counted and scanned, not every finding."""
    return {k: v for k, v in report.items() if k != "findings"}


def _errors(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["code"], f["subject"]) for f in report["findings"] if f["severity"] == "error"]


# ------------------------------------------------------------------------------ DeepGEMM 2.x

DEEPGEMM_JOB = """
import json, os, sys
from fixtures.minijit import DeepGemmRuntime
import xxhash
library = sys.argv[1] if len(sys.argv) > 1 else os.environ["JOB_LIBRARY"]
runtime = DeepGemmRuntime(library, backend="gxx")
kernel = runtime.build("sm90_gemm", "#include <deep_gemm/common.cuh>\\n"
                       "extern \\"C\\" int value() { return DG_VALUE + TILE_VALUE; }\\n")
print(json.dumps({"event": kernel.event, "path": kernel.path, "binary": kernel.binary,
                  "digest": xxhash.xxh3_128_hexdigest(open(kernel.binary, "rb").read())}))
"""


@pytest.fixture
def deepgemm(tmp_path: Path) -> Job:
    library = deepgemm_library(tmp_path)
    env = _env(tmp_path, JOB_LIBRARY=str(library), DG_JIT_CACHE_DIR=str(tmp_path / "dg"))
    return Job(tmp_path, DEEPGEMM_JOB, env)


@needs_gxx
def test_deepgemm_stale_hit_fails_the_run_and_nothing_changed_passes(deepgemm: Job,
                                                                     tmp_path: Path):
    """DeepGEMM's C++ JIT leaves no marker and no record on a disk hit: the run sees the hit by
    the binary's open, and judges the entry."""
    tile = tmp_path / "deep_gemm" / "include" / "cute" / "tile.hpp"
    built, first, _ = deepgemm.run()
    assert built.returncode == 0 and first["event"] == "compile", built.stderr
    same, hit, report = deepgemm.run()
    assert hit["event"] == "disk-hit" and hit["digest"] == deepgemm.fresh("DG_JIT_CACHE_DIR")[
        "digest"]
    assert same.returncode == 0, same.stderr
    assert _errors(report) == []
    counts = _agree(same, report)
    assert (counts["compiles"], counts["disk_hits"], counts["disk_hits_unrecorded"]) == (0, 1, 1)

    tile.write_text("#pragma once\n#define TILE_VALUE 20\n")
    _assert_seen_stale_disk_hit(deepgemm, first, tile)


@needs_gxx
def test_unobservable_opens_audit_the_roots_and_say_may_have_been_served(deepgemm: Job,
                                                                         tmp_path: Path):
    """With no inotify watch to spare (CACHEAUDIT_OPEN_WATCHES=0 stands for a watch limit
    reached), a stale entry in a root the run used is still reported, as possibly served."""
    tile = tmp_path / "deep_gemm" / "include" / "cute" / "tile.hpp"
    assert deepgemm.run()[0].returncode == 0
    same, _hit, report = deepgemm.run(CACHEAUDIT_OPEN_WATCHES="0")
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    tile.write_text("#pragma once\n#define TILE_VALUE 20\n")
    stale, served, report = deepgemm.run(CACHEAUDIT_OPEN_WATCHES="0")
    assert served["digest"] != deepgemm.fresh("DG_JIT_CACHE_DIR")["digest"]
    assert stale.returncode == 1, stale.stderr
    finding = _stale(report, "CA101", str(tile))
    assert "may have been served" in finding["message"]
    assert "inotify watches" in finding["how"]
    assert report["possibly_served"] == {served["path"]: report["possibly_served"][
        served["path"]]}
    assert _agree(stale, report)["possibly_served"] == 1, (_without_findings(report),
                                                           stale.stderr)


# ------------------------------------------------------------------------------ DeepJIT

DEEPJIT_JOB = """
import json, os, sys
from fixtures.minijit import Config, Runtime
import xxhash
tree = os.environ["JOB_TREE"]
runtime = Runtime(Config(tree, "DG", include_dirs=[os.path.join(tree, "inc"),
                                                   os.path.join(tree, "third")],
                         include_prefixes=["mylib/"]), backend=os.environ["JOB_BACKEND"])
if os.environ.get("JOB_APPEND"):
    os.environ["NVCC_APPEND_FLAGS"] = os.environ["JOB_APPEND"]
if os.environ.get("JOB_LISTENER"):
    from cacheaudit.runtimes.deepjit import minijit
    minijit.install(runtime)
kernel = runtime.compile("gemm", "#include <mylib/api.cuh>\\n#ifndef EXTRA\\n#define EXTRA 0\\n"
                         "#endif\\n#ifdef __CUDACC__\\n__global__\\n#endif\\n"
                         "void gemm(int* out) { out[0] = API + TILE + EXTRA; }\\n")
print(json.dumps({"event": kernel.event, "path": kernel.path,
                  "digest": xxhash.xxh3_128_hexdigest(open(kernel.binary, "rb").read())}))
"""


def _deepjit(tmp_path: Path, backend: str) -> Job:
    tree = tmp_path / "tree"
    (tree / "inc" / "mylib").mkdir(parents=True)
    (tree / "third" / "cutlite").mkdir(parents=True)
    (tree / "inc" / "mylib" / "api.cuh").write_text(
        "#pragma once\n#include <cutlite/tile.h>\n#define API 1\n")
    tile = tree / "third" / "cutlite" / "tile.h"
    tile.write_text("#pragma once\n#define TILE 10\n")
    stamp = time.time_ns() - 5_000_000_000
    os.utime(tile, ns=(stamp, stamp))
    env = _env(tmp_path, JOB_TREE=str(tree), JOB_BACKEND=backend,
               DG_JIT_CACHE_DIR=str(tmp_path / "dj"))
    return Job(tmp_path, DEEPJIT_JOB, env)


@needs_gxx
def test_deepjit_stale_hit_fails_the_run_and_the_counts_agree(tmp_path: Path):
    job = _deepjit(tmp_path, "gxx")
    tile = tmp_path / "tree" / "third" / "cutlite" / "tile.h"
    built, first, report = job.run()
    assert built.returncode == 0 and first["event"] == "compile", built.stderr
    counts = _agree(built, report)
    shim = [r for r in job.records() if r.observer.startswith("shim:")]
    # One g++ build of the entry, through the shim: a compile and an invocation.
    assert (counts["compiles"], counts["invocations"], counts["disk_hits"]) == (1, len(shim), 0)
    assert len(shim) == 1 and counts["entries_judged"] == 1, (_without_findings(report),
                                                              built.stderr)

    same, hit, report = job.run()
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    assert hit["digest"] == job.fresh("DG_JIT_CACHE_DIR")["digest"]
    counts = _agree(same, report)
    assert (counts["compiles"], counts["invocations"], counts["disk_hits"]) == (0, 0, 1)

    tile.write_text("#pragma once\n#define TILE 20\n")
    stale, served, report = job.run()
    assert served["event"] == "disk-hit"
    assert served["digest"] != job.fresh("DG_JIT_CACHE_DIR")["digest"]
    assert stale.returncode == 1, stale.stderr
    assert _stale(report, "CA101", str(tile))["entry"] == first["path"]
    # The CA101 says the runtime hit the entry: the summary counts that hit.
    assert _agree(stale, report)["disk_hits"] == 1


@needs_nvcc
def test_a_job_that_sets_nvcc_append_flags_itself_gets_no_ca202(tmp_path: Path):
    """The environment the compile and the hit saw is the evidence, not the controller's."""
    job = _deepjit(tmp_path, "nvcc")
    job.env["DG_JIT_NVCC_COMPILER"] = str(NVCC)
    built, first, report = job.run(JOB_APPEND="-DEXTRA=1")
    assert built.returncode == 0 and first["event"] == "compile", built.stderr
    assert [f for f in report["findings"] if f["code"] == "CA202"] == []
    # The hit, seen with its environment by the in-process listener, under the same value.
    same, hit, report = job.run(JOB_APPEND="-DEXTRA=1", JOB_LISTENER="1")
    assert hit["event"] == "disk-hit"
    assert hit["digest"] == job.fresh("DG_JIT_CACHE_DIR", JOB_APPEND="-DEXTRA=1")["digest"]
    assert same.returncode == 0, same.stderr
    assert [f for f in report["findings"] if f["code"] == "CA202"] == []
    # The same hit without the flag is stale (a fresh compile differs), and found so.
    drift, served, report = job.run(JOB_LISTENER="1")
    assert served["event"] == "disk-hit"
    assert served["digest"] != job.fresh("DG_JIT_CACHE_DIR")["digest"]
    assert drift.returncode == 1
    finding = _stale(report, "CA202", "NVCC_APPEND_FLAGS")
    assert (finding["recorded"], finding["current"]) == ("-DEXTRA=1", "(unset)")
    assert "disk-hit of the entry" in finding["how"]


# ------------------------------------------------------------------------------ torch-ext


TORCH_JOB = """
import ctypes, json, os
import xxhash
from torch.utils.cpp_extension import load
root = os.environ["JOB_ROOT"]
path = load(name="kx", sources=[os.path.join(root, "src", "k.cpp")],
            extra_cflags=["-isystem", os.path.join(root, "sysinc")], is_python_module=False)
print(json.dumps({"event": "compile" if os.environ.get("JOB_FRESH") else "load", "path": path,
                  "value": ctypes.CDLL(path).value(),
                  "digest": xxhash.xxh3_128_hexdigest(open(path, "rb").read())}))
"""


@pytest.mark.slow
def test_torch_ext_stale_hit_fails_the_run(tmp_path: Path):
    pytest.importorskip("torch", reason="torch is not installed")
    for sub in ("src", "sysinc"):
        (tmp_path / sub).mkdir()
    (tmp_path / "src" / "k.cpp").write_text(
        '#include <sysconst.h>\nextern "C" int value() { return SYS_CONST; }\n')
    sysconst = tmp_path / "sysinc" / "sysconst.h"
    sysconst.write_text("#define SYS_CONST 100\n")
    env = _env(tmp_path, JOB_ROOT=str(tmp_path), TORCH_EXTENSIONS_DIR=str(tmp_path / "ext"),
               JOB_FRESH="1")
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    job = Job(tmp_path, TORCH_JOB, env)
    built, first, _ = job.run(JOB_FRESH="")
    assert built.returncode == 0 and first["value"] == 100, built.stderr
    same, again, report = job.run(JOB_FRESH="")
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    assert again["digest"] == first["digest"]
    _agree(same, report)
    sysconst.write_text("#define SYS_CONST 200\n")
    stale, served, report = job.run(JOB_FRESH="")
    assert served["value"] == 100, "torch rebuilt: the scenario no longer holds"
    fresh = job.fresh("TORCH_EXTENSIONS_DIR")
    assert fresh["value"] == 200 and fresh["digest"] != served["digest"]
    assert stale.returncode == 1, stale.stderr
    assert _stale(report, "CA101", str(sysconst))["entry"] == os.path.dirname(first["path"])
    _agree(stale, report)


# ------------------------------------------------------------------------------ the observer


def test_the_opens_observer_sees_opens_and_leaves_no_thread_or_descriptor(tmp_path: Path):
    entry, other = tmp_path / "entry", tmp_path / "other"
    entry.mkdir()
    other.mkdir()
    (entry / "kernel.cubin").write_bytes(b"\x7fELF")
    threads, fds = threading.active_count(), len(os.listdir("/proc/self/fd"))
    observer = OpenObserver([str(entry), str(other), str(tmp_path / "gone")]).start()
    (entry / "kernel.cubin").read_bytes()
    with observer.ignoring():
        (entry / "kernel.cubin").read_bytes()  # cacheaudit's own read: not a hit
        (other / "meta.json").write_text("{}")
    seen = observer.stop()
    assert seen.unwatched == {}
    assert set(seen.opens) == {str(entry / "kernel.cubin")}
    assert seen.opens[str(entry / "kernel.cubin")].first_ns >= seen.started_ns
    assert observer.stop() == seen or observer.stop().opens == seen.opens
    assert threading.active_count() == threads
    assert len(os.listdir("/proc/self/fd")) == fds
    # Past its watch budget an observer says which directories it could not watch, and why.
    limited = OpenObserver([str(entry), str(other)], budget=1).start().stop()
    assert list(limited.unwatched) == [str(other)]
    assert "inotify watches" in limited.unwatched[str(other)]


# ------------------------------------------------------------------------------ cuda.core

CUDA_CORE_JOB = """
import json, os
import xxhash
from cuda.core import Program, ProgramOptions
from cuda.core.utils import FileStreamProgramCache
root = os.environ["JOB_CACHE"]
event = "disk-hit" if os.path.isdir(root) and any(os.scandir(root)) else "compile"
options = ProgramOptions(arch="sm_90", name="kernel.cu")
source = '#include "local.h"\\nextern "C" __global__ void k(int* o) { o[0] = LOCAL_VALUE; }\\n'
code = bytes(Program(source, "c++", options=options).compile(
    "cubin", cache=FileStreamProgramCache(root)).code)
print(json.dumps({"event": event, "digest": xxhash.xxh3_128_hexdigest(code)}))
"""


def test_cuda_core_stale_hit_fails_the_run(tmp_path: Path):
    """cuda.core's guard misses a header beside a bare program name (read from the working
    directory): an edit of it is served the old cubin."""
    pytest.importorskip("cuda.core", reason="cuda-python's cuda.core is not installed")
    local = tmp_path / "local.h"
    local.write_text("#define LOCAL_VALUE 3\n")
    stamp = time.time_ns() - 5_000_000_000
    os.utime(local, ns=(stamp, stamp))
    job = Job(tmp_path, CUDA_CORE_JOB, _env(tmp_path, JOB_CACHE=str(tmp_path / "pc")))
    built, first, _ = job.run()
    if "cuda" in built.stderr.lower() and built.returncode != 0:
        pytest.skip(f"cuda.core cannot compile here: {built.stderr[-300:]}")
    assert built.returncode == 0 and first["event"] == "compile", built.stderr
    same, hit, report = job.run()
    assert hit["event"] == "disk-hit" and hit["digest"] == job.fresh("JOB_CACHE")["digest"]
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    _agree(same, report)
    local.write_text("#define LOCAL_VALUE 4  /* edited */\n")
    stale, served, report = job.run()
    assert served["event"] == "disk-hit"
    assert served["digest"] != job.fresh("JOB_CACHE")["digest"]
    assert stale.returncode == 1, stale.stderr
    _stale(report, "CA101", str(local))
    _agree(stale, report)


# ------------------------------------------------------------ DeepGEMM's Python JIT

REPLICA = ROOT / "fixtures" / "deepgemm_python"

DEEPGEMM_PYTHON_JOB = """
import json, os
import xxhash
import deep_gemm
from deep_gemm.jit.compiler import get_cache_dir
cache = get_cache_dir()
before = set(os.listdir(cache)) if os.path.isdir(cache) else set()
runtime = deep_gemm.fill(3)
served = runtime.load()
print(json.dumps({"event": "disk-hit" if os.path.basename(runtime.path) in before
                  else "compile", "path": runtime.path,
                  "digest": xxhash.xxh3_128_hexdigest(served)}))
"""


UNHASHED = {"cute": "cute/tile.hpp", "subdirectory": "deep_gemm/impl/tile.cuh"}
"""Headers outside the top-level `include/deep_gemm/*.cuh` that `get_deep_gemm_version` hashes:
a CuTe-like one beside the package's headers, and a `.cuh` one directory down."""


def _deepgemm_python(tmp_path: Path, release: str, where: str = "cute") -> tuple[Job, Path]:
    """The replica copied (its headers are edited), its top-level `utils.cuh` including an
    unhashed header (`UNHASHED[where]`), which is returned: it is in no key."""
    package = tmp_path / "site"
    shutil.copytree(REPLICA, package, ignore=shutil.ignore_patterns("__pycache__"))
    include = package / "deep_gemm" / "include"
    tile = include / UNHASHED[where]
    tile.parent.mkdir(parents=True, exist_ok=True)
    tile.write_text("#pragma once\nnamespace cute { constexpr int kTile = 10; }\n")
    utils = include / "deep_gemm" / "utils.cuh"
    utils.write_text(utils.read_text().replace(
        "constexpr int kBias = 1;", "constexpr int kBias = 1 + cute::kTile;").replace(
        "#pragma once\n", f"#pragma once\n#include <{UNHASHED[where]}>\n"))
    stamp = time.time_ns() - 5_000_000_000
    for header in (tile, utils):
        os.utime(header, ns=(stamp, stamp))
    env = _env(tmp_path, DG_JIT_CACHE_DIR=str(tmp_path / "dg"), DG_CACHE_DIR=str(tmp_path / "dg"),
               DG_REPLICA_RELEASE=release)
    del env["DG_JIT_NVCC_COMPILER"]  # the runtime's own lookup: $CUDA_HOME/bin/nvcc
    env["PYTHONPATH"] = os.pathsep.join([str(package), env["PYTHONPATH"]])
    return Job(tmp_path, DEEPGEMM_PYTHON_JOB, env), tile


@needs_nvcc
@pytest.mark.parametrize("where", sorted(UNHASHED))
def test_deepgemm_python_jit_stale_hit_fails_the_run_and_nothing_changed_passes(
        tmp_path: Path, where: str):
    """8dfa329 with nvcc: an edit of a header outside the hashed top level is served the old
    cubin (the key, the path and `is_path_valid` say hit); the adapter sees the hit in-process."""
    job, tile = _deepgemm_python(tmp_path, "8dfa329", where)
    built, first, report = job.run()
    assert built.returncode == 0 and first["event"] == "compile", built.stderr
    counts = _agree(built, report)
    assert (counts["compiles"], counts["disk_hits"]) == (1, 0)

    same, hit, report = job.run()
    assert hit["event"] == "disk-hit" and hit["path"] == first["path"]
    assert hit["digest"] == job.fresh("DG_JIT_CACHE_DIR")["digest"]
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    counts = _agree(same, report)
    assert (counts["compiles"], counts["disk_hits"], counts["disk_hits_unrecorded"]) == (0, 1, 0)

    tile.write_text("#pragma once\nnamespace cute { constexpr int kTile = 20; }\n")
    _assert_seen_stale_disk_hit(job, first, tile)


def _device_code(entry: str) -> str:
    """The digest of the `.nv_fatbin` section of an entry's `kernel.so` (ELF64, little-endian)."""
    data = (Path(entry) / "kernel.so").read_bytes()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(index: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + index * shentsize)
        return name, offset, size

    _, names, _ = section(shstrndx)
    for index in range(shnum):
        name, offset, size = section(index)
        if data[names + name:data.index(b"\0", names + name)] == b".nv_fatbin":
            return xxhash.xxh3_128_hexdigest(data[offset:offset + size])
    raise AssertionError(f"{entry}/kernel.so has no .nv_fatbin section")


@needs_nvcc
@pytest.mark.slow
def test_deepgemm_first_release_counts_nvcc_s_host_steps_as_invocations_not_compiles(
        tmp_path: Path):
    """a6d97a1 links `kernel.so`: nvcc runs its host gcc/g++ from PATH, the masquerade's, so the
    shim records nvcc's host compile and link steps. They are invocations of one build, which
    the adapter recorded: one compile. The stale hit after a CuTe-like edit fails the run."""
    job, tile = _deepgemm_python(tmp_path, "a6d97a1")
    built, first, report = job.run()
    assert built.returncode == 0 and first["event"] == "compile", built.stderr
    shim = [r for r in job.records() if r.observer.startswith("shim:")]
    assert shim, "nvcc's host steps did not go through the shim: the scenario does not hold"
    counts = _agree(built, report)
    assert (counts["compiles"], counts["invocations"]) == (1, len(shim)), (
        counts, [(r.compiler.invoked if r.compiler else None, [s.path for s in r.sources])
                 for r in shim])
    assert _errors(report) == []

    same, hit, report = job.run()
    assert hit["event"] == "disk-hit" and hit["path"] == first["path"]
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    counts = _agree(same, report)
    assert (counts["compiles"], counts["invocations"], counts["disk_hits"]) == (0, 0, 1)

    # nvcc's host objects embed its temporary files' names, so the ground truth is the device
    # code the shared object carries (its `.nv_fatbin`), which a fresh build reproduces.
    assert _device_code(hit["path"]) == _device_code(job.fresh("DG_CACHE_DIR")["path"])

    tile.write_text("#pragma once\nnamespace cute { constexpr int kTile = 20; }\n")
    stale, served, report = job.run()
    assert served["event"] == "disk-hit" and served["digest"] == hit["digest"]
    assert _device_code(served["path"]) != _device_code(job.fresh("DG_CACHE_DIR")["path"]), \
        "a fresh build carries the served device code: the scenario is not stale"
    assert stale.returncode == 1, stale.stderr
    assert _stale(report, "CA101", str(tile))["entry"] == first["path"]
    assert _agree(stale, report)["disk_hits"] == 1


# ------------------------------------------------------------------------------ Triton

TRITON_JOB = """
import json, os
import xxhash
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.cache import _base32


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


cache = os.environ["TRITON_CACHE_DIR"]
before = set(os.listdir(cache)) if os.path.isdir(cache) else set()
signature = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
             "BLOCK": "constexpr"}
kernel = triton.compile(ASTSource(fn=add_kernel, signature=signature,
                                  constexprs={"BLOCK": 1024}),
                        target=GPUTarget("cuda", 90, 32))
entry = _base32(kernel.hash)
print(json.dumps({"event": "disk-hit" if entry in before else "compile",
                  "path": os.path.join(cache, entry),
                  "digest": xxhash.xxh3_128_hexdigest(kernel.asm["cubin"])}))
"""

_PTXAS = """#!/bin/sh
# A ptxas of Triton's own version text: the real one, with the options below added.
exec "{real}" {added} "$@"
"""


@pytest.fixture
def triton_job(tmp_path: Path) -> tuple[Job, Path]:
    """A Triton job compiling for sm_90 with an explicit GPUTarget (no GPU needed), whose ptxas
    (`TRITON_PTXAS_BLACKWELL_PATH`, what Triton runs from sm_90) is a wrapper of the bundled
    one: same `--version` text, so Triton's key cannot tell two of them apart."""
    triton = pytest.importorskip("triton", reason="triton is not installed")
    real = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas-blackwell"
    ptxas = tmp_path / "bin" / "ptxas-blackwell"
    ptxas.parent.mkdir()
    ptxas.write_text(_PTXAS.format(real=real, added=""))
    ptxas.chmod(0o755)
    stamp = time.time_ns() - 5_000_000_000
    os.utime(ptxas, ns=(stamp, stamp))
    env = _env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / "triton"),
               TRITON_PTXAS_BLACKWELL_PATH=str(ptxas), TRITON_DEFAULT_FP_FUSION="1")
    return Job(tmp_path, TRITON_JOB, env), ptxas


def test_triton_stale_disk_hit_fails_the_run_and_nothing_changed_passes(
        triton_job: tuple[Job, Path]):
    """Triton keys ptxas by its `--version` text only: a ptxas that now compiles differently
    (here: the same wrapper, now adding `-O0`) keeps serving the entry the old one built."""
    job, ptxas = triton_job
    built, first, report = job.run()
    assert built.returncode == 0 and first["event"] == "compile", built.stderr
    counts = _agree(built, report)
    assert (counts["compiles"], counts["disk_hits"]) == (1, 0)

    same, hit, report = job.run()
    assert hit["event"] == "disk-hit" and hit["path"] == first["path"]
    assert hit["digest"] == job.fresh("TRITON_CACHE_DIR")["digest"]
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    counts = _agree(same, report)
    assert (counts["compiles"], counts["disk_hits"]) == (0, 1)

    real = ptxas.read_text().split('"')[1]
    ptxas.write_text(_PTXAS.format(real=real, added="-O0"))
    stale, served, report = job.run()
    assert served["event"] == "disk-hit" and served["path"] == first["path"]
    assert served["digest"] != job.fresh("TRITON_CACHE_DIR")["digest"], \
        "a fresh compile equals the served cubin: the scenario is not stale"
    assert stale.returncode == 1, (stale.stderr, _errors(report))
    finding = _stale(report, "CA301", str(ptxas))
    assert finding["entry"] == first["path"]
    assert _agree(stale, report)["disk_hits"] == 1


TRITON_MEMORY_JOB = """
import json, os
import torch
import xxhash
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.backends.driver import DriverBase
from triton.runtime.driver import driver


class CompileOnlyDriver(DriverBase):
    # What JITFunction.run asks of a driver before it launches (warmup never launches).
    @classmethod
    def is_active(cls): return True
    def map_python_to_cpp_type(self, ty): raise NotImplementedError
    def get_current_target(self): return GPUTarget("cuda", 90, 32)
    def get_active_torch_device(self): return torch.device("cpu")
    def get_benchmarker(self): raise NotImplementedError
    def get_current_device(self): return 0
    def get_current_stream(self, device=None): return 0


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0 + 1.0, mask=mask)


driver.set_active(CompileOnlyDriver())
x = torch.empty(1024, dtype=torch.float32)
first = scale_kernel.warmup(x, x, 1024, BLOCK=1024, grid=(1,))
if os.environ.get("JOB_DRIFT"):
    # Later in the same process (a config object, a test fixture): fusion turned off.
    os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"
served = first if os.environ.get("JOB_ONCE") else scale_kernel.warmup(
    x, x, 1024, BLOCK=1024, grid=(1,))
print(json.dumps({"event": "memory-hit" if served is first and not os.environ.get("JOB_ONCE")
                  else "compile",
                  "first": first.hash, "hash": served.hash,
                  "digest": xxhash.xxh3_128_hexdigest(served.asm["cubin"])}))
"""


def test_triton_stale_memory_hit_fails_the_run_and_nothing_changed_passes(tmp_path: Path):
    """Triton's in-memory key holds no cache-invalidating variable (PR #8350): after
    TRITON_DEFAULT_FP_FUSION=0 the process keeps launching the fused kernel."""
    pytest.importorskip("triton", reason="triton is not installed")
    pytest.importorskip("torch", reason="torch is needed for the @jit warmup arguments")
    env = _env(tmp_path, TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_DEFAULT_FP_FUSION="1")
    job = Job(tmp_path, TRITON_MEMORY_JOB, env)

    same, hit, report = job.run()
    assert hit["event"] == "memory-hit" and hit["hash"] == hit["first"]
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    counts = _agree(same, report)
    # The equal memory hit is not written (a ledger write per launch): only the compile counts.
    assert (counts["compiles"], counts["memory_hits"]) == (1, 0)

    stale, served, report = job.run(JOB_DRIFT="1")
    assert served["event"] == "memory-hit" and served["hash"] == hit["hash"]
    fresh = job.fresh("TRITON_CACHE_DIR", TRITON_DEFAULT_FP_FUSION="0", JOB_ONCE="1")
    assert served["digest"] != fresh["digest"], \
        "a fresh compile equals the served cubin: the scenario is not stale"
    assert stale.returncode == 1, stale.stderr
    finding = _stale(report, "CA202", "TRITON_DEFAULT_FP_FUSION")
    assert (finding["recorded"], finding["current"]) == ("TRITON_DEFAULT_FP_FUSION=true",
                                                         "TRITON_DEFAULT_FP_FUSION=false")
    assert _agree(stale, report)["memory_hits"] == 1


# ------------------------------------------------------------------------------ NVRTC

NVRTC_JOB = """
import json, os
import xxhash
from cuda.bindings import nvrtc


def compile_():
    source = b'#include "big.h"\\nextern "C" __global__ void k(float* o) { o[0] = BIG; }\\n'
    _, program = nvrtc.nvrtcCreateProgram(source, b"pk.cu", 0, [], [])
    (result,) = nvrtc.nvrtcCompileProgram(program, 2, [b"--gpu-architecture=sm_90", b"--pch"])
    assert int(result) == 0, result
    _, size = nvrtc.nvrtcGetCUBINSize(program)
    cubin = bytearray(size)
    nvrtc.nvrtcGetCUBIN(program, cubin)
    nvrtc.nvrtcDestroyProgram(program)
    return xxhash.xxh3_128_hexdigest(bytes(cubin))


def header(value):
    with open("big.h", "w") as handle:
        handle.write(f"#pragma once\\n#define BIG {value}\\n")


if os.environ.get("JOB_ONCE"):
    header(os.environ["JOB_ONCE"])
    print(json.dumps({"event": "compile", "digest": compile_()}))
else:
    header("1.0f")
    first = compile_()
    # The same program later in the process, after the header changed (or not): NVRTC's
    # automatic PCH stands for the header it was made from.
    header(os.environ.get("JOB_EDIT") or "1.0f")
    print(json.dumps({"event": "pch-reuse", "first": first, "digest": compile_()}))
"""


def _nvrtc_problem() -> str | None:
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - any failure is a reason to skip
        return f"libnvrtc cannot be loaded: {exc}"
    return None


def test_nvrtc_stale_pch_fails_the_run_and_nothing_changed_passes(tmp_path: Path):
    """NVRTC keys nothing; its automatic PCH (`--pch`) is used again for the same header prefix
    without a look at the header: after an edit the process is served the old header's cubin."""
    if (problem := _nvrtc_problem()) is not None:
        pytest.skip(problem)
    job = Job(tmp_path, NVRTC_JOB, _env(tmp_path))
    same, unchanged, report = job.run()
    assert same.returncode == 0 and _errors(report) == [], same.stderr
    assert unchanged["digest"] == unchanged["first"] == job.fresh(
        "JOB_CACHE", JOB_ONCE="1.0f")["digest"]
    counts = _agree(same, report)
    assert counts["compiles"] == 2

    stale, served, report = job.run(JOB_EDIT="5.0f")
    assert served["digest"] == served["first"], "NVRTC no longer reuses its PCH: see nvrtc.md"
    assert served["digest"] != job.fresh("JOB_CACHE", JOB_ONCE="5.0f")["digest"], \
        "a fresh compile equals the served cubin: the scenario is not stale"
    assert stale.returncode == 1, stale.stderr
    finding = _stale(report, "CA106", str((tmp_path / "big.h").resolve()))
    assert finding["severity"] == "error"
    _agree(stale, report)


def test_a_run_s_roots_are_the_nearest_ones_above_its_records(tmp_path: Path):
    """The roots a run touched are found by walking up from its records' paths, and only the
    nearest counts: here the records' parent directory also holds another project's torch
    build directory, which makes it look like a torch extensions root. Scanning it would put
    that project's extension into the run's audit ("may have been served")."""
    from cacheaudit.audit.run import roots_of

    project = tmp_path / "project"
    root = project / "dj"
    (root / "cache" / ("gemm." + "0" * 32)).mkdir(parents=True)
    (root / "tmp").mkdir()
    build = project / "someone_elses_ext"
    build.mkdir()
    (build / "build.ninja").write_text("ninja_required_version = 1.3\n")
    record = CompileRecord(
        record_id=new_record_id(), event="compile", started_ns=1, runtime=None, kernel=None,
        key=None, entry=None, compiler=None, argv=(), cwd=str(root / "tmp" / "gone-by-now"),
        sources=(), graph=None, outputs=(), exit_code=0, pid=1, host="h", observer="shim:g++")
    from cacheaudit.runtimes import layouts

    assert any(layout.is_root(str(project)) for layout in layouts()), \
        "the scenario needs a parent that looks like a root"
    assert roots_of([record]) == [str(root)]
