"""The audit beyond the truth table: caches built before recording, DeepGEMM entries, leftovers,
key recomputation checked against the reference runtime, filtering and thresholds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cacheaudit.audit import AuditOptions, fails, keep, scan
from cacheaudit.digest import StateCache
from cacheaudit.ledger import Ledger
from cacheaudit.model import Finding
from cacheaudit.policies import policy_for
from cacheaudit.readers import reader_for

from support import NVCC
from truth_table import SOURCE, Project, _write

BACKENDS = ["gxx", pytest.param("nvcc", marks=pytest.mark.skipif(
    NVCC is None, reason="nvcc is not on PATH"))]


def _codes(report: dict) -> list[str]:
    return sorted({f["code"] for f in report["findings"]})


@pytest.fixture(params=BACKENDS)
def project(request, tmp_path: Path) -> Project:
    project = Project(tmp_path, request.param)
    project.setup()
    return project


def _unrecorded(project: Project) -> dict:
    """Build with the real compiler, no shim and no ledger: a cache from before recording."""
    real = shutil.which(project.compiler_name, path=os.environ.get("PATH"))
    return project.once(DG_JIT_NVCC_COMPILER=real, CACHEAUDIT_DISABLE="1")


def test_cache_built_before_recording_is_reconstructed_and_inferred(project: Project):
    _unrecorded(project)
    assert not project.ledger.exists()
    time.sleep(0.05)
    detail = project.root / "third" / "cutlite" / "detail.h"
    detail.write_text("#pragma once\n#define DETAIL 5\n")
    report = project.scan()
    [stale] = [f for f in report["findings"] if f["code"] == "CA101"]
    assert stale["subject"] == str(detail)
    assert stale["inferred"] is True
    assert "inferred" in stale["how"]
    assert report["reconstructed"] == 1
    # The untouched headers are not accused: only files newer than the binary are.
    assert all(f["subject"] == str(detail) for f in report["findings"] if f["code"] == "CA101")
    # The reconstruction is kept: the next scan does not run the dependency pass again, and
    # still knows the finding is inferred.
    again = project.scan()
    assert again["reconstructed"] == 0 and again["matched"] == 1
    assert [f["inferred"] for f in again["findings"] if f["code"] == "CA101"] == [True]


def test_reconstruction_without_the_compiler_is_unverifiable(project: Project, tmp_path: Path):
    tool = project.wrapper(project.compiler_name, 'exec REAL "$@"\n')
    project.once(DG_JIT_NVCC_COMPILER=str(tool), CACHEAUDIT_DISABLE="1")
    tool.unlink()
    report = project.scan()
    assert "CA501" in _codes(report)
    assert not any(f["code"] == "CA101" for f in report["findings"])


def test_recomputed_key_equals_the_reference_runtimes_key(project: Project):
    answer = project.once()
    [entry] = [e for e in reader_for("deepjit").read(str(project.cache), StateCache())
               if hasattr(e, "key")]
    check = policy_for("deepjit").check_key(entry)
    assert check.recomputed == answer["key"] == entry.key
    labels = [c.label for c in check.components]
    assert labels[:5] == ["extra_signature", "compiler version (nvcc --version)", "flags",
                          "post hook", "source + tracked headers"]
    assert "  <mylib/api.cuh>" in labels


def test_tracked_set_is_computed_by_the_runtimes_rules(project: Project):
    project.once()
    [entry] = list(reader_for("deepjit").read(str(project.cache), StateCache()))
    tracked = policy_for("deepjit").tracked(entry, None)
    assert tracked.names == {"mylib/api.cuh": str(project.root / "inc" / "mylib" / "api.cuh")}
    assert str(project.root / "third" / "cutlite" / "tile.h") not in tracked.paths


def test_leftovers_and_partial_entries_are_ca402(project: Project):
    project.once()
    [entry_dir] = list((project.cache / "cache").iterdir())
    crashed = project.cache / "tmp" / f"{os.getpid()}-0badc0de-0badc0de-0badc0de"
    crashed.mkdir(parents=True)
    (crashed / "kernel.cu").write_text(SOURCE)
    binary = next(p for p in entry_dir.iterdir() if p.name.startswith("kernel.")
                  and p.suffix != ".cu")
    binary.unlink()
    report = project.scan()
    subjects = {f["subject"] for f in report["findings"] if f["code"] == "CA402"}
    assert str(crashed) in subjects and str(entry_dir) in subjects


def test_select_ignore_and_fail_on():
    error = Finding("CA101", "a.h", "m")
    warning = Finding("CA102", "3 files", "m")
    info = Finding("CA203", "DG_JIT_CACHE_DIR", "m")
    findings = [error, warning, info]
    assert keep(findings, AuditOptions(select=frozenset({"CA1"}))) == [error, warning]
    assert keep(findings, AuditOptions(ignore=frozenset({"CA102", "CA2"}))) == [error]
    assert fails(findings, "error") and fails([warning], "warning")
    assert not fails([warning, info], "error") and not fails(findings, "never")
    assert fails([info], "info")


def test_fallback_to_dj_prefix_is_reported(tmp_path: Path):
    env = {"HOME": str(tmp_path), "DJ_JIT_CACHE_DIR": str(tmp_path / "root")}
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        result = scan([], env, ledger=ledger)
    fallback = [f for f in result.findings if f.code == "CA203"]
    assert {f.subject for f in fallback} >= {"DG_JIT_CACHE_DIR", "EP_JIT_CACHE_DIR"}
    assert all(f.severity.value == "info" for f in fallback)


def test_default_roots_are_discovered_from_the_environment(project: Project):
    project.once()
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--json", "--ledger",
                           str(project.ledger), "--fail-on", "never"], capture_output=True,
                          text=True, env=project.env, cwd=project.root)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert {"layout": "deepjit", "root": str(project.cache)} in report["roots"]
    assert report["entries"] == 1 and report["matched"] == 1


def _deepgemm_library(root: Path) -> Path:
    include = root / "dglib" / "include"
    _write(include / "deep_gemm" / "common.cuh",
           "#pragma once\n#include <cutlite/tile.h>\n#define DG_VALUE 1\n")
    return include.parent


DG_SOURCE = """\
#include <deep_gemm/common.cuh>
#ifdef __CUDACC__
__global__
#endif
void dg_kernel(int* out) { out[0] = DG_VALUE + TILE_VALUE; }
"""


def test_deepgemm_entries_untracked_and_tracked_changes(project: Project, monkeypatch):
    from fixtures.minijit import DeepGemmRuntime

    library = _deepgemm_library(project.root)
    env = dict(project.env, DG_JIT_CACHE_DIR=str(project.root / "dgcache"),
               CPLUS_INCLUDE_PATH=str(project.root / "third"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    runtime = DeepGemmRuntime(library, backend=project.backend)
    built = runtime.build("dg_kernel", DG_SOURCE)
    assert built.event == "compile"
    [entry] = [e for e in reader_for("deepgemm").read(str(project.root / "dgcache"),
                                                      StateCache()) if hasattr(e, "key")]
    assert entry.include_hash is not None
    with Ledger.open(str(project.ledger)) as ledger:
        record = ledger.records()[-1]
    policy = policy_for("deepgemm")
    assert policy.check_key(entry, record).recomputed == entry.key
    assert set(policy.tracked(entry, record).names) == {"deep_gemm/common.cuh"}

    _write(project.root / "third" / "cutlite" / "detail.h", "#pragma once\n#define DETAIL 3\n")
    with Ledger.open(str(project.ledger)) as ledger:
        result = scan([str(project.root / "dgcache")], env, ledger=ledger)
    assert [f.subject for f in result.findings if f.code == "CA101"] == [
        str(project.root / "third" / "cutlite" / "detail.h")]

    # A tracked header edit changes the key a new process computes: no stale finding for it.
    _write(library / "include" / "deep_gemm" / "common.cuh",
           "#pragma once\n#include <cutlite/tile.h>\n#define DG_VALUE 2\n")
    assert policy.check_key(entry, record).recomputed != entry.key


def test_configuration_changed_after_construction_is_ca204(project: Project):
    driver = project.driver(DG_JIT_CPP_STANDARD="20")
    try:
        driver.compile()
        driver.setenv("DG_JIT_CPP_STANDARD", "17")
        second = driver.compile(SOURCE.replace("void gemm", "void gemm2"))
    finally:
        driver.close()
    report = project.scan(DG_JIT_CPP_STANDARD="17")
    [changed] = [f for f in report["findings"] if f["code"] == "CA204"]
    assert changed["entry"] == second["path"]
    assert (changed["subject"], changed["recorded"], changed["current"]) == (
        "DG_JIT_CPP_STANDARD", "DG_JIT_CPP_STANDARD=20", "DG_JIT_CPP_STANDARD=17")
    # The runtime really did keep the first value: the compile ran with -std=c++20.
    from cacheaudit.ledger import Ledger

    with Ledger.open(str(project.ledger)) as ledger:
        [record] = [r for r in ledger.records() if r.record_id == changed["record_id"]]
    assert "-std=c++20" in [t.text for t in record.effective_argv]
