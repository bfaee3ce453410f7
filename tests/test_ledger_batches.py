"""Records written by the batch (`Ledger.add_records_in_batches`): a real SQLite file, every
record read back whole from a new connection, and a failed batch rolled back alone."""

from __future__ import annotations

import gc
import os
import sqlite3

import pytest

from cacheaudit.ledger import Ledger, RunInfo, new_record_id
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    GraphFile,
    IncludeGraph,
)

RUN = RunInfo(run_uuid="batches", label="test")
NVCC = CompilerIdentity(invoked="nvcc", path="/usr/local/bin/nvcc",
                        resolved="/usr/local/cuda-13.0/bin/nvcc", kind="nvcc",
                        version_text="Cuda compilation tools, release 13.0, V13.0.88\n",
                        digest="c" * 32)
SHARED = IncludeGraph(tuple(
    GraphFile(FileState(f"/opt/cutlass/include/h{i}.h", True, 100 + i, 1, 2, i, f"{i:032x}"),
              f"/opt/cutlass/include/x/../h{i}.h") for i in range(30)), "nvcc -M")
# An undecodable byte in a path (stored as bytes, read back as the same str).
ODD = os.fsdecode(b"/tmp/w/k\xff")


def _record(n: int, **changes: object) -> CompileRecord:
    # Every 50th record (1, 51, ...) has the source of the one before it: same path, content
    # and stat fields.
    m = n - 1 if n % 50 == 1 else n
    values: dict[str, object] = dict(
        record_id=new_record_id(), event="compile" if n % 3 else "disk-hit",
        started_ns=1_700_000_000_000_000_000 + n, runtime="deepjit", kernel=f"gemm_{n % 97}",
        key=f"{n:032x}", entry=f"/cache/gemm_{n % 97}.{n:032x}", compiler=NVCC,
        argv=("kernel.cu", "-cubin", f"-DN={n % 5}"),
        effective_argv=(ArgToken("kernel.cu"), ArgToken(f"-DN={n % 5}", "env:NVCC_APPEND_FLAGS")),
        cwd=f"/tmp/w{n % 7}", env={"NVCC_APPEND_FLAGS": f"-DN={n % 5}"},
        sources=(FileState(f"{ODD}{m}.cu", True, 60 + m % 50, m, m, m, f"{m:031x}s"),),
        graph=SHARED if n % 2 else None,
        outputs=(FileState(f"/tmp/w/{n}.cubin", True, 6000, n, n, n, f"{n:031x}o"),),
        exit_code=0, duration_ns=n, pid=100 + n % 13, host="box", observer="shim:nvcc",
        notes=(f"note {n % 4}",) if n % 4 == 0 else ())
    values.update(changes)
    return CompileRecord(**values)  # type: ignore[arg-type]


def _fields(record: CompileRecord) -> tuple[object, ...]:
    """What a record is, as written and as read back (the ledger adds the run's id on read)."""
    return (record.record_id, record.event, record.started_ns, record.runtime, record.kernel,
            record.key, record.entry, record.compiler, record.argv, record.effective_argv,
            record.cwd, dict(record.env), record.sources, record.graph, record.outputs,
            record.exit_code, record.duration_ns, record.pid, record.host, record.observer,
            record.notes)


def test_ten_thousand_records_written_in_batches_are_all_read_back_whole(tmp_path):
    path = str(tmp_path / "ledger.db")
    written = [_record(n) for n in range(10_000)]
    with Ledger.open(path) as ledger:
        assert ledger.add_records_in_batches(iter(written), RUN, batch_size=1_000) == 10_000
    # A new connection: nothing comes from the writer's memo.
    with Ledger.open(path, create=False) as ledger:
        read = {r.record_id: r for r in ledger.records()}
        assert ledger.integrity_check() == "ok"
        graphs = ledger.count("graphs")
    assert len(read) == 10_000
    for record in written:
        assert _fields(read[record.record_id]) == _fields(record), record.record_id
    # The shared include graph is stored once, however many batches refer to it; so is a
    # source of the same path and content in two records.
    with sqlite3.connect(path) as conn:
        shared = conn.execute("SELECT count(*) FROM graphs WHERE method = 'nvcc -M'").fetchone()
        sources = conn.execute("SELECT count(DISTINCT sources_id) FROM records").fetchone()
    assert shared == (1,)
    assert sources == (10_000 - 200,)
    assert graphs == 1 + sources[0] + 10_000


def test_a_record_already_stored_is_not_stored_twice_nor_counted(tmp_path):
    first = [_record(n) for n in range(300)]
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        assert ledger.add_records_in_batches(first[:200], RUN, batch_size=64) == 200
        assert ledger.add_records_in_batches(first, RUN, batch_size=64) == 100
        assert ledger.count() == 300


