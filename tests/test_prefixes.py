"""A library built on DeepJIT under an env prefix of its own (`MYLIB_JIT_*`), issue 12 case 5.

DeepJIT lets each library choose its prefix (`deep_jit::Config(root, "MYLIB", ...)`) and reads
`<P>_<SUFFIX>`, then `DJ_<SUFFIX>`, then the default. The reference runtime (fixtures/minijit)
runs in its own process (tests/minijit_driver.py) under the prefix MYLIB; ground truth comes
from the same request compiled into an empty cache with cacheaudit disabled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.ledger import Ledger, ingest_spool
from cacheaudit.model import CompileRecord
from tests.support import GXX, needs_gxx
from tests.truth_table import DRIVER, SOURCE, Project, _digest, _write

pytestmark = needs_gxx

PREFIX = "MYLIB"


def _project(tmp_path: Path) -> Project:
    """The truth table's header tree and masquerade directory, configured through MYLIB_ only
    (no DG_, EP_ or DJ_ variable set)."""
    project = Project(tmp_path, "gxx")
    project.setup()
    for name in ("DG_JIT_CACHE_DIR", "DG_JIT_NVCC_COMPILER"):
        project.env.pop(name)
    project.env[f"{PREFIX}_JIT_CACHE_DIR"] = str(project.cache)
    return project


def _compile(project: Project, env: dict[str, str], argv_head: tuple[str, ...] = ()
             ) -> dict[str, Any]:
    """One request to a MYLIB runtime in a new process (optionally under `argv_head`, such as
    `cacheaudit run --`): its answer, with the served binary's digest."""
    config = json.dumps({"root": str(project.root), "backend": "gxx", "prefix": PREFIX,
                         "include_dirs": [str(d) for d in project.include_dirs],
                         "include_prefixes": ["mylib/"]})
    request = json.dumps({"op": "compile", "name": "gemm", "source": SOURCE}) + "\n"
    done = subprocess.run([*argv_head, sys.executable, str(DRIVER), config], input=request,
                          capture_output=True, text=True, env=env, cwd=project.root, timeout=300)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout.splitlines()[0])
    assert answer["event"] != "error", answer
    answer["digest"] = _digest(answer.get("binary"))
    return answer


def _fresh(project: Project, **changes: str) -> dict[str, Any]:
    """The ground truth: the same request, unrecorded, into an empty cache."""
    cache = project.root / f"fresh-{len(list(project.root.glob('fresh-*')))}"
    env = {**project.env, f"{PREFIX}_JIT_CACHE_DIR": str(cache), "CACHEAUDIT_DISABLE": "1",
           **changes}
    return _compile(project, env)


def _scan(project: Project, *roots: str, **changes: str | None
          ) -> tuple[int, dict[str, Any], str]:
    env = {**project.env, **changes}
    env = {name: value for name, value in env.items() if value is not None}
    done = subprocess.run(
        [sys.executable, "-m", "cacheaudit", "scan", *roots, "--json", "--ledger",
         str(project.ledger), "--fail-on", "never", "--no-progress"],
        capture_output=True, text=True, env=env, cwd=project.root, timeout=600)
    return done.returncode, json.loads(done.stdout) if done.stdout.strip() else {}, done.stderr


def _records(ledger: Path) -> list[CompileRecord]:
    with Ledger.open(str(ledger)) as opened:
        ingest_spool(opened)
        return opened.records()


def test_default_scan_finds_a_custom_prefix_root_and_its_untracked_edit(tmp_path: Path):
    project = _project(tmp_path)
    recorded = {**project.env,
                f"{PREFIX}_JIT_NVCC_COMPILER": str(project.root / "masq" / "g++")}
    built = _compile(project, recorded)
    assert built["event"] == "compile"
    detail = project.root / "third" / "cutlite" / "detail.h"
    _write(detail, "#pragma once\n#define DETAIL 2\n")  # outside the tracked mylib/ prefix
    served = _compile(project, recorded)
    fresh = _fresh(project)
    assert served["event"] == "disk-hit" and served["path"] == built["path"]
    assert served["digest"] != fresh["digest"], "ground truth: the served binary is stale"

    status, report, stderr = _scan(project)  # no root named: the default roots
    assert status == 0, stderr
    scanned = {(root["layout"], root["root"]) for root in report["roots"]}
    assert ("deepjit", str(project.cache)) in scanned, (
        f"the default scan did not read {PREFIX}_JIT_CACHE_DIR's root {project.cache}: {scanned}")
    untracked = [f for f in report["findings"] if f["code"] == "CA101"
                 and f.get("subject") == str(detail)]
    assert untracked, f"no CA101 naming {detail}: {report['findings']}"
    assert {f.get("entry") for f in untracked} == {built["path"]}, untracked


