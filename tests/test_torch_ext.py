"""torch.utils.cpp_extension: the adapter, the reader and the policy against real torch builds.

Every build here is a real `load`/`load_inline` in a new Python process, compiled by the real g++
through the real ninja. The extensions include no torch header (a plain `extern "C"` function,
`is_python_module=False`, loaded with ctypes), so a build takes ~0.3 s instead of ~20 s for
`<torch/extension.h>`; torch still passes its own include directories and Python's as
`-isystem`, exactly as for any extension, so what ninja tracks and misses is the same.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.audit import audit_records, audit_run, scan
from cacheaudit.digest import StateCache
from cacheaudit.ledger import Ledger
from cacheaudit.model import CacheEntry, CacheLeftover, CompileRecord, FileState, Finding
from cacheaudit.runtimes import policy_for

from support import GXX, clean_env, deadline

VENV_BIN = os.path.dirname(sys.executable)
NINJA = shutil.which("ninja", path=os.pathsep.join([VENV_BIN, os.environ.get("PATH", "")]))
HAVE_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(
    not HAVE_TORCH or NINJA is None or GXX is None,
    reason="needs torch, ninja and g++ (torch.utils.cpp_extension builds)")

# Runs in a new process: arms the adapter (unless told not to), then performs the steps and
# prints what each load returned, with the value the library computes.
DRIVER = r"""
import ctypes, json, os, sys
spec = json.loads(sys.argv[1])
if spec.get("adapter", True):
    from cacheaudit import adapter, runtimes
    runtimes.activate(["torch_ext"])
from torch.utils import cpp_extension
out = []
for step in spec["steps"]:
    if "write" in step:
        with open(step["write"], "w") as handle:
            handle.write(step["text"])
        if "mtime_ns" in step:
            os.utime(step["write"], ns=(step["mtime_ns"], step["mtime_ns"]))
        continue
    try:
        path = getattr(cpp_extension, step["call"])(**step["args"])
        out.append({"path": path, "value": ctypes.CDLL(path).value()})
    except Exception as exc:
        out.append({"error": type(exc).__name__, "message": str(exc)[:2000]})
print(json.dumps(out))
"""


class Project:
    """Sources, headers in -I, -isystem and two CPATH directories, an extensions root and a
    ledger, all under one temporary directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ext = root / "ext"
        self.ledger = root / "ledger.db"
        for sub in ("src", "inc", "sysinc", "envA", "envB", "ext"):
            (root / sub).mkdir(parents=True, exist_ok=True)
        self.source = root / "src" / "k.cpp"
        self.myconst = root / "inc" / "myconst.h"
        self.sysconst = root / "sysinc" / "sysconst.h"
        self.source.write_text('#include "myconst.h"\n#include <sysconst.h>\n'
                               'extern "C" int value() { return MY_CONST * 1000 + SYS_CONST; }\n')
        self.myconst.write_text("#define MY_CONST 1\n")
        self.sysconst.write_text("#define SYS_CONST 100\n")
        (root / "envA" / "envconst.h").write_text("#define ENV_CONST 111\n")
        (root / "envB" / "envconst.h").write_text("#define ENV_CONST 222\n")
        self.env = clean_env(root)
        self.env["TORCH_EXTENSIONS_DIR"] = str(self.ext)
        self.env["PATH"] = os.pathsep.join([VENV_BIN, self.env.get("PATH", "")])
        self.env.pop("CACHEAUDIT_RUN", None)
        self.env.pop("TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES", None)

    @property
    def build_dir(self) -> Path:
        return self.ext / "kx"

    def load(self, name: str = "kx") -> dict[str, Any]:
        return {"call": "load", "args": {
            "name": name, "sources": [str(self.source)],
            "extra_include_paths": [str(self.root / "inc")],
            "extra_cflags": ["-isystem", str(self.root / "sysinc")],
            "is_python_module": False}}

    def load_inline(self, source: str, name: str = "inl") -> dict[str, Any]:
        return {"call": "load_inline", "args": {
            "name": name, "cpp_sources": [source], "no_implicit_headers": True,
            "extra_include_paths": [str(self.root / "inc")], "is_python_module": False}}

    def run(self, *steps: Mapping[str, Any], adapter: bool = True,
            **env: str | None) -> list[dict[str, Any]]:
        merged = dict(self.env)
        for name, value in env.items():
            if value is None:
                merged.pop(name, None)
            else:
                merged[name] = value
        done = subprocess.run([sys.executable, "-c", DRIVER,
                               json.dumps({"steps": list(steps), "adapter": adapter})],
                              env=merged, cwd=self.root, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        assert "cacheaudit: recording failed" not in done.stderr, done.stderr
        return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]

    def records(self) -> list[CompileRecord]:
        with Ledger.open(str(self.ledger)) as ledger:
            return [r for r in ledger.records() if r.runtime == "torch-ext"]

    def scan(self, **env: str) -> list[Finding]:
        now = dict(self.env)
        now.update(env)
        with Ledger.open(str(self.ledger)) as ledger:
            return scan([str(self.ext)], now, ledger=ledger).findings


