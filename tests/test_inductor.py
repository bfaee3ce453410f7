"""Inductor (torch.compile's C++ layer on CPU), against the real torch 2.13.0: its own
`CppCodeCache.load` builds and serves each kernel in a process of its own
(tests/inductor_driver.py), with a TORCHINDUCTOR_CACHE_DIR per test.

Ground truth is the value the served library returns and the value a compile into an empty
cache returns: a stale hit is a second process served the old value under the same key.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cacheaudit.digest import StateCache
from cacheaudit.model import CacheEntry, CacheLeftover

pytest.importorskip("torch")

TESTS = Path(__file__).parent
DRIVER = TESTS / "inductor_driver.py"
KERNEL = '#include <tile.h>\nextern "C" int scaled(int x) { return x * TILE; }\n'
GXX = shutil.which("g++")

pytestmark = pytest.mark.skipif(GXX is None, reason="Inductor compiles CPU kernels with g++")

# `cpp.vec_isa_ok` (an Inductor config value, in the FX key, the same in every process of a
# scenario): "0" generates scalar kernels, "1" takes the vector ISA from the CPU's flags.
# Either way no ISA probe is compiled, ~4-8 s of every process whose cache is empty; the
# scenarios that set it are not about the probes.
SCALAR_KERNELS = {"TORCHINDUCTOR_VEC_ISA_OK": "0"}
ISA_FROM_CPU_FLAGS = {"TORCHINDUCTOR_VEC_ISA_OK": "1"}
# No precompiled header (also in the FX key): it costs ~4 s per $TMPDIR and per ISA, more than
# the one or two kernels of a scenario save by it.
NO_PRECOMPILED_HEADER = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}


def _env(tmp: Path, cache: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("TORCHINDUCTOR_", "CACHEAUDIT_")) and k != "CPATH"}
    env.update({"TORCHINDUCTOR_CACHE_DIR": str(cache), "XDG_CACHE_HOME": str(tmp / "xdg"),
                "CACHEAUDIT_LEDGER": str(tmp / "ledger.db"),
                # precompiled headers live under $TMPDIR/torchinductor_<user>: kept per test
                "TMPDIR": str(tmp / "tmp"),
                # No pool of compile workers (each a process importing torch, on shared
                # cores): kernels compile in the process. Not in the FX key
                # (`_cache_config_ignore_prefix`, config.py:2854).
                "TORCHINDUCTOR_COMPILE_THREADS": "1",
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(TESTS.parent), os.environ.get("PYTHONPATH", "")) if p)})
    (tmp / "tmp").mkdir(exist_ok=True)
    env.update(extra)
    return env


def _kernel(env: dict[str, str], source: Path, *, recorded: bool = False,
            report: Path | None = None) -> dict[str, object]:
    """The driver's answer for `source`, in a process of its own (under `cacheaudit run` when
    `recorded`, its report written to `report`)."""
    job = [sys.executable, str(DRIVER), "kernel", str(source)]
    run = ["run", *(("--report-json", str(report)) if report else ()), "--"]
    argv = [sys.executable, "-m", "cacheaudit", *run, *job] if recorded else job
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[0])


def _scan(env: dict[str, str], root: Path) -> tuple[int, list[dict[str, object]]]:
    done = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--json", "--fail-on",
                           "error", str(root)], capture_output=True, text=True, env=env,
                          timeout=300)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, json.loads(done.stdout)["findings"]


def _plugin(tmp_path: Path, env: dict[str, str], body: str) -> str:
    """`pytest --cacheaudit --cacheaudit-fail-on=error` of one test, `test_served`, whose body
    is `body` (the driver's functions imported), in a process of its own; the session must pass
    its test and fail on a finding (1). Returns its output."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_served.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\n"
        "from inductor_driver import compile_module, compiled, kernel\n\n\n"
        f"def test_served():\n    {body}\n")
    plugin = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "--cacheaudit", "--cacheaudit-fail-on=error", "test_served.py"],
                            capture_output=True, text=True, env=env, cwd=suite, timeout=600)
    assert plugin.returncode == 1, plugin.stdout[-3000:] + plugin.stderr[-3000:]
    assert "1 passed" in plugin.stdout, plugin.stdout[-3000:]
    return plugin.stdout


def _served_under_plugin(tmp_path: Path, env: dict[str, str], source: Path, value: int) -> str:
    """`_plugin` of a test served the kernel of `source` (its `scaled(3)` is `value`)."""
    return _plugin(tmp_path, env, f"assert kernel({str(source)!r})['value'] == {value}")


