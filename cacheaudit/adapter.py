"""Adapters: in-process hooks, one module per runtime, their activation, and what they share.

Each runtime package with an adapter exposes `ADAPTER`, an instance of a subclass of `Adapter`,
the base here that owns the lifecycle: `install()` (a no-op while installed; all the patches or
none), `uninstall()` (the runtime's originals back exactly: a wrapper another tool put on top of
ours stays, and ours under it passes every call through), `installed()`, the lock (made anew in
a forked child), one report per kind of problem (`ProblemLog`), and `flush()`. A subclass
declares what it patches (`_replacements`, or `_install` for more than one step) and implements
its hooks; both lifecycle calls fail open: an adapter that cannot install says so once on stderr
and leaves the runtime as it was.

`activate()` (in the registry, `cacheaudit.runtimes`) arms every adapter: one whose runtime is
already imported installs now, the others right after their runtime is first imported (a
post-import hook on `sys.meta_path`, `cacheaudit.importhooks`). Neither the runtimes nor the
adapter modules are imported before that: arming costs the start-up hook almost nothing in a
process that never uses a runtime.

Shared by the adapter modules: patching with exact restoration (`apply_patch`,
`apply_patches`, `restore_patches`, `Switch`), the hit buffer of an adapter that batches what it
sees on a runtime's hit path (`HitBuffer`, `Hit`), the environment at the moment of an
observation (`environ_snapshot`, decoded later by `environ_text`, `run_for`), in-memory file
states (`memory_state`) and JSON-able evidence (`jsonable`).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import threading

# weakref.WeakSet is this class; `threading` has imported its module already, while importing
# `weakref` would cost the start-up hook about a millisecond.
from _weakrefset import WeakSet
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from cacheaudit.problems import report_problem

if TYPE_CHECKING:
    from cacheaudit.ledger import RunInfo
    from cacheaudit.model import CompileRecord, FileState


# ------------------------------------------------------------------------------ patching


class Switch:
    """Whether the wrappers of one installation record. Uninstalling turns it off, so that a
    wrapper of ours left in place under another tool's passes every call straight through; a
    new installation gets a new switch, so that an old wrapper never comes back to life."""

    __slots__ = ("on",)

    def __init__(self, on: bool = True) -> None:
        self.on = on


class Patch:
    """One attribute replaced on a module or class, with what was there before."""

    __slots__ = ("had_own", "name", "original", "owner", "replacement")

    def __init__(self, owner: object, name: str, had_own: bool, original: object,
                 replacement: object) -> None:
        self.owner = owner
        self.name = name
        self.had_own = had_own
        self.original = original
        self.replacement = replacement

    @property
    def label(self) -> str:
        return f"{getattr(self.owner, '__name__', self.owner)}.{self.name}"

    def on_top(self) -> bool:
        """Whether the attribute is still our replacement (nobody wrapped or replaced it)."""
        return vars(self.owner).get(self.name) is self.replacement


def apply_patch(owner: object, name: str, replacement: object) -> Patch:
    """Set `owner.name = replacement`, remembering whether `owner` had its own attribute (a
    class may inherit it: restoring then deletes ours rather than copying the base's down)."""
    namespace = vars(owner)
    patch = Patch(owner=owner, name=name, had_own=name in namespace,
                  original=namespace.get(name), replacement=replacement)
    setattr(owner, name, replacement)
    return patch


def apply_patches(replacements: Iterable[tuple[object, str, object]]) -> list[Patch]:
    """`apply_patch` for each (owner, name, replacement), all or none: when one fails, those
    already applied are restored before the error propagates."""
    patches: list[Patch] = []
    try:
        for owner, name, replacement in replacements:
            patches.append(apply_patch(owner, name, replacement))
    except BaseException:
        restore_patches(patches)
        raise
    return patches


def restore_patches(patches: Sequence[Patch]) -> list[str]:
    """Undo patches, newest first; returns the names someone else wrapped or replaced since,
    which are left as found (turn their installation's `Switch` off)."""
    left = []
    for patch in reversed(patches):
        if not patch.on_top():
            left.append(patch.label)
            continue
        if patch.had_own:
            setattr(patch.owner, patch.name, patch.original)
        else:
            delattr(patch.owner, patch.name)
    return left


# ------------------------------------------------------------------------------ problems


class ProblemLog:
    """An adapter's problems on stderr, one line per kind: a hook that fails on every call of a
    hot path must cost one line, not one per call."""

    __slots__ = ("_label", "_seen")

    _LIMIT = 64

    def __init__(self, label: str = "") -> None:
        self._label = label
        self._seen: set[str] = set()

    def __call__(self, problem: str, kind: str | None = None) -> None:
        kind = problem.split(":", 1)[0][:80] if kind is None else kind
        seen = self._seen
        if kind in seen or len(seen) >= self._LIMIT:
            return
        seen.add(kind)
        report_problem(f"{self._label}: {problem}" if self._label else problem)

    def clear(self) -> None:
        self._seen.clear()


# ------------------------------------------------------------------------------ environment


class Environ(dict[Any, Any]):
    """The process environment at an observation: `os.environ`'s own data (bytes on POSIX),
    copied when it changed and shared by every observation while it does not. Comparing it with
    the live data is one C-level dict comparison (~0.3 us for 35 variables); decoding (text,
    redaction, the run) waits for the write, once per snapshot (`environ_text`)."""

    __slots__ = ("disabled",)

    disabled: bool
    """`CACHEAUDIT_DISABLE` was set: record nothing observed under it."""


_last_environ: Environ | None = None


def environ_data() -> dict[Any, Any] | None:
    """The dict behind `os.environ` (bytes keys on POSIX), compared and copied at C speed; None
    where the interpreter has no such attribute."""
    data = getattr(os.environ, "_data", None)
    return data if isinstance(data, dict) else None


def environ_snapshot() -> Environ:
    """The environment now, as the snapshot of the previous call when nothing changed."""
    global _last_environ
    data = getattr(os.environ, "_data", None)
    if not isinstance(data, dict):
        data = dict(os.environ)
    last = _last_environ
    if last is not None and data == last:
        return last
    snapshot = Environ(data)
    raw = snapshot.get(b"CACHEAUDIT_DISABLE", snapshot.get("CACHEAUDIT_DISABLE"))
    # recorder.disabled's rule: set, and neither empty nor "0".
    snapshot.disabled = raw is not None and raw not in (b"", b"0", "", "0")
    _last_environ = snapshot
    return snapshot


def _text(value: object) -> str:
    return os.fsdecode(value) if isinstance(value, bytes) else str(value)


_decoded: dict[int, tuple[Environ, dict[str, str], dict[str, str]]] = {}


def environ_text(snapshot: Environ) -> tuple[dict[str, str], dict[str, str]]:
    """(every variable as text, the compile-affecting environment), once per snapshot: the
    registry lookup and redaction cost ~50 us, which no hit path may pay per record."""
    memo = _decoded.get(id(snapshot))
    if memo is not None and memo[0] is snapshot:
        return memo[1], memo[2]
    from cacheaudit.recorder import recorded_environment

    text = {_text(name): _text(value) for name, value in snapshot.items()}
    compile_env = recorded_environment(text)
    if len(_decoded) > 64:
        _decoded.clear()
    _decoded[id(snapshot)] = (snapshot, text, compile_env)
    return text, compile_env


_runs: dict[tuple[int, str, str | None, str | None], RunInfo] = {}


def run_for(env: Mapping[str, str], observer: str) -> RunInfo:
    """The run a record observed under `env` belongs to, worked out once per process and run
    variables (without CACHEAUDIT_RUN it reads /proc)."""
    from cacheaudit.recorder import current_run
    from cacheaudit.switches import RUN_LABEL_VARIABLE, RUN_VARIABLE

    memo_key = (os.getpid(), observer, env.get(RUN_VARIABLE), env.get(RUN_LABEL_VARIABLE))
    run = _runs.get(memo_key)
    if run is None:
        if len(_runs) > 64:
            _runs.clear()
        run = _runs[memo_key] = current_run(env, observer, in_process=True)
    return run


# ------------------------------------------------------------------------------ evidence


def memory_path(name: str) -> str:
    """The synthetic path of something a runtime holds in memory under `name`."""
    from cacheaudit.model import MEMORY_PREFIX

    return MEMORY_PREFIX + name.lstrip("/")


def memory_state(name: str, content: bytes | None = None, *, size: int = -1,
                 digest: str | None = None) -> FileState:
    """A FileState for bytes held in memory: their real size and xxh3-128 (from `content`, or
    given), no stat fields (there is no file), settled (bytes held by Python cannot change)."""
    from cacheaudit.model import FileState, content_digest

    if content is not None:
        size, digest = len(content), content_digest(bytes(content))
    return FileState(path=memory_path(name), exists=True, size=size, mtime_ns=0, ctime_ns=0,
                     inode=0, digest=digest, settled=True)


def jsonable(value: object) -> object:
    """A runtime's value as JSON holds it: dataclasses (Triton's GPUTarget) and dicts as dicts,
    sequences as lists, bytes and paths as text, anything else as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "surrogateescape")
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, os.PathLike):
        return _text(os.fspath(value))
    import dataclasses

    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


# ------------------------------------------------------------------------------ the hit buffer


class Hit:
    """Hits of one group (one entry, under one environment, ...) since the last write: one
    record however many there were. A subclass adds what its runtime's record needs."""

    __slots__ = ("count", "environ", "last_ns", "ns")

    def __init__(self, ns: int, environ: Environ) -> None:
        self.ns = ns
        """When the group's first hit was seen."""
        self.environ = environ
        """What it was seen under (its test, run and ledger): one snapshot while unchanged."""
        self.count = 1
        self.last_ns = ns


def _first_seen(hit: Hit) -> int:
    return hit.ns


class HitBuffer:
    """Hits noted on a runtime's hit path, grouped by a slot (what makes two hits one record),
    and written later in one transaction by the adapter's `flush()`: with the next record that
    must not wait (a compile), when `limit` groups are pending or the oldest is `age_ns` old
    (checked at the next hit: an idle process waits for the next compile), at uninstall and at
    exit. A process killed with SIGKILL loses what is pending; a forked child drops its
    parent's, which the parent writes.

    A hit path that must be cheaper still reads the fields itself: `last` holds the previous
    hit's group with what that hit served (and whatever else the hit path compares), so that a
    repeat is counted without working out its slot (cuda.core's)."""

    __slots__ = ("age_ns", "due_ns", "last", "limit", "lock", "pending")

    def __init__(self, limit: int, age_ns: float) -> None:
        self.pending: dict[Hashable, Hit] = {}
        self.lock = threading.Lock()
        """Guards the other fields: hits come from any thread, `take` swaps them."""
        self.limit = limit
        self.age_ns = age_ns
        self.due_ns: float = 0
        """When the oldest pending group is `age_ns` old."""
        self.last: tuple[Any, ...] | None = None
        """(group, *served) of the last hit noted with `served`; None after a write."""

    def __len__(self) -> int:
        return len(self.pending)

    def note(self, slot: Hashable, now: int, new: Callable[[], Hit],
             served: tuple[Any, ...] | None = None) -> bool:
        """Count a hit on the group `slot`; `new()` makes the group at its first hit (under the
        lock, so that no other thread counts on a group half made). `served`, when given, is
        kept as `last`, after the group: `(group, *served)`. Returns whether the buffer is due
        for a write."""
        with self.lock:
            pending = self.pending
            group = pending.get(slot)
            if group is not None:
                group.count += 1
                group.last_ns = now
            else:
                if not pending:
                    self.due_ns = now + self.age_ns
                group = pending[slot] = new()
            self.last = None if served is None else (group, *served)
            return len(pending) >= self.limit or now > self.due_ns

    def take(self) -> list[Hit]:
        """Every pending group, oldest first; the buffer is empty after."""
        with self.lock:
            pending, self.pending = self.pending, {}
            self.last = None
        return sorted(pending.values(), key=_first_seen)

    def after_fork(self) -> None:
        # The pending hits are the parent's to write; a lock another thread held at fork()
        # would stay held in the child forever.
        self.lock = threading.Lock()
        self.pending = {}
        self.last = None


# ------------------------------------------------------------------------------ the base


class Adapter:
    """What every runtime's adapter is: the patch lifecycle, the lock, fork handling, one report
    per kind of problem, and the writing of what its hit buffer holds.

    A subclass sets `runtime`, `module` and `observer`, declares what an installation patches
    (`_replacements`, or `_install` where it takes more than one step), and implements its hooks
    (`_uninstalled`, `_after_fork_in_child`, and `_records` where it buffers hits). Its wrappers
    record while the `Switch` they were made with is on; that switch is turned off for good when
    the installation ends, so that a wrapper of ours left under another tool's passes every call
    through, and never comes back to life."""

    runtime: str = ""
    """The id of the runtime the records are of ("triton")."""
    module: str = ""
    """The module whose import makes the runtime available ("torch.utils.cpp_extension")."""
    observer: str = ""
    """The records' observer ("adapter:triton")."""

    def __init__(self, *, label: str = "", hits: HitBuffer | None = None,
                 problems: ProblemLog | None = None) -> None:
        self._lock = threading.RLock()
        self._switch = Switch(on=False)
        self._patches: list[Patch] = []
        """Every patch of the current installation, in the order applied."""
        self._problem = ProblemLog(label) if problems is None else problems
        self._hits = hits
        self._exit_armed = False
        _LIVE.add(self)

    # ---------------------------------------------------------------- what a subclass declares

    def _replacements(self, switch: Switch) -> Iterable[tuple[object, str, object]]:
        """(owner, attribute, replacement) for each attribute an installation replaces, with
        wrappers that record while `switch` is on. Imports the runtime, and may remember what
        the wrappers need; raising leaves the runtime as it was."""
        raise NotImplementedError

    def _install(self, switch: Switch) -> None:
        """Everything an installation patches, each step through `_apply`; raising undoes every
        step. By default, `_replacements`, all or none."""
        self._apply(self._replacements(switch))

    def _uninstalled(self) -> None:
        """Once the patches are restored: drop what the installation held."""

    def _after_fork_in_child(self) -> None:
        """In a forked child, once the lock and the hit buffer are new."""

    def _records(self, hits: list[Any], observed: Sequence[Any]
                 ) -> Iterable[tuple[CompileRecord, Mapping[str, str]]]:
        """The records for `hits` (taken from the buffer) and `observed` (what was handed to
        `_write_with_hits`), each with the environment, as text, it was observed under."""
        raise NotImplementedError

    # ---------------------------------------------------------------- the lifecycle

    def installed(self) -> bool:
        """Whether the hooks record; they may sit under another tool's wrapper."""
        return self._switch.on

    def install(self) -> None:
        """Install the hooks. A no-op while installed, also when another tool has wrapped ours
        since (it calls through ours: wrapping again would record every call twice). Fails
        open: anything missing leaves the runtime as it was, and is reported once."""
        with self._lock:
            if self.installed():
                return
            if self._patches:
                # Installed in part (a hook of ours displaced, or only a first step taken):
                # start again from what is there now.
                self._restore()
            switch = Switch()
            try:
                self._install(switch)
            except Exception as exc:  # noqa: BLE001 - never break the import of the runtime
                switch.on = False
                self._report("install", f"cannot hook {self.module}: {type(exc).__name__}: {exc}")
                self._restore()
                return
            self._switch = switch
            self._arm_exit()

    def uninstall(self) -> None:
        """Write what is buffered, then put back exactly what was there. A wrapper someone put
        over ours stays, and ours under it passes every call straight through."""
        with self._lock:
            self.flush()
            self._restore()

    def flush(self) -> None:
        """Write what the hit buffer holds now (the pytest plugin calls this before it reads
        the ledger). Never raises; nothing to do for an adapter that writes as it observes."""
        if self._hits is not None:
            self._write_with_hits(())

    def _apply(self, replacements: Iterable[tuple[object, str, object]]) -> list[Patch]:
        """`apply_patches`, all or none, into this installation (restored by `_restore`)."""
        patches = apply_patches(replacements)
        self._patches.extend(patches)
        return patches

    def _restore(self) -> None:
        self._switch.on = False
        left = restore_patches(self._patches)
        self._patches = []
        if left:
            self._left_in_place(left)
        self._uninstalled()

    def _left_in_place(self, left: Sequence[str]) -> None:
        self._report("uninstall", f"{', '.join(left)} wrapped or replaced by someone else after "
                                  "cacheaudit: left in place, passing every call through")

    def _arm_exit(self) -> None:
        if self._hits is not None and not self._exit_armed:
            self._exit_armed = True
            atexit.register(self.flush)

    def _report(self, where: str, problem: BaseException | str) -> None:
        """One line on stderr per kind of problem (where it happened), however often it recurs."""
        text = problem if isinstance(problem, str) else f"{type(problem).__name__}: {problem}"
        self._problem(text, kind=where)

    def _guard(self, action: Callable[..., Any], *args: Any) -> Any:
        """Run cacheaudit's own work; any failure is reported once and swallowed (the
        runtime's call goes on as if cacheaudit were absent)."""
        try:
            return action(*args)
        except Exception as exc:  # noqa: BLE001 - fail open inside the runtime
            self._problem(f"{type(exc).__name__}: {exc}")
            return None

    # ---------------------------------------------------------------- writing

    def _write_with_hits(self, observed: Sequence[Any]) -> None:
        """Write the pending hits and what was just `observed` (what must not wait: a compile's
        record), in one transaction per ledger and run. Never raises."""
        with self._lock:
            hits = self._hits.take() if self._hits is not None else []
            if not hits and not observed:
                return
            try:
                self._write(self._records(hits, observed))
            except Exception as exc:  # noqa: BLE001 - fail open
                self._report("flush", exc)

    def _write(self, records: Iterable[tuple[CompileRecord, Mapping[str, str]]]) -> None:
        """Each record into the ledger and run of the environment it was observed under, one
        transaction per ledger and run, through the ledger this process keeps open (closing
        SQLite's last connection checkpoints the WAL, ~10 ms), which spools what it cannot
        take."""
        from cacheaudit.ledger import default_ledger_path
        from cacheaudit.recorder import write_held

        batches: dict[tuple[str, str], tuple[RunInfo, list[CompileRecord]]] = {}
        for record, env in records:
            run = run_for(env, self.observer)
            batch = batches.setdefault((default_ledger_path(env), run.run_uuid), (run, []))
            batch[1].append(record)
        for (path, _), (run, batch_records) in batches.items():
            problem = write_held(batch_records, run, path)
            if problem:
                self._report("ledger", problem)


_LIVE: WeakSet[Adapter] = WeakSet()
"""Every adapter object, for the fork handler."""


# ------------------------------------------------------------------------------ fork


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork() stays held forever in the child.
    for adapter in list(_LIVE):
        adapter._lock = threading.RLock()
        if adapter._hits is not None:
            adapter._hits.after_fork()
        with contextlib.suppress(Exception):
            adapter._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
