"""`cacheaudit run`, the start-up hook and `cacheaudit combine`, run as a user would."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from cacheaudit.ledger import Ledger, RunInfo, new_record_id
from cacheaudit.model import CompileRecord, FileState, GraphFile, IncludeGraph

from support import deepgemm_library

ROOT = Path(__file__).resolve().parent.parent


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "DG_", "EP_", "DJ_", "PYTEST_", "NVCC_"))
           and k not in ("CPATH", "CXX", "CC", "TORCH_EXTENSIONS_DIR")}
    env.update(HOME=str(tmp_path / "home"), **extra)
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
from fixtures.minijit import Config, Runtime
tree = {tree!r}
os.environ["DG_JIT_CACHE_DIR"] = os.path.join(tree, "cache")
runtime = Runtime(Config(tree, "DG", include_dirs=[os.path.join(tree, "inc")],
                         include_prefixes=["mylib/"]))
source = "#include <mylib/api.cuh>\\nint v() {{ return API; }}\\n"
print("minijit", runtime.compile("gemm", source).event)
if {with_torch}:
    os.environ["TORCH_EXTENSIONS_DIR"] = os.path.join(tree, "torch_extensions")
    from torch.utils.cpp_extension import load
    print("torch", load(name="plain", sources=[os.path.join(tree, "plain.cpp")],
                        is_python_module=False))
"""


def _tree(tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    (tree / "inc" / "mylib").mkdir(parents=True)
    (tree / "inc" / "mylib" / "api.cuh").write_text("#pragma once\n#define API 1\n")
    (tree / "plain.cpp").write_text('extern "C" int answer() { return 42; }\n')
    return tree


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          text=True, env=env, cwd=cwd, timeout=600)


@pytest.mark.parametrize("with_torch", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_run_records_a_script_without_changing_it(tmp_path: Path, with_torch: bool):
    if with_torch:
        pytest.importorskip("torch", reason="torch is not installed")
    tree = _tree(tmp_path)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(root=str(ROOT), tree=str(tree), with_torch=with_torch))
    ledger = tmp_path / "ledger.db"
    env = _clean_env(tmp_path)
    done = _run(["run", "--ledger", str(ledger), "--report-json", str(tmp_path / "r.json"),
                 "--", sys.executable, str(script)], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "minijit compile" in done.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_status"] == 0 and report["events"]["compile"] >= 1
    with Ledger.open(str(ledger)) as opened:
        records = opened.records()
    compiled = [r for r in records if r.event == "compile"]
    sources = {os.path.basename(s.path) for r in compiled for s in r.sources}
    assert "kernel.cu" in sources  # the minijit kernel, through the shim
    if with_torch:
        assert "plain.cpp" in sources  # torch's ninja build, through the masqueraded c++
    assert len({r.run_uuid for r in records}) == 1


def test_run_keeps_the_exit_status_unless_fail_on(tmp_path: Path):
    tree = _tree(tmp_path)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(root=str(ROOT), tree=str(tree), with_torch=False))
    env = _clean_env(tmp_path)
    ledger = str(tmp_path / "ledger.db")
    assert _run(["run", "--ledger", ledger, "--", sys.executable, "-c",
                 "raise SystemExit(7)"], env, tmp_path).returncode == 7
    first = _run(["run", "--ledger", ledger, "--", sys.executable, str(script)], env, tmp_path)
    assert first.returncode == 0, first.stderr
    # The tracked header is fine to edit (the key covers it); an untracked one is not.
    (tree / "inc" / "extra.h").write_text("#define EXTRA 1\n")
    (tree / "inc" / "mylib" / "api.cuh").write_text(
        "#pragma once\n#include <extra.h>\n#define API 1\n")
    rebuilt = _run(["run", "--ledger", ledger, "--fail-on", "error", "--", sys.executable,
                    str(script)], env, tmp_path)
    assert rebuilt.returncode == 0, rebuilt.stderr + rebuilt.stdout
    (tree / "inc" / "extra.h").write_text("#define EXTRA 2\n")
    stale = _run(["run", "--ledger", ledger, "--fail-on", "error", "--", sys.executable,
                  str(script)], env, tmp_path)
    assert "minijit disk-hit" in stale.stdout
    assert stale.returncode == 1 and "CA101" in stale.stderr
    lenient = _run(["run", "--ledger", ledger, "--", sys.executable, str(script)], env, tmp_path)
    assert lenient.returncode == 0


