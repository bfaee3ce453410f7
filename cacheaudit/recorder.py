"""Turning an observed compile into a record and getting it into the ledger, whatever happens.

The shim uses `ShimRecorder`; adapters reuse `write_held` and `current_run`. Everything here
fails open: an error becomes a note on the record, a spooled record, or one line on stderr, never a
failed compile.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cacheaudit.digest import StateCache, normalise_path
from cacheaudit.exceptions import LedgerBusy
from cacheaudit.ids import hostname
from cacheaudit.ledger.places import default_ledger_path, spool_dir
from cacheaudit.ledger.redact import redact_record, redact_run
from cacheaudit.ledger.schema import WRITER_PATIENCE_S
from cacheaudit.ledger.values import IDENTITY_MEMO_SUFFIX, RunInfo, new_record_id

# The write path only: the ledger's readers (`reads`, `queries`) and the spool's (`spool`,
# imported where a record is spooled or a spool exists) are none of a recorder's business.
from cacheaudit.ledger.writer import LedgerWriter
from cacheaudit.model import ArgToken, CompileRecord, CompilerIdentity, FileState, IncludeGraph
from cacheaudit.problems import report_problem
from cacheaudit.processes import runtime_process
from cacheaudit.programs import compiler_name
from cacheaudit.switches import (
    DISABLE_VARIABLE,
    RUN_LABEL_VARIABLE,
    RUN_VARIABLE,
    flag_set,
)

if TYPE_CHECKING:
    # Only the shim's recorder needs these; adapters import this module in every process.
    from cacheaudit import compilers, graph

RUNTIME_VARIABLE = "CACHEAUDIT_RUNTIME"
TEST_ID_VARIABLE = "CACHEAUDIT_TEST_ID"


def current_run(env: Mapping[str, str], label: str = "shim", *,
                in_process: bool = False) -> RunInfo:
    """The run a record belongs to: CACHEAUDIT_RUN, else the runtime's process: this one for an
    in-process adapter, the shim's nearest non-shell ancestor for the shim. Its command is
    stored redacted (`write_records`)."""
    explicit = env.get(RUN_VARIABLE)
    if explicit:
        return RunInfo(run_uuid=explicit, label=env.get(RUN_LABEL_VARIABLE, label))
    parent, ticks = runtime_process(os.getpid() if in_process else None)
    host = hostname()
    return RunInfo(run_uuid=f"{host}:{parent}:{ticks}", label=label,
                   host=host, pid=parent, command=_process_command(parent))


def _process_command(pid: int) -> tuple[str, ...] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            raw = handle.read()
    except OSError:
        return None
    return tuple(part.decode("utf-8", "surrogateescape") for part in raw.split(b"\0") if part)


def test_id_from(env: Mapping[str, str]) -> str | None:
    """The pytest node id: the plugin's variable, else pytest's own PYTEST_CURRENT_TEST."""
    explicit = env.get(TEST_ID_VARIABLE)
    if explicit:
        return explicit
    current = env.get("PYTEST_CURRENT_TEST")
    if current:
        return current.rsplit(" (", 1)[0]
    return None


SPOOL_FOLD_IN = 20
"""Spooled records a writer folds in after its own record went in: a backlog drains over the
next compiles without any one of them paying for all of it."""


def write_records(records: Sequence[CompileRecord], run: RunInfo,
                  ledger_path: str | None = None, *, sealed: bool = False) -> str | None:
    """Store records in one transaction, waiting at most `WRITER_PATIENCE_S` for another
    process's lock; what the ledger cannot take is spooled. Then a few spooled records are
    folded in. Returns the problem in one line, or None. Never raises."""
    path = ledger_path or default_ledger_path()
    try:
        stored = list(records) if sealed else [_stored(r) for r in records]
        run = redact_run(run)
    except Exception as exc:  # noqa: BLE001 - fail open
        return f"{type(exc).__name__}: {exc}"
    try:
        with LedgerWriter.open(path, patience_s=WRITER_PATIENCE_S) as ledger:
            ledger.add_records(stored, run)
            _fold_in_spool(ledger)
        return None
    except LedgerBusy as exc:
        problem = str(exc)
    except Exception as exc:  # noqa: BLE001 - any failure must fall back to the spool
        problem = f"{type(exc).__name__}: {exc}"
    return _spool(path, stored, run, problem)


def _spool(path: str, records: Sequence[CompileRecord], run: RunInfo, problem: str) -> str:
    """Spool `records` beside the ledger at `path`; what happened, in one line."""
    spooled: list[str] = []
    failure = ""
    from cacheaudit.ledger.spool import spool_record

    for record in records:
        try:
            spooled.append(spool_record(path, record, run))
        except Exception as exc:  # noqa: BLE001 - fail open: the compile must not see this
            if isinstance(exc, OSError) and exc.strerror:
                reason = exc.strerror[0].lower() + exc.strerror[1:]
                failure = f"{reason} writing {exc.filename or spool_dir(path)}"
            else:
                failure = f"{type(exc).__name__}: {exc}"
    lost = len(records) - len(spooled)
    if lost:
        what = "not recorded" if lost == 1 else f"{lost} records not recorded"
        kept = f" ({len(spooled)} spooled)" if spooled else ""
        return f"{problem}; {what}: {failure}{kept}"
    where = spooled[0] if len(spooled) == 1 else f"{len(spooled)} files in {spool_dir(path)}"
    return (f"{problem}; {'record' if len(spooled) == 1 else 'records'} spooled to {where}, "
            "folded into the ledger by the next command or compile that writes it")


def _fold_in_spool(ledger: LedgerWriter) -> None:
    """A few spooled records into the ledger a writer has just written (no stat more than
    that when there is no spool)."""
    if os.path.isdir(spool_dir(ledger.path)):
        with contextlib.suppress(Exception):
            from cacheaudit.ledger.spool import ingest_spool

            ingest_spool(ledger, limit=SPOOL_FOLD_IN)
        ledger.try_again()


def _stored(record: CompileRecord) -> CompileRecord:
    """The record as it is stored: credentials redacted (`ledger.redact`), then sealed."""
    return _sealed(redact_record(record))


def _sealed(record: CompileRecord) -> CompileRecord:
    """The record with its command sealed by this user's secret (`cacheaudit.seal`), so that the
    rebuild oracle can tell it from a command someone else wrote; unsealed when that fails."""
    try:
        from cacheaudit import seal

        return seal.sealed(record, os.environ)
    except Exception:  # noqa: BLE001 - fail open: an unsealed record only asks before a rerun
        return record


class _HeldLedger:
    """The ledger an in-process adapter writes into, kept open between records.

    Opening and closing a ledger costs ~15 ms a record (closing checkpoints the WAL), writing
    into an open one ~0.1 ms: on a Triton disk hit or an NVRTC compile that difference is the
    budget. It is reopened when the ledger path, the process (a fork) or the file itself
    changes; any failure falls back to `write_records`, which spools what the ledger cannot take.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ledger: LedgerWriter | None = None
        self._key: tuple[Any, ...] | None = None
        self._pid = 0
        self._orphans: list[LedgerWriter] = []
        self._atexit = False

    def write(self, records: Sequence[CompileRecord], run: RunInfo, path: str) -> str | None:
        """All `records` in one transaction; what the ledger cannot take is spooled at once
        when it is busy, else after one more try on a fresh connection."""
        records = [_stored(r) for r in records]
        run = redact_run(run)
        with self._lock:
            held = self._open(path)
            if held is not None:
                try:
                    held.add_records(records, run)
                    _fold_in_spool(held)
                    return None
                except LedgerBusy as exc:
                    # Another process holds the lock: a fresh connection would only wait again.
                    held.try_again()
                    return _spool(path, records, run, str(exc))
                except Exception:  # noqa: BLE001 - the fallback below spools the records
                    self._close_locked()
        return write_records(records, run, path, sealed=True)

    def _open(self, path: str) -> LedgerWriter | None:
        try:
            st = os.stat(path)
            key: tuple[Any, ...] | None = (path, os.getpid(), st.st_dev, st.st_ino)
        except OSError:
            key = None  # not created yet, or gone: open (and create) it again
        if self._ledger is not None and key is not None and key == self._key:
            return self._ledger
        self._close_locked()
        try:
            ledger = LedgerWriter.open(path, patience_s=WRITER_PATIENCE_S)
            st = os.stat(path)
        except Exception:  # noqa: BLE001 - write_records reports what goes wrong
            return None
        self._ledger, self._key, self._pid = ledger, (path, os.getpid(), st.st_dev, st.st_ino), \
            os.getpid()
        if not self._atexit:
            atexit.register(self.close)
            self._atexit = True
        return ledger

    def open_now(self, path: str) -> None:
        """Open the ledger at `path` ahead of the next `write` (a failure is that write's)."""
        with self._lock:
            self._open(path)

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def _after_fork(self) -> None:
        # A lock another thread held at fork() would stay held in the child forever. The
        # inherited connection is left alone: `_open` sees the new pid and orphans it.
        self._lock = threading.Lock()

    def _close_locked(self) -> None:
        ledger, self._ledger, self._key = self._ledger, None, None
        if ledger is None:
            return
        if self._pid != os.getpid():
            # Inherited through fork: an SQLite connection must not be used (nor closed) on
            # both sides; keep it referenced so that it is never finalised here.
            self._orphans.append(ledger)
            return
        with contextlib.suppress(Exception):
            ledger.close()


