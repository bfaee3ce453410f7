"""The ledger: a real SQLite file, real concurrent writer processes, real foreign files."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap

import pytest

from cacheaudit.exceptions import LedgerError
from cacheaudit.ledger import (
    SCHEMA_VERSION,
    Attribution,
    Ledger,
    RunInfo,
    combine,
    default_ledger_path,
    ingest_spool,
    new_record_id,
    open_existing,
    spool_dir,
    spool_record,
)
from cacheaudit.ledger import TestWindow as Window
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
    assert loaded.run_uuid == "run-1"


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
    assert applied == ["0001_initial", "0002_records_by_run_and_test", "0003_entry_identity",
                       "0004_evictions", "0005_records_by_kernel_name",
                       "0006_fewer_record_indexes"]
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0] == (
        str(SCHEMA_VERSION))


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


# ------------------------------------------------------------------ nothing recorded is lost


def _spool_edited(path: str, edit: object) -> tuple[CompileRecord, str]:
    record = _record()
    spooled = spool_record(path, record, RUN)
    with open(spooled) as handle:
        data = json.load(handle)
    edit(data)  # type: ignore[operator]
    with open(spooled, "w") as handle:
        json.dump(data, handle)
    return record, spooled


@pytest.mark.parametrize("edit", [
    lambda d: d["record"].update(event="lookup"),          # breaks the CHECK on event
    lambda d: d["record"].update(started_ns=None),         # breaks NOT NULL on records
    lambda d: d["run"].update(run_uuid="run-2", started_ns=None),  # NOT NULL on runs
], ids=["unknown-event", "record-without-start", "run-without-start"])
def test_a_spooled_record_the_schema_refuses_is_kept_aside_not_dropped(tmp_path, edit):
    path = str(tmp_path / "ledger.db")
    good = _record("fine")
    spool_record(path, good, RUN)
    _bad, spooled = _spool_edited(path, edit)
    with Ledger.open(path) as ledger:
        assert ingest_spool(ledger) == 1
        assert [r.record_id for r in ledger.records()] == [good.record_id]
    # The refused record is still there, out of the way, and later readers are not stopped.
    assert os.path.exists(spooled + ".bad") and not os.path.exists(spooled)
    with Ledger.open(path) as ledger:
        assert ingest_spool(ledger) == 0


def test_add_records_raises_on_a_record_the_schema_refuses(tmp_path):
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        with pytest.raises(sqlite3.IntegrityError):
            ledger.add_records([_record(event="lookup")], RUN)
        assert ledger.count("records") == 0
        assert ledger.add_records([_record()], RUN) == 1


def test_spooled_records_wait_while_the_ledger_cannot_be_written(tmp_path):
    path = str(tmp_path / "ledger.db")
    Ledger.open(path).close()
    spooled = spool_record(path, _record(), RUN)
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with Ledger.open(path, patience_s=0.05) as ledger:  # give up in 50 ms, not 5 s
            assert ingest_spool(ledger) == 0
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert os.path.exists(spooled)


# ------------------------------------------------------------------ schema upgrades


def _downgrade_to_version_1(path: str) -> None:
    conn = sqlite3.connect(path)
    for index in ("records_by_run", "records_by_test", "records_by_sources",
                  "records_by_outputs", "graph_files_by_state", "file_states_by_digest"):
        conn.execute(f"DROP INDEX {index}")
    conn.execute("DELETE FROM _sqlite_migrations WHERE name != '0001_initial'")
    conn.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()


def test_a_version_1_ledger_is_upgraded_by_a_reader_and_keeps_its_records(tmp_path):
    path = str(tmp_path / "ledger.db")
    record = _record(test_id="t.py::test_k[fp16]")
    with Ledger.open(path) as ledger:
        ledger.add_records([record], RUN)
    _downgrade_to_version_1(path)
    with Ledger.open(path, create=False) as ledger:
        assert ledger.record(record.record_id) is not None
        indexes = {r[0] for r in ledger.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index'")}
        version = ledger.conn.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    assert {"records_by_run", "records_by_test", "records_by_sources", "records_by_outputs",
            "graph_files_by_state", "file_states_by_digest"} <= indexes
    assert version == str(SCHEMA_VERSION) == "6"


def test_upgrading_to_version_3_forgets_the_entries_scans_gave_shim_records(tmp_path):
    # Before version 3 a scan tied entries to shim records by the binary's digest alone, which
    # ties twin caches and link steps wrongly; an adapter's own entry is an observation and
    # stays.
    path = str(tmp_path / "ledger.db")
    shim = _record("a")
    adapter = _record("b", observer="adapter:torch-ext", entry="/c/b")
    with Ledger.open(path) as ledger:
        ledger.add_records([shim, adapter], RUN)
        ledger.attribute([Attribution(shim.record_id, "deepjit", "a", "k", "/twin/cache/a")])
    conn = sqlite3.connect(path)
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0003_entry_identity'")
    conn.execute("UPDATE meta SET value = '2' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with Ledger.open(path, create=False) as ledger:
        upgraded = {r.record_id: r for r in ledger.records()}
    assert upgraded[shim.record_id].entry is None
    assert upgraded[shim.record_id].key == "k"  # what the scan learnt besides is kept
    assert upgraded[adapter.record_id].entry == "/c/b"


def test_a_version_3_ledger_gains_the_evictions_table_and_keeps_its_records(tmp_path):
    path = str(tmp_path / "ledger.db")
    record = _record("a")
    with Ledger.open(path) as ledger:
        ledger.add_records([record], RUN)
    conn = sqlite3.connect(path)
    conn.execute("DROP TABLE evictions")
    # A version 3 ledger has neither of the later migrations recorded.
    conn.execute("DELETE FROM _sqlite_migrations WHERE name IN ('0004_evictions',"
                 " '0005_records_by_kernel_name', '0006_fewer_record_indexes')")
    conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()
    with Ledger.open(path, create=False) as ledger:
        assert ledger.record(record.record_id) is not None
        assert ledger.count("evictions") == 0
        indexes = {r[0] for r in ledger.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index'")}
        version = ledger.conn.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
    assert "evictions_by_entry" in indexes
    assert version == str(SCHEMA_VERSION)


# The indexes on records of a version 5 ledger that version 6 changed or dropped.
_VERSION_5_INDEXES = {
    "records_by_kernel": "CREATE INDEX records_by_kernel ON records (runtime, kernel, started_ns)",
    "records_by_kernel_name": "CREATE INDEX records_by_kernel_name ON records (kernel, started_ns)",
    "records_by_key": "CREATE INDEX records_by_key ON records (key)",
    "records_by_sources": "CREATE INDEX records_by_sources ON records (sources_id)",
    "records_by_outputs": "CREATE INDEX records_by_outputs ON records (outputs_id)",
}


def _downgrade_to_version_5(path: str) -> None:
    conn = sqlite3.connect(path)
    for name, statement in _VERSION_5_INDEXES.items():
        conn.execute(f"DROP INDEX IF EXISTS {name}")
        conn.execute(statement)
    conn.execute("DELETE FROM _sqlite_migrations WHERE name = '0006_fewer_record_indexes'")
    conn.execute("UPDATE meta SET value = '5' WHERE key = 'schema_version'")
    conn.commit()
    conn.close()


def _record_indexes(conn: sqlite3.Connection) -> dict[str, str]:
    return {name: " ".join(sql.split()) for name, sql in conn.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'records'"
        " AND sql IS NOT NULL")}


def test_a_version_5_ledger_is_upgraded_to_fewer_record_indexes_and_reads_back_equal(tmp_path):
    # Version 6 (issue 16): one kernel index instead of two; key, sources and outputs indexed
    # only where a record has them (a hit is written into four indexes, not eight).
    path, fresh = str(tmp_path / "ledger.db"), str(tmp_path / "fresh.db")
    written = [_record("a", test_id="t.py::test_a"),
               _record("b", event="disk-hit", entry="/c/b", key="k", sources=(), outputs=(),
                       graph=None, compiler=None, argv=(), effective_argv=(), env={})]
    with Ledger.open(path) as ledger:
        ledger.add_records(written, RUN)
        before = {r.record_id: r for r in ledger.records()}
    Ledger.open(fresh).close()
    _downgrade_to_version_5(path)
    with sqlite3.connect(path) as conn:
        assert "records_by_kernel_name" in _record_indexes(conn)
    with Ledger.open(path, create=False) as ledger:
        after = {r.record_id: r for r in ledger.records()}
        version = ledger.conn.execute(
            "SELECT value FROM meta WHERE key = 'schema_version'").fetchone()[0]
        upgraded = _record_indexes(ledger.conn)
        assert ledger.integrity_check() == "ok"
    with sqlite3.connect(fresh) as conn:
        created = _record_indexes(conn)
    assert version == str(SCHEMA_VERSION) == "6"
    assert after == before
    assert sorted(after) == sorted(r.record_id for r in written)
    # The upgraded ledger has exactly the indexes a new one is created with.
    assert upgraded == created
    assert "records_by_kernel_name" not in upgraded
    assert upgraded["records_by_kernel"].endswith("(kernel, started_ns, id, runtime)")
    for name, condition in (("records_by_key", "event = 'compile'"),
                            ("records_by_sources", "sources_id IS NOT NULL"),
                            ("records_by_outputs", "outputs_id IS NOT NULL")):
        assert upgraded[name].endswith(f"WHERE {condition}"), (name, upgraded[name])


def test_a_hit_is_written_into_the_indexes_of_a_hit_only(tmp_path):
    # The partial indexes hold compiles' keys and present sources/outputs, nothing of a hit.
    path = str(tmp_path / "ledger.db")
    with Ledger.open(path) as ledger:
        ledger.add_records([_record("a"), _record("b", event="disk-hit", entry="/c/b", key="k",
                                                  sources=(), outputs=(), graph=None)], RUN)
        entries = {name: ledger.conn.execute(
            f"SELECT count(*) FROM records INDEXED BY {name} WHERE {where}").fetchone()[0]
            for name, where in (("records_by_key", "event = 'compile' AND key IS NOT NULL"),
                                ("records_by_sources", "sources_id IS NOT NULL"),
                                ("records_by_outputs", "outputs_id IS NOT NULL"))}
    assert entries == {"records_by_key": 0, "records_by_sources": 1, "records_by_outputs": 1}


def test_a_kernels_history_is_read_by_index_with_or_without_its_runtime(tmp_path):
    # Version 5: `report --kernel K` without --runtime read every record's index entry;
    # version 6 reads both through one index, (kernel, started_ns, id, runtime), a version 5
    # ledger upgraded as well as a new one.
    path = str(tmp_path / "ledger.db")
    with Ledger.open(path) as ledger:
        ledger.add_records([_record(f"k{i % 3}", started_ns=i) for i in range(9)], RUN)
    _downgrade_to_version_5(path)
    with Ledger.open(path, create=False) as ledger:
        statements: list[str] = []
        ledger.conn.set_trace_callback(statements.append)
        by_name = ledger.recent_records(kernel="k1", limit=2)
        count = ledger.count_records(kernel="k1")
        both = ledger.recent_records(kernel="k1", runtime="deepjit", limit=2)
        other = ledger.recent_records(kernel="k1", runtime="triton", limit=2)
        ledger.conn.set_trace_callback(None)
        plans = [_plan(ledger, sql, ()) for sql in statements
                 if sql.startswith("SELECT") and "r.kernel = " in sql]
    assert [r.started_ns for r in by_name] == [4, 7] == [r.started_ns for r in both]
    assert other == []
    assert count == 3
    assert len(plans) == 4
    for plan in plans:
        assert "SCAN r" not in plan and "records_by_kernel" in plan, plan
        assert "TEMP B-TREE" not in plan, plan


def test_identity_candidates_are_found_by_entry_source_and_output(tmp_path):
    by_entry = _record("a", entry="/root/cache/a")
    by_path = _record("b", sources=(_state("/root/cache/b/kernel.cu", digest="1" * 32),))
    by_digest = _record("c", sources=(_state("/root/tmp/x/kernel.cu", digest="2" * 32),))
    by_output = _record("d", outputs=(_state("/root/tmp/y/kernel.so", digest="3" * 32),))
    hit = _record("e", event="disk-hit", entry="/root/cache/a")
    unrelated = _record("f", sources=(_state("/else/kernel.cu", digest="9" * 32),))
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([by_entry, by_path, by_digest, by_output, hit, unrelated], RUN)
        found = ledger.identity_candidates(
            entries=["/root/cache/a"], sources=["/root/cache/b/kernel.cu"],
            source_digests=["2" * 32], output_digests=["3" * 32])
    assert sorted(r.kernel for r in found) == ["a", "b", "c", "d"]
    # Each comes with its sources and outputs: the audit chooses among them by those.
    assert all(r.sources and r.outputs for r in found)


def test_identity_candidates_are_found_by_index(tmp_path):
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([_record(f"k{i}") for i in range(5)], RUN)
        statements: list[str] = []
        ledger.conn.set_trace_callback(statements.append)  # the SQL with its values in
        ledger.identity_candidates(entries=["/c/a"], sources=["/tmp/w/k0.cu"],
                                   source_digests=["d" * 32], output_digests=["e" * 32])
        ledger.conn.set_trace_callback(None)
        plans = [_plan(ledger, sql, ()) for sql in statements
                 if sql.startswith("SELECT DISTINCT r.record_uuid")]
    assert len(plans) == 4
    by_entry, by_path, by_digest, by_output = plans
    assert "records_by_entry" in by_entry and "SCAN" not in by_entry, by_entry
    assert "graph_files_by_state" in by_path and "records_by_sources" in by_path, by_path
    for plan in (by_path, by_digest, by_output):
        assert "SCAN" not in plan, plan
    for plan in (by_digest, by_output):
        assert "file_states_by_digest" in plan and "graph_files_by_state" in plan, plan
    assert "records_by_outputs" in by_output, by_output


def _plan(ledger: Ledger, sql: str, params: tuple[object, ...]) -> str:
    return " | ".join(r[3] for r in ledger.conn.execute(f"EXPLAIN QUERY PLAN {sql}", params))


def test_records_of_a_run_and_of_a_test_are_found_by_index(tmp_path):
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([_record(f"k{i}", test_id=f"t.py::test_{i}") for i in range(5)], RUN)
        by_run = _plan(ledger, f"SELECT r.id{ledger._RECORD_FROM} WHERE runs.run_uuid = ?",
                       ("run-1",))
        by_test = _plan(ledger, f"SELECT r.id{ledger._RECORD_FROM} WHERE r.test_id = ?",
                        ("t.py::test_1",))
        first = _plan(ledger, "SELECT f.id FROM records f WHERE f.run_id = ? AND"
                      " f.event = 'compile' ORDER BY f.started_ns, f.id LIMIT 1", (1,))
    assert "records_by_run" in by_run and "SCAN r" not in by_run
    assert "records_by_test" in by_test and "SCAN r" not in by_test
    assert "records_by_run" in first and "TEMP B-TREE" not in first


def test_first_compile_environment_is_the_earliest_compile_of_each_run(tmp_path):
    other = RunInfo(run_uuid="run-2", label="test")
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([
            _record("late", started_ns=30, env={"CPATH": "/late"}),
            _record("early", started_ns=10, env={"CPATH": "/early"}),
            _record("hit", started_ns=5, event="disk-hit", env={"CPATH": "/hit"}),
        ], RUN)
        ledger.add_records([_record("b", started_ns=7, env={"CPATH": "/b"})], other)
        found = ledger.first_compile_environments(["run-1", "run-2", "run-none"])
    assert found == {"run-1": (10, {"CPATH": "/early"}), "run-2": (7, {"CPATH": "/b"})}


def test_lookups_are_read_for_the_entries_asked_about_without_their_files(tmp_path):
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([
            _record("a", event="memory-hit", entry="/c/a", started_ns=2),
            _record("a", event="disk-hit", entry="/c/a", started_ns=1),
            _record("b", event="disk-hit", entry="/c/b", started_ns=1),
            _record("a", entry="/c/a")], RUN)
        everything = ledger.lookups_by_entry()
        only_a = ledger.lookups_by_entry(["/c/a", "/c/elsewhere"])
    assert set(everything) == {"/c/a", "/c/b"}
    assert list(only_a) == ["/c/a"]
    assert [r.event for r in only_a["/c/a"]] == ["disk-hit", "memory-hit"]
    assert all(r.graph is None and not r.sources for r in only_a["/c/a"])


# ------------------------------------------------------------------ reading


def test_an_empty_file_is_named_as_not_a_ledger_yet(tmp_path):
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(LedgerError, match=r"empty or not a cacheaudit ledger yet.*cacheaudit scan"):
        Ledger.open(str(path), create=False)
    assert path.stat().st_size == 0


def test_open_existing_is_none_where_nothing_was_recorded(tmp_path):
    assert open_existing(str(tmp_path / "absent.db")) is None
    assert not (tmp_path / "absent.db").exists()
    path = str(tmp_path / "ledger.db")
    record = _record()
    spool_record(path, record, RUN)
    Ledger.open(path).close()
    opened = open_existing(path)
    assert opened is not None
    with opened:
        assert [r.record_id for r in opened.records()] == [record.record_id]


def test_recent_records_are_the_newest_of_a_kernel_newest_last(tmp_path):
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([_record("gemm", started_ns=n) for n in (3, 1, 2)]
                           + [_record("other", started_ns=9)], RUN)
        assert [r.started_ns for r in ledger.recent_records(kernel="gemm", limit=2)] == [2, 3]
        assert [r.kernel for r in ledger.recent_records(runtime="deepjit")][-1] == "other"
        assert ledger.recent_records(runtime="triton") == []


def test_attributions_are_written_together_and_seen_by_the_next_read(tmp_path):
    path = str(tmp_path / "ledger.db")
    records = [_record("kernel", runtime=None, key=None) for _ in range(3)]
    with Ledger.open(path) as ledger:
        ledger.add_records(records, RUN)
        other = sqlite3.connect(path)
        attributed = "SELECT count(*) FROM records WHERE entry_id IS NOT NULL"
        assert other.execute(attributed).fetchone()[0] == 0
        ledger.attribute(Attribution(record.record_id, "deepjit", f"gemm{n}", f"k{n}",
                                     f"/c/e{n}") for n, record in enumerate(records))
        assert other.execute(attributed).fetchone()[0] == 3  # one call, one transaction
        loaded = {r.record_id: r for r in ledger.records()}
        other.close()
    assert [(loaded[r.record_id].kernel, loaded[r.record_id].entry) for r in records] == [
        (f"gemm{n}", f"/c/e{n}") for n in range(3)]
    # The kernel is named once; an attributed record keeps its name.
    with Ledger.open(path) as ledger:
        ledger.attribute([Attribution(records[0].record_id, "x", "renamed", "x", "/c/x")])
    with Ledger.open(path) as ledger:
        again = ledger.record(records[0].record_id)
    assert again is not None
    assert (again.runtime, again.kernel, again.key, again.entry) == (
        "deepjit", "gemm0", "k0", "/c/e0")


# ------------------------------------------------------------------ combine


def test_combine_brings_findings_and_cache_roots_along_once(tmp_path):
    finding = Finding("CA101", "/h.h", "stale", recorded="aa", current="bb", how="hash",
                      record_id="r1", entry="/c/e")
    sources = []
    for rank in range(2):
        path = str(tmp_path / f"rank{rank}.db")
        with Ledger.open(path) as ledger:
            ledger.add_records([_record(f"k{rank}")], RunInfo(run_uuid=f"rank{rank}",
                                                               label="test"))
            ledger.add_findings([finding], audit_uuid=f"audit-{rank}")
            ledger.remember_roots([("deepjit", f"/roots/{rank}"), ("deepjit", "/roots/shared")])
            ledger.add_tests(RunInfo(run_uuid=f"rank{rank}", label="test"),
                             [Window(f"t.py::test_{rank}", 1, 2, "passed")])
        sources.append(path)
    target = str(tmp_path / "all.db")
    with Ledger.open(target) as ledger:
        combine(ledger, sources, keep=True)
        combine(ledger, sources, keep=True)  # twice adds nothing
        audits = ledger.conn.execute(
            "SELECT audit_uuid, code, entry FROM findings ORDER BY audit_uuid").fetchall()
        roots = sorted(ledger.known_roots())
        assert ledger.count("records") == 2 and ledger.count("tests") == 2
    assert audits == [("audit-0", "CA101", "/c/e"), ("audit-1", "CA101", "/c/e")]
    assert roots == ["/roots/0", "/roots/1", "/roots/shared"]


# ------------------------------------------------------------------ typed facts


FACTS = dict(reconstructed=True, modified_during_compile=("/inc/late.h",),
             runtime_process="box:7:99", graph_problem="no trace was taken",
             runtime_error="non-standard include")


def _stored_extra(ledger: Ledger, record_uuid: str) -> dict[str, object]:
    body = ledger.conn.execute(
        "SELECT b.body FROM records r JOIN blobs b ON b.id = r.extra_id WHERE r.record_uuid = ?",
        (record_uuid,)).fetchone()[0]
    return json.loads(body)


def test_typed_facts_are_stored_under_their_names_in_the_extra_json(tmp_path):
    # The format ledgers had when the facts were keys of `extra`: no schema change, and a
    # ledger written before reads them into the typed fields.
    record = _record(extra={"pch": {"event": "created"}}, **FACTS)
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([record], RUN)
        stored = _stored_extra(ledger, record.record_id)
        loaded = ledger.record(record.record_id)
    assert stored == {"pch": {"event": "created"}, "reconstructed": True,
                      "modified_during_compile": ["/inc/late.h"], "runtime_process": "box:7:99",
                      "graph_problem": "no trace was taken",
                      "runtime_error": "non-standard include"}
    assert loaded is not None and loaded.extra == {"pch": {"event": "created"}}
    assert {name: getattr(loaded, name) for name in FACTS} == FACTS
    assert loaded.run_uuid == "run-1" and loaded.graph_id is None


def test_a_record_without_facts_stores_no_extra_at_all(tmp_path):
    record = _record()
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([record], RUN)
        assert ledger.conn.execute("SELECT extra_id FROM records").fetchone() == (None,)
        loaded = ledger.record(record.record_id)
    assert loaded is not None and loaded.extra == {} and not loaded.reconstructed
    assert loaded.modified_during_compile == () and loaded.runtime_process is None


def test_a_stored_run_id_or_graph_id_never_overrides_the_ledger_s_own(tmp_path):
    # An older reader put both into `extra`; a record re-stored from one carried them along.
    record = _record(extra={"hits": 2})
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        ledger.add_records([record], RUN)
        ledger.conn.execute(
            "UPDATE blobs SET body = ? WHERE id = (SELECT extra_id FROM records)",
            (json.dumps({"run_uuid": "stale", "graph_id": 99, "hits": 2}),))
        [with_graphs] = ledger.records()
        [without] = ledger.records(with_graphs=False)
        graph_id = ledger.conn.execute("SELECT graph_id FROM records").fetchone()[0]
    assert with_graphs.run_uuid == "run-1" and with_graphs.graph_id is None
    assert with_graphs.extra == {"hits": 2}
    assert without.graph_id == graph_id and without.graph is None


def test_typed_facts_survive_the_spool(tmp_path):
    path = str(tmp_path / "ledger.db")
    record = _record(extra={"hits": 3}, **FACTS)
    spool_record(path, record, RUN)
    with open(os.path.join(spool_dir(path), f"{record.record_id}.json")) as handle:
        assert json.load(handle)["record"]["extra"]["modified_during_compile"] == ["/inc/late.h"]
    with Ledger.open(path) as ledger:
        assert ingest_spool(ledger) == 1
        loaded = ledger.record(record.record_id)
    assert loaded is not None and loaded.extra == {"hits": 3}
    assert {name: getattr(loaded, name) for name in FACTS} == FACTS


def test_combine_keeps_typed_facts_and_stores_no_run_id_with_the_record(tmp_path):
    source = str(tmp_path / "rank0.db")
    record = _record(extra={"hits": 1}, **FACTS)
    with Ledger.open(source) as ledger:
        ledger.add_records([record], RunInfo(run_uuid="rank0", label="test"))
        before = _stored_extra(ledger, record.record_id)
    with Ledger.open(str(tmp_path / "all.db")) as ledger:
        assert combine(ledger, [source]).records == 1
        assert combine(ledger, [source]).records == 0
        assert _stored_extra(ledger, record.record_id) == before
        loaded = ledger.record(record.record_id)
    assert loaded is not None and loaded.run_uuid == "rank0" and loaded.extra == {"hits": 1}
    assert {name: getattr(loaded, name) for name in FACTS} == FACTS
