"""The ledger: a real SQLite file, real concurrent writer processes, real foreign files."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from cacheaudit.exceptions import LedgerError
from cacheaudit.ledger import (
    SCHEMA_VERSION,
    Ledger,
    RunInfo,
    default_ledger_path,
    ingest_spool,
    new_record_id,
    spool_dir,
    spool_record,
)
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    Finding,
    GraphFile,
    IncludeGraph,
)


def _state(path: str, digest: str = "a" * 32, size: int = 10) -> FileState:
    return FileState(path=path, exists=True, size=size, mtime_ns=1_000, ctime_ns=2_000,
                     inode=42, digest=digest, settled=True)


def _graph(n: int = 50, prefix: str = "/opt/cutlass/include") -> IncludeGraph:
    return IncludeGraph(tuple(GraphFile(_state(f"{prefix}/h{i}.h"), f"{prefix}/x/../h{i}.h")
                              for i in range(n)), "nvcc -M")


def _record(kernel: str = "gemm", graph: IncludeGraph | None = None, **changes: object
            ) -> CompileRecord:
    host = CompilerIdentity(invoked="g++", path="/usr/bin/g++", resolved="/usr/bin/g++-12",
                            kind="gcc", version_text="g++ (Debian 12.2.0) 12.2.0\n",
                            digest="b" * 32)
    nvcc = CompilerIdentity(invoked="nvcc", path="/usr/local/bin/nvcc",
                            resolved="/usr/local/cuda-13.0/bin/nvcc", kind="nvcc",
                            version_text="Cuda compilation tools, release 13.0, V13.0.88\n",
                            digest="c" * 32, wrappers=("/usr/local/bin/nvcc",), host=host)
    values: dict[str, object] = dict(
        record_id=new_record_id(), event="compile", started_ns=1_700_000_000_000_000_000,
        runtime="deepjit", kernel=kernel, compiler=nvcc, argv=("kernel.cu", "-cubin"),
        effective_argv=(ArgToken("kernel.cu"), ArgToken("-cubin"),
                        ArgToken("-DX=1", "env:NVCC_APPEND_FLAGS")),
        cwd="/tmp/w", env={"NVCC_APPEND_FLAGS": "-DX=1"},
        sources=(_state(f"/tmp/w/{kernel}.cu", digest="d" * 32),),
        graph=graph if graph is not None else _graph(),
        outputs=(_state(f"/tmp/w/{kernel}.cubin", digest="e" * 32),),
        exit_code=0, duration_ns=2_000_000_000, pid=123, host="box", observer="shim:nvcc")
    values.update(changes)
    return CompileRecord(**values)  # type: ignore[arg-type]


RUN = RunInfo(run_uuid="run-1", label="test")


def test_round_trip_keeps_the_four_answers(tmp_path):
    record = _record()
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        assert ledger.add_records([record], RUN) == 1
        loaded = ledger.record(record.record_id)
    assert loaded is not None
    assert loaded.compiler == record.compiler
    assert loaded.compiler.host.version_line == "g++ (Debian 12.2.0) 12.2.0"
    assert loaded.effective_argv == record.effective_argv
    assert loaded.env == record.env
    assert loaded.graph == record.graph
    assert loaded.sources == record.sources and loaded.outputs == record.outputs
    assert loaded.extra["run_uuid"] == "run-1"


def test_adding_the_same_record_twice_stores_it_once(tmp_path):
    record = _record()
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        assert ledger.add_records([record, record], RUN) == 1
        assert ledger.add_records([record], RUN) == 0
        assert ledger.count("records") == 1


def test_separate_writers_share_rows_they_both_need(tmp_path):
    # One ledger object per record, as one shim process per compile: every shared row (argv,
    # environment, compiler, graph) is found again by a fresh connection instead of inserted.
    path = str(tmp_path / "ledger.db")
    for kernel in ("a", "b", "c"):
        with Ledger.open(path) as ledger:
            ledger.add_records([_record(kernel)], RUN)
    with Ledger.open(path) as ledger:
        assert ledger.count("records") == 3
        assert ledger.count("compilers") == 2
        assert ledger.conn.execute(
            "SELECT count(DISTINCT argv_id), count(DISTINCT env_id) FROM records").fetchone() == (
            1, 1)
        assert {r.kernel for r in ledger.records()} == {"a", "b", "c"}


def test_a_shared_graph_is_stored_once(tmp_path):
    shared = _graph(200)
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([_record(f"k{i}", graph=shared) for i in range(100)], RUN)
        assert ledger.count("records") == 100
        # one shared header graph, plus each kernel's own sources and outputs
        assert ledger.conn.execute(
            "SELECT count(*) FROM graphs WHERE method = 'nvcc -M'").fetchone()[0] == 1
        assert ledger.count("graph_files") == 200 + 100 + 100
        assert ledger.count("compilers") == 2


def test_findings_round_trip_latest_audit(tmp_path):
    first = Finding("CA101", "/h.h", "old", recorded="aa", current="bb", how="content hash")
    second = Finding("CA202", "NVCC_APPEND_FLAGS", "drift", recorded="", current="-DX=1",
                     how="environment")
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_findings([first])
        ledger.add_findings([second])
        assert ledger.findings() == [second]


def test_a_file_that_is_not_sqlite_is_refused_with_one_clear_line(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n" * 100)
    with pytest.raises(LedgerError, match="not a cacheaudit ledger"):
        Ledger.open(str(path))
    assert path.read_text() == "hello\n" * 100


def test_a_foreign_sqlite_database_is_refused_and_left_alone(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (name TEXT)")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="SQLite database but not a cacheaudit ledger"):
        Ledger.open(str(path))
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"customers"}


def test_a_ledger_from_a_newer_cacheaudit_names_both_versions(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match=rf"version 99.*\({SCHEMA_VERSION}\)"):
        Ledger.open(path)


def test_schema_is_created_through_recorded_migrations_in_wal_mode(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger.open(path).close()
    conn = sqlite3.connect(path)
    applied = [r[0] for r in conn.execute(
        "SELECT name FROM _sqlite_migrations WHERE migration_set = 'cacheaudit'")]
    assert applied == ["0001_initial"]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_missing_ledger_without_create_is_a_clear_error(tmp_path):
    with pytest.raises(LedgerError, match="no ledger at"):
        Ledger.open(str(tmp_path / "absent.db"), create=False)


def test_default_location_follows_xdg(tmp_path):
    assert default_ledger_path({"CACHEAUDIT_LEDGER": str(tmp_path / "x.db")}) == str(
        tmp_path / "x.db")
    assert default_ledger_path({"XDG_CACHE_HOME": str(tmp_path)}) == str(
        tmp_path / "cacheaudit" / "ledger.db")
    # A relative XDG_CACHE_HOME is invalid by the spec and ignored.
    assert default_ledger_path({"XDG_CACHE_HOME": "rel", "HOME": str(tmp_path)}).endswith(
        os.path.join(".cache", "cacheaudit", "ledger.db"))


def test_spooled_records_are_folded_in_once(tmp_path):
    path = str(tmp_path / "ledger.db")
    record = _record()
    spool_record(path, record, RUN)
    with Ledger.open(path) as ledger:
        assert ingest_spool(ledger) == 1
        assert ingest_spool(ledger) == 0
        assert ledger.record(record.record_id).graph == record.graph
    assert not os.path.exists(spool_dir(path))


def test_an_unreadable_spool_file_is_kept_aside(tmp_path):
    path = str(tmp_path / "ledger.db")
    os.makedirs(spool_dir(path))
    with open(os.path.join(spool_dir(path), "broken.json"), "w") as handle:
        handle.write("{not json")
    with Ledger.open(path) as ledger:
        assert ingest_spool(ledger) == 0
    assert os.path.exists(os.path.join(spool_dir(path), "broken.json.bad"))


WRITER = textwrap.dedent("""
    import sys
    from cacheaudit.ledger import Ledger, RunInfo, new_record_id
    from cacheaudit.model import CompileRecord, FileState, GraphFile, IncludeGraph

    path, worker, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    shared = IncludeGraph(tuple(
        GraphFile(FileState(path=f"/inc/h{i}.h", exists=True, size=i, mtime_ns=1, ctime_ns=1,
                            inode=i, digest=f"{i:032x}"), f"/inc/h{i}.h") for i in range(20)),
        "g++ -M")
    run = RunInfo(run_uuid=f"worker-{worker}", label="test")
    for n in range(count):
        # A fresh connection per record, like one shim process per compile.
        with Ledger.open(path) as ledger:
            ledger.add_records([CompileRecord(
                record_id=new_record_id(), event="compile", started_ns=n, kernel=f"k{worker}-{n}",
                graph=shared, observer="test")], run)