def test_a_header_cpath_supplies_is_served_stale_and_scan_names_it(tmp_path: Path) -> None:
    """CPATH puts a header before the system's; Inductor's kernel key is the source and the
    command line as text, so an edit of that header is served stale by the next process.
    `cacheaudit run` of that process, `pytest --cacheaudit` of a test served it, and a later
    scan name the header (CA101). Before the edit the scan raises no error (control), and
    recording did not change the key: the plain compile into an empty cache after the edit
    computes the same one."""
    include = tmp_path / "include"
    include.mkdir()
    header = include / "tile.h"
    header.write_text("#define TILE 4\n")
    source = tmp_path / "kernel.cpp"
    source.write_text(KERNEL)
    cache = tmp_path / "cache"
    env = _env(tmp_path, cache, CPATH=str(include))

    built = _kernel(env, source, recorded=True)
    assert built["value"] == 12

    status, findings = _scan(env, cache)
    assert status == 0, [f for f in findings if f["severity"] == "error"]
    assert any(f["code"] == "CA102" and str(f["entry"]).endswith(".main.so") for f in findings)

    time.sleep(0.05)
    header.write_text("#define TILE 8\n")
    report = tmp_path / "run.json"
    served = _kernel(env, source, recorded=True, report=report)
    fresh = _kernel(dict(env, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "empty")), source)
    assert (served["key"], served["library"]) == (built["key"], built["library"])
    assert (served["value"], fresh["value"]) == (12, 24)  # ground truth: the hit is stale
    # The plain compile into an empty cache computed the recorded compile's key: recording
    # did not change it (and the header is not in it).
    assert fresh["key"] == built["key"], "recording changed Inductor's kernel key"

    # `cacheaudit run` of the process that was served: a disk hit (seen by its opens; no
    # compiler ran), and the header named on it.
    ran = json.loads(report.read_text())
    assert (ran["activity"]["compiles"], ran["activity"]["disk_hits"]) == (0, 1), ran["activity"]
    assert [(f["code"], f["subject"], f["entry"]) for f in ran["findings"]
            if f["severity"] == "error"] == [("CA101", str(header), built["library"])]

    # `pytest --cacheaudit` of a test served the same library fails the session on it.
    plugin = _served_under_plugin(tmp_path, env, source, 12)
    assert f"{header}: CA101 error" in plugin, plugin[-3000:]

    status, findings = _scan(env, cache)
    assert status == 1
    stale = [(f["code"], f["subject"], f["entry"]) for f in findings if f["code"] == "CA101"]
    assert stale == [("CA101", str(header), built["library"])], findings


@pytest.mark.slow
def test_a_compiler_earlier_on_path_is_served_stale_and_scan_names_it(tmp_path: Path) -> None:
    """`g++` is looked up on PATH in every process and only its name is keyed: another g++
    earlier on PATH gets the old library. Ground truth: an empty cache under the new PATH gives
    the new value. `cacheaudit run` of the served process, `pytest --cacheaudit` of a test
    served the same library, and a later scan under the new PATH name the g++ Inductor would
    run now (CA301, `Policy.looks_up_compiler_by_name`); under the PATH of the build the scan
    raises nothing (control)."""
    source = tmp_path / "kernel.cpp"
    source.write_text('extern "C" int scaled(int x) { return x * SCALE; }\n')
    compilers = {}
    for name, scale in (("old", 2), ("new", 5)):
        directory = tmp_path / name
        directory.mkdir()
        wrapper = directory / "g++"
        wrapper.write_text(f"#!/bin/sh\nexec {GXX} -DSCALE={scale} \"$@\"\n")
        wrapper.chmod(0o755)
        compilers[name] = f"{directory}{os.pathsep}{os.environ['PATH']}"
    cache = tmp_path / "cache"
    env = _env(tmp_path, cache)
    built = _kernel(dict(env, PATH=compilers["old"]), source, recorded=True)
    report = tmp_path / "served.json"
    served = _kernel(dict(env, PATH=compilers["new"]), source, recorded=True, report=report)
    fresh = _kernel(dict(env, PATH=compilers["new"], TORCHINDUCTOR_CACHE_DIR=str(
        tmp_path / "empty")), source)
    assert (served["key"], served["value"], fresh["value"]) == (built["key"], 6, 15)
    new_gxx = str(tmp_path / "new" / "g++")
    assert _errors(report) == [("CA301", new_gxx, built["library"])]
    plugin = _served_under_plugin(tmp_path, dict(env, PATH=compilers["new"]), source, 6)
    assert f"{new_gxx}: CA301 error" in plugin, plugin[-3000:]

    status, findings = _scan(dict(env, PATH=compilers["old"]), cache)
    assert status == 0, [f for f in findings if f["severity"] == "error"]
    status, findings = _scan(dict(env, PATH=compilers["new"]), cache)
    assert status == 1
    drift = [(f["code"], f["subject"], f["entry"]) for f in findings if f["severity"] == "error"]
    assert drift == [("CA301", new_gxx, built["library"])], findings


