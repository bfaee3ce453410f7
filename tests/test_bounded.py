"""Hostile caches, spools, ledgers and snapshots: each bad file is a finding for itself.

Real files on disk and real `cacheaudit` subprocesses, each under a deadline (a hang fails the
test instead of blocking the suite): a FIFO and `/dev/urandom` as an entry's source, JSON nested
100,000 deep in a DeepJIT meta.json, a Triton metadata file, a spool file, a ledger value and a
snapshot, symlink loops as entry and key directories. Each becomes a finding (or a note, or a
usage error) for that one file while a healthy neighbour is still judged, and no command takes
more than 30 s. Then properties of the bounded JSON reader itself (hypothesis).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cacheaudit import bounded
from cacheaudit.ledger import Ledger, RunInfo, new_record_id, spool_dir, spool_record
from cacheaudit.model import CompileRecord, FileState

from support import GXX, clean_env, reliability_figure

DEEP = 100_000
DEEP_JSON = "[" * DEEP + "]" * DEEP
SCAN_LIMIT_S = 30
GOOD, BAD = "good." + "0" * 32, "bad." + "1" * 32
needs_gxx = pytest.mark.skipif(GXX is None, reason="g++ is not on PATH: reconstruction skipped")


def cacheaudit(env: dict[str, str], *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    """A real `cacheaudit` process, killed (and the test failed) past the 30 s budget."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "cacheaudit", *args], capture_output=True,
                          text=True, env=env, timeout=SCAN_LIMIT_S)
    elapsed = time.monotonic() - started
    assert elapsed < SCAN_LIMIT_S
    return done, elapsed


def scan_json(env: dict[str, str], root: Path) -> dict[str, Any]:
    done, _ = cacheaudit(env, "scan", "--json", "--fail-on", "never", str(root))
    assert done.returncode == 0, done.stderr
    assert "internal error" not in done.stderr
    return json.loads(done.stdout)


def findings_of(report: dict[str, Any], entry: Path) -> list[tuple[str, str]]:
    return [(f["code"], f["subject"]) for f in report["findings"] if f["entry"] == str(entry)]


# ------------------------------------------------------------------------------ DeepJIT caches


def deepjit_entry(root: Path, name: str, *, source: bytes | None = b"int k() { return 1; }\n",
                  meta: str | None = None) -> Path:
    """A committed entry of the reference runtime's g++ mode: its command compiles kernel.cu
    with the g++ on PATH, so a scan reconstructs it with a real dependency pass."""
    entry = root / "cache" / name
    entry.mkdir(parents=True)
    (root / "tmp").mkdir(exist_ok=True)
    build = root / "tmp" / "BUILD"
    if source is not None:
        (entry / "kernel.cu").write_bytes(source)
    (entry / "kernel.so").write_bytes(b"\x7fELF" + bytes(60) + name.encode())
    compiler = GXX or "/usr/bin/g++"
    (entry / "meta.json").write_text(meta if meta is not None else json.dumps({
        "command": f"{compiler} -x c++ {build}/kernel.cu -fPIC -shared -o {build}/kernel.so",
        "config": {"python_library_root": str(root), "extra_signature": "",
                   "include_dirs": [], "include_prefixes": ["k/"]},
        "compiler_info": {"path": compiler, "version": "g++ (test) 12\n"},
        "compiler_options": {}}))
    (entry / ".committed").write_bytes(b"")
    return entry


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return clean_env(tmp_path)


