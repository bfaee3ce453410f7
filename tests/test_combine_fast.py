"""The set-wise `combine` (ledger/combine_sql.py) against the per-record one it replaces: real
ledger files, real records written through the real `Ledger`, compared through the read API."""

from __future__ import annotations

import dataclasses
import importlib
import os
import shutil
import sqlite3

import pytest
from test_ledger import FACTS, _downgrade_to_version_1, _graph, _record, _state

from cacheaudit.ledger import Ledger, RunInfo, combine, combine_sql
from cacheaudit.ledger import TestWindow as Window
from cacheaudit.ledger.combine_sql import SOURCE
from cacheaudit.ledger.values import Attribution
from cacheaudit.model import CompilerIdentity, Finding

# `cacheaudit.ledger.combine` is the function; the module is reached by name.
combine_module = importlib.import_module("cacheaudit.ledger.combine")

_FINDING_COLUMNS = ("audit_uuid", "code", "severity", "subject", "message", "recorded",
                    "current", "how", "inferred", "record_uuid", "entry", "runtime", "kernel",
                    "hint")


def _deep_compiler() -> CompilerIdentity:
    """A wrapper around nvcc around g++: a chain of host compilers two deep."""
    [record] = [_record()]
    nvcc = record.compiler
    assert nvcc is not None
    return CompilerIdentity(invoked="ccache", path="/usr/bin/ccache",
                            resolved="/usr/bin/ccache", kind="unknown",
                            version_text="ccache version 4.8\n", digest="f" * 32, host=nvcc)


def _rank_ledger(path: str, rank: int) -> list[str]:
    """A worker's ledger: records in two runs (one shared by every rank), graphs shared with the
    other ranks and one of its own, typed facts, findings (one twice), cache roots, test
    windows, seen states and an attributed entry. Returns its record ids."""
    shared_graph = _graph(30)
    own_graph = _graph(5 + rank, prefix=f"/opt/rank{rank}/include")
    records = [
        _record(f"k{rank}_a", graph=shared_graph, started_ns=1_000 + rank),
        _record(f"k{rank}_b", graph=own_graph, started_ns=2_000 + rank, extra={"hits": rank},
                tracked=("/inc/a.h",), notes=("no depfile",), **FACTS),
        _record(f"k{rank}_c", graph=shared_graph, started_ns=1_500, compiler=_deep_compiler(),
                env={"NVCC_APPEND_FLAGS": f"-DRANK={rank}"}),
        # One record whose every file is the same as another rank's: states shared.
        _record("common", graph=shared_graph, started_ns=900, record_id=f"common-{rank}"),
    ]
    own_run = RunInfo(run_uuid=f"rank{rank}", label="pytest", host=f"node{rank}",
                      command=("python", "-m", "pytest", f"-k rank{rank}"))
    shared_run = RunInfo(run_uuid="job", label="run", host="head", started_ns=5)
    finding = Finding("CA101", "/h.h", "stale", recorded="aa", current="bb", how="hash",
                      record_id=records[0].record_id, entry="/c/e")
    with Ledger.open(path) as ledger:
        ledger.add_records(records[:2], own_run)
        ledger.add_records(records[2:], shared_run)
        ledger.add_findings([finding, finding], audit_uuid=f"audit-{rank}")
        # The same finding of every rank, about no record: kept once.
        ledger.add_findings([dataclasses.replace(finding, record_id=None)],
                            audit_uuid="audit-shared")
        ledger.remember_roots([("deepjit", f"/roots/{rank}"), ("deepjit", "/roots/shared")])
        ledger.add_tests(own_run, [Window(f"t.py::test_{rank}", 10, 20, "passed"),
                                   Window("t.py::test_common", 30, 40, "failed")])
        ledger.remember_states([_state(f"/cache/{rank}/kernel.cubin", digest="9" * 32),
                                _state("/cache/shared/kernel.cubin", digest=str(rank) * 32)])
        ledger.attribute([Attribution(records[0].record_id, "deepjit", f"k{rank}_a",
                                      f"key{rank}", f"/cache/{rank}")])
    return [r.record_id for r in records]


