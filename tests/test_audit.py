"""The audit beyond the truth table: caches built before recording, DeepGEMM entries, leftovers,
key recomputation checked against the reference runtime, filtering and thresholds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.audit import AuditOptions, fails, keep, scan
from cacheaudit.digest import StateCache
from cacheaudit.ledger import Ledger, new_record_id
from cacheaudit.model import ArgToken, CacheEntry, CompileRecord, CompilerIdentity, Finding
from cacheaudit.policy import TrackedSet
from cacheaudit.runtimes import layout_for as reader_for
from cacheaudit.runtimes import policy_for

from support import NVCC, deadline
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
    # The header changed after the build, which nobody observed: what the compiler read is
    # unknown, so timestamps alone may not call the hit stale (CA101, an error). The scan says
    # what it knows, as a warning naming the file.
    [unknown] = [f for f in report["findings"] if f["subject"] == str(detail)]
    assert unknown["code"] == "CA501" and unknown["severity"] == "warning", unknown
    assert unknown["inferred"] is True and "unknown" in unknown["how"]
    assert [f for f in report["findings"] if f["severity"] == "error"] == []
    assert (report["matched"], report["reconstructed"], report["reconstructed_now"]) == (0, 1, 1)
    assert ("(0 tied to an observed compile, 1 judged on inputs reconstructed after the build, "
            "0 unverified)") in report["summary"]
    # The untouched headers are not accused: only files newer than the binary are.
    assert all(f["subject"] == str(detail) for f in report["findings"]
               if f["code"] in ("CA101", "CA501"))
    # The reconstruction is kept: the next scan does not run the dependency pass again, and
    # still does not know what the compiler read of the header.
    again = project.scan()
    assert (again["matched"], again["reconstructed"], again["reconstructed_now"]) == (0, 1, 0)
    assert [(f["code"], f["inferred"]) for f in again["findings"]
            if f["subject"] == str(detail)] == [("CA501", True)]


def test_an_edit_after_the_reconstruction_is_proven_by_content_and_says_it_is_inferred(
        project: Project):
    _unrecorded(project)
    first = project.scan()  # nothing changed since the build: the scan keeps today's content
    assert [f for f in first["findings"] if f["severity"] == "error"] == []
    detail = project.root / "third" / "cutlite" / "detail.h"
    detail.write_text("#pragma once\n#define DETAIL 5\n")
    served = project.once()
    assert served["event"] == "disk-hit" and served["digest"] != project.fresh()  # stale
    report = project.scan()
    [stale] = [f for f in report["findings"] if f["code"] == "CA101"]
    assert stale["subject"] == str(detail)
    # The content differs from what the scan saw after the build; that the compiler read the
    # same is inferred from the file's mtime and ctime, and the graph was reconstructed.
    assert stale["inferred"] is True and "reconstructed" in stale["how"]


def test_reconstruction_without_the_compiler_is_unverifiable(project: Project, tmp_path: Path):
    tool = project.wrapper(project.compiler_name, 'exec REAL "$@"\n')
    project.once(DG_JIT_NVCC_COMPILER=str(tool), CACHEAUDIT_DISABLE="1")
    tool.unlink()
    report = project.scan()
    assert "CA501" in _codes(report)
    assert not any(f["code"] == "CA101" for f in report["findings"])


@pytest.mark.parametrize("meta_change", ["no command", "no kernel.cu in the command"])
def test_an_entry_that_cannot_be_reconstructed_says_why_and_what_to_do(
        project: Project, meta_change: str):
    served = _unrecorded(project)
    meta_path = Path(served["path"]) / "meta.json"
    meta = json.loads(meta_path.read_text())
    if meta_change == "no command":
        del meta["command"]
        why = "records no compile command"
    else:
        meta["command"] = meta["command"].replace("kernel.cu", "source.cu")
        why = "names no kernel.cu"
    meta_path.write_text(json.dumps(meta))
    report = project.scan()
    [unverified] = [f for f in report["findings"] if f["code"] == "CA501"]
    assert unverified["entry"] == served["path"], unverified
    assert why in unverified["message"], unverified
    assert "cacheaudit run" in unverified["hint"], unverified


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


def test_recomputed_key_with_a_post_hook_equals_the_reference_runtimes_key(project: Project):
    # DeepJIT keys the hook's configured path and its bytes, and runs it over the binary.
    hook = project.root / "scripts" / "hook.py"
    _write(hook, "import sys\nopen(sys.argv[1], 'ab').write(b'hooked')\n")
    answer = project.once(post_hook="scripts/hook.py")
    assert Path(answer["binary"]).read_bytes().endswith(b"hooked")
    [entry] = [e for e in reader_for("deepjit").read(str(project.cache), StateCache())
               if isinstance(e, CacheEntry)]
    policy = policy_for("deepjit")
    check = policy.check_key(entry)
    assert check.recomputed == answer["key"] == entry.key, check.note
    assert policy.rewrites_binary(entry)
    # The hook is part of the key: another hook body, another key.
    _write(hook, "import sys\nopen(sys.argv[1], 'ab').write(b'hooked twice')\n")
    assert project.once(post_hook="scripts/hook.py")["key"] != answer["key"]
    assert policy.check_key(entry).recomputed != entry.key


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


def test_prefix_fallback_is_reported_for_the_families_the_scan_found(
        gxx_project: Project, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    # No entry: no runtime that reads DG_ or EP_ was found, so a DJ_ value reaches nothing.
    env = {"HOME": str(tmp_path), "DJ_JIT_CPP_STANDARD": "17"}
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        assert not [f for f in scan([], env, ledger=ledger).findings if f.code == "CA203"]

    # A DeepJIT entry in DG_JIT_CACHE_DIR's root: its runtime reads DG_, not EP_.
    gxx_project.once()
    env = dict(gxx_project.env, DJ_JIT_CPP_STANDARD="17")
    with Ledger.open(str(gxx_project.ledger)) as ledger:
        result = scan([str(gxx_project.cache)], env, ledger=ledger)
    [fallback] = [f for f in result.findings if f.code == "CA203"]
    assert fallback.subject == "DG_JIT_CPP_STANDARD" and fallback.severity.value == "info"
    assert "falls back to DJ_JIT_CPP_STANDARD" in fallback.message
    assert fallback.current == "DJ_JIT_CPP_STANDARD=17" and "DG_JIT_CACHE_DIR" in fallback.how

    # DeepGEMM <= 2.6 has no fallback: the DJ_ value is ignored, and the finding says so.
    _deepgemm_build(gxx_project, monkeypatch, _deepgemm_library(gxx_project.root))
    with Ledger.open(str(gxx_project.ledger)) as ledger:
        result = scan([str(gxx_project.root / "dgcache")], env, ledger=ledger)
    [ignored] = [f for f in result.findings if f.code == "CA203"]
    assert ignored.subject == "DG_JIT_CPP_STANDARD"
    assert "DeepGEMM <= 2.6 reads only DG_ variables: it ignores DJ_JIT_CPP_STANDARD" in (
        ignored.message)
    assert "falls back" not in ignored.message


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
    assert f"process {driver.process.pid}" in changed["how"]
    # The runtime really did keep the first value: the compile ran with -std=c++20.
    from cacheaudit.ledger import Ledger

    with Ledger.open(str(project.ledger)) as ledger:
        [record] = [r for r in ledger.records() if r.record_id == changed["record_id"]]
    assert "-std=c++20" in [t.text for t in record.effective_argv]


def test_ca204_judges_only_the_env_prefix_the_runtime_read(gxx_project: Project):
    driver = gxx_project.driver()
    try:
        driver.compile()
        # The runtime was constructed with prefix DG (tests/minijit_driver.py): EP_ belongs to
        # another library, and only the DG_ change is one it ignored.
        driver.setenv("EP_JIT_CPP_STANDARD", "17")
        driver.setenv("DG_JIT_WITH_LINEINFO", "1")
        second = driver.compile(SOURCE.replace("void gemm", "void gemm2"))
    finally:
        driver.close()
    changed = [f for f in gxx_project.scan()["findings"] if f["code"] == "CA204"]
    assert [(f["subject"], f["entry"]) for f in changed] == [
        ("DG_JIT_WITH_LINEINFO", second["path"])]
    assert "env prefix DG" in changed[0]["how"] and "DG_JIT_CACHE_DIR" in changed[0]["how"]


def test_the_env_prefix_comes_from_meta_json_the_cache_root_or_the_variables_set(
        gxx_project: Project):
    gxx_project.once()
    root = str(gxx_project.cache)
    policy = policy_for("deepjit")

    def prefixes(env: dict[str, str]) -> tuple[str, ...]:
        [entry] = list(reader_for("deepjit").read(root, StateCache()))
        return policy.env_families(entry, env).prefixes  # type: ignore[attr-defined]

    assert prefixes({"DG_JIT_CACHE_DIR": root}) == ("DG",)
    assert prefixes({"EP_JIT_CACHE_DIR": root, "DJ_JIT_CACHE_DIR": "/elsewhere"}) == ("EP",)
    # One root for both families: only a value of one family's own tells them apart, and a
    # compiler setting a session gives every family alike does not.
    shared = {"DJ_JIT_CACHE_DIR": root}
    assert prefixes(shared) == ()
    assert prefixes({**shared, "EP_JIT_CPP_STANDARD": "17"}) == ("EP",)
    assert prefixes({**shared, "DG_JIT_NVCC_COMPILER": "/shims/nvcc",
                     "EP_JIT_NVCC_COMPILER": "/shims/nvcc"}) == ()
    # DeepGEMM 2.8's include prefix names its library whatever the environment says.
    _rewrite_meta(_entry_dir(gxx_project),
                  lambda meta: meta["config"].__setitem__("include_prefixes", ["deep_gemm/"]))
    assert prefixes({"EP_JIT_CACHE_DIR": root}) == ("DG",)
    [entry] = list(reader_for("deepjit").read(root, StateCache()))
    assert "DeepGEMM 2.8+" in policy.env_families(entry, {}).how  # type: ignore[attr-defined]


def test_ca204_compares_compiles_of_one_process_in_a_session(gxx_project: Project):
    session = {"CACHEAUDIT_RUN": "session-ca204"}
    first = gxx_project.driver(DG_JIT_CPP_STANDARD="20", **session)
    try:
        first.compile()
    finally:
        first.close()
    # Another process of the same session, constructed under another value: it used that one.
    second = gxx_project.driver(DG_JIT_CPP_STANDARD="17", **session)
    try:
        second.compile(SOURCE.replace("void gemm", "void gemm2"))
    finally:
        second.close()
    assert not [f for f in gxx_project.scan()["findings"] if f["code"] == "CA204"]

    # One process changing the setting after construction is still caught within the session.
    third = gxx_project.driver(DG_JIT_CPP_STANDARD="17", **session)
    try:
        third.compile(SOURCE.replace("void gemm", "void gemm3"))
        third.setenv("DG_JIT_CPP_STANDARD", "20")
        late = third.compile(SOURCE.replace("void gemm", "void gemm4"))
    finally:
        third.close()
    [changed] = [f for f in gxx_project.scan()["findings"] if f["code"] == "CA204"]
    assert (changed["entry"], changed["recorded"], changed["current"]) == (
        late["path"], "DG_JIT_CPP_STANDARD=17", "DG_JIT_CPP_STANDARD=20")
    assert f"process {third.process.pid}" in changed["how"]


def test_ca106_is_inferred_in_a_session_while_the_runtime_lives(gxx_project: Project):
    api = gxx_project.root / "inc" / "mylib" / "api.cuh"
    driver = gxx_project.driver(CACHEAUDIT_RUN="session-ca106")
    try:
        driver.compile()
        _write(api, "#pragma once\n#include <cutlite/tile.h>\n#define API_VALUE 300\n")
        # No lookup after the edit, so no hit proves it: the process table must tell.
        [stale] = [f for f in gxx_project.scan()["findings"] if f["code"] == "CA106"]
        assert os.path.samefile(stale["subject"], api) and stale["inferred"] is True
        assert f"process {driver.process.pid}" in stale["how"]
        assert "build directory" in stale["how"]
    finally:
        driver.close()
    # The process is gone: a new one computes the new key, nothing stale remains.
    assert not [f for f in gxx_project.scan()["findings"] if f["code"] == "CA106"]


def test_a_live_process_is_the_compiling_one_only_if_it_started_before_the_compile():
    import socket

    from cacheaudit.processes import alive_since

    host = socket.gethostname()
    assert alive_since(host, os.getpid(), time.time_ns())
    assert not alive_since(f"not-{host}", os.getpid(), time.time_ns())
    compiled_ns = time.time_ns()
    time.sleep(0.1)
    # A process that took a pid after the compile started is not the one that compiled.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert not alive_since(host, child.pid, compiled_ns)
        running_ns = time.time_ns()
        assert alive_since(host, child.pid, running_ns)
    finally:
        child.kill()
        child.wait()
    assert not alive_since(host, child.pid, running_ns)


def test_a_tracked_header_shadowed_while_the_runtime_lives_is_ca106_not_ca105(
        gxx_project: Project):
    original = gxx_project.root / "third" / "mylib" / "extra.cuh"
    shadow = gxx_project.root / "third_a" / "mylib" / "extra.cuh"
    _write(original, "#pragma once\n#define EXTRA_VALUE 1\n")
    source = "#include <mylib/extra.cuh>\n" + SOURCE
    driver = gxx_project.driver()
    try:
        driver.compile(source)
        _write(shadow, "#pragma once\n#define EXTRA_VALUE 2\n")
        findings = gxx_project.scan()["findings"]
    finally:
        driver.close()
    # DeepJIT's parser finds the shadow first: a new runtime misses. The one that hashed the
    # header by name, still running, keeps the old key.
    assert not [f for f in findings if f["code"] == "CA105"]
    [stale] = [f for f in findings if f["code"] == "CA106"]
    assert os.path.samefile(stale["subject"], original)
    assert os.path.samefile(stale["current"], shadow)


# ============================================================================================
# Review fixes: meta.json types, byte-exact reads, recipes the policy does not know, fail open
# ============================================================================================



@pytest.fixture
def gxx_project(tmp_path: Path) -> Project:
    project = Project(tmp_path, "gxx")
    project.setup()
    return project


def _entry_dir(project: Project) -> Path:
    [entry_dir] = list((project.cache / "cache").iterdir())
    return entry_dir


def _rewrite_meta(entry_dir: Path, change: Callable[[dict[str, Any]], None]) -> None:
    meta = json.loads((entry_dir / "meta.json").read_text())
    change(meta)
    (entry_dir / "meta.json").write_text(json.dumps(meta))


def _scan(project: Project) -> list[Finding]:
    with Ledger.open(str(project.ledger)) as ledger:
        return scan([str(project.cache)], project.env, ledger=ledger).findings


def test_non_string_include_dirs_give_evidence_not_a_crash(gxx_project: Project):
    gxx_project.once()
    _rewrite_meta(_entry_dir(gxx_project),
                  lambda meta: meta["config"].__setitem__("include_dirs", [1]))
    findings = _scan(gxx_project)
    corrupt = [f.message for f in findings if f.code == "CA402"]
    assert any("config.include_dirs (a JSON list, not a list of strings)" in m for m in corrupt)
    unverifiable = [f.message for f in findings if f.code == "CA501"]
    assert any("tracked set cannot be computed" in m and "include_dirs" in m
               for m in unverifiable), unverifiable


def test_a_string_of_prefixes_is_not_read_one_character_at_a_time(gxx_project: Project):
    gxx_project.once()
    _rewrite_meta(_entry_dir(gxx_project),
                  lambda meta: meta["config"].__setitem__("include_prefixes", "mylib/"))
    [entry] = list(reader_for("deepjit").read(str(gxx_project.cache), StateCache()))
    policy = policy_for("deepjit")
    tracked = policy.tracked(entry, None)
    assert tracked.names == {} and tracked.error is not None
    assert "include_prefixes (a JSON str, not a list of strings)" in tracked.error
    check = policy.check_key(entry)
    assert check.recomputed is None and "include_prefixes" in check.note


def test_an_error_judging_one_entry_is_ca501_for_it_and_the_scan_goes_on(
        gxx_project: Project, monkeypatch: pytest.MonkeyPatch):
    driver = gxx_project.driver()
    try:
        first = driver.compile()
        second = driver.compile(SOURCE.replace("void gemm", "void gemm2"), name="gemm2")
    finally:
        driver.close()
    policy = policy_for("deepjit")
    real_tracked = policy.tracked

    def tracked(entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        # An injected fault: stands for any case a policy does not foresee.
        if entry.path == second["path"]:
            raise RuntimeError("injected fault for this entry only")
        return real_tracked(entry, record)

    monkeypatch.setattr(policy, "tracked", tracked)
    findings = _scan(gxx_project)
    [failed] = [f for f in findings if f.code == "CA501" and f.entry == second["path"]]
    assert "RuntimeError: injected fault for this entry only" in failed.message
    assert "internal error at test_audit.py" in failed.how
    assert not any(f.code == "CA501" and f.entry == first["path"] for f in findings)


def test_crlf_headers_are_hashed_byte_for_byte_deepjit(gxx_project: Project):
    api = gxx_project.root / "inc" / "mylib" / "api.cuh"
    api.write_bytes(api.read_bytes().replace(b"\n", b"\r\n"))
    answer = gxx_project.once(SOURCE.replace("\n", "\r\n"))
    [entry] = list(reader_for("deepjit").read(str(gxx_project.cache), StateCache()))
    assert policy_for("deepjit").check_key(entry).recomputed == answer["key"] == entry.key


def _deepgemm_build(project: Project, monkeypatch: pytest.MonkeyPatch, library: Path,
                    source: str = DG_SOURCE) -> tuple[CacheEntry, CompileRecord]:
    from fixtures.minijit import DeepGemmRuntime

    env = dict(project.env, DG_JIT_CACHE_DIR=str(project.root / "dgcache"),
               CPLUS_INCLUDE_PATH=str(project.root / "third"))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    DeepGemmRuntime(library, backend=project.backend).build("dg_kernel", source)
    [entry] = [e for e in reader_for("deepgemm").read(str(project.root / "dgcache"),
                                                      StateCache()) if hasattr(e, "key")]
    with Ledger.open(str(project.ledger)) as ledger:
        record = ledger.records()[-1]
    return entry, record


def test_crlf_headers_are_hashed_byte_for_byte_deepgemm(gxx_project: Project,
                                                        monkeypatch: pytest.MonkeyPatch):
    library = _deepgemm_library(gxx_project.root)
    common = library / "include" / "deep_gemm" / "common.cuh"
    common.write_bytes(common.read_bytes().replace(b"\n", b"\r\n"))
    entry, record = _deepgemm_build(gxx_project, monkeypatch, library,
                                    DG_SOURCE.replace("\n", "\r\n"))
    assert policy_for("deepgemm").check_key(entry, record).recomputed == entry.key


def test_the_deepgemm_policy_outside_an_audit_remembers_no_header(
        gxx_project: Project, monkeypatch: pytest.MonkeyPatch):
    """The module's policy serves every caller of a long-lived process (the pytest plugin
    audits a session and each fixture): a tracked header edited between two calls is read
    again, so the recomputed key follows it (DeepGEMM itself would miss the old entry)."""
    library = _deepgemm_library(gxx_project.root)
    entry, record = _deepgemm_build(gxx_project, monkeypatch, library)
    policy = policy_for("deepgemm")
    assert policy.check_key(entry, record).recomputed == entry.key
    common = library / "include" / "deep_gemm" / "common.cuh"
    common.write_text(common.read_text() + "#define DG_EDITED 1\n")
    assert policy.check_key(entry, record).recomputed != entry.key


def _dg_library(root: Path) -> Path:
    """A DeepGEMM package as the Python JIT and the early C++ JIT saw it."""
    package = root / "pkg" / "deep_gemm"
    _write(package / "include" / "deep_gemm" / "common.cuh", "#pragma once\n")
    _write(package / "include" / "deep_gemm" / "impls" / "gemm.cuh",
           "#pragma once\n#include <deep_gemm/common.cuh>\n")
    _write(package / "include" / "deep_gemm" / "util.hpp", "#pragma once\n")
    _write(package / "jit" / "interleave_ffma.py", "# rewrites the cubin\n")
    return package / "include"


def _dg_entry(root: Path, key: str, source: str) -> CacheEntry:
    entry_dir = root / "cache" / "cache" / f"kernel.gemm.{key}"
    _write(entry_dir / "kernel.cu", source)
    (entry_dir / "kernel.cubin").write_bytes(b"\x7fELF cubin")
    [entry] = [e for e in reader_for("deepgemm").read(str(root / "cache"), StateCache())
               if isinstance(e, CacheEntry)]
    return entry


def _dg_record(include: Path) -> CompileRecord:
    return CompileRecord(record_id=new_record_id(), event="compile", started_ns=1,
                         effective_argv=(ArgToken(f"-I{include}"),), observer="test")


def test_python_jit_keys_are_recomputed_and_track_what_that_jit_hashed(tmp_path: Path):
    include = _dg_library(tmp_path)
    entry = _dg_entry(tmp_path, "0123456789ab", "#include <deep_gemm/impls/gemm.cuh>\n")
    policy = policy_for("deepgemm")
    check = policy.check_key(entry, _dg_record(include))
    # The made-up key is no md5 of this entry's inputs: recomputed, it leads elsewhere (the
    # recipe against the runtime's own keys: tests/test_deepgemm_scan.py).
    assert check.recomputed is not None and check.matches(entry.key) is False, check
    tracked = policy.tracked(entry, _dg_record(include))
    assert tracked.error is None
    # get_deep_gemm_version(): top-level *.cuh (not impls/, not .hpp) and interleave_ffma.py.
    assert tracked.names == {
        "deep_gemm/common.cuh": str(include / "deep_gemm" / "common.cuh"),
        "jit/interleave_ffma.py": str(include.parent / "jit" / "interleave_ffma.py")}


def test_entries_before_the_include_hash_line_are_not_recomputed(tmp_path: Path):
    include = _dg_library(tmp_path)
    entry = _dg_entry(tmp_path, "0123456789abcdef0123456789abcdef",
                      "#include <deep_gemm/common.cuh>\n")
    policy = policy_for("deepgemm")
    check = policy.check_key(entry, _dg_record(include))
    assert check.recomputed is None and "7f2a703" in check.note
    tracked = policy.tracked(entry, _dg_record(include))
    # get_library_version(): every .cuh under include/deep_gemm, whatever kernel.cu includes.
    assert set(tracked.names) == {"deep_gemm/common.cuh", "deep_gemm/impls/gemm.cuh"}


def test_gxx_stand_in_version_change_is_in_the_deepgemm_key():
    def gxx(version: str) -> CompilerIdentity:
        return CompilerIdentity(invoked="g++", path="/usr/bin/g++", resolved="/usr/bin/g++",
                                kind="gcc", digest="0" * 32,
                                version_text=f"g++ (Debian {version}-14) {version}\n"
                                             "Copyright (C) 2022 Free Software Foundation\n")

    policy = policy_for("deepgemm")
    assert policy.compiler_change_in_key(gxx("12.2.0"), gxx("13.1.0")) is True
    assert policy.compiler_change_in_key(gxx("12.2.0"), gxx("12.2.1")) is False


def _deepjit_entry(root: Path, files: dict[str, bytes]) -> CacheEntry:
    entry_dir = root / "cache" / f"gemm.{'0' * 32}"
    entry_dir.mkdir(parents=True)
    for name, data in files.items():
        (entry_dir / name).write_bytes(data)
    [entry] = [e for e in reader_for("deepjit").read(str(root), StateCache())
               if isinstance(e, CacheEntry)]
    return entry


def test_tracked_errors_name_the_real_source_file(tmp_path: Path):
    meta = json.dumps({"backend": "ROCm", "command": "hipcc", "config": {
        "python_library_root": "/", "extra_signature": "", "include_dirs": [],
        "include_prefixes": []}, "compiler_info": {"path": "hipcc", "version": "HIP 6"},
        "compiler_options": {}}).encode()
    rocm = _deepjit_entry(tmp_path / "rocm", {"kernel.hsaco": b"\x7fELF", "meta.json": meta,
                                              ".committed": b""})
    policy = policy_for("deepjit")
    assert policy.tracked(rocm, None).error == "kernel.hip is missing"
    check = policy.check_key(rocm)
    assert check.recomputed is None and "kernel.hip" in check.note and "CUDA" in check.note

    fifo = _deepjit_entry(tmp_path / "fifo", {"kernel.cubin": b"\x7fELF", ".committed": b""})
    os.mkfifo(os.path.join(fifo.path, "kernel.cu"))
    [fifo] = [e for e in reader_for("deepjit").read(str(tmp_path / "fifo"), StateCache())
              if isinstance(e, CacheEntry)]
    with deadline():
        error = policy.tracked(fifo, None).error
    assert error == "kernel.cu cannot be read: not a regular file"


def test_fifo_sources_and_headers_do_not_hang_the_policies(gxx_project: Project, tmp_path: Path):
    gxx_project.once()
    api = gxx_project.root / "inc" / "mylib" / "api.cuh"
    api.unlink()
    os.mkfifo(api)
    [entry] = list(reader_for("deepjit").read(str(gxx_project.cache), StateCache()))
    policy = policy_for("deepjit")
    with deadline():
        tracked = policy.tracked(entry, None)
        check = policy.check_key(entry)
    assert tracked.error is not None and "not a regular file" in tracked.error
    assert check.recomputed is None and "not a regular file" in check.note

    include = _dg_library(tmp_path / "dg")
    dg = _dg_entry(tmp_path / "dg", "f" * 32,
                   "// Includes' hash value: " + "a" * 32 + "\n#include <deep_gemm/common.cuh>\n")
    common = include / "deep_gemm" / "common.cuh"
    common.unlink()
    os.mkfifo(common)
    with deadline():
        tracked = policy_for("deepgemm").tracked(dg, _dg_record(include))
        check = policy_for("deepgemm").check_key(dg, _dg_record(include))
    assert tracked.error is not None and "not a regular file" in tracked.error
    assert check.recomputed is None and "not a regular file" in check.note


def test_every_finding_code_comes_with_a_fix():
    from cacheaudit.findings import HINTS, make_finding
    from cacheaudit.model import FINDING_CODES

    assert set(HINTS) == set(FINDING_CODES)
    assert make_finding("CA204", subject="DG_JIT_CPP_STANDARD", message="changed").hint.startswith(
        "restart the process")


def test_a_session_compile_without_a_pid_named_build_directory_is_judged_by_the_shim_record():
    """A runtime that compiles elsewhere than `tmp/<pid>-...` (or through a wrapper script):
    the process the shim recorded tells whether the runtime that hashed the headers lives."""
    import socket

    from cacheaudit.audit import live_process
    from cacheaudit.processes import process_stat

    policy = policy_for("deepjit")
    host = socket.gethostname()

    def record_from(pid: int) -> CompileRecord:
        stat = process_stat(pid)
        assert stat is not None
        return CompileRecord(record_id=new_record_id(), event="compile",
                             started_ns=time.time_ns(), cwd="/work/build", host=host,
                             run_uuid="session-2",
                             runtime_process=f"{host}:{pid}:{stat[2]}")

    live = live_process(record_from(os.getpid()), policy)
    assert live is not None and live[0] == os.getpid() and "shim recorded" in live[1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        gone = record_from(child.pid)
    finally:
        child.kill()
        child.wait()
    assert live_process(gone, policy) is None


# ------------------------------------------------------------------------------ unknown runtimes

_TOY_LAYOUT = '''
import os

from cacheaudit.layout import Layout
from cacheaudit.model import CacheEntry


class ToyLayout(Layout):
    """<root>/TOYCACHE marks a root; each directory under it is an entry: kernel.cu, kernel.bin."""

    layout = runtime = {runtime!r}

    def default_roots(self, env):
        return []

    def is_root(self, path):
        return os.path.isfile(os.path.join(path, "TOYCACHE"))

    def read(self, root, cache):
        for name in sorted(os.listdir(root)):
            path = os.path.join(root, name)
            if os.path.isdir(path):
                yield CacheEntry(runtime=self.runtime, layout=self.layout, root=root, path=path,
                                 kernel=name, key=name,
                                 binary=cache.capture(os.path.join(path, "kernel.bin")),
                                 source=cache.capture(os.path.join(path, "kernel.cu")))


LAYOUT = ToyLayout()
'''

_TOY_POLICY = '''
from cacheaudit.policy import Policy, TrackedSet


class ToyPolicy(Policy):
    runtime = {runtime!r}

    def tracked(self, entry, record):
        return TrackedSet(frozenset({{entry.source.path}}), how="the toy's key: its source")


POLICIES = {{{runtime!r}: ToyPolicy()}}
'''


@pytest.fixture
def toy_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Adds a runtime from outside cacheaudit (a package named in CACHEAUDIT_RUNTIMES) whose
    cache holds two real entries; returns a function (runtime id, with a policy?) -> the root."""
    from cacheaudit import runtimes

    def forget() -> None:
        runtimes.reset()
        for name in [m for m in sys.modules if m.startswith("toy_audit_runtime")]:
            del sys.modules[name]

    def install(runtime: str, *, policy: bool) -> Path:
        package = tmp_path / "plugins" / "toy_audit_runtime"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "spec.py").write_text(
            "from cacheaudit.spec import RuntimeSpec\n"
            f"SPEC = RuntimeSpec(name={runtime!r}, title='Toy JIT', layout='layout', "
            f"policy={'policy' if policy else None!r})\n")
        (package / "layout.py").write_text(_TOY_LAYOUT.format(runtime=runtime))
        if policy:
            (package / "policy.py").write_text(_TOY_POLICY.format(runtime=runtime))
        monkeypatch.syspath_prepend(str(tmp_path / "plugins"))
        monkeypatch.setenv("CACHEAUDIT_RUNTIMES", "toy_audit_runtime")
        forget()
        root = tmp_path / "toycache"
        root.mkdir()
        (root / "TOYCACHE").write_text("")
        for kernel in ("gemm", "scale"):
            (root / kernel).mkdir()
            (root / kernel / "kernel.cu").write_text(f"__global__ void {kernel}() {{}}\n")
            (root / kernel / "kernel.bin").write_bytes(f"binary of {kernel}".encode())
        return root

    yield install
    forget()