_HELD = _HeldLedger()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_HELD._after_fork)


def disabled(env: Mapping[str, str]) -> bool:
    """`CACHEAUDIT_DISABLE=1` (the pytest marker sets it for one test): record nothing."""
    return flag_set(env, DISABLE_VARIABLE)


def recorded_environment(env: Mapping[str, str]) -> dict[str, str]:
    """The compile-affecting variables of `env` as a record keeps them
    (`envvars.compile_environment`), answered from the registry's table beside the ledger
    (`envvars.kept`): the registry itself loads every runtime's spec and environment module,
    10-15 ms that neither a shim nor an adapter's first record in a process need pay."""
    from cacheaudit.envvars.kept import kept_environment
    from cacheaudit.ledger.places import ENVIRONMENT_TABLE_SUFFIX

    return kept_environment(env, default_ledger_path(env) + ENVIRONMENT_TABLE_SUFFIX)


def store_in_process(record: CompileRecord, *, observer: str,
                     env: Mapping[str, str] | None = None) -> str | None:
    """Store a record an in-process adapter built, with this process's details filled in:
    the compile-affecting environment, pid, host, test id and run. Never raises."""
    env = os.environ if env is None else env
    if disabled(env):
        return None
    try:
        record = dataclasses.replace(
            record, env=record.env or recorded_environment(env), pid=os.getpid(),
            host=hostname(), test_id=record.test_id or test_id_from(env),
            observer=observer)
        return _HELD.write([record], current_run(env, observer, in_process=True),
                           default_ledger_path(env))
    except Exception as exc:  # noqa: BLE001 - fail open inside the runtime
        return f"{type(exc).__name__}: {exc}"


