"""The ledger's queries, each named for what its callers ask: recent records, the candidates
for a scanned entry's identity, hits by entry, runs, tests, cache roots, seen states, findings.
Indexed and in chunks where a scan asks about thousands of entries."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from cacheaudit import bounded
from cacheaudit.ledger.reads import LedgerReads, _state_from_row
from cacheaudit.ledger.rows import (
    STATE_COLUMNS,
    _chunks,
    _params,
    _rows,
    _select_list,
    _value,
)
from cacheaudit.ledger.values import RunInfo, TestWindow
from cacheaudit.model import CompileRecord, FileState, Finding


class LedgerQueries(LedgerReads):
    """What a `Ledger` answers, built on reading records back (`LedgerReads`)."""

    @staticmethod
    def _kernel_filter(kernel: str | None, runtime: str | None) -> tuple[str, list[Any]]:
        conditions, params = [], []
        if kernel:
            conditions.append("r.kernel = ?")
            params.append(kernel)
        if runtime:
            conditions.append("r.runtime = ?")
            params.append(runtime)
        return " AND ".join(conditions), params

    def count_records(self, *, kernel: str | None = None, runtime: str | None = None) -> int:
        """How many records `recent_records` chooses from (its filter, no limit)."""
        where, params = self._kernel_filter(kernel, runtime)
        sql = "SELECT count(*) AS count FROM records r" + (f" WHERE {where}" if where else "")
        return int(_value(self.conn, sql, _params(params)))

    def recent_records(self, *, kernel: str | None = None, runtime: str | None = None,
                       limit: int = 50, with_files: bool = True) -> list[CompileRecord]:
        """The newest `limit` records, of one kernel or runtime when given, newest last."""
        where, params = self._kernel_filter(kernel, runtime)
        found = self.records(where=where, params=params,
                             order="r.started_ns DESC, r.id DESC", limit=max(limit, 0),
                             with_files=with_files)
        found.reverse()
        return found

    def tests(self, run_uuid: str | None = None) -> list[TestWindow]:
        columns = _select_list("t.nodeid", "t.started_ns", "t.finished_ns", "t.outcome",
                               "t.worker", "runs.run_uuid")
        sql = f"SELECT {columns} FROM tests t JOIN runs ON runs.id = t.run_id"
        params: tuple[Any, ...] = ()
        if run_uuid is not None:
            sql += " WHERE runs.run_uuid = ?"
            params = (run_uuid,)
        return [TestWindow(r["nodeid"], r["started_ns"], r["finished_ns"], r["outcome"],
                           r["worker"], r["run_uuid"])
                for r in _rows(self.conn, sql + " ORDER BY t.started_ns", params)]

    def runs(self) -> dict[str, RunInfo]:
        rows = _rows(self.conn, "SELECT run_uuid, label, started_ns, host, pid, command FROM runs")
        return {r["run_uuid"]: RunInfo(run_uuid=r["run_uuid"], label=r["label"],
                                       started_ns=r["started_ns"], host=r["host"], pid=r["pid"],
                                       command=tuple(bounded.loads_or(r["command"], []))
                                       if r["command"] else None)
                for r in rows}

    def seen_states(self) -> list[FileState]:
        rows = _rows(self.conn,
                     f"SELECT {STATE_COLUMNS} FROM seen_states v"
                     " JOIN file_states s ON s.id = v.state_id JOIN files f ON f.id = v.file_id")
        return [_state_from_row(r) for r in rows]

    def identity_candidates(self, *, entries: Iterable[str] = (), sources: Iterable[str] = (),
                            source_digests: Iterable[str] = (),
                            output_digests: Iterable[str] = ()) -> list[CompileRecord]:
        """The compile records that may have built the scanned entries, each with the paths and
        digests of its sources and outputs (`_identity_records`;
        the audit chooses among them, `audit/identity.py`): those already attributed
        to an entry path of `entries`, those whose primary sources hold a path of `sources` or
        a content digest of `source_digests`, and those whose outputs hold a digest of
        `output_digests` (asked only for entries without a source file).

        Indexed queries in chunks: the cost follows the entries scanned, not the ledger."""
        found: set[str] = set()
        # CROSS JOIN fixes the join order (SQLite's rule): from the few values asked about,
        # through the indexes, to the records; never a scan of the records.
        by_state = " CROSS JOIN graph_files g ON g.state_id = s.id CROSS JOIN records r ON r.{}"
        queries = (
            (entries, "files e CROSS JOIN records r ON r.entry_id = e.id WHERE e.path"),
            (sources, "files f CROSS JOIN file_states s ON s.file_id = f.id"
                      + by_state.format("sources_id = g.graph_id") + " WHERE f.path"),
            (source_digests, "file_states s" + by_state.format("sources_id = g.graph_id")
                             + " WHERE s.digest"),
            (output_digests, "file_states s" + by_state.format("outputs_id = g.graph_id")
                             + " WHERE s.digest"),
        )
        for values, condition in queries:
            for part in _chunks({v for v in values if v}):
                sql = (f"SELECT DISTINCT r.record_uuid AS record_uuid FROM {condition}"
                       f" IN ({', '.join('?' * len(part))}) AND r.event = 'compile'")
                found.update(row["record_uuid"] for row in _rows(self.conn, sql, _params(part)))
        return self._identity_records(sorted(found))

    def _identity_records(self, uuids: Sequence[str]) -> list[CompileRecord]:
        """The records of `uuids` as `records(with_files=False)` reads them (the shared include
        graph loaded once), with the paths and digests of their sources and outputs (states with
        nothing else known): what identity needs, read by the thousand."""
        found: list[CompileRecord] = []
        for part in _chunks(uuids):
            rows = _rows(self.conn, f"SELECT {self._RECORD_COLUMNS}{self._RECORD_FROM}"
                                    f" WHERE r.record_uuid IN ({', '.join('?' * len(part))})",
                         _params(part))
            members = self._graph_members({row[c] for row in rows
                                           for c in ("sources_id", "outputs_id")})
            self._load_graphs(row["graph_id"] for row in rows)  # shared: few, each once
            found += [self._record_from_row(row, True, with_files=False, files=(
                members.get(row["sources_id"], ()), members.get(row["outputs_id"], ())))
                for row in rows]
        return found

    def _graph_members(self, graph_ids: Iterable[int | None]) -> dict[int, tuple[FileState, ...]]:
        """Graph id -> its files as (path, digest) states, for small graphs read by the
        thousand (sources and outputs): no stat fields, no `IncludeGraph`."""
        members: dict[int, list[FileState]] = {}
        for part in _chunks({g for g in graph_ids if g is not None}):
            for row in _rows(
                    self.conn,
                    "SELECT g.graph_id AS graph_id, f.path AS path, s.present AS present,"
                    " s.digest AS digest FROM graph_files g JOIN file_states s ON s.id ="
                    " g.state_id JOIN files f ON f.id = s.file_id"
                    f" WHERE g.graph_id IN ({', '.join('?' * len(part))})"
                    " ORDER BY g.graph_id, g.position", part):
                members.setdefault(row["graph_id"], []).append(FileState(
                    row["path"], bool(row["present"]), digest=row["digest"] or None))
        return {graph_id: tuple(states) for graph_id, states in members.items()}

    def first_compile_environments(self, run_uuids: Iterable[str]
                                   ) -> dict[str, tuple[int, dict[str, str]]]:
        """(start, environment) of the first compile of each run: what a runtime that reads its
        configuration once, at its first use, went by for the rest of the run."""
        found: dict[str, tuple[int, dict[str, str]]] = {}
        for part in _chunks(run_uuids):
            marks = ", ".join("?" * len(part))
            # One row per run, found by walking records_by_run from the run's earliest record.
            rows = _rows(
                self.conn,
                f"SELECT {_select_list('runs.run_uuid', 'r.started_ns', 'r.env_id')} FROM runs"
                " JOIN records r ON r.id = (SELECT f.id FROM records f WHERE f.run_id = runs.id"
                " AND f.event = 'compile' ORDER BY f.started_ns, f.id LIMIT 1)"
                f" WHERE runs.run_uuid IN ({marks})", _params(part))
            for r in rows:
                found[r["run_uuid"]] = (r["started_ns"], dict(self._load_blob(r["env_id"]) or {}))
        return found

    def lookups_by_entry(self, paths: Iterable[str] | None = None, *,
                         with_graphs: bool = False) -> dict[str, list[CompileRecord]]:
        """Hit records (disk-hit, memory-hit) per entry path, oldest first; only those of
        `paths` when given. A hit is judged by its time and process, so its files are left out
        unless `with_graphs`."""
        condition = "r.event != 'compile' AND r.entry_id IS NOT NULL"
        chunks: Iterable[list[str]] = [[]] if paths is None else _chunks(paths)
        by_entry: dict[str, list[CompileRecord]] = {}
        for part in chunks:
            where = condition if paths is None else (
                f"{condition} AND e.path IN ({', '.join('?' * len(part))})")
            for record in self.records(where=where, params=part, order="r.started_ns, r.id",
                                       with_graphs=with_graphs):
                if record.entry:
                    by_entry.setdefault(record.entry, []).append(record)
        return by_entry

    def findings(self, audit_uuid: str | None = None) -> list[Finding]:
        """The findings of one audit pass, by default the latest."""
        if audit_uuid is None:
            audit_uuid = _value(
                self.conn,
                "SELECT audit_uuid FROM findings ORDER BY found_ns DESC, id DESC LIMIT 1")
            if audit_uuid is None:
                return []
        rows = _rows(
            self.conn,
            "SELECT code, subject, message, recorded, current, how, record_uuid, entry, runtime,"
            " kernel, inferred, hint FROM findings WHERE audit_uuid = ? ORDER BY id",
            (audit_uuid,))
        return [Finding(code=r["code"], subject=r["subject"], message=r["message"],
                        recorded=r["recorded"], current=r["current"], how=r["how"],
                        record_id=r["record_uuid"], entry=r["entry"], runtime=r["runtime"],
                        kernel=r["kernel"], inferred=bool(r["inferred"]), hint=r["hint"])
                for r in rows]