def test_an_entry_whose_runtime_has_no_policy_is_unverified_and_the_scan_goes_on(
        toy_runtime: Callable[..., Path], tmp_path: Path):
    root = toy_runtime("toy-without-policy", policy=False)
    # CPATH set: the scan-wide environment check asks the registry about every scanned runtime.
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        result = scan([str(root)], {"CPATH": str(tmp_path / "inc")}, ledger=ledger)
    assert sorted(e.kernel for e in result.entries) == ["gemm", "scale"]
    unverified = [f for f in result.findings if f.code == "CA501"]
    assert sorted(f.entry for f in unverified) == [str(root / "gemm"), str(root / "scale")]
    assert all("no policy for runtime 'toy-without-policy'" in f.message for f in unverified)
    assert not any(f.code == "CA201" for f in result.findings)


def test_an_entry_the_environment_registry_does_not_know_is_unverified(
        toy_runtime: Callable[..., Path], tmp_path: Path):
    # The toy runtime has a spec and a policy but declares no environment: which variables its
    # key misses is unknown, so CA201/CA202 cannot be judged for its entries.
    root = toy_runtime("toy-unregistered", policy=True)
    result = scan([str(root)], {"CPATH": str(tmp_path / "inc")})
    registry = [f for f in result.findings if f.code == "CA501" and "registry" in f.message]
    assert sorted(f.entry for f in registry) == [str(root / "gemm"), str(root / "scale")]
    assert all("it declares no environment variables" in f.message for f in registry)
    # Judged as far as the rest goes: no ledger, so no recorded compile to verify either.
    assert sum(1 for f in result.findings if "no recorded compile" in f.message) == 2
    assert not any(f.code == "CA201" for f in result.findings)