def test_a_failed_batch_loses_nothing_already_committed(tmp_path):
    path = str(tmp_path / "ledger.db")
    batch = 100
    records = [_record(n) for n in range(400)]
    # The third batch breaks the CHECK on event: it goes whole, the two before it stay.
    records[250] = _record(250, event="lookup")
    with Ledger.open(path) as ledger, pytest.raises(sqlite3.IntegrityError):
        ledger.add_records_in_batches(records, RUN, batch_size=batch)
    with Ledger.open(path, create=False) as ledger:
        kept = {r.record_id: r for r in ledger.records()}
        assert ledger.integrity_check() == "ok"
    assert set(kept) == {r.record_id for r in records[:200]}
    for record in records[:200]:
        assert _fields(kept[record.record_id]) == _fields(record), record.record_id
    # The ids handed out inside the rolled-back batch are not reused: the same ledger
    # writes the rest afterwards, and every record reads back whole.
    with Ledger.open(path) as ledger:
        assert ledger.add_records_in_batches(records[:250], RUN, batch_size=batch) == 50
        with pytest.raises(sqlite3.IntegrityError):
            ledger.add_records([records[250]], RUN)
        assert ledger.add_records_in_batches(records[251:], RUN, batch_size=batch) == 149
    with Ledger.open(path, create=False) as ledger:
        final = {r.record_id: r for r in ledger.records()}
    assert len(final) == 399
    for record in records[:250] + records[251:]:
        assert _fields(final[record.record_id]) == _fields(record), record.record_id


def test_a_batch_size_below_one_is_refused(tmp_path):
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger, pytest.raises(ValueError):
        ledger.add_records_in_batches([_record(1)], RUN, batch_size=0)


def test_the_cycle_collector_is_paused_only_while_a_batch_is_stored(tmp_path):
    # Paused around each batch's write (its rows and ids all survive, so collections there
    # are wasted), never while the caller's records are read, and restored when a batch fails.
    seen_while_read: list[bool] = []

    def records(count: int, broken: int | None = None):
        for n in range(count):
            seen_while_read.append(gc.isenabled())
            yield _record(n, event="lookup") if n == broken else _record(n)

    assert gc.isenabled()
    with Ledger.open(str(tmp_path / "ledger.db")) as ledger:
        assert ledger.add_records_in_batches(records(120), RUN, batch_size=50) == 120
        assert gc.isenabled(), "add_records_in_batches left the cycle collector paused"
        with pytest.raises(sqlite3.IntegrityError):
            ledger.add_records_in_batches(records(120, broken=60), RUN, batch_size=50)
        assert gc.isenabled(), "a failed batch left the cycle collector paused"
        gc.disable()
        try:
            ledger.add_records_in_batches(records(10), RUN, batch_size=50)
            assert not gc.isenabled(), "a batch turned on a collector its caller had paused"
        finally:
            gc.enable()
    # 120 records, then 100 (the second batch of the second call fails and stops it).
    assert len(seen_while_read) == 230
    assert all(seen_while_read[:220]), "records were read with the cycle collector paused"


def test_a_records_own_sources_and_outputs_are_stored_under_their_graph_digest(tmp_path):
    # The batch writer makes these digests itself (one state or several): they must be the
    # `IncludeGraph.digest` that every other writer and reader addresses the same graph by.
    path = str(tmp_path / "ledger.db")
    two = (FileState("/tmp/w/a.cu", True, 10, 1, 2, 3, "a" * 32),
           FileState("/tmp/w/b.cuh", True, 20, 4, 5, 6, "b" * 32, settled=False))
    records = [_record(2), _record(4, sources=two)]
    with Ledger.open(path) as ledger:
        ledger.add_records_in_batches(records, RUN, batch_size=10)
    conn = sqlite3.connect(path)
    try:
        for record in records:
            for column, method, states in (("sources_id", "sources", record.sources),
                                           ("outputs_id", "outputs", record.outputs)):
                (stored,) = conn.execute(
                    f"SELECT g.digest FROM records r JOIN graphs g ON g.id = r.{column}"
                    " WHERE r.record_uuid = ?", (record.record_id,)).fetchone()
                expected = IncludeGraph(tuple(GraphFile(s, s.path) for s in states), method)
                assert stored == expected.digest, f"{method} of {record.record_id}"
    finally:
        conn.close()


def test_an_effective_argv_shared_by_records_of_a_batch_is_redacted_in_each(tmp_path):
    # The batch redacts a tuple its records share once (by identity): every record that holds
    # it is stored redacted, and a record with other flags keeps its own.
    secret = ArgToken("-DHF_TOKEN=hf_" + "a1B2c3D4e5" * 3, "env:NVCC_APPEND_FLAGS")
    shared = (ArgToken("kernel.cu"), secret)
    clean = (ArgToken("kernel.cu"), ArgToken("-DN=3"))
    records = [_record(n, effective_argv=shared if n % 2 else clean) for n in range(1, 7)]
    path = str(tmp_path / "ledger.db")
    with Ledger.open(path) as ledger:
        assert ledger.add_records_in_batches(records, RUN, batch_size=10) == 6
    with Ledger.open(path, create=False) as ledger:
        stored = {r.record_id: r for r in ledger.records()}
    for n, record in enumerate(records, start=1):
        texts = [t.text for t in stored[record.record_id].effective_argv]
        if n % 2:
            assert texts == ["kernel.cu", "-DHF_TOKEN=<redacted>"], record.record_id
        else:
            assert texts == ["kernel.cu", "-DN=3"], record.record_id