def test_run_points_a_custom_prefix_compiler_setting_at_the_shim(tmp_path: Path):
    assert GXX is not None
    project = _project(tmp_path)
    env = {**project.env, f"{PREFIX}_JIT_NVCC_COMPILER": GXX}
    # As a user runs it: no masquerade directory of their own on PATH.
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if p != str(project.root / "masq"))
    ledger = project.root / "run-ledger.db"
    run = _compile(project, env, (sys.executable, "-m", "cacheaudit", "run", "--ledger",
                                  str(ledger), "--"))
    plain = _fresh(project, PATH=env["PATH"], **{f"{PREFIX}_JIT_NVCC_COMPILER": GXX})
    assert run["event"] == plain["event"] == "compile"
    assert (run["key"], run["digest"]) == (plain["key"], plain["digest"]), (
        f"the session changed what {PREFIX}_JIT_NVCC_COMPILER={GXX} compiles or keys")
    shim = [r for r in _records(ledger) if r.observer.startswith("shim:") and r.event == "compile"
            and any(os.path.basename(s.path) == "kernel.cu" for s in r.sources)]
    assert shim, f"no shim record of the compile {PREFIX}_JIT_NVCC_COMPILER={GXX} ran"
    assert shim[0].compiler is not None
    assert os.path.realpath(shim[0].compiler.path) == os.path.realpath(GXX), shim[0].compiler


def test_session_never_fills_in_a_custom_prefix_setting(tmp_path: Path):
    from cacheaudit.session import prepare
    from cacheaudit.shim import real_variable, stand_in_name

    assert GXX is not None
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(tmp_path),
           "XDG_CACHE_HOME": str(tmp_path / "xdg"), f"{PREFIX}_JIT_NVCC_COMPILER": GXX}
    session = prepare(env, ledger=str(tmp_path / "l.db"), label="t")
    try:
        pointed = session.env[f"{PREFIX}_JIT_NVCC_COMPILER"]
        assert pointed.startswith(session.shims + os.sep), pointed
        assert session.env[real_variable(stand_in_name(GXX, "nvcc"))] == GXX
        # A prefix the user did not set: which names the runtime reads nobody can tell.
        assert "OTHER_JIT_NVCC_COMPILER" not in session.env
        bare = prepare({k: v for k, v in env.items() if not k.startswith(PREFIX)},
                       ledger=str(tmp_path / "l.db"), label="t")
        assert not any(k.startswith(f"{PREFIX}_") for k in bare.env), bare.env
        bare.close()
    finally:
        session.close()


def test_prefix_fallback_is_judged_for_the_entrys_own_prefix(tmp_path: Path):
    project = _project(tmp_path)
    recorded = {**project.env,
                f"{PREFIX}_JIT_NVCC_COMPILER": str(project.root / "masq" / "g++")}
    built = _compile(project, recorded)
    # Ground truth that a MYLIB runtime takes DJ_ when MYLIB_ is unset: the key changes.
    plain = _fresh(project)
    with_fallback = _fresh(project, DJ_JIT_WITH_LINEINFO="1")
    assert plain["key"] == built["key"] != with_fallback["key"]

    status, report, stderr = _scan(project, str(project.cache), DJ_JIT_WITH_LINEINFO="1")
    assert status == 0, stderr
    notes = [f for f in report["findings"] if f["code"] == "CA203"]
    subjects = {f.get("subject") for f in notes}
    assert f"{PREFIX}_JIT_WITH_LINEINFO" in subjects, (
        f"no CA203 for {PREFIX}_JIT_WITH_LINEINFO falling back to DJ_: {notes}")
    guessed = sorted(s for s in subjects if s and s.startswith(("DG_", "EP_")))
    assert not guessed, f"CA203 guessed DG_/EP_ for the {PREFIX} entry {built['path']}: {guessed}"


@pytest.mark.parametrize("name, runtime_reads", [
    (f"{PREFIX}_JIT_DEBUG", True), (f"{PREFIX}_JIT_CACHE_DIR", True),
    ("PYTORCH_JIT_LOG_LEVEL", False)])
def test_registry_knows_custom_prefix_names_as_deepjits(name: str, runtime_reads: bool):
    from cacheaudit import envvars

    variable = envvars.lookup(name)
    assert (variable is not None and "deepjit" in variable.runtimes) is runtime_reads, variable
    kept = envvars.compile_environment({name: "1"}, "deepjit")
    assert (name in kept) is runtime_reads, kept