def _processes_naming(text: str) -> list[str]:
    """Command lines of running processes that mention `text`."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(cmdline.decode(errors="replace"))
    return found


@needs_gxx
@pytest.mark.parametrize("kind", ["fifo", "urandom"])
def test_a_source_that_is_no_regular_file_is_refused_before_any_compiler(
        tmp_path: Path, env: dict[str, str], kind: str):
    root = tmp_path / "dj"
    good = deepjit_entry(root, GOOD)
    bad = deepjit_entry(root, BAD, source=None)
    if kind == "fifo":
        os.mkfifo(bad / "kernel.cu")
    else:
        os.symlink("/dev/urandom", bad / "kernel.cu")
    report = scan_json(env, root)
    words = "a FIFO" if kind == "fifo" else "a character device"
    refusal = [f for f in report["findings"] if f["entry"] == str(bad) and f["code"] == "CA501"
               and "not compiled" in f["message"]]
    assert [f["subject"] for f in refusal] == [str(bad / "kernel.cu")]
    assert f"kernel.cu is {words}, not a regular file: not compiled" in refusal[0]["message"]
    assert not _processes_naming(str(bad))  # no compiler was started on it (or left behind)
    assert report["reconstructed"] == 1  # the healthy neighbour had its dependency pass
    assert findings_of(report, good)
    assert ("CA501", str(good)) not in findings_of(report, good)


@needs_gxx
def test_an_include_directory_that_is_a_fifo_is_refused(tmp_path: Path, env: dict[str, str]):
    root = tmp_path / "dj"
    os.mkfifo(tmp_path / "pipe")
    compiler = GXX or "g++"
    meta = json.dumps({
        "command": f"{compiler} -x c++ {root}/tmp/BUILD/kernel.cu -I {tmp_path}/pipe -o k.so",
        "config": {"python_library_root": "/", "extra_signature": "", "include_dirs": [],
                   "include_prefixes": []},
        "compiler_info": {"path": compiler, "version": "g++ 12\n"}, "compiler_options": {}})
    bad = deepjit_entry(root, BAD, meta=meta)
    report = scan_json(env, root)
    assert ("CA501", str(tmp_path / "pipe")) in findings_of(report, bad)


@needs_gxx
def test_a_root_of_every_hostile_entry_at_once_is_judged_within_30_s_and_1_gib(
        tmp_path: Path, env: dict[str, str]):
    """The issue's bound, measured on one root holding every hostile entry beside a healthy
    one: the whole scan (cacheaudit and every process it started) under 30 s and 1 GiB."""
    root = tmp_path / "dj"
    good = deepjit_entry(root, GOOD)
    fifo = deepjit_entry(root, "fifo." + "2" * 32, source=None)
    os.mkfifo(fifo / "kernel.cu")
    urandom = deepjit_entry(root, "urandom." + "3" * 32, source=None)
    os.symlink("/dev/urandom", urandom / "kernel.cu")
    deep = deepjit_entry(root, "deep." + "4" * 32, meta=DEEP_JSON)
    loop = root / "cache" / ("loop." + "5" * 32)
    os.symlink(loop.name, loop)
    # The peak resident size of the scan and of every descendant it waited for.
    measure = ("import json, resource, subprocess, sys, time\n"
               "started = time.monotonic()\n"
               "done = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
               "print(json.dumps({'seconds': time.monotonic() - started, 'stdout': done.stdout,"
               " 'rc': done.returncode,"
               " 'peak_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n")
    measured = subprocess.run(
        [sys.executable, "-c", measure, sys.executable, "-m", "cacheaudit", "scan", "--json",
         "--fail-on", "never", str(root)], capture_output=True, text=True, env=env,
        timeout=SCAN_LIMIT_S * 2)
    outcome = json.loads(measured.stdout)
    assert outcome["rc"] == 0, measured.stderr
    report = json.loads(outcome["stdout"])
    said = {name: {(f["code"], f["message"]) for f in report["findings"]
                   if f["entry"] == str(entry)}
            for name, entry in (("fifo", fifo), ("urandom", urandom), ("deep", deep),
                                ("loop", loop))}
    expected = {"fifo": ("CA501", "kernel.cu is a FIFO, not a regular file: not compiled"),
                "urandom": ("CA501", "kernel.cu is a character device, not a regular file"),
                "deep": ("CA402", "meta.json nests more than 64 levels deep"),
                "loop": ("CA402", "Too many levels of symbolic links")}
    for name, (code, words) in expected.items():
        assert any(c == code and words in m for c, m in said[name]), (name, said[name])
    assert report["reconstructed"] == 1 and findings_of(report, good)
    peak_mib = outcome["peak_kib"] / 1024
    assert outcome["seconds"] < SCAN_LIMIT_S, outcome["seconds"]
    assert peak_mib < 1024, f"peak resident size {peak_mib:.0f} MiB"
    left = _processes_naming(str(root))
    assert left == []
    reliability_figure("faults", "one root of a FIFO, /dev/urandom, 100,000-deep meta.json and "
                       "symlink-loop entry beside a healthy one", entries=5,
                       seconds=round(outcome["seconds"], 1), peak_mib=round(peak_mib),
                       processes_left=len(left))


def test_meta_json_nested_100000_deep_is_a_ca402_for_that_entry(
        tmp_path: Path, env: dict[str, str]):
    root = tmp_path / "dj"
    good = deepjit_entry(root, GOOD)
    bad = deepjit_entry(root, BAD, meta=DEEP_JSON)
    report = scan_json(env, root)
    [problem] = [f for f in report["findings"] if f["entry"] == str(bad) and f["code"] == "CA402"]
    assert problem["subject"] == str(bad)
    assert problem["message"].startswith("meta.json nests more than 64 levels deep")
    assert findings_of(report, good)


@pytest.mark.parametrize("link", ["entry", "stray"])
def test_a_symlink_loop_in_cache_is_a_finding_and_the_rest_is_judged(
        tmp_path: Path, env: dict[str, str], link: str):
    root = tmp_path / "dj"
    good = deepjit_entry(root, GOOD)
    loop = root / "cache" / (BAD if link == "entry" else "loop")
    os.symlink(loop.name, loop)  # ln -s loop loop
    report = scan_json(env, root)
    [found] = [f for f in report["findings"] if f["subject"] == str(loop) and f["code"] == "CA402"]
    assert "Too many levels of symbolic links" in found["message"]
    if link == "entry":
        assert found["entry"] == str(loop)
    assert findings_of(report, good)


# ------------------------------------------------------------------------------ Triton caches


def triton_key(root: Path, hex_key: str, *, metadata: str | None = None) -> Path:
    from cacheaudit.runtimes.triton.policy import base32_name

    directory = root / base32_name(hex_key)
    directory.mkdir(parents=True)
    (directory / "k.cubin").write_bytes(b"\x7fELF" + hex_key.encode())
    (directory / "k.json").write_text(metadata if metadata is not None else json.dumps(
        {"hash": hex_key, "target": {"backend": "cuda", "arch": 90, "warp_size": 32},
         "name": "k", "num_warps": 4}))
    (directory / "__grp__k.json").write_text(json.dumps({"child_paths": {
        "k.cubin": str(directory / "k.cubin"), "k.json": str(directory / "k.json")}}))
    return directory


def test_triton_metadata_nested_100000_deep_is_a_ca402_for_that_entry(
        tmp_path: Path, env: dict[str, str]):
    root = tmp_path / "triton"
    good = triton_key(root, "ab" * 32)
    bad = triton_key(root, "cd" * 32, metadata=DEEP_JSON)
    report = scan_json(env, root)
    assert ("CA402", str(bad)) in findings_of(report, bad)
    [problem] = [f["message"] for f in report["findings"]
                 if f["entry"] == str(bad) and f["code"] == "CA402"]
    assert problem.startswith("k.json nests more than 64 levels deep")
    assert findings_of(report, good)


def test_a_triton_key_directory_that_is_a_symlink_loop_is_a_leftover(
        tmp_path: Path, env: dict[str, str]):
    from cacheaudit.runtimes.triton.policy import base32_name

    root = tmp_path / "triton"
    good = triton_key(root, "ab" * 32)
    loop = root / base32_name("ef" * 32)
    os.symlink(loop.name, loop)
    report = scan_json(env, root)
    [found] = [f for f in report["findings"] if f["subject"] == str(loop)]
    assert found["code"] == "CA402" and "Too many levels of symbolic links" in found["message"]
    assert findings_of(report, good)


# ------------------------------------------------------------------------------ spool, ledger


def _record(kernel: str) -> CompileRecord:
    state = FileState(path=f"/tmp/w/{kernel}.cu", exists=True, size=10, mtime_ns=1_000,
                      ctime_ns=2_000, inode=42, digest="d" * 32, settled=True)
    return CompileRecord(
        record_id=new_record_id(), event="compile", started_ns=1_700_000_000_000_000_000,
        runtime="deepjit", kernel=kernel, argv=("kernel.cu", "-cubin"), cwd="/tmp/w",
        env={"NVCC_APPEND_FLAGS": "-DX=1"}, sources=(state,), exit_code=0, pid=1, host="box",
        observer="shim:nvcc")


RUN = RunInfo(run_uuid="run-1", label="test")


def test_a_spool_file_nested_100000_deep_is_set_aside_and_every_report_goes_on(
        tmp_path: Path, env: dict[str, str]):
    ledger = env["CACHEAUDIT_LEDGER"]
    Ledger.open(ledger).close()
    spool_record(ledger, _record("healthy"), RUN)
    deep = Path(spool_dir(ledger)) / "deep.json"
    deep.write_text(DEEP_JSON)
    os.mkfifo(Path(spool_dir(ledger)) / "pipe.json")
    for _ in range(2):  # the bad file used to break every later report too
        done, _ = cacheaudit(env, "report", "--json")
        assert done.returncode == 0, done.stderr
        assert [r["kernel"] for r in json.loads(done.stdout)["records"]] == ["healthy"]
    assert sorted(p.name for p in Path(spool_dir(ledger)).iterdir()) == [
        "deep.json.bad", "pipe.json.bad"]


def _deep_value_in(ledger_path: str, kernels: tuple[str, ...]) -> None:
    """A ledger whose records share a value (their env) rewritten 100,000 deep, as a ledger
    from another machine may hold."""
    with Ledger.open(ledger_path) as ledger:
        ledger.add_records([_record(k) for k in kernels], RUN)
    with sqlite3.connect(ledger_path) as conn:
        conn.execute("UPDATE blobs SET body = ? WHERE body LIKE '%NVCC_APPEND_FLAGS%'",
                     (DEEP_JSON,))


def test_a_ledger_value_nested_100000_deep_is_left_out_with_a_note(
        tmp_path: Path, env: dict[str, str]):
    _deep_value_in(env["CACHEAUDIT_LEDGER"], ("one", "two"))
    done, _ = cacheaudit(env, "report", "--json")
    assert done.returncode == 0, done.stderr
    records = json.loads(done.stdout)["records"]
    assert [r["kernel"] for r in records] == ["one", "two"]
    for record in records:
        assert record["options"]["environment"] == {}
        assert any("nests more than 64 levels deep" in note for note in record["notes"])

    other = str(tmp_path / "other.db")
    _deep_value_in(other, ("three",))
    done, _ = cacheaudit(env, "combine", "--keep", other)
    assert done.returncode == 0, done.stderr
    assert "1 new record(s)" in done.stdout


def test_a_snapshot_nested_100000_deep_is_a_one_line_usage_error(
        tmp_path: Path, env: dict[str, str]):
    good = tmp_path / "good.json"
    good.write_text(json.dumps({"format": 1, "compilers": [], "caches": []}))
    deep = tmp_path / "deep.json"
    deep.write_text(DEEP_JSON)
    shaped = tmp_path / "shaped.json"
    shaped.write_text(json.dumps({"format": 1, "compilers": [1]}))
    for bad, words in ((deep, "nests more than 64 levels deep"),
                       (shaped, "an item of compilers is not an object")):
        done, _ = cacheaudit(env, "diff", str(good), str(bad))
        assert done.returncode == 2
        assert done.stderr.strip().count("\n") == 0 and words in done.stderr
        assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------ the reader


def _depth(value: Any) -> int:
    if isinstance(value, list):
        return 1 + max((_depth(v) for v in value), default=0)
    if isinstance(value, dict):
        return 1 + max((_depth(v) for v in value.values()), default=0)
    return 0


_TEXT = st.text(alphabet=st.sampled_from('[]{}"\\:,ab0 \n\x00é'), max_size=200)
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n', max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner,
                                                                max_size=4),
    max_leaves=40)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(_TEXT, _TEXT.map(lambda t: t.encode("utf-8", "surrogatepass")),
                      st.binary(max_size=200)),
       max_depth=st.integers(0, 8), max_bytes=st.integers(0, 300))
def test_the_reader_raises_only_its_own_error_and_never_exceeds_its_limits(
        data: str | bytes, max_depth: int, max_bytes: int):
    try:
        value = bounded.loads(data, max_bytes=max_bytes, max_depth=max_depth)
    except bounded.Refused as exc:
        assert exc.kind in ("size", "depth", "syntax") and "\n" not in exc.reason
        return
    assert len(data) <= max_bytes
    assert _depth(value) <= max_depth


@settings(max_examples=200, deadline=None)
@given(value=_JSON, extra_depth=st.integers(0, 3))
def test_the_reader_agrees_with_json_within_its_limits_and_refuses_beyond(
        value: Any, extra_depth: int):
    text = json.dumps(value)
    depth = _depth(value)
    assert bounded.loads(text, max_depth=depth) == value
    assert bounded.loads(text.encode(), max_depth=depth + extra_depth) == value
    if depth:
        with pytest.raises(bounded.Refused) as refused:
            bounded.loads(text, max_depth=depth - 1)
        assert refused.value.kind == "depth"


@settings(max_examples=40, deadline=None)
@given(depth=st.integers(65, 20_000), closed=st.booleans(), noise=st.sampled_from(
    ["", '"]]}}"', '"\\\\"', '"\\""', "1, "]))
def test_deep_documents_are_refused_before_decoding(depth: int, closed: bool, noise: str):
    text = ("[" + noise) * depth + ("]" * depth if closed else "")
    with pytest.raises(bounded.Refused) as refused:
        bounded.loads(text)
    assert refused.value.kind in ("depth", "syntax")
    if not noise or noise.startswith('"'):
        assert refused.value.kind == "depth"


def test_files_are_read_without_waiting_and_within_the_size_limit(tmp_path: Path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(bounded.Refused, match="is a FIFO, not a regular file"):
        bounded.load_file(str(pipe))
    with pytest.raises(bounded.Refused, match="is a character device"):
        bounded.load_file("/dev/zero")
    big = tmp_path / "big.json"
    big.write_text(json.dumps(["x" * 100]))
    with pytest.raises(bounded.Refused, match="larger than the limit of 50 bytes"):
        bounded.load_file(str(big), max_bytes=50)
    assert bounded.load_file(str(big)) == ["x" * 100]
    with pytest.raises(FileNotFoundError):
        bounded.load_file(str(tmp_path / "absent.json"))


def test_utf16_is_measured_after_decoding():
    deep = ("[" * 100 + "]" * 100).encode("utf-16")
    with pytest.raises(bounded.Refused) as refused:
        bounded.loads(deep)
    assert refused.value.kind == "depth"
    assert bounded.loads('["[[[", {"a": 1}]'.encode("utf-16")) == ["[[[", {"a": 1}]