def _codes(findings: list[Finding]) -> set[str]:
    return {f.code for f in findings}


def _older(path: Path, seconds: float = 3.0) -> None:
    """Age a file so that a later edit is not within the filesystem's timestamp granularity."""
    stamp = time.time_ns() - int(seconds * 1e9)
    os.utime(path, ns=(stamp, stamp))


@pytest.fixture
def project(tmp_path: Path) -> Project:
    return Project(tmp_path)


# ------------------------------------------------------------------------------ the four answers


@needs_torch
def test_isystem_header_edit_serves_a_stale_library_flagged_ca101(project: Project):
    [first] = project.run(project.load())
    assert first["value"] == 1100
    project.sysconst.write_text("#define SYS_CONST 200\n")
    [again] = project.run(project.load())
    assert again["value"] == 1100, "torch did rebuild: the scenario no longer holds"
    compile_record, hit = project.records()
    assert (compile_record.event, hit.event) == ("compile", "disk-hit")
    assert hit.extra["ninja_dry_run"]["work"] is False
    assert str(project.sysconst) in {f.path for f in compile_record.graph.files}
    assert str(project.sysconst) not in compile_record.tracked
    assert str(project.myconst) in compile_record.tracked
    assert compile_record.entry == hit.entry == str(project.build_dir)
    [stale] = [f for f in project.scan() if f.code == "CA101"]
    assert stale.subject == str(project.sysconst)
    assert stale.entry == str(project.build_dir)
    assert stale.record_id == compile_record.record_id
    assert stale.recorded != stale.current


@needs_torch
def test_cpath_switched_between_header_directories_is_ca202(project: Project):
    source = ('#include "myconst.h"\n#include <envconst.h>\n'
              'extern "C" int value() { return MY_CONST * 1000 + ENV_CONST; }\n')
    [first] = project.run(project.load_inline(source), CPATH=str(project.root / "envA"))
    assert first["value"] == 1111
    [again] = project.run(project.load_inline(source), CPATH=str(project.root / "envB"))
    assert again["value"] == 1111, "torch did rebuild: the scenario no longer holds"
    compile_record, _hit = project.records()
    assert compile_record.env["CPATH"] == str(project.root / "envA")
    # -MMD lists CPATH headers: ninja tracks the file, not the variable that chose it.
    assert str(project.root / "envA" / "envconst.h") in compile_record.tracked
    findings = project.scan(CPATH=str(project.root / "envB"))
    [drift] = [f for f in findings if f.code == "CA202"]
    assert (drift.subject, drift.recorded, drift.current) == (
        "CPATH", str(project.root / "envA"), str(project.root / "envB"))
    assert drift.entry == str(project.ext / "inl")
    assert not _codes(findings) & {"CA101", "CA103", "CA106"}


@needs_torch
def test_header_edited_between_loads_in_one_process_is_ca106(project: Project):
    _older(project.myconst)
    first, again, third = project.run(
        project.load(), {"write": str(project.myconst), "text": "#define MY_CONST 2\n"},
        project.load(), project.load())
    assert first["value"] == again["value"] == third["value"] == 1100
    # The third load shows nothing the second did not: it is counted, not recorded.
    compile_record, hit = project.records()
    assert (compile_record.event, hit.event) == ("compile", "memory-hit")
    assert hit.entry == compile_record.entry and hit.key == compile_record.key
    [proven] = [f for f in project.scan() if f.code == "CA106"]
    assert proven.subject == str(project.myconst)
    assert proven.record_id == hit.record_id and not proven.inferred
    # The record-level check finds the same staleness from the records alone, under the same
    # (code, subject, record) identity.
    [from_records] = [f for f in audit_records(project.records()) if f.code == "CA106"]
    assert (from_records.code, from_records.subject, from_records.record_id) == (
        proven.code, proven.subject, proven.record_id)
    # A run's report merges both and names the stale header once.
    with Ledger.open(str(project.ledger)) as ledger:
        report = audit_run(ledger, hit.run_uuid, project.env, roots=[str(project.ext)])
    assert [f.subject for f in report.findings if f.code == "CA106"] == [str(project.myconst)]


