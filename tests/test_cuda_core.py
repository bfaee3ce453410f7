"""cuda.core's program cache: the header fingerprint, the adapter, the policy, the reader.

Real NVRTC compiles to sm_90 cubins (no GPU needed), real FileStreamProgramCache directories,
real subprocesses for the cross-process stale hit. Skipped with a reason where cuda.core >= 1.2 or
libnvrtc is missing.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.model import CompileRecord


def _cuda_core_problem() -> str | None:
    try:
        from cuda.core.utils import FileStreamProgramCache  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure is a reason to skip
        return f"cuda.core with a program cache (>= 1.2) is not importable: {exc}"
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001
        return f"libnvrtc cannot be loaded (pip install nvidia-cuda-nvrtc): {exc}"
    return None


_PROBLEM = _cuda_core_problem()
needs_cuda_core = pytest.mark.skipif(_PROBLEM is not None, reason=_PROBLEM or "")

ARCH = "sm_90"
BARE_SOURCE = '#include "local.h"\nextern "C" __global__ void k(int* o) { o[0] = LOCAL_VALUE; }\n'
TREE_SOURCE = ('#include <lib/api.h>\n'
               'extern "C" __global__ void k(int* o) { o[0] = API_VALUE; }\n')


def _age(path: Path, seconds: float = 100.0) -> None:
    """Back-date a file, so that it reads as written well before the compile."""
    past = time.time() - seconds
    os.utime(path, (past, past))


def _write(path: Path, text: str, *, aged: bool = True) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if aged:
        _age(path)
    return path


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """An include tree: lib/api.h includes detail.h; unused.h is never included."""
    root = tmp_path / "inc"
    _write(root / "lib" / "api.h", '#pragma once\n#include "detail.h"\n'
                                   "#define API_VALUE (DETAIL_VALUE + 1)\n")
    _write(root / "lib" / "detail.h", "#pragma once\n#define DETAIL_VALUE 10\n")
    _write(root / "unused.h", "#define UNUSED 1\n")
    return root


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The process's working directory, holding the header a bare-named program includes."""
    work = tmp_path / "work"
    _write(work / "local.h", "#define LOCAL_VALUE 3\n")
    monkeypatch.chdir(work)
    return work


@pytest.fixture
def ledger_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "ledger.db"
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(path))
    monkeypatch.delenv("CACHEAUDIT_RUN", raising=False)
    return path


@pytest.fixture
def adapter(ledger_path: Path) -> Iterator[Any]:
    from cacheaudit.runtimes.cuda_core import adapter as cuda_core

    cuda_core._RECORDER.contexts.clear()
    cuda_core._RECORDER.watch.clear()
    cuda_core.ADAPTER.install()
    assert cuda_core.ADAPTER.installed()
    yield cuda_core.ADAPTER
    cuda_core.ADAPTER.uninstall()
    cuda_core._RECORDER.watch.clear()


def _records(path: Path) -> list[CompileRecord]:
    from cacheaudit.ledger import Ledger, ingest_spool

    with Ledger.open(str(path)) as ledger:
        ingest_spool(ledger)
        return ledger.records(with_files=True)


def _options(**kwargs: Any) -> Any:
    from cuda.core import ProgramOptions

    kwargs.setdefault("arch", ARCH)
    return ProgramOptions(**kwargs)


def _compile(source: str, options: Any, cache: Any = None) -> bytes:
    from cuda.core import Program

    program = Program(source, "c++", options=options)
    code = program.compile("cubin", cache=cache).code if cache is not None else \
        program.compile("cubin").code
    return bytes(code)


# ------------------------------------------------------------------------------ import cost


