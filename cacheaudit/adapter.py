"""Adapters: in-process hooks, one module per runtime, their activation, and what they share.

Each adapter module exposes `ADAPTER`, an object with `runtime` (the runtime id), `module` (the
module whose import makes the runtime available: "triton", "torch.utils.cpp_extension", ...),
`install()`, `uninstall()` and `installed()`. Installing twice is a no-op, uninstalling restores
the runtime's originals (a wrapper another tool put on top of ours stays, and ours under it passes
every call through), and both fail open: an adapter that cannot install says so once on stderr
and leaves the runtime as it was.

`activate()` arms every adapter: one whose runtime is already imported installs now, the others
right after their runtime is first imported (a post-import hook on `sys.meta_path`). Neither the
runtimes nor the adapter modules are imported before that: `import cacheaudit.adapters` and
`activate()` cost the start-up hook almost nothing in a process that never uses a runtime.

Adding a runtime: a module here with an `ADAPTER`, and one line in `_RUNTIME_MODULES`.

Shared by the adapter modules: patching with exact restoration (`apply_patch`,
`apply_patches`, `restore_patches`, `Switch`), one report per kind of problem (`ProblemLog`), the
environment at the moment of an observation (`environ_snapshot`, decoded later by
`environ_text`, `run_for`), in-memory file states (`memory_state`) and JSON-able evidence
(`jsonable`).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cacheaudit.ledger import RunInfo
    from cacheaudit.model import FileState

class Adapter(Protocol):
    runtime: str
    module: str

    def install(self) -> None: ...

    def uninstall(self) -> None: ...

    def installed(self) -> bool: ...

    # Optional: `flush()`, for adapters that batch what they record (hits on a hot path) and
    # must write it out before an audit reads the ledger.


def _report(problem: str) -> None:
    # Never `warnings.warn`: under `-W error` (or pytest's filterwarnings = error) a warning
    # raised from a post-import hook would fail the user's import.
    from cacheaudit.recorder import report_problem

    report_problem(problem)


# ------------------------------------------------------------------------------ post-import hooks

_hooks: dict[str, list[Callable[[ModuleType], None]]] = {}
_lock = threading.RLock()
_resolving: set[str] = set()


class _HookedLoader:
    """Runs the real loader, then the hooks registered for the module. (Plain classes: the
    import protocol needs no `importlib.abc` base, which would cost every start-up ~30 ms.)"""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        _run_hooks(self._name, module)

    def __getattr__(self, name: str) -> object:
        # Loaders carry extras (get_resource_reader, is_package, ...) that importers ask for.
        return getattr(self._loader, name)


class _PostImportFinder:
    def find_spec(self, fullname: str, path: Sequence[str] | None,
                  target: ModuleType | None = None) -> Any:
        if fullname not in _hooks or fullname in _resolving:
            return None
        _resolving.add(fullname)
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            _resolving.discard(fullname)
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HookedLoader(spec.loader, fullname)  # type: ignore[assignment]
        return spec


_FINDER = _PostImportFinder()


def _run_hooks(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _hooks.pop(name, [])
    for callback in callbacks:
        try:
            callback(module)
        except Exception as exc:  # noqa: BLE001 - an adapter never breaks the import
            with contextlib.suppress(Exception):
                _report(f"could not hook {name}: {type(exc).__name__}: {exc}")


def when_imported(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call `callback(module)` now if `name` is imported, else right after its first import."""
    module = sys.modules.get(name)
    if module is not None:
        _hooks.setdefault(name, []).append(callback)
        _run_hooks(name, module)
        return
    with _lock:
        _hooks.setdefault(name, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def forget_hooks() -> None:
    with _lock:
        _hooks.clear()
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(_FINDER)


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
        _report(f"{self._label}: {problem}" if self._label else problem)

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
    from cacheaudit.runtimes import environment as envvars

    text = {_text(name): _text(value) for name, value in snapshot.items()}
    compile_env = envvars.compile_environment(text)
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


# ------------------------------------------------------------------------------ fork


def _after_fork_in_child() -> None:
    # A lock held by another thread at fork() stays held forever in the child.
    global _lock
    _lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