@needs_torch
def test_tracked_header_edit_in_a_new_process_is_recorded_as_a_compile(project: Project):
    _older(project.myconst)
    [first] = project.run(project.load())
    project.myconst.write_text("#define MY_CONST 2\n")
    [again] = project.run(project.load())
    assert (first["value"], again["value"]) == (1100, 2100)
    first_record, rebuild = project.records()
    assert (first_record.event, rebuild.event) == ("compile", "compile")
    assert rebuild.extra["ninja_dry_run"]["work"] is True
    assert any("myconst.h" in line for line in rebuild.extra["ninja_dry_run"]["explain"])
    library = str(project.build_dir / "kx.so")
    assert {o.path: o.digest for o in rebuild.outputs}[library] != \
        {o.path: o.digest for o in first_record.outputs}[library]
    findings = project.scan()
    assert not _codes(findings) & {"CA101", "CA103", "CA104", "CA106", "CA202", "CA501"}
    # The entry is tied to the rebuild, not to the first compile.
    assert {f.record_id for f in findings if f.record_id} == {rebuild.record_id}


@needs_torch
def test_tracked_header_restored_with_an_older_mtime_is_ca103(project: Project):
    [first] = project.run(project.load())
    built = (project.build_dir / "k.o").stat().st_mtime_ns
    project.myconst.write_text("#define MY_CONST 3\n")
    os.utime(project.myconst, ns=(built - 10**9, built - 10**9))  # as `cp -p` or `tar x` would
    [again] = project.run(project.load())
    assert first["value"] == again["value"] == 1100
    [broken] = [f for f in project.scan() if f.code == "CA103"]
    assert broken.subject == str(project.myconst)


@needs_torch
def test_failed_build_then_memory_hit_carries_the_versioner_note(project: Project):
    broken = 'extern "C" int value() { return MISSING; }\n'
    first, again = project.run(project.load_inline(broken, "bad"), project.load_inline(broken,
                                                                                         "bad"))
    assert first["error"] == "RuntimeError" and again["error"] != "RuntimeError"
    failed, hit = project.records()
    assert (failed.event, failed.exit_code, hit.event) == ("compile", 1, "memory-hit")
    assert any("pytorch/pytorch#119206" in note for note in hit.notes)


@needs_torch
@pytest.mark.slow
def test_under_cacheaudit_run_the_adapters_record_is_the_entrys(project: Project):
    """`cacheaudit run` puts the shim in front of `c++` too: the shim records the object's
    compile and the library's link (without a graph), and the scan must still judge the library
    by the adapter's record, which has the library's full include graph."""
    def run() -> dict[str, Any]:
        steps = {"steps": [project.load()], "adapter": False}  # the session arms the adapter
        done = subprocess.run(
            [sys.executable, "-m", "cacheaudit", "run", "--ledger", str(project.ledger),
             "--fail-on", "never", "--", sys.executable, "-c", DRIVER, json.dumps(steps)],
            env=project.env, cwd=project.root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        [value] = json.loads(next(line for line in done.stdout.splitlines()
                                  if line.startswith("[")))
        return value  # type: ignore[no-any-return]

    assert run()["value"] == 1100
    project.sysconst.write_text("#define SYS_CONST 200\n")
    assert run()["value"] == 1100
    with Ledger.open(str(project.ledger)) as ledger:
        records = ledger.records()
    observers = {r.observer for r in records}
    assert {"adapter:torch_ext", "shim:c++"} <= observers
    [adapter_compile] = [r for r in records
                         if r.observer == "adapter:torch_ext" and r.event == "compile"]
    [stale] = [f for f in project.scan() if f.code == "CA101"]
    assert stale.subject == str(project.sysconst)
    assert stale.record_id == adapter_compile.record_id


# ------------------------------------------------------------------------------ adapter promises


@needs_torch
def test_install_is_idempotent_and_uninstall_restores_the_originals(project: Project):
    probe = r"""
import json
from torch.utils import cpp_extension as m
from cacheaudit.runtimes.torch_ext.adapter import ADAPTER
before = (m._jit_compile, m._run_ninja_build)
ADAPTER.install(); first = (m._jit_compile, m._run_ninja_build)
ADAPTER.install(); second = (m._jit_compile, m._run_ninja_build)
installed = ADAPTER.installed()
ADAPTER.uninstall(); after = (m._jit_compile, m._run_ninja_build)
print(json.dumps({"wrapped": first[0] is not before[0] and first[1] is not before[1],
                  "idempotent": first[0] is second[0] and first[1] is second[1],
                  "installed": installed, "uninstalled": not ADAPTER.installed(),
                  "restored": after[0] is before[0] and after[1] is before[1],
                  "name": first[0].__name__}))
"""
    done = subprocess.run([sys.executable, "-c", probe], env=project.env, capture_output=True,
                          text=True, timeout=300, check=True)
    assert json.loads(done.stdout) == {"wrapped": True, "idempotent": True, "installed": True,
                                       "uninstalled": True, "restored": True,
                                       "name": "_jit_compile"}


@needs_torch
def test_an_adapter_error_leaves_what_load_returns_and_raises_unchanged(project: Project):
    bare = project.run(project.load(), project.load_inline("syntax error", "bad"), adapter=False)
    probe = DRIVER.replace(
        'runtimes.activate(["torch_ext"])',
        'runtimes.activate(["torch_ext"])\n'
        '    from cacheaudit.runtimes.torch_ext import adapter as torch_ext\n'
        '    def boom(*args):\n'
        '        raise RuntimeError("injected adapter failure")\n'
        '    torch_ext.TorchExtAdapter._before_ninja = boom\n'
        '    torch_ext.TorchExtAdapter._end = boom')
    steps = {"steps": [project.load(), project.load_inline("syntax error", "bad"),
                       project.load()]}
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(steps)], env=project.env,
                          cwd=project.root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    hooked = json.loads(done.stdout.splitlines()[-1])
    assert hooked[0] == hooked[2] == bare[0]
    assert hooked[1]["error"] == bare[1]["error"] == "RuntimeError"
    assert hooked[1]["message"] == bare[1]["message"]
    # One line, however many failures.
    assert done.stderr.count("cacheaudit: recording failed") == 1
    assert "injected adapter failure" in done.stderr


