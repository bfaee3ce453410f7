"""NVRTC through cuda.bindings.nvrtc: real compiles (sm_90 cubins, no GPU needed), real headers.

The adapter must be invisible to the caller (same result codes, byte-identical cubin, PTX and
LTO-IR), must record the headers NVRTC really opened (nested, unused and in-memory ones, quoted
includes resolved as NVRTC resolves them), and must catch NVRTC's automatic PCH serving an old
header inside one process. Everything skips, saying why, where libnvrtc cannot be loaded.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.model import CompileRecord, FileState, GraphFile, IncludeGraph, content_digest

CUDA_INCLUDE = "/usr/local/cuda/include"
_PATCHED = ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcDestroyProgram")


def _nvrtc_problem() -> str | None:
    try:
        from cuda.bindings import nvrtc

        answer = nvrtc.nvrtcVersion()
        if int(answer[0]) != 0:
            return f"nvrtcVersion failed: {answer[0]}"
        return None
    except Exception as exc:  # noqa: BLE001 - any failure means: no NVRTC here
        return f"{type(exc).__name__}: {exc}"


NVRTC_PROBLEM = _nvrtc_problem()
needs_nvrtc = pytest.mark.skipif(
    NVRTC_PROBLEM is not None,
    reason=f"cuda.bindings.nvrtc cannot load libnvrtc (pip install nvidia-cuda-nvrtc): "
           f"{NVRTC_PROBLEM}")
needs_cuda_headers = pytest.mark.skipif(
    not os.path.exists(os.path.join(CUDA_INCLUDE, "cuda_fp16.h")),
    reason=f"{CUDA_INCLUDE}/cuda_fp16.h is missing: the CUDA-header variant is skipped")


@dataclass
class Compiled:
    code: int
    log: bytes
    outputs: dict[str, bytes]


def compile_program(src: bytes, name: bytes, options: Sequence[bytes],
                    headers: Sequence[tuple[bytes, bytes]] = ()) -> Compiled:
    """Compile as a Python caller does: every function looked up on the module at call time."""
    from cuda.bindings import nvrtc

    err, prog = nvrtc.nvrtcCreateProgram(src, name, len(headers), [c for _, c in headers],
                                         [n for n, _ in headers])
    assert int(err) == 0, err
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(options), list(options))
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        outputs = {}
        for kind, size_fn, get_fn in (
                ("cubin", nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN),
                ("ptx", nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX),
                ("ltoir", nvrtc.nvrtcGetLTOIRSize, nvrtc.nvrtcGetLTOIR)):
            err, size = size_fn(prog)
            if int(err) == 0 and size:
                buffer = bytearray(size)
                get_fn(prog, buffer)
                outputs[kind] = bytes(buffer)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return Compiled(int(result), bytes(log), outputs)


def ledger_records(path: Path) -> list[CompileRecord]:
    from cacheaudit.ledger import Ledger, ingest_spool

    with Ledger.open(str(path)) as ledger:
        ingest_spool(ledger)
        return ledger.records()


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("CACHEAUDIT_RUN", "CACHEAUDIT_RUN_LABEL", "CACHEAUDIT_TEST_ID"):
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(path))
    return path


@pytest.fixture
def adapter(ledger: Path) -> Iterator[Any]:
    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    ADAPTER.install()
    assert ADAPTER.installed()
    try:
        yield ADAPTER
    finally:
        ADAPTER.uninstall()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """Headers three ways: beside the program name (quoted, with a nested include and an unused
    one), on -I, and in memory; a second `local.h` in the working directory as a decoy."""
    root = tmp_path / "tree"
    (root / "pd" / "sub").mkdir(parents=True)
    (root / "inc").mkdir()
    (root / "pd" / "local.h").write_text(
        '#pragma once\n#include "sub/inner.h"\n#include "unused.h"\n#define LOCAL (INNER + 1.0f)\n')
    (root / "pd" / "sub" / "inner.h").write_text(
        '#pragma once\n#include "deeper.h"\n#define INNER DEEP\n')
    (root / "pd" / "sub" / "deeper.h").write_text("#pragma once\n#define DEEP 2.0f\n")
    (root / "pd" / "unused.h").write_text("#pragma once\n#define NEVER_USED 1\n")
    (root / "inc" / "api.h").write_text("#pragma once\n#define API 10.0f\n")
    (root / "local.h").write_text("#pragma once\n#define LOCAL 99.0f\n")
    return root


SOURCE = (b'#include "local.h"\n#include <api.h>\n#include "mem.h"\n'
          b'extern "C" __global__ void k(float* o) { o[0] = LOCAL + API + MEMV; }\n')
MEMORY = ((b"mem.h", b"#pragma once\n#define MEMV 3.0f\n"),)


def _only(records: list[CompileRecord]) -> CompileRecord:
    assert len(records) == 1, [r.kernel for r in records]
    return records[0]


# ------------------------------------------------------------------------------ transparency


@needs_nvrtc
@pytest.mark.parametrize("extra", [
    [b"--gpu-architecture=sm_90"],
    [b"--gpu-architecture=compute_90"],
    [b"--gpu-architecture=sm_90", b"-G"],
    [b"--gpu-architecture=sm_90", b"-lineinfo", b"--use_fast_math"],
    [b"--gpu-architecture=sm_90", b"-dlto"],
], ids=["sm_90", "compute_90", "G", "lineinfo", "dlto"])
def test_outputs_are_byte_identical_with_and_without_the_adapter(
        tree: Path, ledger: Path, extra: list[bytes]) -> None:
    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    name = str(tree / "pd" / "k.cu").encode()
    options = [*extra, f"-I{tree / 'inc'}".encode()]
    bare = compile_program(SOURCE, name, options, MEMORY)
    assert bare.code == 0, bare.log
    ADAPTER.install()
    try:
        seen = compile_program(SOURCE, name, options, MEMORY)
    finally:
        ADAPTER.uninstall()
    assert seen.code == bare.code
    assert seen.outputs == bare.outputs
    assert seen.log == bare.log
    record = _only(ledger_records(ledger))
    # Every output NVRTC has (PTX after -dlto is a lone NUL: nothing), by its digest.
    assert {s.digest for s in record.outputs} == {
        content_digest(b) for b in bare.outputs.values() if len(b) > 1}
    assert record.graph is not None and record.graph.method == "nvrtc --fdevice-time-trace"
    # The option cacheaudit added is not part of what the caller asked for.
    assert record.argv == tuple(o.decode() for o in options)


@needs_nvrtc
@needs_cuda_headers
def test_cuda_headers_compile_identically_and_are_recorded(tree: Path, ledger: Path) -> None:
    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    source = b'#include <cuda_fp16.h>\n' + SOURCE
    name = str(tree / "pd" / "k.cu").encode()
    options = [b"--gpu-architecture=sm_90", f"-I{tree / 'inc'}".encode(),
               f"-I{CUDA_INCLUDE}".encode()]
    bare = compile_program(source, name, options, MEMORY)
    ADAPTER.install()
    try:
        seen = compile_program(source, name, options, MEMORY)
    finally:
        ADAPTER.uninstall()
    assert bare.code == seen.code == 0
    assert seen.outputs["cubin"] == bare.outputs["cubin"]
    graph = _only(ledger_records(ledger)).graph
    assert graph is not None
    assert os.path.realpath(os.path.join(CUDA_INCLUDE, "cuda_fp16.h")) in graph.paths


@needs_nvrtc
def test_a_failed_compile_fails_the_same_way_and_is_recorded(
        tree: Path, ledger: Path, adapter: Any) -> None:
    broken = b'#include "local.h"\nextern "C" __global__ void k(float* o) { o[0] = NOPE; }\n'
    name = str(tree / "pd" / "k.cu").encode()
    adapter.uninstall()
    bare = compile_program(broken, name, [b"--gpu-architecture=sm_90"])
    adapter.install()
    seen = compile_program(broken, name, [b"--gpu-architecture=sm_90"])
    assert bare.code == seen.code == 6  # NVRTC_ERROR_COMPILATION
    assert seen.log == bare.log
    record = _only(ledger_records(ledger))
    assert record.exit_code == 6 and not record.succeeded
    assert any("NOPE" in note for note in record.notes)
    from cacheaudit.audit import audit_records

    assert audit_records([record]) == []


@needs_nvrtc
def test_an_ordinary_failing_compile_is_compiled_once(tree: Path, ledger: Path) -> None:
    from cuda.bindings import nvrtc

    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    broken = b'extern "C" __global__ void k(float* o) { o[0] = NOPE; }\n'
    real = nvrtc.nvrtcCompileProgram
    calls: list[tuple[Any, ...]] = []

    def counting(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    nvrtc.nvrtcCompileProgram = counting  # under the adapter: sees every compile it makes
    try:
        ADAPTER.install()
        try:
            seen = compile_program(broken, str(tree / "k.cu").encode(),
                                   [b"--gpu-architecture=sm_90"])
        finally:
            ADAPTER.uninstall()
    finally:
        nvrtc.nvrtcCompileProgram = real
    assert seen.code == 6 and b"NOPE" in seen.log  # NVRTC_ERROR_COMPILATION, as asked
    assert len(calls) == 1  # the error is the source's: no second compile without the trace
    record = _only(ledger_records(ledger))
    assert record.exit_code == 6 and record.extra["trace"]["added"] is True
    assert not any("compiled again" in note for note in record.notes)


@needs_nvrtc
def test_a_compile_that_fails_with_the_trace_is_compiled_again_as_asked(
        tree: Path, ledger: Path, adapter: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # ptxas reads back an existing trace file and fails on one it did not write: a real failure
    # of the option, which must never reach the caller.
    spoiled = tree / "spoiled"
    (tree / "spoiled.json").write_text('{"traceEvents": [{}]} junk')
    name = str(tree / "pd" / "k.cu").encode()
    options = [b"--gpu-architecture=sm_90", f"-I{tree / 'inc'}".encode()]
    with monkeypatch.context() as patch:
        patch.setattr(adapter, "_new_trace_path", lambda: str(spoiled))
        seen = compile_program(SOURCE, name, options, MEMORY)
    adapter.uninstall()
    bare = compile_program(SOURCE, name, options, MEMORY)
    assert seen.code == bare.code == 0
    assert seen.outputs == bare.outputs
    record = _only(ledger_records(ledger))
    assert any("compiled again as asked" in note for note in record.notes)
    assert record.extra["trace"]["added"] is False
    # The shadow pass had the same spoiled path: no graph, and the audit says so.
    from cacheaudit.audit import audit_records

    findings = audit_records([record])
    assert [f.code for f in findings] == ["CA501"]
    assert "failed with the trace option" in findings[0].message


# ------------------------------------------------------------------------------ the graph


@needs_nvrtc
def test_graph_lists_nested_unused_and_in_memory_headers(
        tree: Path, ledger: Path, adapter: Any) -> None:
    name = str(tree / "pd" / "k.cu").encode()
    result = compile_program(SOURCE, name, [b"--gpu-architecture=sm_90",
                                            f"-I{tree / 'inc'}".encode()], MEMORY)
    assert result.code == 0
    record = _only(ledger_records(ledger))
    assert record.runtime == "nvrtc" and record.kernel == name.decode()
    assert record.event == "compile" and record.observer == "adapter:nvrtc"
    graph = record.graph
    assert graph is not None
    paths = set(graph.paths)
    for header in ("pd/local.h", "pd/sub/inner.h", "pd/sub/deeper.h", "pd/unused.h",
                   "inc/api.h"):
        assert str((tree / header).resolve()) in paths, header
    memory = graph.by_path()["<memory>/mem.h"]
    assert memory.written == "mem.h"
    assert memory.state.digest == content_digest(MEMORY[0][1])
    assert memory.state.size == len(MEMORY[0][1]) and memory.state.exists
    assert str((tree / "local.h").resolve()) not in paths  # the decoy in another directory
    deeper = graph.by_path()[str((tree / "pd/sub/deeper.h").resolve())].state
    assert deeper.digest == content_digest((tree / "pd/sub/deeper.h").read_bytes())
    # The source was in memory too, and NVRTC's builtin header is its builtins library.
    assert [s.path for s in record.sources] == [f"<memory>/{name.decode().lstrip('/')}"]
    assert record.sources[0].digest == content_digest(SOURCE)
    builtin = [f for f in graph.files if f.written == "__nv_nvrtc_builtin_header.h"]
    assert builtin and "libnvrtc-builtins" in builtin[0].path and builtin[0].state.readable
    assert record.compiler is not None and record.compiler.kind == "nvrtc"
    assert "libnvrtc" in os.path.basename(record.compiler.resolved)
    assert record.compiler.digest and record.compiler.version_text.startswith("NVRTC ")


@needs_nvrtc
@pytest.mark.parametrize("how", ["relative", "absolute", "bare"])
def test_quoted_includes_resolve_from_the_program_name_directory(
        tree: Path, ledger: Path, adapter: Any, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    monkeypatch.chdir(tree)
    name = {"relative": b"pd/k.cu", "absolute": str(tree / "pd" / "k.cu").encode(),
            "bare": b"k.cu"}[how]
    result = compile_program(SOURCE, name, [b"--gpu-architecture=compute_90",
                                            f"-I{tree / 'inc'}".encode()], MEMORY)
    assert result.code == 0, result.log
    # LOCAL is 99.0f in the working directory's local.h, 3.0f through pd/local.h; + 10 + 3.
    value = 112.0 if how == "bare" else 16.0
    assert str(struct.unpack("<I", struct.pack("<f", value))[0]).encode() in result.outputs["ptx"]
    graph = _only(ledger_records(ledger)).graph
    assert graph is not None
    beside = str((tree / "pd" / "local.h").resolve())
    decoy = str((tree / "local.h").resolve())
    if how == "bare":
        assert decoy in graph.paths and beside not in graph.paths
    else:
        assert beside in graph.paths and decoy not in graph.paths
        assert str((tree / "pd/sub/inner.h").resolve()) in graph.paths


@needs_nvrtc
def test_the_callers_own_trace_is_read_and_left_in_place(
        tree: Path, ledger: Path, adapter: Any) -> None:
    mine = tree / "mytrace"
    result = compile_program(SOURCE, str(tree / "pd" / "k.cu").encode(),
                             [b"--gpu-architecture=sm_90", f"-I{tree / 'inc'}".encode(),
                              f"--fdevice-time-trace={mine}".encode()], MEMORY)
    assert result.code == 0
    assert json.loads((tree / "mytrace.json").read_text())["traceEvents"]
    record = _only(ledger_records(ledger))
    assert record.extra["trace"]["added"] is False
    assert record.graph is not None and "caller" in record.graph.method
    assert str((tree / "pd/sub/deeper.h").resolve()) in record.graph.paths


@needs_nvrtc
def test_a_program_created_before_installation_still_gets_its_graph(
        tree: Path, ledger: Path) -> None:
    from cuda.bindings import nvrtc

    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    _, prog = nvrtc.nvrtcCreateProgram(SOURCE, str(tree / "pd" / "k.cu").encode(), 1,
                                       [MEMORY[0][1]], [MEMORY[0][0]])
    ADAPTER.install()
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, 2, [b"--gpu-architecture=sm_90",
                                                        f"-I{tree / 'inc'}".encode()])
        nvrtc.nvrtcDestroyProgram(prog)
    finally:
        ADAPTER.uninstall()
    assert int(result) == 0
    record = _only(ledger_records(ledger))
    assert record.kernel is None and record.sources == ()
    assert any("created before cacheaudit was installed" in n for n in record.notes)
    assert record.graph is not None
    assert str((tree / "pd/sub/deeper.h").resolve()) in record.graph.paths


# ------------------------------------------------------------------------------ PCH

_PCH_DRIVER = textwrap.dedent("""
    import json, os, sys
    root, use_adapter = sys.argv[1], sys.argv[2] == "1"
    os.chdir(root)
    if use_adapter:
        from cacheaudit.runtimes.nvrtc.adapter import ADAPTER
        ADAPTER.install()
    from cuda.bindings import nvrtc

    def compile_(src, name, headers=()):
        err, prog = nvrtc.nvrtcCreateProgram(src, name, len(headers), [c for _, c in headers],
                                             [n for n, _ in headers])
        (res,) = nvrtc.nvrtcCompileProgram(prog, 2, [b"--gpu-architecture=sm_90", b"--pch"])
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        nvrtc.nvrtcDestroyProgram(prog)
        assert int(res) == 0, res
        return bytes(cubin).hex()

    src = b'#include "big.h"\\nextern "C" __global__ void k(float* o) { o[0] = BIG; }\\n'
    cubins = []
    for value in ("1.0f", "1.0f", "5.0f"):
        with open("big.h", "w") as handle:
            handle.write(f"#pragma once\\n#define BIG {value}\\n")
        cubins.append(compile_(src, b"pk.cu"))
    msrc = b'#include "mem.h"\\nextern "C" __global__ void m(float* o) { o[0] = MEMV; }\\n'
    for value in (b"1.0f", b"7.0f"):
        cubins.append(compile_(msrc, b"mk.cu", [(b"mem.h", b"#define MEMV " + value + b"\\n")]))
    print(json.dumps(cubins))
