"""The start-up hook: cacheaudit in any Python process whose environment asks for it.

Installed with the package as `cacheaudit-startup.pth` (and the PEP 829 form
`cacheaudit-startup.start`, which Python 3.15+ prefers). The `.pth` line reads two environment
variables and does nothing else unless `CACHEAUDIT=1` (set by `cacheaudit run` and the pytest
plugin, inherited by child processes) or `CACHEAUDIT_CONFIG` is set; `CACHEAUDIT_DISABLE=1` opts a
process out. When on, it arms the in-process adapters (each installs when its runtime is first
imported) and, where no session prepared the environment yet, prepares one so that compilers run
by this process and its children go through the shim. Running it twice does nothing the second
time; any error is reported in one line and the process goes on.

A session the hook prepared is audited when this process exits, as `cacheaudit run` audits its
command: the opens of the cache entries known at the start are watched meanwhile
(`cacheaudit.watch`), and at exit `cacheaudit.audit.audit_scope` judges the run; the summary line
and each error-level finding, one line each, go to stderr. The exit status stays the program's,
and a run that recorded nothing and opened no entry is not audited at all (the audit imports
the judge and scans the roots; most sessions of the hook compile nothing). A process that runs
an integration auditing the same run itself (`cacheaudit run`'s controller, the pytest plugin)
leaves the audit to it.
"""

from __future__ import annotations

import atexit
import os
import sys
import time

# Not `typing.TYPE_CHECKING`: importing `typing` would cost every Python process of a session
# ~10 ms, most of them compiling nothing. Checkers read the name alone.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

    from cacheaudit.audit import RunReport
    from cacheaudit.session import Session
    from cacheaudit.watch import Observation, ScopeObserver

_started = False
_audit: _ExitAudit | None = None


def process_startup() -> bool:
    """Activate cacheaudit in this process if the environment asks; True if it did."""
    global _started
    if _started:
        return False
    # Only the switches here: this runs in every Python process of a session, most of which
    # compile nothing; the rest of cacheaudit is imported when it is needed.
    from cacheaudit import switches

    if switches.in_shim_process(sys.orig_argv):
        # The shim records its compile itself; a session or adapters here would only cost the
        # compile start-up time and split one build across runs.
        return False
    if not switches.enabled(os.environ):
        return False
    _started = True
    try:
        if os.environ.get(switches.SHIMS):
            # A process inside a session (`cacheaudit run`, the pytest plugin, a process the
            # hook prepared one in): only the adapters, armed without reading a spec where the
            # session said which imports arm them.
            names = _arming_names(os.environ)
            if names is not None:
                from cacheaudit.importhooks import when_first_imported

                when_first_imported(names, _activate_adapters)
                return True
        else:
            from cacheaudit import session

            prepared = session.prepare(os.environ, ledger=_ledger_setting(),
                                       label=LABEL)
            os.environ.update(prepared.env)
            atexit.register(prepared.close)
            _watch(prepared)
        _activate_adapters()
    except Exception as exc:  # noqa: BLE001 - a start-up hook never stops the program
        sys.stderr.write(f"cacheaudit: start-up hook failed: {type(exc).__name__}: {exc}\n")
    return True


def _activate_adapters() -> None:
    from cacheaudit import runtimes

    runtimes.activate()


def _arming_names(env: Mapping[str, str]) -> list[str] | None:
    """The top-level modules whose first import arms the adapters, as the session above this
    process wrote them (`cacheaudit.runtimes.arming_text`); None where it wrote none, or wrote
    them for another `CACHEAUDIT_RUNTIMES` than this process has (then the specs are read)."""
    from cacheaudit.switches import ADAPTER_IMPORTS, RUNTIMES

    extra, separator, names = env.get(ADAPTER_IMPORTS, "").rpartition(";")
    if not separator or extra != env.get(RUNTIMES, ""):
        return None
    return [name for name in names.split(":") if name]