""")


@pytest.mark.slow
def test_eight_processes_writing_500_records_each_lose_nothing(tmp_path):
    path = str(tmp_path / "ledger.db")
    # All eight race to create the schema too: nobody opened the file before.
    writers = [subprocess.Popen([sys.executable, "-c", WRITER, path, str(w), "500"],
                                stderr=subprocess.PIPE) for w in range(8)]
    errors = [w.communicate(timeout=600)[1].decode() for w in writers]
    assert [w.returncode for w in writers] == [0] * 8, errors
    with Ledger.open(path) as ledger:
        assert ledger.count("records") == 4000
        assert ledger.integrity_check() == "ok"
        assert ledger.count("runs") == 8
        assert ledger.conn.execute(
            "SELECT count(DISTINCT kernel) FROM records").fetchone()[0] == 4000
        assert ledger.count("graphs") == 1


def test_records_survive_json_of_odd_bytes(tmp_path):
    # Paths and argv are bytes on POSIX; undecodable ones arrive as surrogate escapes.
    odd = "/tmp/w/caf\udce9.cu"
    record = _record(argv=(odd,), cwd="/tmp/w\udcff", sources=(_state(odd),))
    path = str(tmp_path / "ledger.db")
    spool_record(path, record, RUN)
    with Ledger.open(path) as ledger:
        ingest_spool(ledger)
        loaded = ledger.record(record.record_id)
    assert loaded.argv == (odd,)
    assert loaded.sources[0].path == odd
    assert loaded.cwd == "/tmp/w\udcff"
