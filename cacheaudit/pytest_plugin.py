"""pytest plugin: JIT compiles recorded and audited during a test session (`pytest --cacheaudit`).

Off unless asked for (`--cacheaudit`, or `cacheaudit = true` in the ini file). When on, it starts
before conftest files import the code under test (as pytest-cov does): it prepares the session
environment (the compiler shim first on PATH, the runtimes' compiler settings at the shim, one
run id and ledger), arms the in-process adapters, and tags every record with the running test.
Under pytest-xdist each worker writes its own ledger, combined by the controller at the end. Then
it audits what the session did, prints a `cacheaudit` section and, with `--cacheaudit-fail-on`,
sets the exit status.
"""

from __future__ import annotations

import contextlib
import glob
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from cacheaudit.config import FAIL_ON_CHOICES
from cacheaudit.plain import PausedCollector

if TYPE_CHECKING:
    from cacheaudit.audit import RunReport
    from cacheaudit.ledger import Ledger, RunInfo, TestWindow
    from cacheaudit.model import CompileRecord, Finding
    from cacheaudit.render import Line
    from cacheaudit.session import Session
    from cacheaudit.watch import Observation, ScopeObserver

MARKER = "no_cacheaudit"
_PLUGIN_NAME = "_cacheaudit_session"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("cacheaudit", "compile-cache identity audit (cacheaudit)")
    group.addoption("--cacheaudit", action="store_true", default=False,
                    help="Record JIT compiles and cache hits during the session and audit them.")
    group.addoption("--cacheaudit-fail-on", choices=FAIL_ON_CHOICES, default=None,
                    help="Fail the session when a finding reaches this severity "
                         "(default: the ini option cacheaudit_fail_on, else error).")
    group.addoption("--cacheaudit-ledger", default=None, metavar="PATH",
                    help="Ledger file (default: CACHEAUDIT_LEDGER, else "
                         ".pytest_cache/cacheaudit/ledger.db under the rootdir).")
    group.addoption("--cacheaudit-root", action="append", default=[], metavar="DIR",
                    help="Also audit this cache root at the end (repeatable).")
    parser.addini("cacheaudit", type="bool", default=False,
                  help="Turn cacheaudit on for every run, as --cacheaudit does.")
    parser.addini("cacheaudit_fail_on", default="error",
                  help="Severity that fails the session: error, warning, info or never.")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}: do not record the compiles and cache hits of this test")


def _enabled(config: pytest.Config) -> bool:
    namespace = config.known_args_namespace
    return bool(getattr(namespace, "cacheaudit", False)) or bool(config.getini("cacheaudit"))


def _fail_on(config: pytest.Config) -> str:
    """--cacheaudit-fail-on, else the ini option; a value the ini gives wrong is a usage error
    now rather than an "audit failed" at the end of a session that then cannot fail."""
    given = getattr(config.known_args_namespace, "cacheaudit_fail_on", None)
    if given:
        return str(given)
    value = str(config.getini("cacheaudit_fail_on") or "error").strip()
    if value not in FAIL_ON_CHOICES:
        raise pytest.UsageError(f"cacheaudit_fail_on = {value!r} in the ini file: expected one "
                                f"of {', '.join(FAIL_ON_CHOICES)}")
    return value


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser,
                                  args: list[str]) -> None:
    """Start before conftest files import the code under test (and its runtimes)."""
    if not _enabled(early_config):
        return
    fail_on = _fail_on(early_config)
    try:
        session: _Session | _Off = _Session(early_config, fail_on)
    except Exception as exc:  # noqa: BLE001 - cacheaudit must not stop the tests from running
        session = _Off(f"{type(exc).__name__}: {exc}")
    early_config.pluginmanager.register(session, _PLUGIN_NAME)


class _Off:
    """Stands in for the session when it could not start: the tests run unrecorded, and the
    terminal summary says why, once."""

    ledger: str | None = None

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        _write_off(terminalreporter, self.reason)


def _write_off(terminalreporter: Any, reason: str) -> None:
    terminalreporter.write_sep("=", "cacheaudit")
    terminalreporter.write_line(f"cacheaudit: recording is off for this session: {reason}",
                                yellow=True)


