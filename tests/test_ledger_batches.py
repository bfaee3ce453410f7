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