""")


def _run_pch_driver(root: Path, use_adapter: bool, env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _PCH_DRIVER, str(root), "1" if use_adapter
                           else "0"], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert "cacheaudit:" not in done.stderr, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_nvrtc
def test_a_header_edited_under_an_automatic_pch_is_flagged(tmp_path: Path, ledger: Path) -> None:
    """One process, `--pch`: NVRTC serves the old header's binary after the edit, with and
    without cacheaudit alike, and the audit of the records names the header (CA106)."""
    from cacheaudit.audit import audit_records

    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEAUDIT_RUN")}
    (tmp_path / "bare").mkdir()
    (tmp_path / "seen").mkdir()
    bare = _run_pch_driver(tmp_path / "bare", False, env)
    seen = _run_pch_driver(tmp_path / "seen", True, env)
    assert seen == bare
    assert bare[2] == bare[0], "NVRTC no longer serves a stale PCH: revisit docs/runtimes/nvrtc.md"
    assert bare[4] == bare[3], "NVRTC's PCH now sees in-memory header edits: revisit the docs"

    records = ledger_records(ledger)
    assert [r.kernel for r in records] == ["pk.cu"] * 3 + ["mk.cu"] * 2
    events = [r.extra.get("pch", {}).get("event") for r in records]
    assert events == ["created", "reused", "reused", "created", "reused"]
    findings = audit_records(records)
    assert [f.code for f in findings] == ["CA106", "CA106"], findings
    on_disk, in_memory = findings
    header = str((tmp_path / "seen" / "big.h").resolve())
    assert on_disk.subject == header and not on_disk.inferred
    assert on_disk.record_id == records[2].record_id
    assert on_disk.recorded == content_digest(b"#pragma once\n#define BIG 1.0f\n")
    assert on_disk.current == content_digest(b"#pragma once\n#define BIG 5.0f\n")
    assert records[0].record_id in on_disk.how
    assert in_memory.subject == "<memory>/mem.h" and not in_memory.inferred
    assert in_memory.recorded == content_digest(b"#define MEMV 1.0f\n")
    assert in_memory.current == content_digest(b"#define MEMV 7.0f\n")
    # The unchanged reuse is not a finding; the reuse records name the PCH as an input.
    pch_file = records[0].extra["pch"]["file"]
    assert pch_file in records[1].graph.paths  # type: ignore[union-attr]
    assert pch_file in [s.path for s in records[0].outputs]


_LATE_DRIVER = textwrap.dedent("""
    import json, os, sys
    root, mode = sys.argv[1], sys.argv[2]
    os.chdir(root)
    from cuda.bindings import nvrtc
    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    def compile_():
        src = b'#include "big.h"\\nextern "C" __global__ void k(float* o) { o[0] = BIG; }\\n'
        err, prog = nvrtc.nvrtcCreateProgram(src, b"pk.cu", 0, [], [])
        (res,) = nvrtc.nvrtcCompileProgram(prog, 2, [b"--gpu-architecture=sm_90", b"--pch"])
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        nvrtc.nvrtcDestroyProgram(prog)
        return bytes(cubin).hex()

    with open("big.h", "w") as handle:
        handle.write("#pragma once\\n#define BIG 1.0f\\n")
    cubins = [compile_()]
    if mode == "late":
        ADAPTER.install()
    with open("big.h", "w") as handle:
        handle.write("#pragma once\\n#define BIG 5.0f\\n")
    cubins += [compile_(), compile_()]
    print(json.dumps(cubins))