def hold_open(path: str) -> None:
    """Open the ledger at `path` now for `write_held` (the shim does so while the compile
    runs: its end then waits for the record's transaction alone). Never raises."""
    with contextlib.suppress(Exception):
        _HELD.open_now(path)


def close_held() -> None:
    """Close the ledger `write_held` keeps open (checkpointing its WAL), before this process
    ends by a way that runs no exit function. Never raises."""
    with contextlib.suppress(Exception):
        _HELD.close()


def write_held(records: Sequence[CompileRecord], run: RunInfo, path: str) -> str | None:
    """Store a batch of records an in-process adapter built in full (run and details included)
    through the ledger this process keeps open. Returns a problem, or None; never raises."""
    try:
        return _HELD.write(records, run, path)
    except Exception as exc:  # noqa: BLE001 - fail open inside the runtime
        return f"{type(exc).__name__}: {exc}"


def record_event(*, runtime: str, kernel: str | None, event: str, observer: str,
                 env: Mapping[str, str] | None = None, **fields: Any) -> str | None:
    """Store what an in-process adapter saw: a compile (with whatever of the four answers it
    knows), a memory or disk hit, or a lookup the runtime refused.

    `fields` are `CompileRecord` fields (record_id, key, entry, compiler, argv, effective_argv,
    sources, graph, outputs, tracked, exit_code, started_ns, duration_ns, notes, extra, ...);
    the process, host, test id and the compile-affecting environment are filled in. Returns a
    problem, or None; never raises, so that an adapter can call it from the runtime's own path.
    """
    try:
        fields.setdefault("record_id", new_record_id())
        fields.setdefault("started_ns", time.time_ns())
        fields["notes"] = tuple(fields.get("notes") or ())
        fields["extra"] = dict(fields.get("extra") or {})
        record = CompileRecord(event=event, runtime=runtime, kernel=kernel, **fields)
    except Exception as exc:  # noqa: BLE001 - fail open inside the runtime
        return f"{type(exc).__name__}: {exc}"
    return store_in_process(record, observer=observer, env=env)


