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
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import xxhash

from cacheaudit.ledger import Ledger
from cacheaudit.opens import OpenObserver

from support import GXX, NVCC, clean_env, needs_gxx, needs_nvcc

ROOT = Path(__file__).resolve().parent.parent
SUMMARY = re.compile(r"(\d+) compile\(s\), (\d+) disk hit\(s\)(?: \((\d+) seen[^)]*\))?, "
                     r"(\d+) memory hit\(s\), (\d+) compiler invocation\(s\) through the shim; "
                     r"(\d+) entry\(ies\) judged")


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


def _deepgemm_library(tmp_path: Path) -> Path:
    library = tmp_path / "deep_gemm"
    (library / "include" / "deep_gemm").mkdir(parents=True)
    (library / "include" / "cute").mkdir(parents=True)
    (library / "include" / "deep_gemm" / "common.cuh").write_text(
        "#pragma once\n#include <cute/tile.hpp>\n#define DG_VALUE 1\n")
    tile = library / "include" / "cute" / "tile.hpp"
    tile.write_text("#pragma once\n#define TILE_VALUE 10\n")
    stamp = time.time_ns() - 5_000_000_000
    os.utime(tile, ns=(stamp, stamp))
    return library


@pytest.fixture
def deepgemm(tmp_path: Path) -> Job:
    library = _deepgemm_library(tmp_path)
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
    stale, served, report = deepgemm.run()
    assert served["event"] == "disk-hit" and served["path"] == first["path"]
    assert served["digest"] != deepgemm.fresh("DG_JIT_CACHE_DIR")["digest"], \
        "a fresh compile equals the served binary: the scenario is not stale"
    assert stale.returncode == 1, stale.stderr
    finding = _stale(report, "CA101", str(tile))
    assert finding["entry"] == first["path"]
    assert "may have been served" not in finding["message"]  # seen, not inferred
    assert _agree(stale, report)["disk_hits"] == 1


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
    assert _agree(stale, report)["possibly_served"] == 1, (report["roots"], stale.stderr)


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
    assert len(shim) == 1 and counts["entries_judged"] == 1

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