def test_recording_leaves_g_plus_plus_v_alone(tmp_path: Path) -> None:
    """Inductor keys `<compiler> -v` (cpp_builder.py get_compiler_version_info, :639) into
    its vector-ISA probes (cpu_vec_isa.py:30) and precompiled headers (codecache.py:3597):
    under recording the text must be the same, or both are rebuilt under other keys."""
    job = [sys.executable, "-c", "from torch._inductor.cpp_builder import "
           "get_compiler_version_info as v; print(v('g++'))"]
    env = _env(tmp_path, tmp_path / "cache")
    plain = subprocess.run(job, capture_output=True, text=True, env=env, timeout=300)
    recorded = subprocess.run([sys.executable, "-m", "cacheaudit", "run", "--", *job],
                              capture_output=True, text=True, env=env, timeout=300)
    assert plain.returncode == recorded.returncode == 0, recorded.stderr
    assert "COLLECT_GCC=g++" in plain.stdout
    assert recorded.stdout.splitlines()[0] == plain.stdout.splitlines()[0]


@pytest.mark.slow
def test_recording_leaves_the_key_of_a_cxx_given_by_path_alone(tmp_path: Path) -> None:
    """`CXX=/usr/bin/g++` is on Inductor's hashed command line as written (config.py:1690,
    codecache.py:3752): a recorded compile must compute the key a plain one does. The session
    leaves it alone (Inductor's spec declares CXX with `path_in_key_if`)."""
    source = tmp_path / "kernel.cpp"
    source.write_text('extern "C" int scaled(int x) { return x * 7; }\n')
    env = _env(tmp_path, tmp_path / "cache", CXX=str(GXX))
    plain = _kernel(dict(env, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "plain")), source)
    recorded = _kernel(env, source, recorded=True)
    assert (plain["value"], recorded["value"]) == (21, 21)
    assert recorded["key"] == plain["key"]


class _Runs:
    """A pickle payload that would create a file if anything unpickled it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch {self.marker}",))


def test_the_reader_names_every_entry_kind_and_never_unpickles(tmp_path: Path) -> None:
    """The layout on a cache of every kind (built by hand in Inductor's grammar: a kernel pair,
    a probe pair, a source whose library is missing, a dead build directory, FX graph and
    AOTAutograd pickles, a precompiled header): the pickles are entries by name and digest,
    and reading them, or scanning them, runs nothing they name."""
    from cacheaudit.runtimes.inductor.layout import LAYOUT

    root = tmp_path / "cache"
    key = "c" + "a" * 51
    shard = root / key[1:3]
    shard.mkdir(parents=True)
    (shard / f"{key}.main.cpp").write_text(KERNEL)
    (shard / f"{key}.main.so").write_bytes(b"\x7fELF")
    probe = "c" + "b" * 51
    (root / probe[1:3]).mkdir()
    (root / probe[1:3] / f"{probe}.cpp").write_text("// probe\n")
    (root / probe[1:3] / f"{probe}.so").write_bytes(b"\x7fELF")
    orphan = "c" + "d" * 51
    (shard / f"{orphan}.main.cpp").write_text(KERNEL)
    (shard / f"{orphan}_CxxBuild").mkdir()
    marker = tmp_path / "unpickled"
    fx = root / "fxgraph" / "ee" / ("f" + "e" * 51)
    fx.mkdir(parents=True)
    (fx / "guards1").write_bytes(pickle.dumps(_Runs(marker)))
    aot = root / "aotautograd" / ("a" + "f" * 51)
    aot.mkdir(parents=True)
    (aot / "guards2").write_bytes(pickle.dumps(_Runs(marker)))
    headers = root / "precompiled_headers"
    headers.mkdir()
    header = "c" + "g" * 51
    (headers / f"{header}.h").write_text("#include <torch/csrc/inductor/cpp_prefix.h>\n")
    (headers / f"{header}.h.gch").write_bytes(b"gpch")
    (root / "locks").mkdir()

    assert LAYOUT.is_root(str(root))
    found = list(LAYOUT.read(str(root), StateCache()))
    entries = {(e.meta["kind"], e.key, os.path.relpath(e.path, root))
               for e in found if isinstance(e, CacheEntry)}
    assert entries == {
        ("kernel", key, f"aa/{key}.main.so"), ("cpp", probe, f"bb/{probe}.so"),
        ("fxgraph", fx.name, f"fxgraph/ee/{fx.name}/guards1"),
        ("aotautograd", aot.name, f"aotautograd/{aot.name}/guards2"),
        ("precompiled_header", header, f"precompiled_headers/{header}.h.gch")}
    leftovers = {os.path.relpath(e.path, root) for e in found if isinstance(e, CacheLeftover)}
    assert leftovers == {f"aa/{orphan}.main.cpp", f"aa/{orphan}_CxxBuild"}

    env = _env(tmp_path, root)
    _scan(env, root)
    assert not marker.exists(), "a pickle in the cache was unpickled"


def _every_kind(root: Path) -> dict[str, CacheEntry]:
    """One entry of each kind the reader names, in Inductor's grammar, by kind."""
    from cacheaudit.runtimes.inductor.layout import LAYOUT

    kernel, probe, header = ("c" + letter * 51 for letter in "abg")
    fx, aot = "f" + "e" * 51, "a" + "f" * 51
    for relative in (f"aa/{kernel}.main.cpp", f"aa/{kernel}.main.so", f"bb/{probe}.cpp",
                     f"bb/{probe}.so", f"fxgraph/ee/{fx}/guards1", f"aotautograd/{aot}/guards2",
                     f"precompiled_headers/{header}.h", f"precompiled_headers/{header}.h.gch"):
        (root / relative).parent.mkdir(parents=True, exist_ok=True)
        (root / relative).write_text(relative)
    return {str(e.meta["kind"]): e for e in LAYOUT.read(str(root), StateCache())
            if isinstance(e, CacheEntry)}