def modified_since(states: Sequence[FileState], started_ns: int) -> list[FileState]:
    """Inputs whose mtime or ctime is not older than the compile's start: the compiler may have
    read a different version than the one hashed afterwards (ccache's "too new" race). An unknown
    start (0) proves nothing, and flagging every input would be a false CA401 for each."""
    if started_ns <= 0:
        return []
    return [s for s in states
            if s.exists and (s.mtime_ns >= started_ns or s.ctime_ns >= started_ns)]


@dataclass
class ShimRecorder:
    """The recording side of one shim invocation; the shim owns the process plumbing."""

    name: str
    real: str
    argv: tuple[str, ...]
    env: dict[str, str]
    kind: str
    effective: tuple[ArgToken, ...]
    command: compilers.ParsedCommand
    cwd: str
    notes: list[str] = field(default_factory=list)
    started_ns: int = 0
    compiler: CompilerIdentity | None = None
    dependency_pass: graph.DependencyPass | None = None
    depfile: str | None = None
    method: str = ""
    _states: StateCache = field(default_factory=StateCache, repr=False)
    _early_inputs: tuple[tuple[FileState, ...], IncludeGraph] | None = field(default=None,
                                                                             repr=False)
    """(sources, graph) hashed while the compile ran (`collect_inputs`)."""
    _environment: dict[str, str] | None = field(default=None, repr=False)
    _run: RunInfo | None = field(default=None, repr=False)

    @classmethod
    def prepare(cls, name: str, real: str, argv: Sequence[str],
                env: Mapping[str, str]) -> ShimRecorder | None:
        """A recorder for a compile or link; None for a query such as `--version`."""
        from cacheaudit import compilers

        kind = compilers.compiler_kind(name)
        cwd = os.getcwd()
        expansion = compilers.expand_argv(kind, argv, env, cwd)
        command = compilers.parse_command(kind, [t.text for t in expansion.tokens])
        if not command.records:
            return None
        return cls(name=name, real=real, argv=tuple(argv), env=dict(env), kind=kind,
                   effective=expansion.tokens, command=command, cwd=cwd,
                   notes=list(expansion.notes))

    def start(self, child_env: Mapping[str, str], started_ns: int, workdir: str) -> None:
        """Runs while the compiler runs: the dependency pass, then the identity (memoised per
        binary in `identity_memo_path`: no `--version` run once a binary is known)."""
        from cacheaudit import compilers, graph

        self.started_ns = started_ns
        if self.command.sources:
            self.depfile = os.path.join(workdir, "deps.d")
            dep_env = dict(child_env)
            # The effective argv already holds these flags, in nvcc's own order.
            dep_env.pop("NVCC_PREPEND_FLAGS", None)
            dep_env.pop("NVCC_APPEND_FLAGS", None)
            self.method = f"{compiler_name(self.name)} -M"
            self.dependency_pass = graph.start_dependency_pass(
                self.real, self.command.dependency_argv(self.depfile), self.cwd, dep_env)
        from cacheaudit.switches import is_masquerade_dir

        # The same environment as the compile: a wrapper that calls `g++` by name must not
        # come back into this shim through the masquerade directory.
        self.compiler = compilers.identify(self.name, env=child_env, skip=is_masquerade_dir,
                                           path=self.real,
                                           argv=[t.text for t in self.effective],
                                           memo=compilers.FileMemo(identity_memo_path(self.env)))

    def collect_inputs(self, compiling: Callable[[], bool]) -> None:
        """While the compile runs (`compiling()`): wait for the dependency pass, then hash every
        file it lists, so that after the compile only the outputs are left to hash. Returns as
        soon as the compile ends, whatever is left then being done after it, as before; what
        was hashed here is checked then (`_build`)."""
        from cacheaudit import graph

        dependency_pass = self.dependency_pass
        if dependency_pass is None:
            return
        while dependency_pass.running:
            if not compiling():
                return
            time.sleep(_POLL_S)
        result = dependency_pass.wait()
        if not (result.ok and result.depfile_text is not None and compiling()):
            return
        source_paths = [normalise_path(s, self.cwd) for s in self.command.sources]
        with contextlib.suppress(graph.DepfileError):  # `_build` notes it
            self._early_inputs = graph.graph_from_depfile(
                result.depfile_text, self.cwd, source_paths, self._states, self.method)

    def ready_to_write(self) -> None:
        """While the compile runs: what the record needs that the compile cannot change (the
        compile-affecting environment, and the run), and the imports that writing it needs (the
        seal), so that the compile's end waits for none of it. The environment is answered from
        the registry's table beside the ledger (`envvars.kept`): the registry itself, which
        loads every runtime's spec and environment module, is built by the first shim only."""
        from cacheaudit import seal  # noqa: F401

        self._environment = recorded_environment(self.env)
        self._run = current_run(self.env)
        # Opened now (made or upgraded where needed, its schema checked): the compile's end
        # waits only for the record's own transaction.
        hold_open(default_ledger_path(self.env))

    def finish(self, returncode: int, duration_ns: int) -> None:
        """After the compile: hash inputs and outputs, write the record. Never raises."""
        try:
            record = self._build(returncode, duration_ns)
            run = self._run or current_run(self.env)
        except Exception as exc:  # noqa: BLE001 - fail open
            report_problem(f"{type(exc).__name__}: {exc}")
            return
        problem = write_held([record], run, default_ledger_path(self.env))
        if problem:
            report_problem(problem)

    def build(self, returncode: int, duration_ns: int) -> CompileRecord:
        """The record of the compile, without storing it: for an in-process adapter that ran
        the compiler itself (DeepGEMM's Python JIT) and completes the record with what only
        the runtime knows. May raise."""
        return self._build(returncode, duration_ns)

    def _build(self, returncode: int, duration_ns: int) -> CompileRecord:
        from cacheaudit import compilers, graph

        cache = self._states
        source_paths = [normalise_path(s, self.cwd) for s in self.command.sources]
        sources: tuple[FileState, ...] = ()
        include_graph: IncludeGraph | None = None
        if self.dependency_pass is not None:
            if returncode < 0:
                # Interrupted: whoever stopped the compile wants the process gone, not a graph.
                self.dependency_pass.kill()
            result = self.dependency_pass.wait(timeout=_dependency_timeout(duration_ns))
            if self._early_inputs is not None and result.ok:
                sources, include_graph = _checked(*self._early_inputs, cache)
            elif result.ok and result.depfile_text is not None:
                try:
                    sources, include_graph = graph.graph_from_depfile(
                        result.depfile_text, self.cwd, source_paths, cache, self.method)
                except graph.DepfileError as exc:
                    self.notes.append(f"dependency pass wrote an unreadable depfile: {exc}")
            else:
                reason = result.error or f"exit {result.exit_code}"
                self.notes.append(f"dependency pass failed ({reason}): "
                                  f"{(result.stderr or '').strip()[:500]}")
        if not sources:
            sources = tuple(cache.capture(p) for p in source_paths)
        objects = tuple(cache.capture(normalise_path(o, self.cwd)) for o in self.command.objects)
        outputs = tuple(cache.capture(normalise_path(o, self.cwd))
                        for o in compilers.output_paths(self.kind, self.command, self.cwd))
        inputs = sources + objects + (tuple(f.state for f in include_graph.files)
                                      if include_graph else ())
        runtime_process_id: str | None = None
        if self.env.get(RUN_VARIABLE):
            # A session's run id is shared by every process below it; the runtime's own process
            # (as a bare shim's run id names it) is what in-memory staleness is judged by.
            pid, ticks = runtime_process()
            runtime_process_id = f"{hostname()}:{pid}:{ticks}"
        late = modified_since(inputs, self.started_ns)
        signal_number = -returncode if returncode < 0 else None
        return CompileRecord(
            record_id=new_record_id(), event="compile", started_ns=self.started_ns,
            runtime=self.env.get(RUNTIME_VARIABLE) or None,
            kernel=_kernel_name(self.command.sources or self.command.objects),
            compiler=self.compiler, argv=self.argv, effective_argv=self.effective,
            cwd=self.cwd, env=(self._environment if self._environment is not None
                               else recorded_environment(self.env)),
            sources=sources + objects, graph=include_graph, outputs=outputs,
            exit_code=None if signal_number else returncode, signal=signal_number,
            duration_ns=duration_ns, pid=os.getpid(), host=hostname(),
            test_id=test_id_from(self.env), observer=f"shim:{self.name}",
            notes=tuple(self.notes), runtime_process=runtime_process_id,
            modified_during_compile=tuple(s.path for s in late))