def _logical(ledger: Ledger) -> dict[str, object]:
    """Everything the read API shows of a ledger, with no row id of its own in it."""
    records = {r.record_id: dataclasses.replace(r, graph_id=None)
               for r in ledger.records(order="r.record_uuid")}
    versions = dict(ledger.conn.execute("SELECT run_uuid, cacheaudit_version FROM runs"))
    return {
        "records": records,
        "runs": ledger.runs(),
        "run versions": versions,
        "tests": sorted(ledger.tests(), key=lambda t: (t.run_uuid, t.nodeid, t.started_ns)),
        "findings": ledger.conn.execute(
            f"SELECT {', '.join(_FINDING_COLUMNS)} FROM findings"
            f" ORDER BY {', '.join(_FINDING_COLUMNS)}").fetchall(),
        "roots": ledger.conn.execute(
            "SELECT path, layout, last_scan_ns FROM cache_roots ORDER BY path").fetchall(),
        "seen": sorted(ledger.seen_states(), key=lambda s: s.path),
        "graphs": ledger.conn.execute(
            "SELECT digest, method, file_count FROM graphs ORDER BY digest").fetchall(),
        "compilers": ledger.conn.execute("SELECT c.digest, h.digest FROM compilers c LEFT JOIN"
                                         " compilers h ON h.id = c.host_id ORDER BY c.digest"
                                         ).fetchall(),
        "blobs": ledger.conn.execute("SELECT digest, body FROM blobs ORDER BY digest").fetchall(),
    }