def test_the_isa_override_is_judged_by_each_layer_s_key(tmp_path: Path) -> None:
    """`ATEN_CPU_CAPABILITY` recorded as avx2, judged under the build's environment: CA202 on
    the FX graph and AOTAutograd entries (their keys miss the ISA), none on the C++ layer's
    (kernel, probe, precompiled header), whose key holds the ISA's flags (the ground truth,
    same source under two keys by ISA, is the slow real-compile test above); `CPATH`, in no
    layer's key, is CA202 on every kind. A scan under the override reports CA201 where an FX
    entry is scanned, and not for C++ entries alone."""
    from cacheaudit.audit.checks.environment import (
        environment_findings,
        scan_environment_findings,
    )
    from cacheaudit.audit.context import AuditContext
    from cacheaudit.model import CompileRecord
    from cacheaudit.runtimes.inductor.policy import POLICIES

    policy = POLICIES["inductor"]
    entries = _every_kind(tmp_path / "cache")
    assert set(entries) == {"kernel", "cpp", "fxgraph", "aotautograd", "precompiled_header"}
    built = {"ATEN_CPU_CAPABILITY": "avx2", "CPATH": str(tmp_path)}
    judged: dict[str, set[str]] = {}
    for kind, entry in entries.items():
        record = CompileRecord(record_id="r", event="compile", started_ns=1, duration_ns=0,
                               runtime="inductor", entry=entry.path, env=built)
        judged[kind] = {f.subject for f in environment_findings(AuditContext(env={}), entry,
                                                                record, policy)
                        if f.code == "CA202"}
    assert judged == {"fxgraph": {"ATEN_CPU_CAPABILITY", "CPATH"},
                      "aotautograd": {"ATEN_CPU_CAPABILITY", "CPATH"},
                      "kernel": {"CPATH"}, "cpp": {"CPATH"},
                      "precompiled_header": {"CPATH"}}, judged

    override = AuditContext(env={"ATEN_CPU_CAPABILITY": "avx2"})

    def warned(kinds: tuple[str, ...]) -> set[str]:
        chosen = [entries[kind] for kind in kinds]
        return {str(f.subject) for f in scan_environment_findings(
            override, chosen, [(e, policy) for e in chosen]) if f.code == "CA201"}

    assert warned(("kernel", "cpp", "precompiled_header")) == set()
    assert warned(("kernel", "fxgraph")) == {"ATEN_CPU_CAPABILITY"}


def test_the_default_roots_follow_torch(tmp_path: Path) -> None:
    """cache_dir() then default_cache_dir() (runtime/cache_dir_utils.py:14, :24): the second
    holds the precompiled headers whatever TORCHINDUCTOR_CACHE_DIR says."""
    from cacheaudit.runtimes.inductor.layout import LAYOUT

    env = {"TMPDIR": str(tmp_path), "USER": "a/b", "TORCHINDUCTOR_CACHE_DIR": "rel"}
    assert LAYOUT.default_roots(env) == [os.path.abspath("rel"),
                                         str(tmp_path / "torchinductor_a_b")]
    assert LAYOUT.default_roots({"TMPDIR": str(tmp_path), "USER": "u"}) == [
        str(tmp_path / "torchinductor_u")]


