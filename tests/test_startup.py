"""The start-up hook's cost and laziness, seen from real interpreters: what a Python process
inside a session imports before it uses a runtime (nothing of cacheaudit beyond the hook's
minimum), that it still records a compile when it imports a runtime later, and the finder that
waits for that import. Timings are benchmarks/bench_startup.py's, never asserted here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cacheaudit import runtimes, switches
from cacheaudit.ledger import Ledger
from cacheaudit.session import Session, prepare
from cacheaudit.spec import EXTRA_VARIABLE


def _nvrtc_problem() -> str | None:
    try:
        from cuda.bindings import nvrtc

        return None if int(nvrtc.nvrtcVersion()[0]) == 0 else "nvrtcVersion failed"
    except Exception as exc:  # noqa: BLE001 - any failure means: no NVRTC here
        return f"{type(exc).__name__}: {exc}"


_NVRTC = _nvrtc_problem()
needs_nvrtc = pytest.mark.skipif(_NVRTC is not None, reason=f"libnvrtc cannot load: {_NVRTC}")

HOOK_MINIMUM = {"cacheaudit", "cacheaudit.startup", "cacheaudit.switches",
                "cacheaudit.importhooks", "__future__", "atexit"}
"""Everything the hook of a process inside a session may add to a bare interpreter's modules."""

MODULES = "import sys, json; print(json.dumps(sorted(sys.modules)))"


def _clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "DG_", "EP_", "DJ_", "PYTEST_", "NVCC_"))
           and k not in ("CXX", "CC")}
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               TMPDIR=str(tmp_path), **extra)
    (tmp_path / "home").mkdir(exist_ok=True)
    return env


def _session(tmp_path: Path) -> Session:
    return prepare(_clean_env(tmp_path), ledger=str(tmp_path / "ledger.db"), label="test")


def _python(code: str, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args],
                          capture_output=True, text=True, env=env, timeout=300)


def _modules(env: dict[str, str]) -> set[str]:
    done = _python(MODULES, env)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout))


def test_a_process_inside_a_session_imports_only_the_hooks_minimum(tmp_path: Path):
    """No spec, registry, adapter, `typing` or `threading` before a runtime is imported."""
    session = _session(tmp_path)
    try:
        assert session.env[switches.ADAPTER_IMPORTS] == runtimes.arming_text()
        bare = _modules(_clean_env(tmp_path))
        hooked = _modules(session.env)
    finally:
        session.close()
    added = hooked - bare
    assert "cacheaudit.startup" in added, "the hook did not run in the session's child"
    assert added <= HOOK_MINIMUM, f"imported at start-up: {sorted(added - HOOK_MINIMUM)}"


OWN_SESSION_NEVER = ("cacheaudit.audit", "cacheaudit.ledger.store", "cacheaudit.ledger.spool",
                     "cacheaudit.ledger.values",
                     "cacheaudit.ledger.combine", "cacheaudit.ledger.combine_sql",
                     "cacheaudit.scratch", "cacheaudit.recorder", "cacheaudit.compilers",
                     "cacheaudit.runtimes.triton.policy", "cacheaudit.children", "subprocess",
                     "tomllib", "sqlite3", "cacheaudit.model", "cacheaudit.digest", "typing",
                     "dataclasses", "inspect", "uuid", "shutil", "shlex", "ctypes", "re",
                     "enum", "threading", "select", "struct", "xxhash", "datetime",
                     "collections", "functools", "contextlib", "importlib", "warnings",
                     "types", "operator", "keyword", "reprlib")
"""What a process that prepares its own session (`CACHEAUDIT=1`, no session above it) and
compiles nothing never imports, from start-up to its exit audit, while no ledger file exists
yet and no pyproject.toml above it names cacheaudit: the judge, the ledger's readers and
writers, the shim's recorder, a runtime's policy, cacheaudit's child processes, the TOML parser;
nor, where no cache root exists, any layout reader (the specs' `roots` modules say where the
roots would be), the model or the state cache; nor `typing`, `dataclasses`, `uuid`, `shutil`,
`shlex`, `ctypes`, `re`, `enum`, `datetime` or `xxhash` (`cacheaudit.plain`, `cacheaudit.ids`,
plain classes, `spec.literal_tail`), nor `collections`, `functools`, `contextlib`, `importlib`,
`warnings` or `types` (`plain.NamedTuple`, `plain.memoized`, `plain.import_module`: ~5 ms of
such a process together), nor, where nothing is watched, `threading`, `select` or `struct`,
beyond what the interpreter's own start-up imported."""