_POLL_S = 0.005
"""How often `collect_inputs` looks whether the dependency pass or the compile has ended."""


def identity_memo_path(env: Mapping[str, str]) -> str:
    """The compilers' identities file beside the ledger (`compilers.FileMemo`)."""
    return default_ledger_path(env) + IDENTITY_MEMO_SUFFIX


def _checked(sources: tuple[FileState, ...], include_graph: IncludeGraph, cache: StateCache
             ) -> tuple[tuple[FileState, ...], IncludeGraph]:
    """Inputs hashed while the compile ran, as they are after it: a state stands when it was
    settled and its stat is unchanged; any other file is read again (`StateCache.verify`), as
    if it had been hashed only now, so that a file changed during the compile is recorded as
    it is afterwards and its timestamps flag it (`modified_since`)."""
    checked_sources = tuple(cache.verify(s) for s in sources)
    files = []
    for graph_file in include_graph.files:
        state = cache.verify(graph_file.state)
        files.append(graph_file if state is graph_file.state
                     else dataclasses.replace(graph_file, state=state))
    return checked_sources, IncludeGraph(files=tuple(files), method=include_graph.method)


def _dependency_timeout(compile_ns: int) -> float:
    # The dependency pass does less work than the compile; allow it generously more time, so that a
    # loaded machine still yields a graph, but never hang the runtime on it.
    return max(30.0, 4 * compile_ns / 1e9)


def _kernel_name(paths: Sequence[str]) -> str | None:
    if not paths:
        return None
    stem = os.path.basename(paths[0])
    return stem.rsplit(".", 1)[0] if "." in stem else stem