@pytest.mark.slow
def test_a_real_torch_compile_cache_is_read_whole_and_its_kernels_tied_to_their_compiles(
        tmp_path: Path) -> None:
    """torch.compile of a small function on CPU under `cacheaudit run`, then again in a new
    process: torch's own counters say the second was an FX graph and AOTAutograd hit with the
    same result. The scan reads every entry kind Inductor wrote (kernels, ISA probes, FX graph
    and AOTAutograd entries, the precompiled header under $TMPDIR) and ties every C++ entry to
    the g++ compile the shim recorded, and the FX graph and AOTAutograd entries to the
    adapter's records of their saves; nothing in the cache raises an error."""
    cache = tmp_path / "cache"
    env = _env(tmp_path, cache)
    job = [sys.executable, str(DRIVER), "compile"]
    first = subprocess.run([sys.executable, "-m", "cacheaudit", "run", "--", *job],
                           capture_output=True, text=True, env=env, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    first_end = time.time_ns()
    built = json.loads(first.stdout.splitlines()[0])
    assert built["inductor"].get("fxgraph_cache_miss") == 1, built
    again = subprocess.run(job, capture_output=True, text=True, env=env, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    served = json.loads(again.stdout.splitlines()[0])
    assert served["inductor"].get("fxgraph_cache_hit") == 1, served
    assert served["aot_autograd"].get("autograd_cache_hit") == 1, served
    assert served["result"] == built["result"]

    from cacheaudit.runtimes.inductor.layout import LAYOUT, default_cache_dir

    headers_root = default_cache_dir(env)
    assert LAYOUT.default_roots(env) == [str(cache), headers_root]
    kinds = {e.meta["kind"] for root in (cache, headers_root)
             for e in LAYOUT.read(str(root), StateCache()) if isinstance(e, CacheEntry)}
    assert kinds == {"kernel", "cpp", "fxgraph", "aotautograd", "precompiled_header"}, kinds

    done = subprocess.run([sys.executable, "-m", "cacheaudit", "scan", "--json", "--fail-on",
                           "error"], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    findings = json.loads(done.stdout)["findings"]
    unrecorded = {str(f["entry"]) for f in findings
                  if f["code"] == "CA501" and "no recorded compile" in f["message"]}
    # The FX graph and AOTAutograd entries have the adapter's compile records (the saves,
    # FxGraphCache._save_graph and AOTAutogradCache._write_to_local_cache), tied by the scan.
    assert not {path for path in unrecorded if f"{os.sep}fxgraph{os.sep}" in path
                or f"{os.sep}aotautograd{os.sep}" in path}, unrecorded
    # Every C++ entry the recorded process built is tied to its compile. The unrecorded second
    # process rebuilt the ISA probes (and the precompiled header) under other keys: both keys
    # hold `g++ -v`, which the shim changes (test_recording_leaves_g_plus_plus_v_alone).
    rebuilt = {path for path in unrecorded if os.stat(path).st_mtime_ns > first_end}
    assert unrecorded - rebuilt == set(), unrecorded


def _compile(env: dict[str, str], *, report: Path | None = None) -> dict[str, object]:
    job = [sys.executable, str(DRIVER), "compile"]
    argv = ([sys.executable, "-m", "cacheaudit", "run", "--report-json", str(report), "--", *job]
            if report else job)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    # Under `cacheaudit run` an error finding fails the run (1); the job's answer is still
    # its first line.
    assert done.returncode in ((0, 1) if report else (0,)), done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[0])


def _fx_entries(root: Path) -> dict[str, str]:
    """FX graph key -> sha256 of its entry file."""
    import hashlib

    return {path.parent.name: hashlib.sha256(path.read_bytes()).hexdigest()
            for path in (root / "fxgraph").glob("*/*/*") if path.is_file()}


def _has_avx512() -> bool:
    try:
        with open("/proc/cpuinfo") as info:
            return " avx512f" in info.read()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _has_avx512(), reason="Inductor picks AVX-512 only on a CPU that has it")
def test_an_isa_override_is_served_the_other_isa_s_graph_and_run_names_it(
        tmp_path: Path) -> None:
    """`ATEN_CPU_CAPABILITY=avx2` after a compile without it on an AVX-512 CPU: the FX graph key
    does not hold the ISA (pick_vec_isa reads it at run time, cpu_vec_isa.py:661), so the next
    process is an FX hit served the graph generated for AVX-512 (16-lane loads), whose kernels
    are compiled again with the AVX2 flags (the C++ key holds those). Ground truth: an empty
    cache under the override gives other numbers. `cacheaudit run` of the served process,
    `pytest --cacheaudit` of a test served the same graph, and a later scan under the override
    name the variable on the FX entry (CA202, the save record's environment against the hit's,
    or the scan's); the scan under the build's environment raises no error on it (control)."""
    cache = tmp_path / "cache"
    env = _env(tmp_path, cache, **ISA_FROM_CPU_FLAGS, **NO_PRECOMPILED_HEADER)
    override = dict(env, ATEN_CPU_CAPABILITY="avx2")
    report = tmp_path / "served.json"
    built = _compile(env, report=tmp_path / "built.json")
    served = _compile(override, report=report)
    fresh = _compile(dict(override, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "empty")))
    assert served["inductor"].get("fxgraph_cache_hit") == 1, served
    assert fresh["result"] == built["result"]  # the right numbers, for either ISA
    assert served["result"] != fresh["result"], served  # ground truth: the hit is wrong
    ran = json.loads(report.read_text())
    named = {(f["code"], f["subject"], str(f["entry"])) for f in ran["findings"]
             if f["severity"] == "error" and f"{os.sep}fxgraph{os.sep}" in str(f["entry"])}
    assert {(code, subject) for code, subject, _ in named} == {
        ("CA202", "ATEN_CPU_CAPABILITY")}, ran["findings"]

    plugin = _plugin(tmp_path, override, "compiled()")
    assert "ATEN_CPU_CAPABILITY: CA202 error" in plugin, plugin[-3000:]

    def fx_errors(findings: list[dict[str, object]]) -> set[tuple[str, str, str]]:
        return {(str(f["code"]), str(f["subject"]), str(f["entry"])) for f in findings
                if f["severity"] == "error" and f"{os.sep}fxgraph{os.sep}" in str(f["entry"])}

    def isa_alarms(findings: list[dict[str, object]]) -> set[str]:
        return {str(f["entry"]) for f in findings
                if f["code"] == "CA202" and f["subject"] == "ATEN_CPU_CAPABILITY"}

    # Ground truth that the C++ kernel key holds the ISA: the served process compiled the
    # same kernel sources again under the override, and they got keys of their own, built
    # with the AVX2 defines beside the AVX-512 ones (the shim's records of both processes).
    from cacheaudit.ledger import Ledger

    with Ledger.open(env["CACHEAUDIT_LEDGER"], create=False) as ledger:
        compiles = [r for r in ledger.records() if r.event == "compile" and r.sources
                    and r.sources[0].path.endswith(".main.cpp")]
    isas_by_source: dict[str, set[tuple[str, str]]] = {}
    for record in compiles:
        source = Path(record.sources[0].path)
        # `-D CPU_CAPABILITY_AVX2` (two tokens, cpp_builder.py's defines) or one token
        isa = next((a.rpartition("CPU_CAPABILITY_")[2] for a in record.argv
                    if "CPU_CAPABILITY_" in a), "none")
        isas_by_source.setdefault(source.read_text(), set()).add((source.name, isa))
    rebuilt = [pairs for pairs in isas_by_source.values()
               if len({isa for _, isa in pairs}) > 1 and len({key for key, _ in pairs}) > 1]
    assert rebuilt, isas_by_source.values()
    kernels_built_under_override = {r.sources[0].path for r in compiles
                                    if r.env.get("ATEN_CPU_CAPABILITY") == "avx2"}
    assert kernels_built_under_override, [r.env for r in compiles]

    # The scan under the build's environment: no error on the FX entry (its save's
    # environment is the build's), and no ATEN_CPU_CAPABILITY on any kernel, not even those
    # built under the override: their key holds the ISA, so they cannot be served to it
    # (the C++ layer's variant of the registry, InductorPolicy.environment_variant).
    _, findings = _scan(env, cache)
    assert fx_errors(findings) == set(), findings
    assert isa_alarms(findings) == set(), findings
    status, findings = _scan(override, cache)
    assert status == 1
    assert fx_errors(findings) == named, findings
    # Under the override: the FX entry (and the AOTAutograd entry: neither key holds the ISA);
    # none of the kernels the build made for AVX-512, which are never served to the AVX2
    # process.
    alarms = isa_alarms(findings)
    assert {entry for _, _, entry in named} <= alarms, findings
    assert {entry for entry in alarms if f"{os.sep}fxgraph{os.sep}" not in entry
            and f"{os.sep}aotautograd{os.sep}" not in entry} == set(), findings