@pytest.mark.parametrize("pyproject", [None, "[tool.ruff]\nline-length = 100\n"],
                         ids=["no pyproject.toml", "another tool's pyproject.toml"])
def test_a_process_preparing_its_own_session_imports_no_judge_and_no_ledger(
        tmp_path: Path, pyproject: str | None):
    from cacheaudit.config import find_pyproject

    work = tmp_path / "work"
    work.mkdir()
    assert find_pyproject(str(work)) is None, "a pyproject.toml above the test directory"
    if pyproject is not None:
        (work / "pyproject.toml").write_text(pyproject)
    ledger = tmp_path / "ledger.db"
    env = _clean_env(tmp_path, CACHEAUDIT="1", CACHEAUDIT_LEDGER=str(ledger))
    # The exit audit is called here, before the modules are listed; at the real exit it finds
    # the observer stopped already and does nothing more.
    done = subprocess.run(
        [sys.executable, "-c", "import json, sys\nfrom cacheaudit import startup\n"
         "assert startup._audit is not None, 'the hook prepared no session'\nstartup._audit()\n"
         "print(json.dumps(sorted(sys.modules)))"],
        capture_output=True, text=True, env=env, cwd=work, timeout=300)
    assert done.returncode == 0, done.stderr
    modules = set(json.loads(done.stdout))
    assert "cacheaudit.session" in modules and "cacheaudit.watch" in modules, sorted(modules)
    bare = _modules(_clean_env(tmp_path))  # what the interpreter's own start-up imports
    below = tuple(f"{name}." for name in OWN_SESSION_NEVER)  # and their submodules
    imported = sorted(m for m in modules - bare
                      if m in OWN_SESSION_NEVER or m.startswith(below)
                      or m == "cacheaudit.layout" or m.endswith(".layout"))
    assert imported == [], f"imported by a process that compiled nothing: {imported}"
    assert not ledger.exists(), "a process that recorded nothing created the ledger"
    # One module a runtime beside its package: the spec, which holds the default roots too.
    beyond_specs = sorted(m for m in modules if m.startswith("cacheaudit.runtimes.")
                          and m.count(".") > 2 and not m.endswith(".spec")
                          and not m.startswith("cacheaudit.runtimes._deepseek."))
    assert beyond_specs == [], f"runtime modules beyond the specs: {beyond_specs}"


@pytest.mark.parametrize("text", [
    "[tool.cacheaudit]\nredact-argv = false\n",
    '[tool."cacheaudit"]\nredact-argv = false\n',
    "[tool]\ncacheaudit.redact-argv = false\n",
    "tool = { cacheaudit = { redact-argv = false } }\n",
    '[tool."cache\\u0061udit"]\nredact-argv = false\n',
    "[tool.'cacheaudit']\nredact-argv = false\n",
], ids=["bare", "quoted", "dotted", "inline", "escaped", "literal"])
def test_a_session_reads_the_table_in_every_spelling_toml_allows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str):
    """A session parses a pyproject.toml only where it may hold `[tool.cacheaudit]`
    (`config.may_hold_table`): every spelling of the key must still reach the job."""
    import tomllib

    assert tomllib.loads(text)["tool"]["cacheaudit"] == {"redact-argv": False}
    (tmp_path / "pyproject.toml").write_text(text)
    monkeypatch.chdir(tmp_path)
    session = _session(tmp_path)
    try:
        assert session.env.get(switches.REDACT_ARGV) == "0", text
    finally:
        session.close()


def test_the_arming_names_are_the_adapters_top_level_packages():
    names = runtimes.arming_text().rpartition(";")[2].split(":")
    expected = {declared.adapter_imports.split(".")[0] for declared in runtimes.specs()
                if declared.adapter is not None and declared.adapter_imports}
    assert set(names) == expected and "torch" in names and "triton" in names
    assert switches.RUNTIMES == EXTRA_VARIABLE


def test_another_runtimes_setting_than_the_sessions_reads_the_specs(tmp_path: Path):
    """A child that names other runtime packages than its session did cannot trust the names
    the session wrote: it arms from the specs, at start-up."""
    session = _session(tmp_path)
    try:
        env = dict(session.env, **{EXTRA_VARIABLE: "toyjit"})
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(__file__).parent), env.get("PYTHONPATH", "")])
        modules = _modules(env)
    finally:
        session.close()
    assert "cacheaudit.runtimes" in modules and "cacheaudit.spec" in modules


