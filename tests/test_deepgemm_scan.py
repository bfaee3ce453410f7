"""DeepGEMM 2.x C++ JIT caches built without recording, judged by a scan (issue 12, case 2).

Truth-table style: the reference runtime (fixtures/minijit/deepgemm.py, g++ stand-in) builds a
kernel in its own process with cacheaudit disabled, one thing changes, the runtime is asked
again, and the ground truth is a fresh compile of the same request into an empty cache,
compared byte for byte with what the runtime served. The scan runs as a user runs it, with the
installed `deep_gemm` package on its PYTHONPATH (or named with `--include-dir`), never imported.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import xxhash

from support import needs_gxx, needs_nvcc
from truth_table import checked

ROOT = Path(__file__).resolve().parent.parent

CODE = "#include <deep_gemm/gemm.cuh>\nint deep_gemm_value() { return GEMM_VALUE + TILE; }\n"

_BUILD = """\
import json, sys
from fixtures.minijit.deepgemm import DeepGemmRuntime
kernel = DeepGemmRuntime(sys.argv[1], backend="gxx").build("gemm", sys.argv[2])
print(json.dumps({"event": kernel.event, "path": kernel.path, "binary": kernel.binary}))
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def _digest(path: str | None) -> str | None:
    if path is None or not os.path.exists(path):
        return None
    return xxhash.xxh3_128_hexdigest(Path(path).read_bytes())


def install_deep_gemm(site: Path, gemm_value: int = 100) -> Path:
    """A `deep_gemm` package as pip installs it: the library headers and CuTe under
    deep_gemm/include; the package directory is returned."""
    package = site / "deep_gemm"
    _write(package / "__init__.py", "")
    _write(package / "include" / "deep_gemm" / "gemm.cuh",
           f"#pragma once\n#include <cute/tile.hpp>\n#define GEMM_VALUE {gemm_value}\n")
    _write(package / "include" / "cute" / "tile.hpp", "#pragma once\n#define TILE 10\n")
    return package


@dataclass
class Job:
    root: Path
    package: Path
    env: dict[str, str]

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.db"

    def build(self, cache: Path | None = None) -> dict[str, Any]:
        """One runtime process, unrecorded (cacheaudit disabled, the real g++)."""
        env = dict(self.env, DG_JIT_CACHE_DIR=str(cache or self.cache), CACHEAUDIT_DISABLE="1",
                   PYTHONPATH=str(ROOT))
        done = subprocess.run([sys.executable, "-c", _BUILD, str(self.package), CODE],
                              capture_output=True, text=True, env=env, timeout=300, check=True)
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        answer["digest"] = _digest(answer["binary"])
        return answer

    def fresh(self) -> str | None:
        fresh = self.root / f"fresh-{len(list(self.root.glob('fresh-*')))}"
        return self.build(fresh)["digest"]

    def scan(self, *args: str, pythonpath: list[Path] | None = None,
             cwd: Path | None = None) -> dict[str, Any]:
        paths = [ROOT] + (pythonpath if pythonpath is not None else [self.package.parent])
        env = dict(self.env, PYTHONPATH=os.pathsep.join(str(p) for p in paths))
        done = subprocess.run(
            [sys.executable, "-m", "cacheaudit", "scan", str(self.cache), "--json", "--ledger",
             str(self.ledger), "--fail-on", "never", "--no-progress", *args],
            capture_output=True, text=True, env=env, cwd=cwd or self.root, timeout=600)
        assert done.returncode == 0, done.stderr
        return checked(done.stdout)


@pytest.fixture
def job(tmp_path: Path) -> Job:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "NVCC_", "DG_", "EP_", "DJ_", "PYTEST_"))
           and k not in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "PYTHONPATH")}
    env.update(HOME=str(tmp_path / "home"), DG_JIT_NVCC_COMPILER=str(shutil.which("g++")))
    return Job(tmp_path, install_deep_gemm(tmp_path / "site"), env)


def _named(report: dict[str, Any], code: str) -> list[str]:
    return [f["subject"] for f in report["findings"] if f["code"] == code]