ADAPTER_JOB = '''
import ctypes, json, sys
from cacheaudit import runtimes
runtimes.activate(["inductor"])
from torch._inductor.codecache import CppCodeCache
from cacheaudit.runtimes.inductor.adapter import ADAPTER
source = 'extern "C" int seven() { return 7; }\\n'
first = CppCodeCache.load(source, needs_vec_isa=False)
CppCodeCache.cache.clear()  # the next load is served from disk, as in a new process
again = CppCodeCache.load(source, needs_vec_isa=False)
again.seven.restype = ctypes.c_int
ADAPTER.flush()
print(json.dumps({"installed": ADAPTER.installed(), "key": again.key, "library": again._name,
                  "value": again.seven()}))
'''


def _adapter_job(env: dict[str, str]) -> tuple[dict[str, object], str]:
    done = subprocess.run([sys.executable, "-c", ADAPTER_JOB], capture_output=True, text=True,
                          env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), done.stderr


def test_the_adapter_records_a_disk_hit_and_fails_open(tmp_path: Path) -> None:
    """The adapter in a process of torch's own `CppCodeCache.load`: the second load, served
    from disk, is a disk-hit record with the key, the hashed command line, the ISA and
    `existed`, whose entry is the library loaded. With a ledger that cannot be written (its
    directory is a file) the kernel still loads and returns 7, and the problem is one line on
    stderr: recording never breaks the runtime."""
    from cacheaudit.ledger import Ledger

    env = _env(tmp_path, tmp_path / "cache")
    served, _ = _adapter_job(env)
    assert served["installed"] and served["value"] == 7
    with Ledger.open(env["CACHEAUDIT_LEDGER"], create=False) as ledger:
        hits = [r for r in ledger.records() if r.observer == "adapter:inductor"]
    assert [(r.event, r.key, r.entry) for r in hits] == [
        ("disk-hit", served["key"], served["library"])]
    extra = hits[0].extra
    assert extra["existed"] is True and extra["isa"] == "none"
    assert extra["command_line"].startswith(("g++", "c++")), extra

    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")
    env = _env(tmp_path, tmp_path / "cache2", CACHEAUDIT_LEDGER=str(blocked / "ledger.db"))
    served, stderr = _adapter_job(env)
    assert served["installed"] and served["value"] == 7
    problems = [line for line in stderr.splitlines() if "cacheaudit" in line]
    assert len(problems) == 1, stderr