class _Session:
    """The plugin's state for one pytest process: the controller, a worker, or a plain run."""

    def __init__(self, config: pytest.Config, fail_on: str) -> None:
        self.saved_env = dict(os.environ)
        self.session: Session | None = None
        self.off: str | None = None
        try:
            with PausedCollector():  # see `PausedCollector`: a full collection of pytest's heap
                self._start(config, fail_on)
        except BaseException:
            self._stop()
            raise

    def _start(self, config: pytest.Config, fail_on: str) -> None:
        from cacheaudit import runtimes, startup
        from cacheaudit.session import prepare
        from cacheaudit.switches import LEDGER

        self.config = config
        # A start-up hook session of this process (`CACHEAUDIT=1 pytest --cacheaudit`) is this
        # test run: reported here, once, not again by the hook at exit.
        startup.leave_audit("pytest --cacheaudit")
        # An xdist worker inherits the environment its controller prepared; a pytest started
        # from inside some other xdist worker (pytester, say) inherits PYTEST_XDIST_WORKER alone.
        # `pytest_configure` checks the guess against `config.workerinput`.
        self.worker = os.environ.get("PYTEST_XDIST_WORKER", "") if os.environ.get(
            "CACHEAUDIT_RUN_LABEL") == "pytest" else ""
        self.windows: list[TestWindow] = []
        self.test_started: dict[str, int] = {}
        self.observer: ScopeObserver | None = None
        self.started_ns = time.time_ns()
        self.outcomes: dict[str, str] = {}
        self.report: RunReport | None = None
        self.failed = False
        self.snapshot: str | None = None
        self.problem: str | None = None
        namespace = config.known_args_namespace
        self.fail_on = fail_on
        self.roots = list(getattr(namespace, "cacheaudit_root", None) or [])
        if self.worker:
            # The controller prepared the environment; each worker keeps a ledger of its own
            # (one writer per file), combined by the controller at the end.
            self.ledger = os.environ[LEDGER] + f".{self.worker}"
            os.environ[LEDGER] = self.ledger
            self.run_uuid = os.environ.get("CACHEAUDIT_RUN", "")
        else:
            ledger = (getattr(namespace, "cacheaudit_ledger", None)
                      or os.environ.get(LEDGER)
                      or str(Path(config.rootpath) / ".pytest_cache" / "cacheaudit"
                             / "ledger.db"))
            os.makedirs(os.path.dirname(os.path.abspath(ledger)), exist_ok=True)
            self.session = prepare(os.environ, ledger=ledger, label="pytest")
            os.environ.update(self.session.env)
            self.ledger = self.session.ledger
            self.run_uuid = self.session.run_uuid
        # The observer alone, not the audit package: a session that records nothing and knows no
        # cache root never imports the judge (`_finish`).
        from cacheaudit.watch import ScopeObserver

        # The opens of every cache entry known at the start, watched until the end (in each
        # process that runs tests, for the fixture; the controller's serves the report).
        self.observer = ScopeObserver.start(self.ledger, os.environ, self.roots)
        runtimes.activate()

    def _stop(self) -> None:
        """Put the process back as it was: adapters off, the session's environment gone."""
        from cacheaudit import runtimes

        try:
            if self.observer is not None:
                self.observer.stop()
            with contextlib.suppress(Exception):  # what they had pending is spooled or lost
                runtimes.deactivate()
        finally:
            if self.session is not None:
                self.session.close()
                self.session = None
            os.environ.clear()
            os.environ.update(self.saved_env)

    def pytest_configure(self, config: pytest.Config) -> None:
        if self.worker and not hasattr(config, "workerinput"):
            self.off = ("this pytest inherited an xdist worker's environment but is not a "
                        "worker; unset PYTEST_XDIST_WORKER or CACHEAUDIT_RUN_LABEL")
            self._stop()

    # ---------------------------------------------------------------- per test

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Iterator[None]:
        if self.off:
            yield
            return
        excluded = item.get_closest_marker(MARKER) is not None
        os.environ["CACHEAUDIT_TEST_ID"] = item.nodeid
        if excluded:
            os.environ["CACHEAUDIT_DISABLE"] = "1"
        started = self.test_started[item.nodeid] = time.time_ns()
        try:
            yield
        finally:
            from cacheaudit.ledger import TestWindow

            os.environ.pop("CACHEAUDIT_TEST_ID", None)
            if excluded:
                os.environ.pop("CACHEAUDIT_DISABLE", None)
            self.windows.append(TestWindow(item.nodeid, started, time.time_ns(),
                                           self.outcomes.get(item.nodeid, ""), self.worker))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call" or report.outcome != "passed":
            self.outcomes[report.nodeid] = report.outcome

    # ---------------------------------------------------------------- the end

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.off:
            return
        try:
            with PausedCollector():
                self._finish(session)
        except Exception as exc:  # noqa: BLE001 - a reporting failure is a warning, not a crash
            self.problem = f"{type(exc).__name__}: {exc}"

    def _finish(self, session: pytest.Session) -> None:
        from cacheaudit.ledger.values import RunInfo
        from cacheaudit.runtimes import flush_all

        flush_all()
        observation = self.observer.stop() if self.observer is not None else None
        run = RunInfo(run_uuid=self.run_uuid, label="pytest")
        if self.worker:
            from cacheaudit.ledger.sessions import SessionLedger

            with SessionLedger.open(self.ledger) as ledger:
                ledger.add_tests(run, self.windows)
            return
        workers = sorted(glob.glob(glob.escape(self.ledger) + ".gw*[0-9]"))
        quiet = None if workers else self._quiet(run, observation)
        self.report = quiet if quiet is not None else self._audited(run, observation, workers)
        if not self.report.findings:
            return
        from cacheaudit.audit.options import fails

        if fails(self.report.findings, self.fail_on):
            self.failed = True
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED
            self.snapshot = self._write_snapshot()

    def _quiet(self, run: RunInfo, observation: Observation | None) -> RunReport | None:
        """The report of a session that has nothing to audit (nothing spooled, no record of its
        run, no entry opened: `nothing_to_audit`), its tests stored, all without the records'
        model (`SessionLedger`); None where there may be something."""
        from cacheaudit.audit.report import RunReport, nothing_to_audit
        from cacheaudit.ledger.places import pending_spooled
        from cacheaudit.ledger.sessions import SessionLedger

        if not os.path.exists(self.ledger) or pending_spooled(self.ledger):
            return None  # a ledger to make, or records to fold in: the whole ledger's business
        with SessionLedger.open(self.ledger) as ledger:
            if not nothing_to_audit(ledger, self.run_uuid, os.environ, self.roots, observation):
                return None
            ledger.mend_record_indexes()  # what a combine of no ledgers does
            ledger.add_tests(run, self.windows)
        # What `audit_run` reports of such a run, without importing the judge.
        return RunReport(self.run_uuid, [], [])

    def _audited(self, run: RunInfo, observation: Observation | None,
                 workers: list[str]) -> RunReport:
        """The workers' ledgers combined, the tests stored, and the run audited."""
        from cacheaudit.audit.report import RunReport, nothing_to_audit
        from cacheaudit.ledger import open_ledger

        with open_ledger(self.ledger) as ledger:
            if workers:
                from cacheaudit.ledger import combine

                combine(ledger, workers, keep=False)
            else:
                ledger.mend_record_indexes()
            ledger.add_tests(run, self.windows)
            if nothing_to_audit(ledger, self.run_uuid, os.environ, self.roots, observation):
                return RunReport(self.run_uuid, [], [])
            from cacheaudit.audit import audit_run

            report = audit_run(ledger, self.run_uuid, os.environ, started_ns=self.started_ns,
                               roots=self.roots, observation=observation)
            if report.findings:
                ledger.add_findings(report.findings)
            return report

    def _write_snapshot(self) -> str | None:
        """A failing session leaves the bug-report snapshot beside its ledger."""
        from cacheaudit.ledger.private import write_file
        from cacheaudit.snapshot import collect, to_markdown

        path = os.path.join(os.path.dirname(self.ledger), "cacheaudit-snapshot.md")
        try:
            text = to_markdown(collect(os.environ, ledger=self.ledger))
            write_file(path, text.encode("utf-8"))  # 0600 when new, like the ledger beside it
        except OSError:
            return None
        return path

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.off:
            _write_off(terminalreporter, self.off)
            return
        if self.worker:
            return
        write = terminalreporter.write_line
        terminalreporter.write_sep("=", "cacheaudit")
        if self.problem:
            write(f"cacheaudit: the audit failed, the test results stand: {self.problem}",
                  yellow=True)
            return
        report = self.report
        if report is None:
            return
        with PausedCollector():
            lines = _section(report, self.ledger, _width(terminalreporter))
        for line in lines:
            write(line.shown, **_markup(line))
        if self.failed:
            write(f"cacheaudit: failing the session (--cacheaudit-fail-on={self.fail_on})",
                  red=True, bold=True)
            if self.snapshot:
                write(f"cacheaudit: environment snapshot for a bug report: {self.snapshot}")

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        # Leave the process as it was: pytester runs sessions inside one interpreter.
        self._stop()