def _errors(report: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def _tile(job: Job) -> Path:
    return job.package / "include" / "cute" / "tile.hpp"


@needs_gxx
def test_unrecorded_entry_unchanged_is_judged(job: Job):
    built = job.build()
    served = job.build()
    assert served["event"] == "disk-hit" and served["digest"] == job.fresh()
    report = job.scan("--verify-keys")
    # Reconstructed against the installed package's include tree, not left unverified: the
    # key recomputed from the flags found (CA501 if it differed) is the entry's.
    assert report["reconstructed"] == 1, report
    assert _named(report, "CA501") == [], report["findings"]
    assert _errors(report) == [], report["findings"]
    assert built["path"] == served["path"]


@needs_gxx
def test_unrecorded_entry_untracked_cute_header_edited(job: Job):
    job.build()
    assert job.scan()["reconstructed_now"] == 1  # a scan before the edit keeps what it read
    _write(_tile(job), "#pragma once\n#define TILE 20\n")
    served = job.build()
    assert served["event"] == "disk-hit"
    assert served["digest"] != job.fresh()  # a stale hit: the ground truth
    report = job.scan()
    # The edited CuTe header under DeepGEMM's include tree is named.
    assert str(_tile(job)) in [f["subject"] for f in _errors(report)
                               if f["code"] == "CA101"], report["findings"]


@needs_gxx
def test_unrecorded_entry_edited_before_any_scan_is_named(job: Job):
    job.build()
    _write(_tile(job), "#pragma once\n#define TILE 20\n")
    served = job.build()
    assert served["digest"] != job.fresh()
    report = job.scan()
    # Its content at build time is unknown: named, unverified (a rebuild proves it).
    assert str(_tile(job)) in _named(report, "CA501"), report["findings"]


@needs_gxx
def test_unrecorded_entry_tracked_header_edited_is_an_orphan(job: Job):
    first = job.build()
    gemm = job.package / "include" / "deep_gemm" / "gemm.cuh"
    _write(gemm, "#pragma once\n#include <cute/tile.hpp>\n#define GEMM_VALUE 200\n")
    served = job.build()
    assert served["event"] == "compile" and served["digest"] == job.fresh()
    report = job.scan()
    # The old entry's include hash no longer matches the tree: DeepGEMM misses it, so nothing
    # about it is stale, and nothing is left unverified.
    assert report["reconstructed"] == 2, report
    assert _errors(report) == [], report["findings"]
    assert [f for f in report["findings"] if f["code"] == "CA501"
            and f["entry"] == first["path"]] == [], report["findings"]


@needs_gxx
def test_the_tree_that_built_the_entry_is_chosen(job: Job):
    # Another deep_gemm comes first on the scan's path (the one cacheaudit's own interpreter
    # would import); the entry was built by the second, and its include-hash line says so.
    decoy = install_deep_gemm(job.root / "decoy", gemm_value=300)
    job.build()
    job.scan(pythonpath=[decoy.parent, job.package.parent])
    _write(_tile(job), "#pragma once\n#define TILE 20\n")
    served = job.build()
    assert served["digest"] != job.fresh()
    report = job.scan(pythonpath=[decoy.parent, job.package.parent])
    assert str(_tile(job)) in _named(report, "CA101"), report["findings"]
    named = [f["subject"] for f in report["findings"] if str(decoy) in f["subject"]]
    assert named == [], named


@needs_gxx
def test_a_differing_tree_is_said(job: Job):
    decoy = install_deep_gemm(job.root / "decoy", gemm_value=300)
    job.build()
    report = job.scan(pythonpath=[decoy.parent])
    entry_findings = [f for f in report["findings"] if f["code"] == "CA501"]
    assert any("include hash" in f["message"] and str(decoy / "include") in f["message"]
               for f in entry_findings), report["findings"]


@needs_gxx
def test_include_dir_named_on_the_command_line(job: Job):
    job.build()
    job.scan("--include-dir", str(job.package / "include"), pythonpath=[])
    _write(_tile(job), "#pragma once\n#define TILE 20\n")
    served = job.build()
    assert served["digest"] != job.fresh()
    report = job.scan("--include-dir", str(job.package / "include"), pythonpath=[])
    assert str(_tile(job)) in _named(report, "CA101"), report["findings"]


@needs_gxx
def test_include_dir_named_in_pyproject(job: Job):
    job.build()
    project = job.root / "project"
    _write(project / "pyproject.toml",
           f"[tool.cacheaudit]\ninclude-dirs = [{str(job.package)!r}]\n")
    job.scan(pythonpath=[], cwd=project)
    _write(_tile(job), "#pragma once\n#define TILE 20\n")
    served = job.build()
    assert served["digest"] != job.fresh()
    report = job.scan(pythonpath=[], cwd=project)
    assert str(_tile(job)) in _named(report, "CA101"), report["findings"]



# ------------------------------------------------------------ DeepGEMM's Python JIT (case 3)

REPLICA = ROOT / "fixtures" / "deepgemm_python"

_PYTHON_BUILD = """\
import json, os, sys
import xxhash
import deep_gemm
from deep_gemm.jit.compiler import get_cache_dir
cache = get_cache_dir()
before = set(os.listdir(cache)) if os.path.isdir(cache) else set()
runtime = deep_gemm.fill(3)
print(json.dumps({"event": "disk-hit" if os.path.basename(runtime.path) in before
                  else "compile", "path": runtime.path,
                  "digest": xxhash.xxh3_128_hexdigest(runtime.load())}))
"""


@dataclass
class PythonJob:
    """The replica installed in a site directory, its top-level utils.cuh including a CuTe-like
    header that `get_deep_gemm_version` never hashes."""

    root: Path
    site: Path
    env: dict[str, str]

    @property
    def cache(self) -> Path:
        return self.root / "dg"

    @property
    def include(self) -> Path:
        return self.site / "deep_gemm" / "include"

    @property
    def tile(self) -> Path:
        return self.include / "cute" / "tile.hpp"

    @property
    def utils(self) -> Path:
        return self.include / "deep_gemm" / "utils.cuh"

    def build(self, cache: Path | None = None, recorded: bool = False,
              **extra: str) -> dict[str, Any]:
        script = self.root / "job.py"
        script.write_text(_PYTHON_BUILD)
        env = dict(self.env, DG_JIT_CACHE_DIR=str(cache or self.cache),
                   DG_CACHE_DIR=str(cache or self.cache), **extra)
        if recorded:
            env["PYTHONPATH"] = os.pathsep.join([str(self.site), str(ROOT)])
            argv = [sys.executable, "-m", "cacheaudit", "run", "--ledger",
                    str(self.root / "ledger.db"), "--fail-on", "never", "--",
                    sys.executable, str(script)]
        else:
            env.update(CACHEAUDIT_DISABLE="1", PYTHONPATH=str(self.site))
            argv = [sys.executable, str(script)]
        done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300,
                              cwd=self.root)
        assert done.returncode == 0, done.stdout + done.stderr
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        return json.loads(lines[-1])

    def fresh(self, **extra: str) -> str:
        fresh = self.root / f"fresh-{len(list(self.root.glob('fresh-*')))}"
        answer = self.build(fresh, **extra)
        assert answer["event"] == "compile"
        return str(answer["digest"])

    def scan(self, *args: str) -> dict[str, Any]:
        env = dict(self.env, PYTHONPATH=os.pathsep.join([str(ROOT), str(self.site)]))
        done = subprocess.run(
            [sys.executable, "-m", "cacheaudit", "scan", str(self.cache), "--json", "--ledger",
             str(self.root / "ledger.db"), "--fail-on", "never", "--no-progress", *args],
            capture_output=True, text=True, env=env, cwd=self.root, timeout=600)
        assert done.returncode == 0, done.stderr
        return checked(done.stdout)