# ------------------------------------------------------------------ stale FX hits, module by module


def _module(env: dict[str, str], module: Path, *, report: Path | None = None
            ) -> dict[str, object]:
    """The driver's `module` mode on `module` (torch.compile of its `function`), in a process
    of its own, under `cacheaudit run` when `report` is given."""
    job = [sys.executable, str(DRIVER), "module", str(module)]
    argv = ([sys.executable, "-m", "cacheaudit", "run", "--report-json", str(report), "--", *job]
            if report else job)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
    # Under `cacheaudit run` an error finding fails the run (1); the job's answer is its line.
    assert done.returncode in ((0, 1) if report else (0,)), done.stderr[-3000:]
    return json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))


def _errors(report: Path) -> list[tuple[str, str, str]]:
    ran = json.loads(report.read_text())
    return sorted((f["code"], f["subject"], str(f["entry"])) for f in ran["findings"]
                  if f["severity"] == "error")


SCALE = 2
"""A module-level option the pass below reads (the scenario of a pass configured from outside
its uuid())."""


class _Scale:
    """A custom pass in Inductor's shape: `__call__(graph)` and `uuid()`."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    def __call__(self, graph: object) -> int:
        return SCALE * self.factor

    def uuid(self) -> str:
        return "scale-1"


def test_a_custom_passs_state_outside_its_uuid_is_compared_and_named(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The adapter's pass snapshot against a later one, field by field: an instance attribute
    and a module-level value the pass's `__call__` names are told apart and named
    (`_Scale.factor`, `test_inductor.SCALE`); the same state, or another uuid() (in the key,
    so that entry is not what is served), gives nothing."""
    from cacheaudit.runtimes.inductor.adapter import _pass_state, _record, custom_pass_changes
    from cacheaudit.runtimes.inductor.policy import POLICIES

    slot = "post_grad_custom_post_pass"
    then = {slot: _pass_state(_Scale(3))}
    assert custom_pass_changes(then, {slot: _pass_state(_Scale(3))}) == []
    monkeypatch.setattr(sys.modules[__name__], "SCALE", 5)
    changes = custom_pass_changes(then, {slot: _pass_state(_Scale(4))})
    assert [(c["field"], c["recorded"], c["current"]) for c in changes] == [
        ("attribute factor", "3", "4"), ("global SCALE", "2", "5")]
    renamed = _pass_state(_Scale(4))
    renamed["uuid"] = "'scale-2'"
    assert custom_pass_changes(then, {slot: renamed}) == []

    hit = _record("disk-hit", "f" + "a" * 51, None, {"layer": "fxgraph",
                                                     "custom_passes_changed": changes})
    findings = POLICIES["inductor"].record_findings(hit, [])
    assert [(f.code, f.subject) for f in findings] == [
        ("CA101", "_Scale.factor"), ("CA101", f"{__name__}.SCALE")]
    assert all(slot in f.message for f in findings)

CLAMP = '''import torch


def function(x):
    return torch.clamp_min(x, 1.5)


def inputs():
    return (torch.arange(4, dtype=torch.float32),)
'''
PREFIX_HEADER = "torch/csrc/inductor/cpp_prefix.h"
MAX_PROPAGATE_NAN = ("inline scalar_t max_propagate_nan(scalar_t a, scalar_t b) {\n"
                     "  if (at::_isnan(a)) {\n    return a;\n  }\n  return a > b ? a : b;\n}")


def _torch_farm(root: Path, header: str) -> tuple[Path, Path]:
    """A private torch, so that the installed one is never touched: every top-level entry of
    the package a symlink but `include/`, rebuilt as a tree of per-file symlinks, in which the
    one `header` (relative to include/) is a real copy. First on PYTHONPATH it is the torch a
    subprocess imports, and `cpp_extension.include_paths()` (cpp_builder.py:1315) points into
    it. Returns (the directory for PYTHONPATH, the copied header)."""
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    real = Path(spec.origin).parent
    farm = root / "torch"
    farm.mkdir(parents=True)
    for entry in real.iterdir():
        if entry.name != "include":
            (farm / entry.name).symlink_to(entry)
    for directory, _, files in os.walk(real / "include"):
        into = farm / Path(directory).relative_to(real)
        into.mkdir(exist_ok=True)
        for name in files:
            (into / name).symlink_to(Path(directory) / name)
    copied = farm / "include" / header
    copied.unlink()
    shutil.copyfile(real / "include" / header, copied)
    return root, copied


