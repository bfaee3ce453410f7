"""The spool: when a writer cannot reach the ledger (busy past its patience, disk full, a
damaged or read-only file), the record goes to `<ledger>.spool/<record id>.json` instead, and
the next reader or writer folds it in: fail open, lose nothing. `open_ledger` and
`open_existing` are the readers' way in.

A spool file is written whole or not at all: into a temporary `.<record id>.<host>.<pid>.tmp`,
flushed to disk, then renamed; a failed write removes its temporary. Temporaries that a killed
writer left (its pid gone on this host, or older than an hour anywhere) are swept by the next
ingest. The directory is 0700 and the files 0600 (`private`).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import time
from collections.abc import Mapping
from typing import Any

from cacheaudit import bounded
from cacheaudit.exceptions import LedgerError
from cacheaudit.ledger import private
from cacheaudit.ledger.places import pending_spooled, spool_dir
from cacheaudit.ledger.redact import redact_record, redact_run
from cacheaudit.ledger.store import Ledger
from cacheaudit.ledger.values import RunInfo, default_ledger_path
from cacheaudit.ledger.writes import LedgerWrites
from cacheaudit.model import (
    ArgToken,
    CompileRecord,
    CompilerIdentity,
    FileState,
    GraphFile,
    IncludeGraph,
    split_stored_extra,
)


def open_ledger(path: str, *, create: bool = True) -> Ledger:
    """The ledger at `path` with its spool folded in: what every command and report reads, so
    that a record a writer could only spool is never missing from it. Where the spool cannot
    be folded in (the ledger busy or read-only) one line on stderr says how many records wait;
    a later write this command cannot make is told once (`Ledger.tell`)."""
    from cacheaudit.problems import report_problem

    ledger = Ledger.open(path, create=create)
    ledger.tell = lambda line: report_problem(line, prefix="")
    try:
        ledger.check_columns()
        if not ledger.read_only:
            ingest_spool(ledger)
        waiting = pending_spooled(ledger.path)
        if waiting:
            why = ledger.unwritable or f"the ledger {ledger.path} could not take them"
            report_problem(f"{why}: {waiting} spooled record(s) in {spool_dir(ledger.path)} "
                           "are not in it yet (kept for the next command)", prefix="")
        if ledger.unseen:
            report_problem(f"the ledger {ledger.path} is read-only here: {ledger.unseen}",
                           prefix="")
    except BaseException as exc:
        explained = ledger.explained(exc)
        ledger.close()
        if explained is not None:
            raise explained from exc
        raise
    return ledger


def open_existing(path: str | None = None) -> Ledger | None:
    """The ledger at `path` (or the default place) for reading, with its spool folded in; None
    when no file is there yet. Readers never create a ledger."""
    location = os.path.abspath(path or default_ledger_path())
    if not os.path.exists(location):
        return None
    return open_ledger(location, create=False)


def record_to_json(record: CompileRecord, run: RunInfo) -> dict[str, Any]:
    """A record and its run as plain JSON, the spool's format."""
    return {
        "format": 1,
        "run": {"run_uuid": run.run_uuid, "label": run.label, "started_ns": run.started_ns,
                "host": run.host, "pid": run.pid,
                "command": list(run.command) if run.command is not None else None},
        "record": {
            "record_id": record.record_id, "event": record.event,
            "started_ns": record.started_ns, "runtime": record.runtime,
            "kernel": record.kernel, "key": record.key, "entry": record.entry,
            "compiler": record.compiler.to_dict() if record.compiler else None,
            "argv": list(record.argv),
            "effective_argv": [t.to_list() for t in record.effective_argv],
            "cwd": record.cwd, "env": dict(record.env),
            "sources": [s.to_dict() for s in record.sources],
            "graph": None if record.graph is None else {
                "method": record.graph.method,
                "files": [[f.written, f.state.to_dict()] for f in record.graph.files]},
            "outputs": [s.to_dict() for s in record.outputs],
            "tracked": list(record.tracked) if record.tracked is not None else None,
            "exit_code": record.exit_code, "signal": record.signal,
            "duration_ns": record.duration_ns, "pid": record.pid, "host": record.host,
            "test_id": record.test_id, "observer": record.observer,
            "notes": list(record.notes), "extra": record.stored_extra(),
        },
    }


def record_from_json(data: Mapping[str, Any]) -> tuple[CompileRecord, RunInfo]:
    run_data = data["run"]
    run = RunInfo(run_uuid=run_data["run_uuid"], label=run_data["label"],
                  started_ns=run_data["started_ns"], host=run_data["host"], pid=run_data["pid"],
                  command=tuple(run_data["command"]) if run_data.get("command") else None)
    r = dict(data["record"])
    graph = r.get("graph")
    facts, extra = split_stored_extra(r.get("extra"))
    record = CompileRecord(
        record_id=r["record_id"], event=r["event"], started_ns=r["started_ns"],
        runtime=r.get("runtime"), kernel=r.get("kernel"), key=r.get("key"),
        entry=r.get("entry"), compiler=CompilerIdentity.from_dict(r.get("compiler")),
        argv=tuple(r.get("argv") or ()),
        effective_argv=tuple(ArgToken(t, o) for t, o in r.get("effective_argv") or ()),
        cwd=r.get("cwd") or "", env=dict(r.get("env") or {}),
        sources=tuple(FileState.from_dict(s) for s in r.get("sources") or ()),
        graph=None if graph is None else IncludeGraph(
            tuple(GraphFile(FileState.from_dict(s), w) for w, s in graph["files"]),
            graph["method"]),
        outputs=tuple(FileState.from_dict(s) for s in r.get("outputs") or ()),
        tracked=tuple(r["tracked"]) if r.get("tracked") is not None else None,
        exit_code=r.get("exit_code"), signal=r.get("signal"),
        duration_ns=r.get("duration_ns") or 0, pid=r.get("pid") or 0, host=r.get("host") or "",
        test_id=r.get("test_id"), observer=r.get("observer") or "",
        notes=tuple(r.get("notes") or ()), extra=extra, **facts)
    return record, run