def _python_job(tmp_path: Path, release: str) -> PythonJob:
    site = tmp_path / "site"
    shutil.copytree(REPLICA, site, ignore=shutil.ignore_patterns("__pycache__"))
    job = PythonJob(tmp_path, site, {})
    _write(job.tile, "#pragma once\nnamespace cute { constexpr int kTile = 10; }\n")
    job.utils.write_text(job.utils.read_text().replace(
        "constexpr int kBias = 1;", "constexpr int kBias = 1 + cute::kTile;").replace(
        "#pragma once\n", "#pragma once\n#include <cute/tile.hpp>\n"))
    stamp = time.time_ns() - 5_000_000_000
    for header in (job.tile, job.utils):
        os.utime(header, ns=(stamp, stamp))
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "NVCC_", "DG_", "EP_", "DJ_", "PYTEST_"))
           and k not in ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "PYTHONPATH")}
    env.update(HOME=str(tmp_path / "home"), DG_REPLICA_RELEASE=release)
    (tmp_path / "home").mkdir()
    job.env = env
    return job


@pytest.fixture
def python_job(tmp_path: Path) -> PythonJob:
    return _python_job(tmp_path, "8dfa329")


def _entry_findings(report: dict[str, Any], entry: str, *codes: str) -> list[dict[str, Any]]:
    return [f for f in report["findings"] if f["entry"] == entry and f["code"] in codes]


@needs_nvcc
@pytest.mark.parametrize("release", ["8dfa329", "a6d97a1"])
def test_python_jit_key_is_recomputed_as_the_replica_keys(tmp_path: Path, release: str):
    job = _python_job(tmp_path, release)
    built = job.build()
    entry = built["path"]
    from cacheaudit.runtimes.deepgemm.policy import POLICIES

    policy = POLICIES["deepgemm"].for_audit(
        dict(job.env, PYTHONPATH=str(job.site)), ())
    from cacheaudit.digest import StateCache
    from cacheaudit.runtimes.deepgemm.layout import LAYOUT

    entries = [e for e in LAYOUT.read(str(job.cache), StateCache()) if hasattr(e, "key")]
    assert [e.path for e in entries] == [entry]
    check = policy.check_key(entries[0])
    # The recomputed key is the directory name's 12 hex digits the replica chose.
    assert check.recomputed == entry.rsplit(".", 1)[1], (entry, check)
    report = job.scan("--verify-keys")
    assert report["reconstructed"] == 1, report
    assert _entry_findings(report, entry, "CA501") == [], report["findings"]