@pytest.mark.slow
def test_a_torch_include_header_edited_is_served_stale_and_run_and_scan_name_it(
        tmp_path: Path) -> None:
    """A header under torch/include edited (`max_propagate_nan` in cpp_prefix.h, which every
    Inductor CPU kernel includes, made to double its result), in a private torch whose include
    directory Inductor compiles with (`-I<farm>/torch/include` on the command line it hashes):
    neither key holds a header's content (`torch_key` hashes torch's Python sources, the kernel
    key the source and the command line as text), so the next process is an FX hit whose
    kernel, looked up by the same C++ key, is the old library: clamp_min(x, 1.5) as before,
    where an empty cache gives twice that. `cacheaudit run` of that process, `pytest
    --cacheaudit` of a test served the same graph, and a later scan name the header (CA101) on
    the kernel."""
    farm, header = _torch_farm(tmp_path / "farm", PREFIX_HEADER)
    include = str(header.parents[len(Path(PREFIX_HEADER).parts) - 1])
    env = _env(tmp_path, tmp_path / "cache", **SCALAR_KERNELS, **NO_PRECOMPILED_HEADER,
               PYTHONDONTWRITEBYTECODE="1")  # no byte code written into the real torch
    env["PYTHONPATH"] = os.pathsep.join((str(farm), env["PYTHONPATH"]))
    text = header.read_text()
    assert text.count(MAX_PROPAGATE_NAN) == 1
    edited = text.replace(MAX_PROPAGATE_NAN, MAX_PROPAGATE_NAN.replace(
        "return a > b ? a : b;", "return 2 * (a > b ? a : b);"))

    module = tmp_path / "scenario.py"
    module.write_text(CLAMP)
    built = _module(env, module, report=tmp_path / "built.json")
    assert built["result"] == [1.5, 1.5, 2.0, 3.0], built
    header.write_text(edited)
    report = tmp_path / "served.json"
    served = _module(env, module, report=report)
    fresh = _module(dict(env, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "empty")), module)
    assert served["inductor"].get("fxgraph_cache_hit") == 1, served
    assert served["libraries"] == built["libraries"] == fresh["libraries"], (served, fresh)
    assert served["result"] == built["result"]  # the old kernel, from both layers
    assert fresh["result"] == [3.0, 3.0, 4.0, 6.0]  # ground truth: the edited header compiled

    # The kernel was built and looked up with the farm's include directory.
    from cacheaudit.ledger import Ledger

    with Ledger.open(env["CACHEAUDIT_LEDGER"], create=False) as ledger:
        lookups = [r.extra["command_line"] for r in ledger.records()
                   if r.observer == "adapter:inductor" and r.extra.get("layer") == "cpp"]
    assert lookups and all(f"-I{include} " in line for line in lookups), lookups

    library = str(tmp_path / "cache" / served["libraries"][0][1:3] / served["libraries"][0])
    assert _errors(report) == [("CA101", str(header), library)]
    plugin = _plugin(tmp_path, env, f"assert compile_module({str(module)!r})['result'] == "
                                    f"{built['result']!r}")
    assert f"{header}: CA101 error" in plugin, plugin[-3000:]
    status, findings = _scan(env, tmp_path / "cache")
    assert status == 1
    stale = [(f["code"], f["subject"], f["entry"]) for f in findings if f["severity"] == "error"]
    assert stale == [("CA101", str(header), library)], findings


@pytest.mark.slow
def test_a_variable_in_the_fx_key_misses_and_run_stays_clean(tmp_path: Path) -> None:
    """Control: `TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS=0` after a compile without it, a
    variable cacheaudit knows and that is in the FX key (an Inductor config value): the next
    process misses (torch's counter), writes an FX entry under another key and gets the
    numbers an empty cache gives; `cacheaudit run` of it raises no error."""
    env = _env(tmp_path, tmp_path / "cache", **SCALAR_KERNELS)
    module = tmp_path / "scenario.py"
    module.write_text(CLAMP)
    built = _module(env, module, report=tmp_path / "built.json")
    report = tmp_path / "changed.json"
    changed = _module(dict(env, TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS="0"), module,
                      report=report)
    assert built["inductor"].get("fxgraph_cache_miss") == 1, built
    assert changed["inductor"].get("fxgraph_cache_miss") == 1, changed
    assert len(_fx_entries(tmp_path / "cache")) == 2
    assert changed["result"] == built["result"] == [1.5, 1.5, 2.0, 3.0]
    assert _errors(report) == []