def spool_record(ledger_path: str, record: CompileRecord, run: RunInfo) -> str:
    """Write a record beside the ledger for a later reader to fold in; returns the file.

    Atomic: a reader sees the whole file or none. A failed write (a full disk) leaves no
    temporary behind and raises the OSError, its `filename` the file that could not be
    written."""
    directory = spool_dir(ledger_path)
    private.make_directories(directory)
    final = os.path.join(directory, f"{record.record_id}.json")
    temporary = os.path.join(
        directory, f".{record.record_id}.{socket.gethostname()}.{os.getpid()}{_TEMPORARY}")
    body = json.dumps(record_to_json(redact_record(record), redact_run(run)),
                      ensure_ascii=False).encode(
        "utf-8", "surrogateescape")
    try:
        try:
            private.write_file(final, body, sync=True, temporary=temporary)
        except FileNotFoundError:
            # A reader removed the emptied directory between our mkdir and our write.
            private.make_directories(directory)
            private.write_file(final, body, sync=True, temporary=temporary)
    except OSError as exc:
        if exc.filename is None:
            exc.filename = final
        raise
    return final


_TEMPORARY = ".tmp"
STALE_TEMPORARY_S = 3600.0
"""A spool temporary older than this is a dead writer's, whatever host wrote it (a write takes
milliseconds); one whose pid is gone on this host is swept after `_DEAD_WRITER_S`."""
_DEAD_WRITER_S = 10.0


def _writer_gone(name: str, age_s: float) -> bool:
    """Whether the temporary `name` (`.<record>.<host>.<pid>.tmp`, or `<record>.json.<pid>.tmp`
    as versions before 0.2 named it) belongs to a writer that can no longer finish it."""
    if age_s >= STALE_TEMPORARY_S:
        return True
    if age_s < _DEAD_WRITER_S:
        return False
    parts = name[:-len(_TEMPORARY)].lstrip(".").split(".")
    host = ".".join(parts[1:-1]) if name.startswith(".") else socket.gethostname()
    if host != socket.gethostname() or not parts[-1].isdigit():
        return False
    try:
        os.kill(int(parts[-1]), 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive (another user's) or unknowable: wait for the age rule
    return False


def sweep_temporaries(ledger_path: str) -> int:
    """Remove the spool temporaries of writers that died writing them; returns how many."""
    directory = spool_dir(ledger_path)
    try:
        names = [n for n in os.listdir(directory) if n.endswith(_TEMPORARY)]
    except OSError:
        return 0
    removed = 0
    now = time.time()
    for name in names:
        path = os.path.join(directory, name)
        try:
            if _writer_gone(name, now - os.lstat(path).st_mtime):
                os.remove(path)
                removed += 1
        except OSError:
            continue
    return removed


def read_spooled(path: str) -> Any:
    """A spool file parsed within `bounded`'s limits: never waiting on a FIFO, never deeper or
    larger than a record can be. Undecodable path bytes come back as the writer kept them
    (surrogateescape). Raises OSError, or `bounded.Refused` (a ValueError: set aside as .bad)."""
    return bounded.load_file(path, max_bytes=bounded.RECORD_BYTES,
                             decode=lambda data: data.decode("utf-8", "surrogateescape"))


# What a spooled record that can never be stored raises: a value the schema refuses (an unknown
# event, a missing start time), a field of the wrong type (sqlite3 cannot bind a list), or a file
# `read_spooled` refuses (`bounded.Refused` is a ValueError).
_UNSTORABLE = (sqlite3.IntegrityError, sqlite3.InterfaceError, sqlite3.DataError,
               sqlite3.ProgrammingError, OverflowError, ValueError, KeyError, TypeError,
               AttributeError)


def ingest_spool(ledger: LedgerWrites, limit: int | None = None) -> int:
    """Fold spooled records into the ledger and delete their files; returns how many. At most
    `limit` files are tried (a writer folds in a few on its way, a reader all of them); stale
    temporaries are swept first.

    A file that cannot be read or stored is renamed to `.bad` beside the others, for a human to
    look at, never deleted. While the ledger cannot be written at all (busy past its patience,
    read-only, disk full) the files stay for the next reader. A record already in the ledger
    (its file left by a reader killed between storing and deleting) is not stored twice.
    """
    directory = spool_dir(ledger.path)
    try:
        names = sorted(n for n in os.listdir(directory) if n.endswith(".json"))
    except OSError:
        return 0
    sweep_temporaries(ledger.path)
    added = 0
    for name in names[:limit]:
        path = os.path.join(directory, name)
        try:
            record, run = record_from_json(read_spooled(path))
            added += ledger.add_records([record], run)
        except OSError:
            continue  # gone (another reader took it) or unreadable now: try again next time
        except (sqlite3.OperationalError, LedgerError):
            return added  # busy, read-only, disk full: the files wait for the next reader
        except _UNSTORABLE:
            with contextlib.suppress(OSError):
                os.replace(path, path + ".bad")
            continue
        with contextlib.suppress(OSError):
            os.remove(path)
    with contextlib.suppress(OSError):
        os.rmdir(directory)
    return added