@needs_torch
def test_an_unwritable_ledger_is_reported_once_and_changes_nothing(project: Project):
    blocker = project.root / "not-a-dir"
    blocker.write_text("")
    steps = {"steps": [project.load(), project.load()]}
    done = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(steps)],
                          env=dict(project.env, CACHEAUDIT_LEDGER=str(blocker / "ledger.db")),
                          cwd=project.root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert [v["value"] for v in json.loads(done.stdout.splitlines()[-1])] == [1100, 1100]
    assert done.stderr.count("cacheaudit: recording failed") == 1


@needs_torch
def test_dependency_passes_run_a_bounded_number_at_once(project: Project):
    """Six sources with MAX_JOBS=2: never more than two `-M` passes at once, and every source's
    headers in the graph. The compiler is a real wrapper around g++ that counts the `-M` passes
    running beside it."""
    count = 6
    sources = []
    for index in range(count):
        (project.root / "inc" / f"h{index}.h").write_text(f"#define H{index} {index}\n")
        source = project.root / "src" / f"part{index}.cpp"
        source.write_text(f'#include "h{index}.h"\n'
                          f'extern "C" int part{index}() {{ return H{index}; }}\n')
        sources.append(str(source))
    sources[0] = str(project.source)  # the one that defines value()
    running, log = project.root / "running", project.root / "passes.log"
    running.mkdir()
    wrapper = project.root / "bin" / "c++"
    wrapper.parent.mkdir()
    wrapper.write_text(f"""#!/bin/sh
case " $* " in
  *" -M -MF "*)
    mkdir "{running}/$$"
    ls "{running}" | wc -l >> "{log}"
    sleep 0.3
    {GXX} "$@"; status=$?
    rmdir "{running}/$$"
    exit $status;;
esac
exec {GXX} "$@"
""")
    wrapper.chmod(0o755)
    load = project.load("many")
    load["args"]["sources"] = sources
    [loaded] = project.run(load, CXX=str(wrapper), MAX_JOBS="2")
    assert loaded["value"] == 1100
    seen = [int(line) for line in log.read_text().split()]
    assert len(seen) == count and max(seen) <= 2
    [record] = [r for r in project.records() if r.event == "compile"]
    assert record.graph is not None
    names = {os.path.basename(p) for p in record.graph.paths}
    assert {f"h{index}.h" for index in range(1, count)} <= names
    assert not [n for n in record.notes if "dependency pass" in n]


def test_dependency_passes_share_one_deadline(tmp_path: Path):
    from cacheaudit.graph import start_dependency_pass
    from cacheaudit.runtimes.torch_ext.adapter import _Pass, _Passes

    slow = tmp_path / "slow-c++"
    slow.write_text("#!/bin/sh\nexec sleep 20\n")
    slow.chmod(0o755)
    items = []
    for index in range(3):
        item = _Pass(output=f"{index}.o", sources=(f"{index}.cpp",), compiler=str(slow),
                     tokens=(str(slow),))
        item.depfile = str(tmp_path / f"{index}.d")
        item.argv = (str(slow), f"{index}.cpp", "-M", "-MF", item.depfile)
        items.append(item)
    started = time.monotonic()
    passes = _Passes(items, str(tmp_path), os.environ, 1, 1.0, start_dependency_pass)
    passes.finish()
    assert time.monotonic() - started < 10  # one deadline for all, not one per pass
    assert items[0].running is not None and items[0].running.wait().timed_out
    assert [item.running for item in items[1:]] == [None, None]
    assert all("not started" in (item.error or "") for item in items[1:])