@needs_nvcc
def test_python_jit_unrecorded_tracked_edit_is_an_orphan(python_job: PythonJob):
    job = python_job
    first = job.build()
    job.utils.write_text(job.utils.read_text().replace("1 + cute::kTile", "2 + cute::kTile"))
    served = job.build()
    assert served["event"] == "compile" and served["path"] != first["path"]
    assert served["digest"] == job.fresh()
    report = job.scan()
    # The old entry's key no longer comes out of the headers: the runtime misses it.
    assert report["reconstructed"] == 2, report
    assert _errors(report) == [], report["findings"]
    assert _entry_findings(report, first["path"], "CA501", "CA101") == [], report["findings"]


@needs_nvcc
def test_python_jit_unrecorded_untracked_edit_is_stale(python_job: PythonJob):
    job = python_job
    first = job.build()
    assert job.scan()["reconstructed_now"] == 1  # a scan before the edit keeps what it read
    _write(job.tile, "#pragma once\nnamespace cute { constexpr int kTile = 20; }\n")
    served = job.build()
    assert served["event"] == "disk-hit" and served["path"] == first["path"]
    assert served["digest"] != job.fresh()  # a stale hit: the ground truth
    report = job.scan()
    stale = _entry_findings(report, first["path"], "CA101")
    assert [f["subject"] for f in stale] == [str(job.tile)], report["findings"]


@needs_nvcc
def test_python_jit_unrecorded_untracked_edit_before_any_scan_is_named(python_job: PythonJob):
    job = python_job
    first = job.build()
    _write(job.tile, "#pragma once\nnamespace cute { constexpr int kTile = 20; }\n")
    served = job.build()
    assert served["digest"] != job.fresh()
    report = job.scan()
    assert str(job.tile) in [f["subject"] for f in _entry_findings(report, first["path"],
                                                                   "CA501")], report["findings"]


@needs_nvcc
def test_python_jit_recorded_tracked_edit_is_an_orphan(python_job: PythonJob):
    job = python_job
    first = job.build(recorded=True)
    job.utils.write_text(job.utils.read_text().replace("1 + cute::kTile", "2 + cute::kTile"))
    served = job.build(recorded=True)
    assert served["event"] == "compile" and served["digest"] == job.fresh()
    report = job.scan()
    assert report["matched"] == 2, report
    assert _errors(report) == [], report["findings"]
    assert _entry_findings(report, first["path"], "CA501", "CA101") == [], report["findings"]


def _code_digest(entry: str) -> str:
    """The digest of the `.text.*` sections of an entry's kernel.cubin (ELF64, little-endian)."""
    import struct

    data = (Path(entry) / "kernel.cubin").read_bytes()
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def section(index: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + index * shentsize)
        return name, offset, size

    _, names, _ = section(shstrndx)
    code = b""
    for index in range(shnum):
        name, offset, size = section(index)
        if data[names + name:data.index(b"\0", names + name)].startswith(b".text."):
            code += data[offset:offset + size]
    assert code, f"{entry}/kernel.cubin has no .text section"
    return xxhash.xxh3_128_hexdigest(code)


def _nvrtc_problem() -> str | None:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except ImportError as exc:
        return f"cuda.bindings.nvrtc does not import: {exc}"
    return None


@pytest.mark.skipif(_nvrtc_problem() is not None, reason=str(_nvrtc_problem()))
@pytest.mark.parametrize("recorded", [True, False], ids=["recorded", "unrecorded"])
def test_python_jit_nvrtc_entry_is_not_reported_broken(python_job: PythonJob, recorded: bool):
    job = python_job
    built = job.build(recorded=recorded, DG_JIT_USE_NVRTC="1")
    fresh = job.root / "fresh-nvrtc"
    again = job.build(fresh, DG_JIT_USE_NVRTC="1")
    # NVRTC's cubins differ from one compile to the next outside the code: the ground truth is
    # the same key and the same machine code in a fresh compile into an empty cache.
    assert Path(again["path"]).name == Path(built["path"]).name
    assert _code_digest(built["path"]) == _code_digest(again["path"])
    assert not (Path(built["path"]) / "kernel.cu").exists()
    report = job.scan()
    entry = built["path"]
    assert _entry_findings(report, entry, "CA402", "CA301") == [], report["findings"]
    assert _errors(report) == [], report["findings"]
    unverified = _entry_findings(report, entry, "CA501")
    assert len(unverified) <= 1, unverified
    # Recorded or not, the one CA501 says why a scan cannot judge it: NVRTC compiled in memory.
    assert [f["subject"] for f in unverified] == [entry], report["findings"]
    assert "NVRTC" in unverified[0]["message"], unverified