def test_importing_the_modules_imports_no_cuda() -> None:
    probe = ("import sys, cacheaudit.headers, cacheaudit.runtimes.cuda_core.adapter, "
             "cacheaudit.runtimes.cuda_core.policy, cacheaudit.runtimes.cuda_core.layout, "
             "cacheaudit.runtimes.cupy.policy, cacheaudit.runtimes.cupy.layout; "
             "print(' '.join(sorted(m for m in sys.modules "
             "if m.split('.')[0] in ('cuda', 'cupy', 'cupy_backends', 'torch', 'triton'))))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.strip() == ""


# ------------------------------------------------------------------------------ fingerprints


@needs_cuda_core
def test_fingerprint_changes_with_a_header_on_the_include_path_and_not_otherwise(
        tree: Path) -> None:
    from cacheaudit.headers import TRACE, fingerprint_headers

    options = _options(include_path=[str(tree)])
    first = fingerprint_headers(TREE_SOURCE, options)
    assert first.method == TRACE
    assert set(first.paths) == {str(tree / "lib" / "api.h"), str(tree / "lib" / "detail.h")}
    assert isinstance(first.digest, bytes) and len(first.digest) == 32
    assert bytes(first) == first.digest

    # Not otherwise: the same again, a new trace, a touched header, an unused header edited,
    # another source and macro that read the same headers.
    assert fingerprint_headers(TREE_SOURCE, options).digest == first.digest
    assert fingerprint_headers(TREE_SOURCE, options, retrace=True).digest == first.digest
    os.utime(tree / "lib" / "detail.h")
    assert fingerprint_headers(TREE_SOURCE, options).digest == first.digest
    _write(tree / "unused.h", "#define UNUSED 2 /* edited */\n")
    assert fingerprint_headers(TREE_SOURCE, options).digest == first.digest
    other = TREE_SOURCE.replace("API_VALUE; }", "API_VALUE + 1; }")
    assert fingerprint_headers(other, _options(include_path=[str(tree)],
                                               define_macro="EXTRA")).digest == first.digest

    # A nested header on the include path changes: the digest changes; restored, it returns.
    original = (tree / "lib" / "detail.h").read_text()
    _write(tree / "lib" / "detail.h", "#pragma once\n#define DETAIL_VALUE 11\n")
    edited = fingerprint_headers(TREE_SOURCE, options)
    assert edited.digest != first.digest
    _write(tree / "lib" / "detail.h", original)
    assert fingerprint_headers(TREE_SOURCE, options).digest == first.digest


@needs_cuda_core
def test_fingerprint_is_the_extra_digest_cuda_core_asks_for(tree: Path) -> None:
    from cuda.core.utils import make_program_cache_key

    from cacheaudit.headers import fingerprint_headers, header_digest

    options = _options(include_path=[str(tree)])
    with pytest.raises(ValueError, match="extra_digest"):
        make_program_cache_key(code=TREE_SOURCE, code_type="c++", options=options,
                               target_type="cubin")
    fingerprint = fingerprint_headers(TREE_SOURCE, options)
    by_object = make_program_cache_key(code=TREE_SOURCE, code_type="c++", options=options,
                                       target_type="cubin", extra_digest=fingerprint)
    by_bytes = make_program_cache_key(code=TREE_SOURCE, code_type="c++", options=options,
                                      target_type="cubin",
                                      extra_digest=header_digest(TREE_SOURCE, options))
    assert by_object == by_bytes


@needs_cuda_core
def test_scan_and_tree_fallbacks(tree: Path, workdir: Path) -> None:
    from cacheaudit.headers import SCAN, TREE, fingerprint_headers

    options = _options(include_path=[str(tree)])
    traced = fingerprint_headers(TREE_SOURCE, options)
    scanned = fingerprint_headers(TREE_SOURCE, options, method="scan")
    assert scanned.method == SCAN
    assert scanned.digest == traced.digest  # the same files found, the same digest

    whole = fingerprint_headers([str(tree)])  # cuda.core's docstring form
    assert whole.method == TREE
    assert str(tree / "unused.h") in whole.paths

    bare = fingerprint_headers(BARE_SOURCE, _options(name="kernel.cu"), method="scan")
    assert bare.from_working_directory == (str(workdir / "local.h"),)


@needs_cuda_core
def test_trace_names_headers_read_from_the_working_directory(workdir: Path) -> None:
    from cacheaudit.headers import fingerprint_headers

    fingerprint = fingerprint_headers(BARE_SOURCE, _options(name="kernel.cu"))
    assert fingerprint.paths == (str(workdir / "local.h"),)
    assert fingerprint.files[0].written == "local.h"
    assert fingerprint.from_working_directory == (str(workdir / "local.h"),)


@needs_cuda_core
def test_the_trace_compile_bypasses_wrapped_nvrtc_functions(tree: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """cacheaudit's NVRTC adapter wraps `cuda.bindings.nvrtc` functions (functools.wraps); the
    fingerprint's private compile must not show up as one of the program's compiles."""
    import functools

    from cuda.bindings import nvrtc

    from cacheaudit.headers import fingerprint_headers

    calls: list[object] = []
    for name in ("nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcDestroyProgram"):
        original = getattr(nvrtc, name)

        def counting(*args: Any, __original: Any = original, **kwargs: Any) -> Any:
            calls.append(args)
            return __original(*args, **kwargs)

        monkeypatch.setattr(nvrtc, name, functools.wraps(original)(counting))
    fingerprint = fingerprint_headers(TREE_SOURCE, _options(include_path=[str(tree)]),
                                      retrace=True)
    assert len(fingerprint.files) == 2
    assert calls == []


# ------------------------------------------------------------------------------ the adapter


@needs_cuda_core
def test_a_compile_then_a_disk_hit_with_the_same_key(adapter: Any, ledger_path: Path,
                                                     tmp_path: Path, tree: Path) -> None:
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

    source = 'extern "C" __global__ void k(int* o) { o[0] = 7; }\n'
    options = _options(name="seven")
    cache = FileStreamProgramCache(tmp_path / "pc")
    built = _compile(source, options, cache)
    served = _compile(source, options, cache)
    assert built == served
    adapter.flush()
    compile_record, hit = _records(ledger_path)
    key = make_program_cache_key(code=source, code_type="c++", options=options,
                                 target_type="cubin")
    assert (compile_record.event, hit.event) == ("compile", "disk-hit")
    assert compile_record.runtime == hit.runtime == "cuda-core"
    assert compile_record.kernel == "seven"
    assert compile_record.key == hit.key == key.hex()
    name = hashlib.sha256(key).hexdigest()
    entry = tmp_path / "pc" / "entries" / name[:2] / name[2:]
    assert compile_record.entry == hit.entry == str(entry)
    from cacheaudit.digest import hash_file

    assert compile_record.outputs[0].digest == hit.outputs[0].digest == hash_file(str(entry))
    inputs = compile_record.extra["key_inputs"]
    assert inputs["extra_digest"] is None and inputs["unguarded"] is False
    assert inputs["nvrtc_version"].count(".") == 1
    assert compile_record.graph is None  # nothing included: nothing read

    from cacheaudit.runtimes.cuda_core.keys import recompute_key

    assert recompute_key(inputs, None) == key


@needs_cuda_core
def test_in_memory_cache_records_memory_hits(adapter: Any, ledger_path: Path) -> None:
    from cuda.core.utils import InMemoryProgramCache

    source = 'extern "C" __global__ void k(int* o) { o[0] = 8; }\n'
    cache = InMemoryProgramCache()
    _compile(source, _options(), cache)
    _compile(source, _options(), cache)
    adapter.flush()
    records = _records(ledger_path)
    assert [r.event for r in records] == ["compile", "memory-hit"]
    assert all(r.entry is None for r in records)
    assert records[0].outputs[0].digest == records[1].outputs[0].digest


@needs_cuda_core
def test_audited_wrapper_records_a_users_own_backend(ledger_path: Path, tmp_path: Path) -> None:
    from cuda.core.utils import FileStreamProgramCache, ProgramCacheResource

    from cacheaudit.runtimes.cuda_core.adapter import ADAPTER, AuditedProgramCache

    class DictCache(ProgramCacheResource):
        def __init__(self) -> None:
            self.data: dict[bytes, bytes] = {}

        def __getitem__(self, key: Any) -> bytes:
            return self.data[bytes(key)]

        def __setitem__(self, key: Any, value: Any) -> None:
            self.data[bytes(key)] = bytes(getattr(value, "code", value))

        def __delitem__(self, key: Any) -> None:
            del self.data[bytes(key)]

        def __len__(self) -> int:
            return len(self.data)

        def clear(self) -> None:
            self.data.clear()

    source = 'extern "C" __global__ void k(int* o) { o[0] = 9; }\n'
    try:
        own = AuditedProgramCache(DictCache(), event="memory-hit")
        _compile(source, _options(), own)
        _compile(source, _options(), own)
        # Wrapping a FileStream cache while the class hooks are installed records once.
        ADAPTER.install()
        files = AuditedProgramCache(FileStreamProgramCache(tmp_path / "pc"))
        _compile(source, _options(), files)
        _compile(source, _options(), files)
        assert len(own) == 1
    finally:
        ADAPTER.uninstall()
    records = _records(ledger_path)
    assert [r.event for r in records] == ["compile", "memory-hit", "compile", "disk-hit"]
    assert records[0].extra["key_inputs"]["code_size"] == len(source)
    assert records[3].entry is not None and os.path.isfile(records[3].entry)


@needs_cuda_core
def test_hits_from_many_threads_are_all_counted(adapter: Any, ledger_path: Path) -> None:
    from cuda.core.utils import InMemoryProgramCache

    cache = InMemoryProgramCache()
    # More distinct groups than the buffer holds: it is written (and swapped) every 256 hits.
    keys = [f"key-{n}".encode() for n in range(300)]
    for key in keys:
        cache[key] = b"binary " + key
    rounds, workers = 8, 4

    def lookups() -> None:
        for _ in range(rounds):
            for key in keys:
                cache[key]

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: inside the hit path too
    try:
        threads = [threading.Thread(target=lookups) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    adapter.flush()
    hits = [r for r in _records(ledger_path) if r.event == "memory-hit"]
    assert sum(r.extra["hits"] for r in hits) == rounds * workers * len(keys)


@needs_cuda_core
def test_nothing_is_recorded_under_cacheaudit_disable(adapter: Any, ledger_path: Path,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.core.utils import FileStreamProgramCache

    cache = FileStreamProgramCache(tmp_path / "pc")
    with monkeypatch.context() as patch:
        patch.setenv("CACHEAUDIT_DISABLE", "1")
        _compile('extern "C" __global__ void k(int* o) { o[0] = 21; }\n', _options(), cache)
        _compile('extern "C" __global__ void k(int* o) { o[0] = 21; }\n', _options(), cache)
    # Written after the variable is gone: what was observed under it stays unrecorded.
    adapter.flush()
    source = 'extern "C" __global__ void k(int* o) { o[0] = 22; }\n'
    _compile(source, _options(), cache)
    _compile(source, _options(), cache)
    adapter.flush()
    assert [r.event for r in _records(ledger_path)] == ["compile", "disk-hit"]


@needs_cuda_core
def test_a_hit_is_recorded_with_the_environment_of_the_hit(adapter: Any, ledger_path: Path,
                                                           tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch
                                                           ) -> None:
    from cuda.core.utils import FileStreamProgramCache

    source = 'extern "C" __global__ void k(int* o) { o[0] = 23; }\n'
    cache = FileStreamProgramCache(tmp_path / "pc")
    other = tmp_path / "other.db"
    with monkeypatch.context() as patch:
        patch.setenv("CACHEAUDIT_TEST_ID", "tests/a.py::first")
        patch.setenv("NVCC_APPEND_FLAGS", "-DFIRST")
        _compile(source, _options(), cache)
        _compile(source, _options(), cache)
    with monkeypatch.context() as patch:
        patch.setenv("CACHEAUDIT_TEST_ID", "tests/a.py::second")
        patch.setenv("CACHEAUDIT_LEDGER", str(other))
        patch.setenv("CACHEAUDIT_RUN", "second-run")
        _compile(source, _options(), cache)
    # Written now, under neither: each record keeps the test, ledger, run and environment of
    # its own moment.
    adapter.flush()
    first = _records(ledger_path)
    assert [(r.event, r.test_id) for r in first] == [("compile", "tests/a.py::first"),
                                                     ("disk-hit", "tests/a.py::first")]
    assert all(r.env.get("NVCC_APPEND_FLAGS") == "-DFIRST" for r in first)
    (second,) = _records(other)
    assert (second.event, second.test_id) == ("disk-hit", "tests/a.py::second")
    assert "NVCC_APPEND_FLAGS" not in second.env
    assert second.run_uuid == "second-run"


@needs_cuda_core
def test_a_variable_changed_between_two_hits_is_seen_by_the_second(
        adapter: Any, ledger_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.core.utils import InMemoryProgramCache

    # Hits share one environment snapshot while nothing changes; every way os.environ changes
    # (set, os.environb, delete) makes the next hit take a new one.
    monkeypatch.delenv("NVCC_APPEND_FLAGS", raising=False)
    source = 'extern "C" __global__ void k(int* o) { o[0] = 24; }\n'
    cache = InMemoryProgramCache()
    _compile(source, _options(), cache)
    _compile(source, _options(), cache)
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-DONE")
    _compile(source, _options(), cache)
    _compile(source, _options(), cache)
    os.environb[b"NVCC_APPEND_FLAGS"] = b"-DTWO"
    _compile(source, _options(), cache)
    del os.environ["NVCC_APPEND_FLAGS"]
    _compile(source, _options(), cache)
    adapter.flush()
    hits = [r for r in _records(ledger_path) if r.event == "memory-hit"]
    assert [(r.env.get("NVCC_APPEND_FLAGS"), r.extra["hits"]) for r in hits] == [
        (None, 1), ("-DONE", 2), ("-DTWO", 1), (None, 1)]


@needs_cuda_core
def test_an_entry_rewritten_between_two_hits_is_a_hit_of_other_bytes(
        adapter: Any, ledger_path: Path, tmp_path: Path) -> None:
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

    from cacheaudit.digest import hash_file

    source = 'extern "C" __global__ void k(int* o) { o[0] = 26; }\n'
    options = _options()
    cache = FileStreamProgramCache(tmp_path / "pc")
    _compile(source, options, cache)
    key = make_program_cache_key(code=source, code_type="c++", options=options,
                                 target_type="cubin")
    name = hashlib.sha256(key).hexdigest()
    entry = tmp_path / "pc" / "entries" / name[:2] / name[2:]
    first = hash_file(str(entry))
    cache[key]
    cache[key]
    # Another process rewrites the entry (same size: only the bytes tell the hits apart).
    original = entry.read_bytes()
    entry.write_bytes(original[:-1] + bytes([original[-1] ^ 0xFF]))
    second = hash_file(str(entry))
    cache[key]
    adapter.flush()
    hits = [r for r in _records(ledger_path) if r.event == "disk-hit"]
    assert [(r.outputs[0].digest, r.extra["hits"]) for r in hits] == [(first, 2), (second, 1)]


@needs_cuda_core
def test_hits_compare_the_environment_when_its_watch_is_bypassed(
        adapter: Any, ledger_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.core.utils import InMemoryProgramCache

    ours = os._Environ.__setitem__, os._Environ.__delitem__
    originals = [getattr(method, "__cacheaudit_original__", None) for method in ours]
    assert None not in originals
    monkeypatch.delenv("NVCC_APPEND_FLAGS", raising=False)
    source = 'extern "C" __global__ void k(int* o) { o[0] = 25; }\n'
    cache = InMemoryProgramCache()
    _compile(source, _options(), cache)
    _compile(source, _options(), cache)
    with monkeypatch.context() as patch:
        # Someone puts back the methods they saved before cacheaudit was installed: changes
        # are no longer counted, so hits compare the whole environment again.
        patch.setattr(os._Environ, "__setitem__", originals[0])
        patch.setattr(os._Environ, "__delitem__", originals[1])
        patch.setenv("NVCC_APPEND_FLAGS", "-DBYPASS")
        _compile(source, _options(), cache)
    # The variable went away through the original __delitem__ (uncounted).
    _compile(source, _options(), cache)
    adapter.flush()
    hits = [r for r in _records(ledger_path) if r.event == "memory-hit"]
    assert [r.env.get("NVCC_APPEND_FLAGS") for r in hits] == [None, "-DBYPASS", None]


@needs_cuda_core
def test_hits_of_one_key_from_many_threads_while_flushing_are_all_counted(
        adapter: Any, ledger_path: Path) -> None:
    from cuda.core.utils import InMemoryProgramCache

    cache = InMemoryProgramCache()
    cache[b"one-key"] = b"binary"
    rounds, workers = 2000, 4
    done = threading.Event()

    def lookups() -> None:
        for _ in range(rounds):
            cache[b"one-key"]

    def flushes() -> None:
        while not done.is_set():
            adapter.flush()  # swaps the buffer under the hits' feet

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        flusher = threading.Thread(target=flushes)
        flusher.start()
        threads = [threading.Thread(target=lookups) for _ in range(workers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        done.set()
        flusher.join()
    finally:
        sys.setswitchinterval(interval)
    adapter.flush()
    hits = [r for r in _records(ledger_path) if r.event == "memory-hit"]
    assert sum(r.extra["hits"] for r in hits) == rounds * workers


# ------------------------------------------------------------------------------ the guard's gap

_DRIVER = textwrap.dedent("""
    import hashlib, sys
    from cacheaudit import adapter, runtimes
    runtimes.activate(["cuda_core"])          # before cuda.core is imported: a post-import hook
    from cuda.core import Program, ProgramOptions
    from cuda.core.utils import FileStreamProgramCache
    from cacheaudit.runtimes.cuda_core.adapter import ADAPTER
    assert ADAPTER.installed()
    source = open(sys.argv[2]).read()
    options = ProgramOptions(arch="sm_90", name="kernel.cu")
    cache = FileStreamProgramCache(sys.argv[1])
    code = bytes(Program(source, "c++", options=options).compile("cubin", cache=cache).code)
    print(hashlib.sha256(code).hexdigest())
""")


@needs_cuda_core
def test_bare_name_stale_hit_is_real_and_found(tmp_path: Path, workdir: Path,
                                                ledger_path: Path) -> None:
    """The gap of cuda.core's guard: a program named without a directory reads `#include
    "local.h"` from the working directory; after an edit the cache serves the old cubin, and the
    audit names the header."""
    from cacheaudit import audit
    from cacheaudit.ledger import Ledger

    driver = tmp_path / "driver.py"
    driver.write_text(_DRIVER)
    source = _write(tmp_path / "kernel.src", BARE_SOURCE)
    root = tmp_path / "program-cache"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CACHEAUDIT_", "PYTEST_"))}
    env["CACHEAUDIT_LEDGER"] = str(ledger_path)

    def run() -> str:
        done = subprocess.run([sys.executable, str(driver), str(root), str(source)], cwd=workdir,
                              env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        assert "cacheaudit:" not in done.stderr, done.stderr
        return done.stdout.strip()

    built = run()
    _write(workdir / "local.h", "#define LOCAL_VALUE 4  /* edited */\n", aged=False)
    served = run()
    fresh = hashlib.sha256(_compile(BARE_SOURCE, _options(name="kernel.cu"))).hexdigest()
    assert served == built, "the cache missed: the stale hit was not reproduced"
    assert fresh != served, "a fresh compile equals the cached one: the edit changed nothing"

    with Ledger.open(str(ledger_path)) as ledger:
        records = ledger.records(with_files=True)
        assert [r.event for r in records] == ["compile", "disk-hit"]
        compile_record = records[0]
        assert compile_record.extra["key_inputs"]["unguarded"] is True
        assert compile_record.graph is not None
        assert compile_record.extra["from_working_directory"] == [str(workdir / "local.h")]
        assert compile_record.tracked == ()

        result = audit.scan([str(root)], os.environ, ledger=ledger)
        stale = [f for f in result.findings if f.code == "CA101"]
        assert [f.subject for f in stale] == [str(workdir / "local.h")]
        assert stale[0].record_id == compile_record.record_id
        assert stale[0].recorded != stale[0].current

        second_run = str(records[1].run_uuid)
        report = audit.audit_run(ledger, second_run, os.environ)
        assert "CA101" in {f.code for f in report.findings}


@needs_cuda_core
@pytest.mark.parametrize("kind", ["disk", "memory"])
def test_a_repeated_hit_served_after_its_header_changed_is_flagged(
        adapter: Any, workdir: Path, tmp_path: Path, ledger_path: Path, kind: str) -> None:
    """Repeats of a hit (same cache, key and bytes) are counted on the hook's fast path, which
    only counts and times them: the check against the header is made at the write, and must
    still see a change that came before the last of them."""
    from cuda.core.utils import FileStreamProgramCache, InMemoryProgramCache

    from cacheaudit import audit
    from cacheaudit.ledger import Ledger

    root = tmp_path / "pc"
    cache = FileStreamProgramCache(root) if kind == "disk" else InMemoryProgramCache()
    _compile(BARE_SOURCE, _options(name="kernel.cu"), cache)
    _compile(BARE_SOURCE, _options(name="kernel.cu"), cache)  # a first hit: the whole way
    _compile(BARE_SOURCE, _options(name="kernel.cu"), cache)  # a repeat: the fast path
    _write(workdir / "local.h", "#define LOCAL_VALUE 6\n", aged=False)
    _compile(BARE_SOURCE, _options(name="kernel.cu"), cache)  # a repeat, now stale
    adapter.flush()
    records = _records(ledger_path)
    header = str(workdir / "local.h")
    assert [(r.event, r.extra.get("hits")) for r in records] == [
        ("compile", None), (f"{kind}-hit", 3)]
    assert [c["path"] for c in records[1].extra["changed_before_hit"]] == [header]
    if kind == "memory":
        findings = audit.audit_records(records)
    else:
        with Ledger.open(str(ledger_path)) as ledger:
            findings = audit.scan([str(root)], os.environ, ledger=ledger).findings
    assert [f.subject for f in findings if f.code == "CA101"] == [header]


@needs_cuda_core
def test_repeated_hits_before_a_header_change_are_not_flagged(
        adapter: Any, workdir: Path, tmp_path: Path, ledger_path: Path) -> None:
    from cuda.core.utils import FileStreamProgramCache

    cache = FileStreamProgramCache(tmp_path / "pc")
    for _ in range(3):  # a compile, a first hit, a repeat
        _compile(BARE_SOURCE, _options(name="kernel.cu"), cache)
    # Changed after the last hit, before the write: those hits served what was current.
    _write(workdir / "local.h", "#define LOCAL_VALUE 7\n", aged=False)
    adapter.flush()
    records = _records(ledger_path)
    assert [(r.event, r.extra.get("hits")) for r in records] == [("compile", None),
                                                                 ("disk-hit", 2)]
    assert "changed_before_hit" not in records[1].extra


@needs_cuda_core
def test_a_compile_after_a_miss_of_a_key_made_before_is_timed_from_the_miss(
        adapter: Any, tmp_path: Path, ledger_path: Path) -> None:
    """A key made again is not noted again (equal keys, equal inputs): the compile that a later
    miss of it starts is timed from that miss, not from the key's first making."""
    from cuda.core.utils import FileStreamProgramCache

    source = 'extern "C" __global__ void k(int* o) { o[0] = 27; }\n'
    cache = FileStreamProgramCache(tmp_path / "pc")
    _compile(source, _options(), cache)
    _compile(source, _options(), cache)
    cache.clear()  # evicted
    before = time.time_ns()
    _compile(source, _options(), cache)
    adapter.flush()
    records = _records(ledger_path)
    assert [r.event for r in records] == ["compile", "disk-hit", "compile"]
    assert records[2].started_ns >= before
    assert records[2].extra["key_inputs"]["code_size"] == len(source)


@needs_cuda_core
def test_the_key_observer_raises_what_make_program_cache_key_raises(adapter: Any) -> None:
    import cuda.core.utils as utils

    from cacheaudit.runtimes.cuda_core.keys import ORIGINAL_ATTRIBUTE

    observer = utils.make_program_cache_key
    original = getattr(observer, ORIGINAL_ATTRIBUTE)
    good = {"code": 'extern "C" __global__ void k() {}\n', "code_type": "c++",
            "options": _options(), "target_type": "cubin"}
    assert observer(**good) == original(**good)
    assert observer(**good, extra_digest=b"x") == original(**good, extra_digest=b"x")
    for args, kwargs in (((), {k: v for k, v in good.items() if k != "code"}),
                         ((), {**good, "unknown": 1}),
                         (("positional",), good),
                         ((), {**good, "code_type": "fortran"})):
        with pytest.raises(Exception) as ours:
            observer(*args, **kwargs)
        with pytest.raises(Exception) as theirs:
            original(*args, **kwargs)
        assert (type(ours.value), str(ours.value)) == (type(theirs.value), str(theirs.value)), \
            f"make_program_cache_key(*{args!r}, **{sorted(kwargs)!r})"


@needs_cuda_core
def test_bare_name_unchanged_header_is_a_warning(adapter: Any, workdir: Path, tmp_path: Path,
                                                 ledger_path: Path) -> None:
    from cuda.core.utils import FileStreamProgramCache

    from cacheaudit import audit
    from cacheaudit.ledger import Ledger

    _compile(BARE_SOURCE, _options(name="kernel.cu"), FileStreamProgramCache(tmp_path / "pc"))
    adapter.flush()
    with Ledger.open(str(ledger_path)) as ledger:
        codes = [f.code for f in audit.scan([str(tmp_path / "pc")], os.environ,
                                            ledger=ledger).findings]
    assert codes == ["CA102"]


@needs_cuda_core
def test_in_memory_stale_hit_is_proven_by_the_hit(adapter: Any, workdir: Path,
                                                  ledger_path: Path) -> None:
    from cuda.core.utils import InMemoryProgramCache

    from cacheaudit import audit

    cache = InMemoryProgramCache()
    _compile(BARE_SOURCE, _options(name="kernel.cu"), cache)
    _write(workdir / "local.h", "#define LOCAL_VALUE 5\n", aged=False)
    _compile(BARE_SOURCE, _options(name="kernel.cu"), cache)
    adapter.flush()
    records = _records(ledger_path)
    assert [r.event for r in records] == ["compile", "memory-hit"]
    assert records[1].extra["changed_before_hit"][0]["path"] == str(workdir / "local.h")
    findings = audit.audit_records(records)
    assert [(f.code, f.record_id) for f in findings] == [
        ("CA102", records[0].record_id), ("CA101", records[1].record_id)]


@needs_cuda_core
def test_stale_extra_digest_reused_after_an_edit_is_ca106(adapter: Any, tree: Path,
                                                          tmp_path: Path,
                                                          ledger_path: Path) -> None:
    """The manual pattern cuda.core documents, with a fingerprint computed once and kept: the key
    no longer moves with the headers. Recomputing it per compile is the fix (a miss)."""
    from cuda.core import ObjectCode, Program
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

    from cacheaudit import audit
    from cacheaudit.headers import fingerprint_headers

    options = _options(include_path=[str(tree)])
    cache = FileStreamProgramCache(tmp_path / "pc")

    def compile_with(digest: Any) -> tuple[bool, bytes]:
        key = make_program_cache_key(code=TREE_SOURCE, code_type="c++", options=options,
                                     target_type="cubin", extra_digest=digest)
        data = cache.get(key)
        if data is None:
            code = Program(TREE_SOURCE, "c++", options=options).compile("cubin")
            cache[key] = code
            return False, bytes(code.code)
        return True, bytes(ObjectCode.from_cubin(data).code)

    kept = fingerprint_headers(TREE_SOURCE, options)
    assert compile_with(kept)[0] is False
    _write(tree / "lib" / "detail.h", "#pragma once\n#define DETAIL_VALUE 12\n", aged=False)
    hit, _ = compile_with(kept)  # the old fingerprint, kept by the caller
    assert hit
    missed, _ = compile_with(fingerprint_headers(TREE_SOURCE, options))  # recomputed: a miss
    assert missed is False
    adapter.flush()
    records = _records(ledger_path)
    assert [r.event for r in records] == ["compile", "disk-hit", "compile"]
    assert records[0].extra["key_inputs"]["extra_digest_source"] == "cacheaudit.headers"
    assert set(records[0].tracked or ()) == set(kept.paths)
    findings = audit.audit_records(records)
    assert [(f.code, f.subject) for f in findings] == [("CA106", str(tree / "lib" / "detail.h"))]


@needs_cuda_core
def test_entry_keyed_by_a_fingerprint_is_verified_by_recomputing_the_key(
        adapter: Any, tree: Path, tmp_path: Path, ledger_path: Path) -> None:
    from cuda.core import Program
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

    from cacheaudit import audit
    from cacheaudit.headers import fingerprint_headers
    from cacheaudit.ledger import Ledger

    options = _options(include_path=[str(tree)])
    cache = FileStreamProgramCache(tmp_path / "pc")
    key = make_program_cache_key(code=TREE_SOURCE, code_type="c++", options=options,
                                 target_type="cubin",
                                 extra_digest=fingerprint_headers(TREE_SOURCE, options))
    cache[key] = Program(TREE_SOURCE, "c++", options=options).compile("cubin")
    adapter.flush()
    strict = audit.AuditOptions(verify_keys=True)
    with Ledger.open(str(ledger_path)) as ledger:
        unchanged = audit.scan([str(tmp_path / "pc")], os.environ, ledger=ledger, options=strict)
        assert unchanged.matched == 1
        assert unchanged.findings == []  # the recomputed key names the entry: no CA501
        # A tracked header changes: the fingerprint, hence the key, moves; cuda.core misses.
        _write(tree / "lib" / "detail.h", "#pragma once\n#define DETAIL_VALUE 13\n", aged=False)
        changed = audit.scan([str(tmp_path / "pc")], os.environ, ledger=ledger)
        stale = [f for f in changed.findings if f.code in ("CA101", "CA103")]
        assert stale == []
        # The key takes a fresh fingerprint at every compile: a live process (this one) keeps
        # no stale header digest, so nothing is inferred from it.
        assert [f for f in changed.findings if f.code == "CA106"] == []


@needs_cuda_core
def test_a_callers_own_extra_digest_cannot_be_verified(adapter: Any, tree: Path,
                                                        tmp_path: Path,
                                                        ledger_path: Path) -> None:
    from cuda.core import Program
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

    from cacheaudit import audit
    from cacheaudit.ledger import Ledger

    options = _options(include_path=[str(tree)])
    key = make_program_cache_key(code=TREE_SOURCE, code_type="c++", options=options,
                                 target_type="cubin", extra_digest=b"\0")  # PR #2555's bypass
    cache = FileStreamProgramCache(tmp_path / "pc")
    cache[key] = Program(TREE_SOURCE, "c++", options=options).compile("cubin")
    adapter.flush()
    record = _records(ledger_path)[0]
    assert record.extra["key_inputs"]["extra_digest_source"] == "caller"
    assert record.graph is not None and len(record.graph.files) == 2
    with Ledger.open(str(ledger_path)) as ledger:
        findings = audit.scan([str(tmp_path / "pc")], os.environ, ledger=ledger).findings
    assert [f.code for f in findings] == ["CA501"]
    assert "cannot be verified" in findings[0].message


# ------------------------------------------------------------------------------ install, fail open


@needs_cuda_core
def test_install_is_idempotent_and_uninstall_restores_the_originals(ledger_path: Path) -> None:
    import cuda.core.utils as utils
    import cuda.core.utils._program_cache as package
    from cuda.core.utils import FileStreamProgramCache, InMemoryProgramCache

    from cacheaudit.runtimes.cuda_core.adapter import ADAPTER

    def snapshot() -> list[object]:
        return [package.make_program_cache_key, utils.make_program_cache_key,
                *(vars(cls).get(name) for cls in (FileStreamProgramCache, InMemoryProgramCache)
                  for name in ("__getitem__", "__setitem__", "get")),
                *(vars(os._Environ).get(name)
                  for name in ("__setitem__", "__delitem__"))]

    before = snapshot()
    ADAPTER.install()
    installed = snapshot()
    ADAPTER.install()
    assert snapshot() == installed
    assert installed[0] is not before[0] and installed[2] is not before[2]
    assert installed[-1] is not before[-1]  # the environment watch
    ADAPTER.uninstall()
    assert all(a is b for a, b in zip(snapshot(), before, strict=True))
    assert not ADAPTER.installed()
    ADAPTER.uninstall()  # twice: nothing to do


@needs_cuda_core
def test_fail_open_the_runtime_behaves_exactly_as_without(
        tmp_path: Path, workdir: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    from cuda.core.utils import FileStreamProgramCache, make_program_cache_key

    from cacheaudit.runtimes.cuda_core import adapter as cuda_core

    # A ledger that cannot exist (its directory is a file), and a key observer that breaks.
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("CACHEAUDIT_LEDGER", str(blocker / "ledger.db"))
    baseline_cache = FileStreamProgramCache(tmp_path / "plain")
    baseline = _compile(BARE_SOURCE, _options(name="kernel.cu"), baseline_cache)
    cuda_core._RECORDER.problems.clear()
    cuda_core.ADAPTER.install()
    try:
        def broken() -> int:
            raise RuntimeError("observer broke")

        # The clock every hook reads first: the key observer and the hit path both break.
        monkeypatch.setattr(cuda_core, "_time_ns", broken)
        cache = FileStreamProgramCache(tmp_path / "pc")
        assert _compile(BARE_SOURCE, _options(name="kernel.cu"), cache) == baseline
        assert _compile(BARE_SOURCE, _options(name="kernel.cu"), cache) == baseline
        key = make_program_cache_key(code="x", code_type="c++", options=_options(),
                                     target_type="cubin")
        with pytest.raises(KeyError):
            cache[key]  # a miss still raises KeyError
        assert cache.get(key) is None
        with pytest.raises(ValueError, match="extra_digest"):  # the guard still refuses
            _compile(BARE_SOURCE, _options(include_path=[str(tmp_path)]), cache)
        cuda_core.ADAPTER.flush()
    finally:
        cuda_core.ADAPTER.uninstall()
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("cacheaudit:")]
    assert lines and all("the compile is unaffected" in line for line in lines)
    assert any("observer broke" in line for line in lines)
    assert len(lines) == len(set(lines))  # each problem once


@needs_cuda_core
def test_uninstall_leaves_what_someone_patched_over(ledger_path: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    import cuda.core.utils._program_cache as package

    from cacheaudit.runtimes.cuda_core import adapter as cuda_core

    cuda_core._RECORDER.problems.clear()
    cuda_core.ADAPTER.install()
    ours = package.make_program_cache_key

    def theirs(**kwargs: Any) -> bytes:
        return ours(**kwargs)  # type: ignore[no-any-return]

    package.make_program_cache_key = theirs
    try:
        cuda_core.ADAPTER.uninstall()
        assert package.make_program_cache_key is theirs
        assert "replaced by someone else" in capfd.readouterr().err
        # Ours, left under theirs, observes nothing any more.
        cuda_core._RECORDER.contexts.clear()
        theirs(code="int x;", code_type="c++", options=_options(), target_type="cubin")
        assert cuda_core._RECORDER.contexts == {}
        # Installing again observes once, through a fresh observer on top.
        cuda_core.ADAPTER.install()
        try:
            assert package.make_program_cache_key is not theirs
            key = package.make_program_cache_key(code="int y;", code_type="c++",
                                                 options=_options(), target_type="cubin")
            assert list(cuda_core._RECORDER.contexts) == [key]
        finally:
            cuda_core.ADAPTER.uninstall()
        assert package.make_program_cache_key is theirs
    finally:
        package.make_program_cache_key = getattr(ours, "__cacheaudit_original__", ours)


# ------------------------------------------------------------------------------ the reader


def test_reader_lists_entries_and_interrupted_writes(tmp_path: Path) -> None:
    from cacheaudit.digest import StateCache
    from cacheaudit.model import CacheEntry, CacheLeftover
    from cacheaudit.runtimes.cuda_core.layout import LAYOUT

    root = tmp_path / "program-cache"
    name = hashlib.sha256(b"some key").hexdigest()
    entry = root / "entries" / name[:2] / name[2:]
    entry.parent.mkdir(parents=True)
    entry.write_bytes(b"\x7fELF" + b"\0" * 60)
    empty_name = hashlib.sha256(b"empty").hexdigest()
    empty = root / "entries" / empty_name[:2] / empty_name[2:]
    empty.parent.mkdir(parents=True, exist_ok=True)
    empty.write_bytes(b"")
    (root / "entries" / name[:2] / "stray.bin").write_bytes(b"x")
    (root / "tmp").mkdir()
    dead = root / "tmp" / "entry-k2j3h4g5"
    dead.write_bytes(b"\x7fELF partial")
    _age(dead, 7200)
    assert LAYOUT.is_root(str(root))
    assert not LAYOUT.is_root(str(tmp_path))

    items = list(LAYOUT.read(str(root), StateCache()))
    entries = {i.path: i for i in items if isinstance(i, CacheEntry)}
    leftovers = {i.path: i for i in items if isinstance(i, CacheLeftover)}
    assert set(entries) == {str(entry), str(empty)}
    assert entries[str(entry)].key == name
    assert entries[str(entry)].meta["format"] == "cubin"
    assert entries[str(entry)].problems == ()
    assert "empty" in entries[str(empty)].problems[0]
    assert set(leftovers) == {str(root / "entries" / name[:2] / "stray.bin"), str(dead)}
    assert "never reached os.replace" in leftovers[str(dead)].reason


def test_reader_default_roots_follow_cuda_core() -> None:
    from cacheaudit.runtimes.cuda_core.layout import LAYOUT

    assert LAYOUT.default_roots({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == [
        "/x/cuda-python/program-cache"]
    assert LAYOUT.default_roots({"XDG_CACHE_HOME": "", "HOME": "/h"}) == [
        "/h/.cache/cuda-python/program-cache"]
    assert LAYOUT.default_roots({}) == []


@needs_cuda_core
def test_reader_matches_the_directory_cuda_core_writes(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from cuda.core.utils import FileStreamProgramCache

    from cacheaudit.digest import StateCache
    from cacheaudit.runtimes.cuda_core.layout import LAYOUT

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache = FileStreamProgramCache()  # the default root, as cuda.core resolves it
    cache[b"k"] = b"payload"
    (root,) = LAYOUT.default_roots(dict(os.environ))
    assert LAYOUT.is_root(root)
    (entry,) = LAYOUT.read(root, StateCache())
    assert entry.key == hashlib.sha256(b"k").hexdigest()
    assert cache[b"k"] == Path(entry.path).read_bytes()


# ------------------------------------------------------------------------------ review fixes
# (headers, reader, policy): where a header was found, odd names


def test_headers_found_through_include_path_are_not_from_the_working_directory(
        tmp_path: Path, workdir: Path) -> None:
    from cacheaudit.headers import SCAN, fingerprint_headers

    inc = tmp_path / "inc"
    _write(inc / "shared.h", "#define SHARED 1\n")
    _write(inc / "pre.h", "#define PRE 1\n")
    source = '#include "shared.h"\n#include "local.h"\n'
    fingerprint = fingerprint_headers(source, include_path=[str(inc)], pre_include=["pre.h"],
                                      method="scan")
    assert fingerprint.method == SCAN
    assert set(fingerprint.paths) == {str(inc / "shared.h"), str(inc / "pre.h"),
                                      str(workdir / "local.h")}
    # The quoted include and the pre-include resolved through include_path, not the working
    # directory (which is searched first and does not hold them).
    assert fingerprint.from_working_directory == (str(workdir / "local.h"),)


def test_reader_names_a_directory_where_an_entry_file_belongs(tmp_path: Path) -> None:
    from cacheaudit.digest import StateCache
    from cacheaudit.model import CacheLeftover
    from cacheaudit.runtimes.cuda_core.layout import LAYOUT

    name = hashlib.sha256(b"a key").hexdigest()
    (tmp_path / "entries" / name[:2] / name[2:]).mkdir(parents=True)
    (tmp_path / "tmp").mkdir()
    [leftover] = list(LAYOUT.read(str(tmp_path), StateCache()))
    assert isinstance(leftover, CacheLeftover)
    assert leftover.reason.startswith("a directory with an entry's name")
    assert "IsADirectoryError" in leftover.reason


def test_key_recomputation_takes_a_program_name_that_is_not_utf8() -> None:
    from cacheaudit.runtimes.cuda_core.keys import recompute_key

    inputs = {"code_type": "c++", "schema": 2, "code": "extern \"C\" __global__ void k() {}",
              "option_bytes": ["-arch=sm_90"], "nvrtc_version": "13.0", "target_type": "cubin",
              "name_expressions": [], "name": os.fsdecode(b"kernel-\xff.cu")}
    plain = dict(inputs, name="kernel.cu")
    assert recompute_key(inputs, None) != recompute_key(plain, None)