@needs_torch
def test_a_torch_without_the_hooked_functions_is_left_alone(project: Project):
    probe = r"""
import json
from torch.utils import cpp_extension as m
del m._run_ninja_build
from cacheaudit import adapter, runtimes
runtimes.activate(["torch_ext"])
from cacheaudit.runtimes.torch_ext.adapter import ADAPTER
ADAPTER.install()
print(json.dumps({"installed": ADAPTER.installed(),
                  "untouched": not hasattr(m._jit_compile, "__wrapped__")}))
"""
    done = subprocess.run([sys.executable, "-W", "error", "-c", probe], env=project.env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"installed": False, "untouched": True}
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("cacheaudit:")]
    assert len(lines) == 1 and "_run_ninja_build" in lines[0], done.stderr


@needs_torch
def test_a_wrapper_on_top_keeps_working_and_ours_under_it_goes_quiet(project: Project):
    probe = r"""
import json
from torch.utils import cpp_extension as m
from cacheaudit import adapter, runtimes
from cacheaudit.runtimes.torch_ext.adapter import ADAPTER
runtimes.activate(["torch_ext"])
ours = m._jit_compile
calls = []
def theirs(*args, **kwargs):
    calls.append(1)
    return ours(*args, **kwargs)
m._jit_compile = theirs
ADAPTER.install()  # ours still runs under theirs: wrapping again would record twice
again = m._jit_compile is theirs
first = m.load(**json.loads(__import__("sys").argv[1]))
runtimes.deactivate()
second = m.load(**json.loads(__import__("sys").argv[1]))
print(json.dumps({"again": again, "calls": len(calls), "kept": m._jit_compile is theirs,
                  "same": first == second}))
"""
    args = project.load()["args"]
    done = subprocess.run([sys.executable, "-c", probe, json.dumps(args)], env=project.env,
                          cwd=project.root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"again": True, "calls": 2,
                                                        "kept": True, "same": True}
    # One record, for the first load: the second ran through ours, switched off.
    assert [r.event for r in project.records()] == ["compile"]