def test_start_up_hook_is_installed_gated_and_idempotent(tmp_path: Path):
    site = Path(sysconfig.get_paths()["purelib"])
    assert (site / "cacheaudit-startup.pth").exists()
    assert (site / "cacheaudit-startup.start").read_text().strip().endswith(
        "cacheaudit.startup:pth_entry")
    probe = ("import sys, os; print(json.dumps({'loaded': 'cacheaudit' in sys.modules, "
             "'shims': os.environ.get('CACHEAUDIT_SHIMS'), "
             "'again': __import__('cacheaudit.startup').startup.process_startup() "
             "if 'cacheaudit' in sys.modules else None}))")
    probe = "import json; " + probe
    off = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         env=_clean_env(tmp_path), check=True)
    assert json.loads(off.stdout) == {"loaded": False, "shims": None, "again": None}
    on_env = _clean_env(tmp_path, CACHEAUDIT="1", CACHEAUDIT_LEDGER=str(tmp_path / "l.db"))
    on = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                   env=on_env, check=True).stdout)
    assert on["loaded"] and on["shims"] and on["again"] is False
    opted_out = dict(on_env, CACHEAUDIT_DISABLE="1")
    out = json.loads(subprocess.run([sys.executable, "-c", probe], capture_output=True,
                                    text=True, env=opted_out, check=True).stdout)
    assert out == {"loaded": False, "shims": None, "again": None}


def test_child_python_processes_inherit_the_hook(tmp_path: Path):
    # Armed: the hook's finder waits on sys.meta_path for a runtime's first import.
    child = ("import sys, os, json; print(json.dumps([any(type(f).__module__ == "
             "'cacheaudit.importhooks' for f in sys.meta_path), "
             "os.environ.get('CACHEAUDIT_RUN')]))")
    parent = textwrap.dedent(f"""
        import os, subprocess, sys, json
        run = os.environ["CACHEAUDIT_RUN"]
        out = subprocess.run([sys.executable, "-c", {child!r}], capture_output=True,
                             text=True).stdout
        print(json.dumps([run, json.loads(out)]))
    """)
    env = _clean_env(tmp_path, CACHEAUDIT="1", CACHEAUDIT_LEDGER=str(tmp_path / "l.db"))
    done = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True,
                          env=env, check=True)
    run, (armed, inherited) = json.loads(done.stdout)
    assert armed and inherited == run


def _ledger(path: Path, kernels: list[str], graph: IncludeGraph) -> list[str]:
    ids = []
    with Ledger.open(str(path)) as ledger:
        for kernel in kernels:
            record = CompileRecord(record_id=new_record_id(), event="compile", started_ns=1,
                                   kernel=kernel, graph=graph, observer="test")
            ledger.add_records([record], RunInfo(run_uuid=f"run-{path.name}", label="t"))
            ids.append(record.record_id)
    return ids