""")


@needs_nvrtc
def test_installing_after_an_untraced_pch_leaves_it_in_use(tmp_path: Path, ledger: Path) -> None:
    """A PCH this process made before installation has no trace option on its command line:
    adding one would make NVRTC refuse it and compile afresh, so the adapter takes the graph by
    a shadow pass instead, and NVRTC goes on serving the old PCH exactly as without it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CACHEAUDIT_RUN")}
    runs = {}
    for mode in ("bare", "late"):
        (tmp_path / mode).mkdir()
        done = subprocess.run([sys.executable, "-c", _LATE_DRIVER, str(tmp_path / mode), mode],
                              capture_output=True, text=True, env=env, timeout=120, check=False)
        assert done.returncode == 0 and "cacheaudit:" not in done.stderr, done.stderr
        runs[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    assert runs["late"] == runs["bare"]
    assert runs["bare"][1] == runs["bare"][0]  # stale, with and without cacheaudit
    records = ledger_records(ledger)
    assert len(records) == 2
    for record in records:
        assert record.extra["trace"]["added"] is False
        assert "without the trace" in record.extra["trace"]["skipped"]
        assert record.graph is not None and "shadow" in record.graph.method
        assert record.extra["pch"]["event"] == "reused"
        assert record.extra["pch"]["created_by"] is None


@needs_nvrtc
def test_explicit_pch_files_keep_their_command_line(
        tree: Path, ledger: Path, adapter: Any) -> None:
    """NVRTC refuses a PCH made with another command line (--fdevice-time-trace counts), so an
    explicit `--use-pch` compile gets no trace, and a shadow pass takes the graph."""
    from cacheaudit.audit import audit_records

    header = tree / "pd" / "big.h"
    header.write_text("#pragma once\n#define BIG 1.0f\n")
    pch = tree / "x.pch"
    src = b'#include "big.h"\nextern "C" __global__ void k(float* o) { o[0] = BIG; }\n'
    name = str(tree / "pd" / "pk.cu").encode()
    create = [b"--gpu-architecture=sm_90", f"--create-pch={pch}".encode()]
    use = [b"--gpu-architecture=sm_90", f"--use-pch={pch}".encode()]
    assert compile_program(src, name, create).code == 0
    first = compile_program(src, name, use)
    header.write_text("#pragma once\n#define BIG 5.0f\n")
    seen = compile_program(src, name, use)
    adapter.uninstall()
    bare = compile_program(src, name, use)
    assert b"using precompiled header" in seen.log and seen.log == bare.log
    assert seen.outputs == bare.outputs == first.outputs  # stale, with and without cacheaudit

    records = ledger_records(ledger)
    assert [r.extra["pch"]["event"] for r in records] == ["created", "reused", "reused"]
    for record in records:
        assert record.extra["trace"]["added"] is False
        assert record.graph is not None and "shadow" in record.graph.method
        assert str(header.resolve()) in record.graph.paths
    findings = audit_records(records)
    assert [(f.code, f.subject, f.inferred) for f in findings] == [
        ("CA106", str(header.resolve()), True)]


# ------------------------------------------------------------------------------ lifecycle


@needs_nvrtc
def test_install_twice_is_a_no_op_and_uninstall_restores_the_originals(ledger: Path) -> None:
    from cuda.bindings import nvrtc

    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    originals = {name: getattr(nvrtc, name) for name in _PATCHED}
    ADAPTER.install()
    try:
        wrapped = {name: getattr(nvrtc, name) for name in _PATCHED}
        assert all(wrapped[n] is not originals[n] for n in _PATCHED)
        assert wrapped["nvrtcCompileProgram"].__name__ == "nvrtcCompileProgram"
        ADAPTER.install()
        assert {name: getattr(nvrtc, name) for name in _PATCHED} == wrapped
        assert all(getattr(nvrtc, n) is wrapped[n] for n in _PATCHED)
    finally:
        ADAPTER.uninstall()
    assert all(getattr(nvrtc, n) is originals[n] for n in _PATCHED)
    assert not ADAPTER.installed()
    ADAPTER.uninstall()  # twice is harmless too
    assert all(getattr(nvrtc, n) is originals[n] for n in _PATCHED)


@needs_nvrtc
def test_activation_installs_the_nvrtc_adapter(ledger: Path) -> None:
    from cuda.bindings import nvrtc

    from cacheaudit import runtimes
    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    original = nvrtc.nvrtcCompileProgram
    try:
        assert "nvrtc" in runtimes.activate(["nvrtc"])
        assert ADAPTER.installed()
    finally:
        runtimes.deactivate()
    assert nvrtc.nvrtcCompileProgram is original


@needs_nvrtc
def test_a_broken_ledger_changes_nothing_for_the_caller(
        tree: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from cacheaudit.runtimes.nvrtc.adapter import ADAPTER

    blocker = tree / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(blocker / "ledger.db"))
    name = str(tree / "pd" / "k.cu").encode()
    options = [b"--gpu-architecture=sm_90", f"-I{tree / 'inc'}".encode()]
    bare = compile_program(SOURCE, name, options, MEMORY)
    ADAPTER.install()
    try:
        first = compile_program(SOURCE, name, options, MEMORY)
        second = compile_program(SOURCE, name, options, MEMORY)
    finally:
        ADAPTER.uninstall()
    assert first.code == second.code == bare.code == 0
    assert first.outputs == second.outputs == bare.outputs
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("cacheaudit:")]
    assert len(lines) == 1, lines  # reported once, not once per compile