def test_importing_the_torch_ext_modules_does_not_import_torch():
    probe = ("import sys, cacheaudit.runtimes.torch_ext.adapter, "
             "cacheaudit.runtimes.torch_ext.policy, cacheaudit.runtimes.torch_ext.layout; "
             "from cacheaudit import runtimes; "
             "runtimes.adapter('torch_ext'); "
             "print(' '.join(m for m in ('torch', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    assert done.stdout.strip() == ""


# ------------------------------------------------------------------------------ the reader


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """One real build, shared by the read-only checks below (tests copy it before changing)."""
    if not HAVE_TORCH or NINJA is None or GXX is None:
        pytest.skip("needs torch, ninja and g++")
    project = Project(tmp_path_factory.mktemp("built"))
    project.run(project.load())
    return project


@needs_torch
def test_build_file_and_deps_log_parsers_agree_with_ninja(built: Project):
    from cacheaudit.graph import parse_ninja_deps
    from cacheaudit.runtimes._ninja.build import read_build_file, read_deps_log

    build = read_build_file(str(built.build_dir / "build.ninja"))
    commands = subprocess.run([NINJA, "-t", "commands"], cwd=built.build_dir, check=True,
                              capture_output=True, text=True).stdout.splitlines()
    assert [e.command for e in build.edges] == commands
    assert build.library == "kx.so" and build.sources == (str(built.source),)
    text = subprocess.run([NINJA, "-t", "deps"], cwd=built.build_dir, check=True,
                          capture_output=True, text=True).stdout
    expected = {d.target: (d.mtime_ns, d.inputs) for d in parse_ninja_deps(text)}
    assert {k: (v.mtime_ns, v.inputs) for k, v in read_deps_log(str(built.build_dir)).items()} \
        == expected


def test_build_file_parser_evaluates_ninja_escapes_and_scopes():
    from cacheaudit.runtimes._ninja.build import parse_build_file, shell_escape

    text = ("cxx = c++\nflags = -I/a$ b -DX=$$HOME\n"
            "rule compile\n  command = $cxx $flags -c $in -o $out $extra\n  depfile = $out.d\n"
            "  deps = gcc\n"
            "build o$ 1.o: compile /src/it's.cpp | implicit.h || order\n  extra = -O$\n"
            "    2\n"
            "build lib.so: link o$ 1.o\nrule link\n  command = $cxx $in -shared -o $out\n"
            "default lib.so\n")
    build = parse_build_file(text, "/b/build.ninja")
    first, second = build.edges
    assert first.command == ("c++ -I/a b -DX=$HOME -c '" + "/src/it'\\''s.cpp' -o 'o 1.o'"
                             " -O2")
    assert (first.depfile, first.inputs) == ("o 1.o.d", ("/src/it's.cpp",))
    assert second.command == "c++ 'o 1.o' -shared -o lib.so"
    assert build.library == "lib.so" and build.objects == ("o 1.o",)
    assert shell_escape("/plain/path-1.0_x+y") == "/plain/path-1.0_x+y"


def test_default_roots_follow_torch():
    from cacheaudit.runtimes.torch_ext.layout import LAYOUT

    assert LAYOUT.default_roots({"TORCH_EXTENSIONS_DIR": "/x/ext", "HOME": "/h"}) == ["/x/ext"]
    if sys.platform.startswith("linux"):
        assert LAYOUT.default_roots({"HOME": "/h", "XDG_CACHE_HOME": "/c"}) == [
            os.path.realpath("/c/torch_extensions")]
        assert LAYOUT.default_roots({"HOME": "/h"}) == [
            os.path.realpath("/h/.cache/torch_extensions")]


@needs_torch
def test_reader_finds_the_entry_under_the_default_layout(built: Project, tmp_path: Path):
    from cacheaudit.runtimes.torch_ext.layout import LAYOUT

    root = tmp_path / "torch_extensions"
    shutil.copytree(built.build_dir, root / "py311_cpu" / "kx")
    assert LAYOUT.is_root(str(root)) and LAYOUT.is_root(str(root / "py311_cpu"))
    assert LAYOUT.is_root(str(root / "py311_cpu" / "kx"))
    assert not LAYOUT.is_root(str(tmp_path))
    [entry] = [e for e in LAYOUT.read(str(root), StateCache()) if isinstance(e, CacheEntry)]
    assert entry.kernel == "kx" and entry.path == str(root / "py311_cpu" / "kx")
    assert entry.binary is not None and entry.binary.path.endswith("/kx.so")
    assert entry.source is not None and entry.source.path == str(built.source)
    assert entry.key and not entry.problems
    assert entry.meta["library"] == "kx.so"
    assert entry.meta["deps"]["k.o"] == [str(built.source), str(built.myconst)]


@needs_torch
def test_stale_lock_missing_library_and_old_versions_are_reported(built: Project,
                                                                   tmp_path: Path):
    from cacheaudit.runtimes.torch_ext.layout import LAYOUT

    root = tmp_path / "ext"
    shutil.copytree(built.build_dir, root / "kx")
    (root / "kx" / "lock").write_text("")  # what a killed build leaves: no process holds it
    shutil.copy(root / "kx" / "kx.so", root / "kx" / "kx_v1.so")
    (root / "kx" / "kx.so").unlink()
    (root / "orphan").mkdir()
    items = list(LAYOUT.read(str(root), StateCache()))
    [entry] = [e for e in items if isinstance(e, CacheEntry)]
    problems = " | ".join(entry.problems)
    from cacheaudit.runtimes.torch_ext.layout import lock_holders

    if lock_holders(str(root / "kx" / "lock")) is None:
        # Some process's descriptors are hidden from this user: "stale" cannot be claimed.
        assert "if no build is running" in problems and "pytorch/pytorch#189245" in problems
    else:
        assert "stale FileBaton lock" in problems and "pytorch/pytorch#189245" in problems
    assert "kx.so, which is missing" in problems
    leftovers = {Path(x.path).name: x.reason for x in items if isinstance(x, CacheLeftover)}
    assert set(leftovers) == {"kx_v1.so", "orphan"}
    assert "in-process rebuild 1" in leftovers["kx_v1.so"]
    # A lock that a running build holds open is no problem.
    with open(root / "kx" / "lock") as held:
        assert held and not any("lock" in p for p in next(
            e for e in LAYOUT.read(str(root), StateCache()) if isinstance(e, CacheEntry)
        ).problems)


# ------------------------------------------------------------------------------ the policy


def _state(path: str, digest: str) -> FileState:
    return FileState(path=path, exists=True, size=10, mtime_ns=1, ctime_ns=1, inode=1,
                     digest=digest)


def _record(event: str, states: list[FileState], started: int, tracked: tuple[str, ...]
            ) -> CompileRecord:
    return CompileRecord(record_id=f"{event}-{started}", event=event, started_ns=started,  # type: ignore[arg-type]
                         runtime="torch-ext", kernel="kx", entry="/ext/kx",
                         sources=tuple(states), tracked=tracked, pid=42,
                         observer="adapter:torch_ext")


def test_record_findings_report_each_changed_tracked_header_once():
    policy = policy_for("torch-ext")
    tracked = ("/src/k.cpp", "/inc/a.h")
    build = _record("compile", [_state("/src/k.cpp", "s"), _state("/inc/a.h", "a1")], 1, tracked)
    same = _record("memory-hit", [_state("/src/k.cpp", "s"), _state("/inc/a.h", "a1")], 2,
                   tracked)
    changed = _record("memory-hit", [_state("/src/k.cpp", "s"), _state("/inc/a.h", "a2")], 3,
                      tracked)
    again = _record("memory-hit", [_state("/src/k.cpp", "s"), _state("/inc/a.h", "a2")], 4,
                    tracked)
    assert policy.record_findings(same, [build]) == []
    [finding] = policy.record_findings(changed, [build, same])
    assert (finding.code, finding.subject, finding.record_id) == ("CA106", "/inc/a.h",
                                                                 changed.record_id)
    assert policy.record_findings(again, [build, same, changed]) == []
    # A hit whose build this process never saw is not judged; nor are other runtimes' records.
    assert policy.record_findings(changed, []) == []
    # A new ninja run (disk hit) is a new baseline.
    rebuilt = _record("disk-hit", [_state("/src/k.cpp", "s"), _state("/inc/a.h", "a2")], 5,
                      tracked)
    assert policy.record_findings(again, [build, changed, rebuilt]) == []


def test_compiler_identity_is_not_in_the_key():
    from cacheaudit.model import CompilerIdentity

    old = CompilerIdentity(invoked="c++", path="/usr/bin/c++", resolved="/usr/bin/g++-12",
                           kind="gcc", version_text="g++ 12.2", digest="a")
    new = CompilerIdentity(invoked="/usr/bin/c++", path="/usr/bin/c++",
                           resolved="/usr/bin/g++-12", kind="gcc", version_text="g++ 12.3",
                           digest="b")
    assert policy_for("torch-ext").compiler_change_in_key(old, new) is False


@needs_torch
def test_dependency_command_reconstructs_a_cache_built_before_recording(project: Project):
    [first] = project.run(project.load(), adapter=False)
    assert first["value"] == 1100
    assert not project.ledger.exists()
    time.sleep(0.05)
    sysconst = project.sysconst.read_text()
    project.sysconst.write_text("#define SYS_CONST 300\n")
    findings = project.scan()
    # Changed after a build nobody observed: what the compiler read of it is unknown, which
    # the scan says (a warning, inferred), instead of a stale hit on timestamps alone.
    [unknown] = [f for f in findings if f.subject == str(project.sysconst)]
    assert unknown.code == "CA501" and unknown.inferred and unknown.severity.value == "warning"
    assert not any(f.code == "CA101" for f in findings)
    # Scanned again once the header is back as it was built: still no error.
    project.sysconst.write_text(sysconst)
    assert [f for f in project.scan() if f.severity.value == "error"] == []


# ------------------------------------------------------------------------------ review fixes
# (reader and policy): FIFOs, unlistable directories, locks of other users, the audit's env




@needs_torch
def test_a_fifo_deps_log_is_evidence_not_a_hang(built: Project, tmp_path: Path):
    from cacheaudit.runtimes.torch_ext.layout import LAYOUT

    build = tmp_path / "ext" / "kx"
    shutil.copytree(built.build_dir, build)
    (build / ".ninja_deps").unlink()
    os.mkfifo(build / ".ninja_deps")
    with deadline():
        [entry] = [e for e in LAYOUT.read(str(build.parent), StateCache())
                   if isinstance(e, CacheEntry)]
        tracked = policy_for("torch-ext").tracked(entry, None)
    assert "not a regular file" in entry.meta["deps_error"]
    assert tracked.error is not None and "not a regular file" in tracked.error


@needs_torch
def test_check_key_asks_the_ninja_of_the_environment_it_is_given(built: Project,
                                                                 tmp_path: Path):
    from cacheaudit.runtimes.torch_ext.layout import LAYOUT

    [entry] = [e for e in LAYOUT.read(str(built.ext), StateCache()) if isinstance(e, CacheEntry)]
    policy = policy_for("torch-ext")
    assert shutil.which("ninja", path=built.env["PATH"]) is not None
    without = policy.check_key(entry, None, env={"PATH": str(tmp_path)})
    assert without.recomputed is None and "ninja is not on PATH" in without.note
    assert policy.check_key(entry, None, env=built.env).recomputed == entry.key


_OTHER_UID = 65534  # nobody


@functools.cache
def _python_for_another_user() -> str | None:
    """An interpreter that user nobody may run, with this checkout and its packages importable;
    None when there is none (or this process cannot start one as another user)."""
    if os.geteuid() != 0:
        return None
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python in (sys.executable, f"/usr/bin/python{version}"):
        try:
            done = subprocess.run([python, "-c", "import cacheaudit.runtimes.torch_ext.layout"],
                                  env=_other_env(), user=_OTHER_UID, group=_OTHER_UID,
                                  extra_groups=[], cwd="/", capture_output=True, timeout=60)
        except OSError:
            continue
        if done.returncode == 0:
            return python
    return None


def _other_env() -> dict[str, str]:
    root = Path(__file__).resolve().parent.parent
    return {"PYTHONPATH": os.pathsep.join([str(root), sysconfig.get_paths()["purelib"]]),
            "PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}


def _as_another_user(code: str, *args: str) -> Any:
    """What `code` prints (JSON), run by user nobody: as root, that is the only way to meet a
    directory mode 000 or another user's hidden /proc/<pid>/fd."""
    python = _python_for_another_user()
    if python is None:
        pytest.skip("needs root and an interpreter user nobody can run")
    done = subprocess.run([python, "-c", code, *args], env=_other_env(), user=_OTHER_UID,
                          group=_OTHER_UID, extra_groups=[], cwd="/", capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory user nobody can reach (pytest's own tmp_path is private to this user)."""
    base = Path(tempfile.mkdtemp(prefix="cacheaudit-other-user-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        for directory, _dirs, _files in os.walk(base):
            os.chmod(directory, 0o755)
        shutil.rmtree(base)


_READ_AS_OTHER = """
import json, sys
from cacheaudit.digest import StateCache
from cacheaudit.runtimes.torch_ext.layout import LAYOUT
print(json.dumps([[type(i).__name__, i.path, getattr(i, "reason", "")]
                  for i in LAYOUT.read(sys.argv[1], StateCache())]))
"""


def _open_to_all(top: Path) -> None:
    for directory, _dirs, files in os.walk(top):
        os.chmod(directory, 0o755)
        for name in files:
            os.chmod(os.path.join(directory, name), 0o644)


def test_unlistable_directories_are_said_so_not_passed_over(shared_tmp: Path):
    root = shared_tmp / "ext"
    (root / "py311_cpu" / "closed").mkdir(parents=True)
    (root / "py311_cpu" / "open").mkdir()
    (root / "locked").mkdir()
    _open_to_all(shared_tmp)
    (root / "py311_cpu" / "closed").chmod(0)
    (root / "locked").chmod(0)

    items = _as_another_user(_READ_AS_OTHER, str(root))
    by_path = {path: (kind, reason) for kind, path, reason in items}
    closed = by_path[str(root / "py311_cpu" / "closed")]
    assert closed[0] == "CacheLeftover"
    assert closed[1] == "cannot list closed/: PermissionError: Permission denied"
    assert "empty extension directory" in by_path[str(root / "py311_cpu" / "open")][1]
    assert by_path[str(root / "locked")][1].startswith("cannot list locked/: PermissionError")

    (root / "py311_cpu").chmod(0)
    items = _as_another_user(_READ_AS_OTHER, str(root))
    assert [kind for kind, path, _ in items if path == str(root / "py311_cpu")] == [
        "CacheLeftover"]
    root.chmod(0)
    assert _as_another_user(_READ_AS_OTHER, str(root)) == [
        ["CacheLeftover", str(root), "cannot list ext/: PermissionError: Permission denied"]]


def test_a_lock_held_where_descriptors_are_hidden_is_not_called_stale(shared_tmp: Path):
    lock = shared_tmp / "kx" / "lock"
    lock.parent.mkdir()
    lock.write_text("")
    _open_to_all(shared_tmp)
    probe = ("import json, sys\n"
             "from cacheaudit.runtimes.torch_ext.layout import lock_holders, lock_problem\n"
             "print(json.dumps([lock_holders(sys.argv[1]), lock_problem(sys.argv[1])]))\n")
    # This process holds the lock open, as another user's build would: user nobody cannot
    # read its descriptors, so it cannot tell that the lock is held.
    with open(lock):
        holders, problem = _as_another_user(probe, str(lock))
    assert holders is None
    assert "stale" not in problem and "remove it" not in problem
    assert "if no build is running" in problem



# ------------------------------------------------------------------ nothing in build.ninja runs


@needs_torch
def test_nothing_build_ninja_names_is_run_by_a_scan(built: Project, tmp_path: Path):
    """A scan asks ninja `-n` in the cache's build directory: a build.ninja whose own
    regeneration edge is out of date and whose edges would write a marker runs none of them
    (ninja's dry run prints commands, never runs one: measured with ninja 1.11)."""
    from support import reliability_figure

    root = tmp_path / "ext"
    build = root / "kx"
    shutil.copytree(built.build_dir, build)
    marker = tmp_path / "MARKER"
    manifest = build / "build.ninja"
    text = manifest.read_text()
    manifest.write_text(text + f"\nrule regen\n  command = touch {marker}\n  generator = 1\n"
                        f"build build.ninja: regen regen.in\n"
                        f"rule mark\n  command = touch {marker} $out\n"
                        f"build marked.o: mark regen.in\n")
    stamp = time.time_ns() - 10_000_000_000
    os.utime(manifest, ns=(stamp, stamp))
    (build / "regen.in").write_text("newer than build.ninja\n")
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--json", "--no-progress",
                           "--fail-on", "never", "--ledger", str(tmp_path / "l.db"), str(root)],
                          capture_output=True, text=True, env=built.env, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["entries"] == 1
    assert not marker.exists(), "a scan ran a command of build.ninja"
    reliability_figure("faults", "a torch extension build.ninja whose edges write a marker",
                       markers_written=0, scans=1)