def test_combine_merges_without_duplicates(tmp_path: Path):
    graph = IncludeGraph(tuple(GraphFile(FileState(f"/inc/h{i}.h", True, i, 1, 1, i,
                                                   f"{i:032x}"), f"/inc/h{i}.h")
                               for i in range(50)), "g++ -M")
    a = _ledger(tmp_path / "a.db", ["k1", "k2"], graph)
    b = _ledger(tmp_path / "b.db", ["k3"], graph)
    (tmp_path / "junk.db").write_text("not a ledger")
    target = tmp_path / "all.db"
    env = _clean_env(tmp_path)
    done = _run(["combine", "--ledger", str(target), str(tmp_path / "a.db"),
                 str(tmp_path / "b.db"), str(tmp_path / "junk.db")], env, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "skipped" in done.stderr and "junk.db" in done.stderr
    assert (tmp_path / "junk.db").exists()
    assert not (tmp_path / "a.db").exists() and not (tmp_path / "b.db").exists()
    conn = sqlite3.connect(target)
    assert sorted(r[0] for r in conn.execute("SELECT record_uuid FROM records")) == sorted(a + b)
    assert conn.execute("SELECT count(*) FROM graphs WHERE method = 'g++ -M'").fetchone()[0] == 1
    assert conn.execute("SELECT count(*) FROM file_states").fetchone()[0] == 50
    assert conn.execute("SELECT count(*) FROM runs").fetchone()[0] == 2


def test_sessions_share_one_masquerade_directory(tmp_path: Path):
    import shutil

    from cacheaudit.session import prepare

    gxx = shutil.which("g++")
    if gxx is None:
        pytest.skip("g++ is not installed")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home"),
           "XDG_CACHE_HOME": str(tmp_path / "cache")}
    # CC, not CXX, for the path: where torch is importable the session leaves a CXX given by
    # path as it is (Inductor keys its text; tests/test_inductor.py).
    first = prepare({**env, "CXX": "g++"}, ledger=str(tmp_path / "l.db"), label="one")
    second = prepare({**env, "CC": gxx}, ledger=str(tmp_path / "l.db"), label="two")
    first.close()
    second.close()
    # One directory for every session of this installation, kept: a path that changed per
    # session would change torch's build.ninja and rebuild every extension.
    assert first.shims == second.shims and os.path.isdir(first.shims)
    assert first.shims.startswith(str(tmp_path / "cache"))
    assert first.env["PATH"].split(os.pathsep)[0] == first.shims
    # A bare masquerade name is left alone (PATH finds the shim); a path gets a link of its own.
    assert first.env["CXX"] == "g++"
    assert os.path.dirname(second.env["CC"]) == second.shims
    assert second.env["CC"].endswith("-g++")
    version = subprocess.run([second.env["CC"], "--version"], capture_output=True, text=True,
                             env=second.env, timeout=60)
    assert version.returncode == 0 and version.stdout == subprocess.run(
        [gxx, "--version"], capture_output=True, text=True, timeout=60).stdout