LABEL = "startup"
"""The run label of a session the hook prepared (`CACHEAUDIT_RUN_LABEL`)."""


class _ExitAudit:
    """The audit, at exit, of the session the hook prepared in this process."""

    def __init__(self, prepared: Session, observer: ScopeObserver, started_ns: int) -> None:
        self.session = prepared
        self.observer = observer
        self.started_ns = started_ns
        self.pid = os.getpid()
        self.left_to: str | None = None

    def __call__(self) -> None:
        from cacheaudit.problems import report_problem

        try:
            if os.getpid() != self.pid:  # a forked child runs its parent's atexit hooks too
                return
            observation = self.observer.stop()
            if self.left_to is not None:
                return
            from cacheaudit.runtimes import flush_all

            flush_all()
            if observation.saw_nothing() and not _recorded(self.session):
                return
            report = _audit_run(self.session, observation, self.started_ns)
            if report is not None:
                _tell(report)
        except Exception as exc:  # noqa: BLE001 - the program's exit is never disturbed
            report_problem(f"{type(exc).__name__}: {exc}",
                           prefix="the start-up hook's audit failed, the exit status stands: ")


def _watch(prepared: Session) -> None:
    """Watch the entries' opens from now, and audit the session at exit (before `close`)."""
    global _audit
    from cacheaudit.watch import ScopeObserver

    started_ns = time.time_ns()
    _audit = _ExitAudit(prepared, ScopeObserver.start(prepared.ledger, prepared.env),
                        started_ns)
    atexit.register(_audit)


def leave_audit(to: str) -> None:
    """An integration of this process audits the hook's run itself (`to` names it): the hook
    does not audit it again at exit."""
    if _audit is not None:
        _audit.left_to = to


def _recorded(prepared: Session) -> bool:
    """Whether anything of the run reached the ledger or its spool (cheap: no record is read
    in full; nothing of the ledger but its places where there is no ledger file)."""
    from cacheaudit.ledger.places import pending_spooled

    if pending_spooled(prepared.ledger):
        return True
    if not os.path.exists(prepared.ledger):  # `open_existing`'s own answer, before its import
        return False
    from cacheaudit.ledger import open_existing

    opened = open_existing(prepared.ledger)
    if opened is None:
        return False
    with opened:
        return opened.has_records_of(prepared.run_uuid)


def _audit_run(prepared: Session, observation: Observation, started_ns: int
               ) -> RunReport | None:
    from cacheaudit.audit import audit_run
    from cacheaudit.ledger import open_existing

    opened = open_existing(prepared.ledger)
    if opened is None:
        return None
    with opened:
        return audit_run(opened, prepared.run_uuid, prepared.env, started_ns=started_ns,
                         observation=observation)


def _tell(report: RunReport) -> None:
    """The summary line `cacheaudit run` prints, then each error-level finding on one line."""
    lines = [f"cacheaudit: {report.summary()} in run {report.run_uuid}"]
    for finding in report.findings:
        if finding.severity.value != "error":
            continue
        where = f" (entry {finding.entry})" if finding.entry else ""
        lines.append(f"cacheaudit: {finding.code} {finding.severity.value}: {finding.subject}: "
                     f"{finding.message}{where}")
    sys.stderr.write("".join(f"{' '.join(line.split())}\n" for line in lines))
    sys.stderr.flush()


def _ledger_setting() -> str:
    """The same precedence as the CLI's: CACHEAUDIT_LEDGER, then the configuration's ledger."""
    from cacheaudit.config import Settings, ledger_location, load_settings
    from cacheaudit.switches import CONFIG, LEDGER

    config = os.environ.get(CONFIG)
    settings = load_settings(os.path.dirname(os.path.abspath(config))) if config else Settings()
    return ledger_location(os.environ.get(LEDGER), settings)


def pth_entry() -> None:
    """The PEP 829 `.start` entry point (process_startup applies the same gate as the `.pth`
    line)."""
    process_startup()