def _counts(path: str) -> dict[str, int]:
    conn = sqlite3.connect(path)
    try:
        tables = [r[0] for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite%'")]
        return {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    finally:
        conn.close()


def _sources(tmp_path, ranks: int) -> list[str]:
    paths = []
    for rank in range(ranks):
        path = str(tmp_path / f"rank{rank}.db")
        _rank_ledger(path, rank)
        paths.append(path)
    return paths


def _target_with_one_record(path: str) -> None:
    """A target that already holds a record, a finding and a root the sources also hold."""
    with Ledger.open(path) as ledger:
        ledger.add_records([_record("common", graph=_graph(30), started_ns=900,
                                    record_id="common-0")],
                           RunInfo(run_uuid="job", label="run", host="head", started_ns=5))
        ledger.remember_roots([("deepjit", "/roots/shared")])


def _spy_on_set_wise_copies(monkeypatch) -> list[str]:
    copied: list[str] = []
    real = combine_module.copy_ledger

    def counted(conn: sqlite3.Connection, path: str) -> int:
        copied.append(os.path.basename(path))
        return real(conn, path)

    monkeypatch.setattr(combine_module, "copy_ledger", counted)
    return copied


def _record_indexes(ledger: Ledger) -> set[str]:
    return {r[0] for r in ledger.conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'records'"
        " AND sql IS NOT NULL")}


@pytest.mark.parametrize("rebuild_from", [2, 100], ids=["indexes-built-once", "indexes-kept"])
def test_set_wise_combine_of_three_ledgers_stores_what_the_per_record_one_does(
        tmp_path, monkeypatch, rebuild_from):
    monkeypatch.setattr(combine_sql, "REBUILD_FROM_SOURCES", rebuild_from)
    sources = _sources(tmp_path, 3)
    old, new = str(tmp_path / "old.db"), str(tmp_path / "new.db")
    _target_with_one_record(old)
    shutil.copyfile(old, new)  # the same target twice, its root's scan time included
    with Ledger.open(old) as ledger:
        indexes_before = _record_indexes(ledger)
        by_record = combine(ledger, sources, keep=True, set_wise=False)
        expected = _logical(ledger)
    if rebuild_from == 2:  # the sources outweigh the target: the indexes are built once
        assert combine_sql._size(sources) > combine_sql._size([new])
    with Ledger.open(new) as ledger:
        set_wise = combine(ledger, sources, keep=True)
        got = _logical(ledger)
        attached = [r[1] for r in ledger.conn.execute("PRAGMA database_list")]
    assert set_wise.records == by_record.records == 11  # common-0 was in both targets
    assert set_wise.combined == by_record.combined == sources
    for part, value in expected.items():
        assert got[part] == value, f"{part} differ between set-wise and per-record combine"
    assert SOURCE not in attached
    # The records came from the sources: a typed fact, a deep compiler, an attribution.
    records = got["records"]
    assert isinstance(records, dict)
    assert records["common-1"].compiler is not None
    b1 = next(r for r in records.values() if r.kernel == "k1_b")
    assert b1.extra == {"hits": 1} and b1.graph_problem == FACTS["graph_problem"]
    assert b1.tracked == ("/inc/a.h",) and b1.notes == ("no depfile",)
    c2 = next(r for r in records.values() if r.kernel == "k2_c")
    assert c2.compiler is not None and c2.compiler.host is not None
    assert c2.compiler.host.host is not None and c2.compiler.host.host.kind == "gcc"
    a0 = next(r for r in records.values() if r.kernel == "k0_a")
    assert a0.entry == "/cache/0" and a0.key == "key0"
    assert len(expected["findings"]) == 4  # audit-0, -1, -2 and audit-shared once
    with Ledger.open(new) as ledger:
        assert ledger.integrity_check() == "ok"
        assert _record_indexes(ledger) == indexes_before, "a records index is missing"
    # Paths and states as the per-record path interns them: those the records, new graphs and
    # seen states name, none besides.
    assert _interned(new) == _interned(old)


def _interned(path: str) -> tuple[set[str], set[tuple[object, ...]]]:
    conn = sqlite3.connect(path)
    try:
        paths = {p for (p,) in conn.execute("SELECT path FROM files")}
        states = set(conn.execute(
            "SELECT f.path, s.present, s.size, s.mtime_ns, s.digest, s.settled FROM file_states"
            " s JOIN files f ON f.id = s.file_id"))
        return paths, states
    finally:
        conn.close()


def test_a_combine_killed_with_the_indexes_dropped_is_mended_by_the_next(tmp_path):
    [source] = _sources(tmp_path, 1)
    target = str(tmp_path / "all.db")
    with Ledger.open(target) as ledger:
        expected = _record_indexes(ledger)
        for name in expected:  # as `record_indexes_built_once` leaves them, killed inside it
            ledger.conn.execute(f"DROP INDEX {name}")
        assert _record_indexes(ledger) == set()
        combine(ledger, [source], keep=True)
        assert _record_indexes(ledger) == expected and ledger.integrity_check() == "ok"


def test_a_session_without_workers_mends_the_indexes_as_a_combine_of_none_does(tmp_path):
    """`pytest --cacheaudit` without worker ledgers mends instead of combining nothing."""
    target = str(tmp_path / "all.db")
    with Ledger.open(target) as ledger:
        expected = _record_indexes(ledger)
        for name in expected:
            ledger.conn.execute(f"DROP INDEX {name}")
        ledger.mend_record_indexes()
        assert _record_indexes(ledger) == expected, f"{target}: the record indexes not mended"
        ledger.mend_record_indexes()  # made already: nothing to do, nothing raised
        assert _record_indexes(ledger) == expected and ledger.integrity_check() == "ok"


def test_set_wise_combine_twice_adds_nothing(tmp_path):
    sources = _sources(tmp_path, 2)
    target = str(tmp_path / "all.db")
    with Ledger.open(target) as ledger:
        first = combine(ledger, sources, keep=True)
        once = _logical(ledger)
    counts = _counts(target)
    with Ledger.open(target) as ledger:
        again = combine(ledger, sources, keep=True)
        twice = _logical(ledger)
    assert first.records == 8 and again.records == 0
    assert twice == once
    assert _counts(target) == counts, "a second combine of the same sources added rows"


def test_a_source_of_an_older_schema_goes_record_by_record(tmp_path, monkeypatch):
    current, older = _sources(tmp_path, 2)
    _downgrade_to_version_1(older)
    copied = _spy_on_set_wise_copies(monkeypatch)
    target = str(tmp_path / "all.db")
    with Ledger.open(target) as ledger:
        result = combine(ledger, [current, older], keep=True)
        got = _logical(ledger)
    assert copied == ["rank0.db"], f"set-wise copies: {copied}"
    assert result.records == 8 and result.combined == [current, older]
    assert {r.kernel for r in got["records"].values()} >= {"k1_a", "k1_b", "k1_c"}  # type: ignore[union-attr]
    # The same as a combine of the two (the older now upgraded) record by record.
    reference = str(tmp_path / "reference.db")
    with Ledger.open(reference) as ledger:
        combine(ledger, [current, older], keep=True, set_wise=False)
        assert _logical(ledger) == got


def test_unreadable_sources_are_named_and_kept_the_others_removed_with_companions(tmp_path):
    [source] = _sources(tmp_path, 1)
    for suffix in ("-wal", "-shm"):
        with open(source + suffix, "a"):
            pass
    broken = tmp_path / "broken.db"
    broken.write_text("not a ledger")
    with Ledger.open(str(tmp_path / "all.db")) as ledger:
        result = combine(ledger, [str(broken), source], keep=False)
        assert ledger.count("records") == 4
    assert result.combined == [source]
    assert len(result.skipped) == 1 and result.skipped[0].startswith(str(broken))
    assert broken.exists()
    assert not any(os.path.exists(source + s) for s in ("", "-wal", "-shm"))


def test_spooled_records_of_a_source_come_along_set_wise(tmp_path, monkeypatch):
    from cacheaudit.ledger import spool_record

    [source] = _sources(tmp_path, 1)
    spooled = _record("spooled", started_ns=7)
    with Ledger.open(source) as ledger:
        spool_record(ledger.path, spooled, RunInfo(run_uuid="late", label="shim"))
    copied = _spy_on_set_wise_copies(monkeypatch)
    with Ledger.open(str(tmp_path / "all.db")) as ledger:
        result = combine(ledger, [source], keep=True)
        got = ledger.record(spooled.record_id)
    assert copied == ["rank0.db"]
    assert result.records == 5 and got is not None and got.run_uuid == "late"


def test_a_source_recorded_without_redaction_goes_record_by_record_and_is_redacted(
        tmp_path, monkeypatch):
    token = "hf_" + "aB3dE5gH7jK9mN1pQ3sT5vW7yZ"
    secret = _record("leaky", argv=("kernel.cu", f"-DHF_TOKEN={token}"))
    source = str(tmp_path / "verbatim.db")
    monkeypatch.setenv("CACHEAUDIT_REDACT_ARGV", "0")
    with Ledger.open(source) as ledger:
        ledger.add_records([secret], RUN_VERBATIM)
        stored = ledger.record(secret.record_id)
    assert stored is not None and stored.argv[1] == f"-DHF_TOKEN={token}"
    monkeypatch.delenv("CACHEAUDIT_REDACT_ARGV")
    copied = _spy_on_set_wise_copies(monkeypatch)
    with Ledger.open(str(tmp_path / "all.db")) as ledger:
        result = combine(ledger, [source], keep=True)
        combined = ledger.record(secret.record_id)
        bodies = [b for (b,) in ledger.conn.execute("SELECT body FROM blobs")]
    assert copied == [] and result.records == 1
    assert combined is not None and token not in combined.argv[1], combined.argv
    assert not any(token in body for body in bodies), "the token reached the combined ledger"


RUN_VERBATIM = RunInfo(run_uuid="verbatim", label="test")
