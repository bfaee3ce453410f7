"""`cacheaudit run -- COMMAND`: a command run inside a recording session, its cache entries' opens
watched meanwhile, then audited as one scope (`cacheaudit.audit.scope`)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass

from cacheaudit import startup
from cacheaudit.audit import RunReport, ScopeObserver, audit_run
from cacheaudit.exceptions import CommandNotRun, ExitCode, LedgerBusy, UsageError
from cacheaudit.ledger import Ledger, open_ledger
from cacheaudit.session import prepare
from cacheaudit.shimrun import SignalForwarder, restore_handlers

_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


@dataclass
class RunOutcome:
    status: int
    report: RunReport | None
    problem: str | None = None
    """Why there is no report: the audit failed after the command ran (the status stands)."""


def run_recorded(command: Sequence[str], *, ledger: str) -> RunOutcome:
    """Run `command` with the shim and the start-up hook active; the status is the shell's
    convention (128 + signal for a command killed by one).

    Once the command has run, its status is the outcome whatever happens to the audit: a
    failing audit leaves `report` None and says why in `problem`, as the pytest plugin does.
    """
    if not command:
        raise UsageError("no command given: cacheaudit run -- COMMAND [ARGS...]")
    _refuse_unusable_ledger(ledger)
    try:
        os.makedirs(os.path.dirname(os.path.abspath(ledger)), exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the ledger's directory for {ledger}: "
                         f"{exc.strerror or exc}") from exc
    # A start-up hook session of this process (`CACHEAUDIT=1 cacheaudit run ...`) is this run:
    # audited here, once.
    startup.leave_audit("cacheaudit run")
    session = prepare(os.environ, ledger=ledger, label="run")
    started_ns = time.time_ns()
    # The opens of every cache entry known now (the job's default roots, the ledger's), watched
    # while the command runs.
    observer = ScopeObserver.start(session.ledger, session.env)
    try:
        # Before the command starts: a signal that arrives while it is being started is held
        # and handed to it, never taken by cacheaudit alone (as the shim does for a compile).
        forwarder = SignalForwarder()
        previous = forwarder.install(_FORWARDED)
        try:
            try:
                child = subprocess.Popen(list(command), env=session.env)
            except OSError as exc:
                status = (ExitCode.NOT_FOUND if isinstance(exc, FileNotFoundError)
                          else ExitCode.NOT_EXECUTABLE)
                raise CommandNotRun(f"cannot run {command[0]}: {exc.strerror}", status) from exc
            forwarder.attach(child)
            returncode = child.wait()
        finally:
            restore_handlers(previous)
        status = returncode if returncode >= 0 else 128 - returncode
        observation = observer.stop()
        try:
            with open_ledger(session.ledger) as opened:
                report = audit_run(opened, session.run_uuid, session.env, started_ns=started_ns,
                                   observation=observation)
        except Exception as exc:  # noqa: BLE001 - the command's status must survive the audit
            return RunOutcome(status=status, report=None,
                              problem=f"{type(exc).__name__}: {exc}")
    finally:
        observer.stop()
        session.close()
    return RunOutcome(status=status, report=report)


def _refuse_unusable_ledger(ledger: str) -> None:
    """A ledger the audit at the end could not use (a directory, a file that is no ledger, a
    damaged one) is refused before the command starts, as bad input: once it has run, its
    status stands and the audit's failure is only a warning. A busy ledger is not refused:
    the audit waits for it again; a read-only one is read, and the records wait in its spool."""
    if not os.path.exists(ledger):
        return  # the first record makes it
    try:
        with Ledger.open(ledger) as opened:
            opened.check_columns()
    except LedgerBusy:
        return