def _section(report: RunReport, ledger: str, width: int) -> list[Line]:
    """The session's findings as `cacheaudit scan` shows them, then its summary."""
    from cacheaudit.render import View, findings_lines

    scope = [f"{report.summary()} in run {report.run_uuid}", f"ledger {ledger}"]
    return findings_lines(report.findings, scope, View(width=width))


def _width(terminalreporter: Any) -> int:
    writer = getattr(terminalreporter, "_tw", None)
    width = getattr(writer, "fullwidth", None)
    return width if isinstance(width, int) and width > 0 else 80


def _markup(line: Line) -> dict[str, bool]:
    """The line's strongest style as pytest's terminal markup (a whole line, not a span)."""
    styles = " ".join(style for _start, _end, style in line.spans)
    if "red" in styles:
        return {"red": True}
    if "yellow" in styles:
        return {"yellow": True}
    if "green" in styles:
        return {"green": True}
    return {}


# ------------------------------------------------------------------------------ the fixture


class CacheauditFixture:
    """What happened inside one test: its records and the findings about them, from the same
    audit of a scope as the session report (`cacheaudit.audit.audit_scope`), with the test's
    records and window as the scope."""

    def __init__(self, ledger: str, nodeid: str, *, run_uuid: str = "",
                 started_ns: int | None = None, roots: tuple[str, ...] = (),
                 observer: ScopeObserver | None = None) -> None:
        self.ledger = ledger
        self.nodeid = nodeid
        self.run_uuid = run_uuid
        self.started_ns = started_ns if started_ns is not None else time.time_ns()
        self.roots = roots
        self.observer = observer

    def records(self) -> list[CompileRecord]:
        ledger = self._ledger()
        if ledger is None:
            return []
        with ledger:
            return self._own(ledger)

    def report(self) -> RunReport | None:
        """The audit of this test so far: its records, and the hits inside its window."""
        from cacheaudit.audit import Scope, audit_scope

        ledger = self._ledger()
        if ledger is None:
            return None
        scope = Scope(self.run_uuid, self.started_ns, test_id=self.nodeid, roots=self.roots)
        observer = self.observer
        with ledger, observer.ignoring() if observer is not None else contextlib.nullcontext():
            observation = observer.observation() if observer is not None else None
            return audit_scope(ledger, scope, os.environ, observation=observation)

    def findings(self) -> list[Finding]:
        """The findings of this test's audit, as of now."""
        report = self.report()
        return report.findings if report is not None else []

    def _ledger(self) -> Ledger | None:
        from cacheaudit.ledger import open_existing
        from cacheaudit.runtimes import flush_all

        flush_all()
        return open_existing(self.ledger)

    def _own(self, ledger: Ledger) -> list[CompileRecord]:
        return ledger.records(where="r.test_id = ?", params=(self.nodeid,))

    def assert_no_stale_hits(self) -> None:
        errors = [f for f in self.findings() if f.severity.value == "error"]
        if errors:
            raise AssertionError("cacheaudit: " + "; ".join(
                f"{f.code} {f.subject} ({f.entry or f.kernel or '-'}): {f.message}"
                for f in errors))


@pytest.fixture
def cacheaudit(request: pytest.FixtureRequest) -> CacheauditFixture:
    """The compiles and cache hits of this test, and the findings about them."""
    plugin = request.config.pluginmanager.get_plugin(_PLUGIN_NAME)
    if plugin is None:
        pytest.skip("cacheaudit is not enabled: run pytest with --cacheaudit")
    if isinstance(plugin, _Off) or plugin.off:
        pytest.skip("cacheaudit could not start in this session; its summary says why")
    nodeid = request.node.nodeid
    return CacheauditFixture(plugin.ledger, nodeid, run_uuid=plugin.run_uuid,
                             started_ns=plugin.test_started.get(nodeid),
                             roots=tuple(plugin.roots), observer=plugin.observer)