def test_a_shared_masquerade_directory_changed_since_its_stamp_is_installed_again(
        tmp_path: Path):
    """The stamp beside the shared directory spares a session the link-by-link check only
    while the directory is as the last install left it: a link removed, or a launcher
    rewritten, is put back by the next session."""
    from cacheaudit.session import shared_shims
    from cacheaudit.shim import LAUNCHER, MASQUERADE_NAMES, masquerade_ready

    env = {"HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "cache")}
    shims = shared_shims(env)
    assert shims is not None and masquerade_ready(shims), f"{shims}: no stamp after install"
    assert shared_shims(env) == shims
    gone = os.path.join(shims, MASQUERADE_NAMES[0])
    os.remove(gone)
    assert not masquerade_ready(shims), f"{gone} removed, yet the stamp still holds"
    assert shared_shims(env) == shims and os.path.islink(gone), f"{gone} not put back"
    assert masquerade_ready(shims)
    launcher = os.path.join(shims, LAUNCHER)
    with open(launcher, "a", encoding="utf-8") as handle:  # in place: the directory unchanged
        handle.write("# edited\n")
    assert not masquerade_ready(shims), f"{launcher} edited, yet the stamp still holds"
    shared_shims(env)
    with open(launcher, encoding="utf-8") as handle:
        assert "# edited" not in handle.read(), f"{launcher} not rewritten"


def _fake_compiler(path: Path, says: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\necho {says}\n")
    path.chmod(0o755)
    return path


def test_each_compiler_setting_keeps_the_compiler_it_named(tmp_path: Path):
    from cacheaudit.session import prepare

    old = _fake_compiler(tmp_path / "cuda-12.8" / "bin" / "nvcc", "nvcc-12.8")
    new = _fake_compiler(tmp_path / "cuda-13" / "bin" / "nvcc", "nvcc-13")
    _fake_compiler(tmp_path / "bin" / "g++-99", "gxx-99")
    env = {"PATH": os.pathsep.join([str(tmp_path / "bin"), os.environ.get("PATH", "")]),
           "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "DG_JIT_NVCC_COMPILER": str(old), "FLASHINFER_NVCC": str(new), "CXX": "g++-99",
           "CC": "ccache gcc"}
    session = prepare(env, ledger=str(tmp_path / "l.db"), label="t")

    def says(command: str) -> str:
        done = subprocess.run([command, "--version"], capture_output=True, text=True,
                              env=session.env, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert says(session.env["DG_JIT_NVCC_COMPILER"]) == "nvcc-12.8"
    assert says(session.env["FLASHINFER_NVCC"]) == "nvcc-13"
    assert says(session.env["CXX"]) == "gxx-99"
    # What the settings named never leaks into a bare name run in the session.
    assert says("c++") != "gxx-99"
    # A wrapper command line is left as it is: the wrapper runs gcc, which PATH leads to the shim.
    assert session.env["CC"] == "ccache gcc"


def test_runtimes_find_the_toolkit_they_found_before_the_session(tmp_path: Path):
    """Without CUDA_HOME, torch, DeepJIT, DeepGEMM and DeepEP take dirname(dirname(which nvcc)):
    the shims first on PATH must not become their CUDA home."""
    from cacheaudit.session import prepare

    toolkit = tmp_path / "cuda-13.0"
    real = _fake_compiler(toolkit / "bin" / "nvcc", "nvcc-13.0")
    env = {**_clean_env(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PATH": os.pathsep.join([str(toolkit / "bin"), os.environ.get("PATH", "")])}
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    session = prepare(env, ledger=str(tmp_path / "l.db"), label="t")
    assert session.env["CUDA_HOME"] == str(toolkit)
    # torch's own discovery (CUDA_HOME itself is None in a CPU build of torch).
    found = subprocess.run(
        [sys.executable, "-W", "ignore", "-c",
         "from torch.utils.cpp_extension import _find_cuda_home; print(_find_cuda_home())"],
        capture_output=True, text=True, env=session.env, timeout=300)
    if "No module named 'torch'" in found.stderr:
        pytest.skip("torch is not installed")
    assert found.stdout.strip() == str(toolkit), found.stderr
    # DeepGEMM <= 2.6 and DeepEP EPv2 read only their own prefix: each is pointed at a shim that
    # hands over to the nvcc they would have run, as is DeepJIT's DJ_ fallback.
    for setting in ("DG_JIT_NVCC_COMPILER", "EP_JIT_NVCC_COMPILER", "DJ_JIT_NVCC_COMPILER"):
        stand_in = session.env[setting]
        assert os.path.dirname(stand_in) == session.shims
        done = subprocess.run([stand_in, "--version"], capture_output=True, text=True,
                              env=session.env, timeout=60)
        assert done.stdout.strip() == "nvcc-13.0", (setting, done.stderr)
    assert real.exists()


def test_a_dj_setting_stays_the_one_deepjit_prefixes_fall_back_to(tmp_path: Path):
    from cacheaudit.session import prepare

    chosen = _fake_compiler(tmp_path / "opt" / "bin" / "nvcc", "nvcc-chosen")
    _fake_compiler(tmp_path / "cuda" / "bin" / "nvcc", "nvcc-default")
    env = {**_clean_env(tmp_path), "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "CUDA_HOME": str(tmp_path / "cuda"), "DJ_JIT_NVCC_COMPILER": str(chosen)}
    session = prepare(env, ledger=str(tmp_path / "l.db"), label="t")
    # Filling in DG_ would override the DJ_ fallback of DeepGEMM 2.8 and run another compiler.
    assert "DG_JIT_NVCC_COMPILER" not in session.env
    assert "EP_JIT_NVCC_COMPILER" not in session.env
    assert session.env["CUDA_HOME"] == str(tmp_path / "cuda")
    done = subprocess.run([session.env["DJ_JIT_NVCC_COMPILER"], "--version"],
                          capture_output=True, text=True, env=session.env, timeout=60)
    assert done.stdout.strip() == "nvcc-chosen", done.stderr


def test_an_unwritable_cache_gets_a_temporary_masquerade_directory(tmp_path: Path):
    from cacheaudit.session import prepare

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    env = {"PATH": os.environ.get("PATH", ""), "XDG_CACHE_HOME": str(blocked)}
    session = prepare(env, ledger=str(tmp_path / "l.db"), label="t")
    assert os.path.isdir(session.shims) and not session.shims.startswith(str(blocked))
    session.close()
    assert not os.path.exists(session.shims)


@pytest.mark.slow
def test_a_torch_extension_is_not_rebuilt_by_the_next_session(tmp_path: Path):
    import shutil

    pytest.importorskip("torch", reason="torch is not installed")
    compiler = shutil.which("c++")
    if compiler is None:
        pytest.skip("c++ is not installed")
    tree = _tree(tmp_path)
    script = tmp_path / "script.py"
    script.write_text(SCRIPT.format(root=str(ROOT), tree=str(tree), with_torch=True))
    ledger = tmp_path / "ledger.db"
    env = _clean_env(tmp_path, CXX=compiler, XDG_CACHE_HOME=str(tmp_path / "cache"))
    for _ in range(2):
        done = _run(["run", "--ledger", str(ledger), "--", sys.executable, str(script)], env,
                    tmp_path)
        assert done.returncode == 0, done.stderr
    with Ledger.open(str(ledger)) as opened:
        torch_records = [r for r in opened.records() if r.runtime == "torch-ext"]
    assert [r.event for r in sorted(torch_records, key=lambda r: r.started_ns)] == [
        "compile", "disk-hit"]


def test_the_start_up_hook_keeps_the_ledger_the_environment_names(tmp_path: Path):
    """CACHEAUDIT_LEDGER wins over the configuration's ledger, as on the command line."""
    (tmp_path / "pyproject.toml").write_text('[tool.cacheaudit]\nledger = "from-config.db"\n')
    env = _clean_env(tmp_path, CACHEAUDIT="1", CACHEAUDIT_CONFIG=str(tmp_path / "pyproject.toml"),
                     CACHEAUDIT_LEDGER=str(tmp_path / "from-env.db"),
                     XDG_CACHE_HOME=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c",
                           "import os; print(os.environ['CACHEAUDIT_LEDGER'])"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "from-env.db")
    env.pop("CACHEAUDIT_LEDGER")
    done = subprocess.run([sys.executable, "-c",
                           "import os; print(os.environ['CACHEAUDIT_LEDGER'])"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert done.stdout.strip() == str(tmp_path / "from-config.db"), done.stderr


# ------------------------------------------------------------------------------ the hook's audit

HOOK_JOB = """
import json, os, sys
sys.path.insert(0, {root!r})
import xxhash
if not os.environ.get("JOB_NOTHING"):
    from fixtures.minijit import DeepGemmRuntime
    kernel = DeepGemmRuntime(os.environ["JOB_LIBRARY"], backend="gxx").build(
        "sm90_gemm", "#include <deep_gemm/common.cuh>\\n"
        "extern \\"C\\" int value() {{ return DG_VALUE + TILE_VALUE; }}\\n")
    print(json.dumps({{"event": kernel.event, "path": kernel.path,
                      "digest": xxhash.xxh3_128_hexdigest(open(kernel.binary, "rb").read())}}))
sys.exit(int(os.environ.get("JOB_EXIT", "0")))
"""
HOOK_SUMMARY = re.compile(r"^cacheaudit: (\d+) compiles?, (\d+) disk hits?.* in run (\w+)$")


def _hook_job(tmp_path: Path) -> tuple[Path, Path, dict[str, str]]:
    """DeepGEMM's 2.x layout through the reference runtime's g++ mode: a disk hit leaves no
    record and no marker, only the binary's open; `cute/tile.hpp` is in no key."""
    library = deepgemm_library(tmp_path)
    tile = library / "include" / "cute" / "tile.hpp"
    job = tmp_path / "job.py"
    job.write_text(HOOK_JOB.format(root=str(ROOT)))
    env = _clean_env(tmp_path, JOB_LIBRARY=str(library), DG_JIT_CACHE_DIR=str(tmp_path / "dg"),
                     DG_JIT_NVCC_COMPILER=shutil.which("g++") or "g++",
                     XDG_CACHE_HOME=str(tmp_path / "xdg"), TMPDIR=str(tmp_path))
    return job, tile, env


def _hooked(job: Path, env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(job)], capture_output=True, text=True,
                          env={**env, "CACHEAUDIT": "1", **extra}, cwd=job.parent, timeout=300)


def _hook_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in done.stderr.splitlines() if line.startswith("cacheaudit:")]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_start_up_hook_audits_its_session_at_exit(tmp_path: Path):
    """`CACHEAUDIT=1 python job.py`: the run the hook prepared is audited at exit like `cacheaudit
    run`'s (the same summary line), error findings one line each, the exit status untouched."""
    job, tile, env = _hook_job(tmp_path)
    ledger = str(tmp_path / "ledger.db")
    env["CACHEAUDIT_LEDGER"] = ledger

    built = _hooked(job, env)
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout)["event"] == "compile"
    [summary] = _hook_lines(built)
    compiles, disk, run = HOOK_SUMMARY.match(summary).groups()  # type: ignore[union-attr]
    assert (compiles, disk) == ("1", "0")

    hit = _hooked(job, env, JOB_EXIT="3")
    assert hit.returncode == 3, hit.stderr  # the program's status, whatever the audit says
    served = json.loads(hit.stdout)
    assert served["event"] == "disk-hit"
    [summary] = _hook_lines(hit)
    compiles, disk, again = HOOK_SUMMARY.match(summary).groups()  # type: ignore[union-attr]
    assert (compiles, disk) == ("0", "1") and again != run

    tile.write_text("#pragma once\n#define TILE_VALUE 20\n")
    stale = _hooked(job, env)
    assert json.loads(stale.stdout)["digest"] == served["digest"]
    fresh = subprocess.run([sys.executable, str(job)], capture_output=True, text=True,
                           env={**env, "DG_JIT_CACHE_DIR": str(tmp_path / "fresh")},
                           cwd=tmp_path, timeout=300)
    assert json.loads(fresh.stdout)["event"] == "compile", fresh.stderr
    assert json.loads(fresh.stdout)["digest"] != served["digest"], "the scenario is not stale"
    assert stale.returncode == 0, stale.stderr  # reported, never failed
    summary, *errors = _hook_lines(stale)
    assert HOOK_SUMMARY.match(summary), stale.stderr
    assert [line for line in errors if f"CA101 error: {tile}:" in line
            and f"(entry {served['path']})" in line], stale.stderr

    # The same line `cacheaudit run` prints for the same job.
    report = tmp_path / "report.json"
    recorded = subprocess.run(
        [sys.executable, "-m", "cacheaudit", "run", "--ledger", ledger, "--report-json",
         str(report), "--", sys.executable, str(job)],
        capture_output=True, text=True, env={**env, "CACHEAUDIT": "1"}, cwd=tmp_path,
        timeout=300)
    assert recorded.returncode == 0, recorded.stderr
    said = json.loads(report.read_text())["summary"]
    assert said in summary
    # Once: the controller's own hook (CACHEAUDIT=1 reaches it too) leaves the run to it.
    assert " ".join(recorded.stderr.split()).count(said) == 1, recorded.stderr


def test_the_start_up_hook_does_not_audit_a_run_that_compiled_and_opened_nothing(
        tmp_path: Path):
    job, _tile, env = _hook_job(tmp_path)
    env["CACHEAUDIT_LEDGER"] = str(tmp_path / "ledger.db")
    done = _hooked(job, env, JOB_NOTHING="1")
    assert done.returncode == 0 and _hook_lines(done) == [], done.stderr
    assert not (tmp_path / "ledger.db").exists()
    # A session above it (`cacheaudit run`, the pytest plugin) audits its own run: the hook of a
    # process inside it prepares nothing and audits nothing.
    inside = _hooked(job, env, CACHEAUDIT_SHIMS=str(tmp_path / "xdg"), JOB_NOTHING="1")
    assert inside.returncode == 0 and _hook_lines(inside) == [], inside.stderr