@needs_nvrtc
def test_a_process_inside_a_session_records_a_compile_when_it_imports_a_runtime_later(
        tmp_path: Path):
    """The adapters are armed lazily, yet the NVRTC compile of a process that imports
    cuda.bindings only after start-up is recorded, into the session's run, with its program
    name, and nothing of the adapter was imported before."""
    session = _session(tmp_path)
    try:
        done = _python("""
            import json, sys
            before = sorted(m for m in sys.modules if m.startswith("cacheaudit.runtimes"))
            from cuda.bindings import nvrtc
            err, prog = nvrtc.nvrtcCreateProgram(
                b'extern "C" __global__ void later(int* o) { o[0] = 7; }\\n', b"later.cu", 0,
                [], [])
            assert int(err) == 0
            assert int(nvrtc.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=sm_90"])[0]) == 0
            nvrtc.nvrtcDestroyProgram(prog)
            print(json.dumps(before))
        """, session.env)
    finally:
        session.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []
    with Ledger.open(session.ledger) as opened:
        records = opened.records(where="runs.run_uuid = ?", params=(session.run_uuid,))
    compiles = [r for r in records if r.runtime == "nvrtc" and r.event == "compile"]
    assert compiles, f"no NVRTC compile recorded for later.cu: {records}"
    assert any("later" in (r.kernel or "") or any(s.path.endswith("later.cu") for s in r.sources)
               for r in compiles), compiles


def _package(tmp_path: Path) -> Path:
    root = tmp_path / "pkgs"
    (root / "lazyrt").mkdir(parents=True)
    (root / "lazyrt" / "__init__.py").write_text("VALUE = 1\n")
    (root / "lazyrt" / "sub.py").write_text("VALUE = 2\n")
    return root


FIRST_IMPORT = """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from cacheaudit import importhooks
    seen = []
    def arm():
        seen.append("armed")
        importhooks.when_imported("lazyrt", lambda m: seen.append(("lazyrt", m.VALUE)))
        importhooks.when_imported("lazyrt.sub", lambda m: seen.append(("lazyrt.sub", m.VALUE)))
    importhooks.when_first_imported(["lazyrt", "other"], arm)
    import json.tool
    seen.append("unrelated import")
    import lazyrt.sub
    import lazyrt
    print(json.dumps(seen))
"""