def test_importing_the_adapter_and_policy_imports_no_runtime() -> None:
    code = ("import sys, cacheaudit.runtimes.nvrtc.adapter, cacheaudit.runtimes.nvrtc.policy\n"
            "bad = [m for m in sys.modules if m.split('.')[0] in ('cuda', 'torch', 'triton', "
            "'cupy')]\nassert not bad, bad\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------ policy


def _state(path: str, content: bytes) -> FileState:
    return FileState(path=path, exists=True, size=len(content), mtime_ns=1, ctime_ns=1, inode=1,
                     digest=content_digest(content))


def _record(record_id: str, started_ns: int, **fields: Any) -> CompileRecord:
    fields.setdefault("runtime", "nvrtc")
    fields.setdefault("kernel", "k.cu")
    fields.setdefault("observer", "adapter:nvrtc")
    fields.setdefault("exit_code", 0)
    fields.setdefault("run_uuid", "run")
    return CompileRecord(record_id=record_id, event="compile", started_ns=started_ns, **fields)


def test_policy_keys_nothing() -> None:
    from cacheaudit.model import CacheEntry
    from cacheaudit.runtimes import policy_for

    policy = policy_for("nvrtc")
    entry = CacheEntry(runtime="nvrtc", layout="none", root="/", path="/x", kernel="k", key=None)
    assert policy.tracked(entry, None).paths == frozenset()
    assert policy.check_key(entry).recomputed is None
    assert policy.dependency_command(entry) is None


def test_policy_flags_a_changed_header_against_the_creating_record() -> None:
    from cacheaudit.audit import audit_records

    old, new = _state("/h/big.h", b"old"), _state("/h/big.h", b"new")
    same = _state("/h/same.h", b"same")
    creator = _record("c", 1, graph=IncludeGraph(
        (GraphFile(old, "big.h"), GraphFile(same, "same.h")), "nvrtc --fdevice-time-trace"),
        extra={"pch": {"event": "created", "file": "/p/k_0.pch"}})
    reuse = _record("r", 2, graph=IncludeGraph((), "nvrtc --fdevice-time-trace"), extra={
        "pch": {"event": "reused", "file": "/p/k_0.pch", "created_by": "c", "coverage": "exact",
                "headers": [new.to_dict(), same.to_dict()], "changed": []}})
    findings = audit_records([reuse, creator])
    assert [(f.code, f.subject, f.recorded, f.current, f.inferred, f.record_id)
            for f in findings] == [("CA106", "/h/big.h", old.digest, new.digest, False, "r")]
    # Without the creating record the adapter's own comparison stands in, saying so.
    alone = audit_records([dataclasses.replace(reuse, extra={
        **reuse.extra, "pch": {**reuse.extra["pch"], "changed": [
            {"path": "/h/big.h", "recorded": old.digest, "current": new.digest}]}})])
    assert [(f.code, f.subject) for f in alone] == [("CA106", "/h/big.h")]
    assert "not among the records audited" in alone[0].how


def test_policy_reports_a_successful_compile_without_a_graph() -> None:
    from cacheaudit.audit import audit_records

    blind = _record("b", 1, graph=None, graph_problem="NVRTC wrote no trace at /t")
    failed = _record("f", 2, graph=None, exit_code=6, graph_problem="x")
    findings = audit_records([blind, failed])
    assert [(f.code, f.record_id) for f in findings] == [("CA501", "b")]
    assert "NVRTC wrote no trace" in findings[0].message


def test_option_helpers() -> None:
    from cacheaudit.runtimes.nvrtc.adapter import has_option, memory_state, option_value
    from cacheaudit.runtimes.nvrtc.trace import nvrtc_shadow_options as shadow_options

    options = ["--pch", "--pch-dir=/a", "-pch-dir=/b", "-I/x"]
    assert option_value(options, ("--pch-dir", "-pch-dir")) == "/b"
    assert option_value(options, ("--pch",)) == ""
    assert not has_option(options, ("--use-pch", "-use-pch"))
    assert shadow_options([b"--pch", b"--use-pch=/p", b"--time=t.csv", b"-I/x",
                           b"--fdevice-time-trace=/t", b"-arch=sm_90"]) == [b"-I/x",
                                                                           b"-arch=sm_90"]
    state = memory_state("/abs/k.cu", b"abc")
    assert state.path == "<memory>/abs/k.cu" and state.size == 3 and state.settled
    assert state.digest == content_digest(b"abc") and state.mtime_ns == 0