def test_the_first_import_of_a_watched_package_arms_the_hooks_of_it_and_below(tmp_path: Path):
    done = _python(FIRST_IMPORT, dict(os.environ), str(_package(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["unrelated import", "armed", ["lazyrt", 1],
                                       ["lazyrt.sub", 2]]


def test_a_watched_package_imported_already_arms_at_once(tmp_path: Path):
    code = FIRST_IMPORT.replace("from cacheaudit import importhooks",
                                "import lazyrt\n    from cacheaudit import importhooks")
    done = _python(code, dict(os.environ), str(_package(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["armed", ["lazyrt", 1], "unrelated import",
                                       ["lazyrt.sub", 2]]


def test_a_failing_arming_never_breaks_the_import(tmp_path: Path):
    done = _python("""
        import sys
        sys.path.insert(0, sys.argv[1])
        from cacheaudit import importhooks
        def arm():
            raise RuntimeError("the registry broke")
        importhooks.when_first_imported(["lazyrt"], arm)
        import lazyrt.sub
        print(lazyrt.sub.VALUE)
    """, dict(os.environ), str(_package(tmp_path)))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    assert "could not arm the adapters: RuntimeError: the registry broke" in done.stderr


@pytest.mark.parametrize("label", ["inside", "root"])
def test_the_hook_still_records_into_the_session_ledger(tmp_path: Path, label: str):
    """Both paths of the hook arm the adapters: inside a session lazily, at the root of one at
    start-up (the process prepared the session itself)."""
    env = (_session(tmp_path).env if label == "inside"
           else _clean_env(tmp_path, CACHEAUDIT="1",
                           CACHEAUDIT_LEDGER=str(tmp_path / "ledger.db")))
    done = _python("""
        import json, os, sys
        import json.tool
        print(json.dumps([os.environ.get("CACHEAUDIT_SHIMS") is not None,
                          [type(f).__name__ for f in sys.meta_path
                           if type(f).__module__ == "cacheaudit.importhooks"]]))
    """, env)
    assert done.returncode == 0, done.stderr
    shims, finders = json.loads(done.stdout)
    assert shims
    assert finders == (["_FirstImportTrigger"] if label == "inside" else ["_PostImportFinder"])


def _cuda_core_problem() -> str | None:
    try:
        from cuda.core import Program  # noqa: F401
        from cuda.core.utils import FileStreamProgramCache  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure means: no cuda.core here
        return f"{type(exc).__name__}: {exc}"
    return _NVRTC


_CUDA_CORE = _cuda_core_problem()
HITS_JOB = """
    import os, sys
    from cuda.core import Program, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache
    program = Program('extern "C" __global__ void k(int* o) {{ o[0] = 9; }}\\n', "c++",
                      options=ProgramOptions(arch="sm_90", name="nine"))
    cache = FileStreamProgramCache(sys.argv[1])
    for _ in range({calls}):
        program.compile("cubin", cache=cache)
    if sys.argv[2] == "exception":
        raise RuntimeError("the job failed after its hits")
"""


@pytest.mark.skipif(_CUDA_CORE is not None, reason=f"cuda.core cannot compile: {_CUDA_CORE}")
@pytest.mark.parametrize("ending", ["normal", "exception"])
def test_buffered_hits_reach_the_ledger_when_the_process_ends(tmp_path: Path, ending: str):
    """cuda.core's hits are counted in a buffer, not written one by one: at the end of a
    process inside a session, whether it exits or dies of an exception, every one of them is in
    the session's ledger file, as hits of the entry the compile wrote."""
    session = _session(tmp_path)
    calls = 40
    try:
        done = _python(HITS_JOB.format(calls=calls), session.env, str(tmp_path / "pc"), ending)
    finally:
        session.close()
    assert done.returncode == (1 if ending == "exception" else 0), done.stderr
    with Ledger.open(session.ledger) as opened:
        records = [r for r in opened.records(where="runs.run_uuid = ?",
                                             params=(session.run_uuid,))
                   if r.runtime == "cuda-core"]
    [built] = [r for r in records if r.event == "compile"]
    hits = [r for r in records if r.event == "disk-hit"]
    assert built.kernel == "nine" and built.entry and os.path.isfile(built.entry)
    assert {r.entry for r in hits} == {built.entry}
    assert {r.outputs[0].digest for r in hits} == {built.outputs[0].digest}
    assert sum(r.extra["hits"] for r in hits) == calls - 1, [r.extra for r in hits]


def test_the_watch_plan_reads_no_entry_to_know_it_is_there(tmp_path: Path) -> None:
    """A session's first process plans which entry directories to watch; an Inductor root's
    precompiled header (tens of MB in a real cache) is listed by its stat and never opened, the
    plan is the one a reading of every file gives, and Inductor's is the only reader loaded.
    Seen through the interpreter's own audit events (`open`), in a process of its own."""
    key = "c" + "a" * 51
    headers = tmp_path / "inductor" / "precompiled_headers"
    headers.mkdir(parents=True)
    (headers / f"{key}.h").write_text("#include <vector>\n")
    (headers / f"{key}.h.gch").write_bytes(b"\0" * 4096)
    probe = textwrap.dedent(f"""
        import json, sys
        from cacheaudit.digest import StateCache
        from cacheaudit import watch
        opened = []
        sys.addaudithook(lambda event, args: opened.append(str(args[0]))
                         if event == "open" and {str(tmp_path)!r} in str(args[0]) else None)
        env = {{"TORCHINDUCTOR_CACHE_DIR": {str(tmp_path / "inductor")!r},
               "TMPDIR": {str(tmp_path)!r}, "HOME": {str(tmp_path)!r}}}
        plan = watch.plan_watch(None, env)
        stat_only = sorted(opened)
        readers = sorted(m for m in sys.modules if m.startswith("cacheaudit.runtimes.")
                         and m.endswith(".layout"))
        watch.StatOnlyCache = StateCache  # the same plan, every file read
        read = watch.plan_watch(None, env)
        print(json.dumps({{"opened": stat_only, "readers": readers,
                          "plan": sorted(plan.entries.items()),
                          "read": sorted(read.entries.items()), "roots": list(plan.roots)}}))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120, env={k: v for k, v in os.environ.items()
                                            if not k.startswith(("CACHEAUDIT", "TORCHINDUCTOR"))})
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    gch = str(headers / f"{key}.h.gch")
    assert seen["roots"] == [str(tmp_path / "inductor")]
    assert gch in dict(seen["plan"]), seen["plan"]
    assert seen["plan"] == seen["read"]
    # A default root is read by the layout that declared it, and no other reader is loaded.
    assert seen["readers"] == ["cacheaudit.runtimes.inductor.layout"], seen["readers"]
    assert not [path for path in seen["opened"] if path.endswith((".gch", ".h"))], seen["opened"]
