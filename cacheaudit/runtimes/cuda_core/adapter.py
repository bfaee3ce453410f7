"""cuda.core's program cache (cuda-core >= 1.2), seen from the inside.

`Program` is an immutable Cython type: `Program.compile` cannot be patched. What it does with
`cache=` can be observed, though (cuda_core/cuda/core/_program.pyx, checked against 1.2.2):

1. it derives the key by calling `cuda.core.utils._program_cache.make_program_cache_key(code=,
   code_type=, options=, target_type=)`, looked up on that package at call time;
2. it calls `cache.get(key)` (the ABC's `get` calls `__getitem__`, which raises KeyError on a
   miss) and, on a hit, wraps the bytes in a new ObjectCode;
3. on a miss it compiles and stores `cache[key] = object_code` (`__setitem__`).

The cache must be a `ProgramCacheResource` instance (Program.compile checks). So this adapter:

- observes keys: wraps `make_program_cache_key` in `cuda.core.utils._program_cache` and
  `cuda.core.utils` (`keys.key_observer`), and remembers what each key was made from (source,
  options, target, name expressions, `extra_digest`), without changing the key or any
  exception;
- observes the two caches cuda.core ships: `FileStreamProgramCache.__getitem__`/`__setitem__`
  (a hit is "disk-hit", the entry is `<root>/entries/<2>/<62>`) and `InMemoryProgramCache`'s
  ("memory-hit", no entry on disk); a store is a "compile" record;
- `AuditedProgramCache(inner)` wraps any other `ProgramCacheResource` (a user's own backend) and
  records the same way; pass it as `cache=`.

What a compile record carries (`extra["key_inputs"]`, `keys.describe_key`): what the key
covered, field by field, so that the policy can recompute it (`keys.recompute_key`); whether
`extra_digest` was given and by whom (this process's `cacheaudit.headers`, whose files are then
known, or the caller); and, in the case cuda.core's guard misses (a program name without a
directory, a quoted `#include`, no `extra_digest`: NVRTC then reads the header from the
process's working directory, and the key never sees it), the headers NVRTC read, from its own
trace (`cacheaudit.headers`), as the record's include graph.

Cost on a hit (benchmarks/bench_cuda_core.py, budget 1.05x): the runtime's disk hit is ~30-60
µs, and after its system calls every object the adapter's code touches is a cache miss, so the
hit path touches few. The key observer notes a key only the first time it is made (equal keys,
equal inputs), and binds cuda-core 1.2.2's keyword arguments directly. The cache hook counts a
repeat of the previous hit inline (same cache object, key and bytes: compared with the bytes
that hit served, held until the next write), checking what it can before the runtime's call;
the rest goes the whole way (`_Recorder.hit`): the hit is counted in a buffer, grouped by key,
cache, served bytes (an xxh3) and environment (a snapshot shared while it does not change, so
that the test, the run, the ledger and the compile environment are those of the hit, not of the
write; "does not change" is a generation that os._Environ's __setitem__ and __delitem__, wrapped
while the adapter is installed, bump, and at which they drop the repeat memo). A lookup that
misses is timed: the compile a store ends started then. Hits under `CACHEAUDIT_DISABLE` are not
counted. The buffer is written, one record per group, in one transaction through the ledger the
process keeps open: with every compile record, when 256 distinct groups are pending, at the
first hit more than 5 s after the oldest pending one (the age is checked only when a hit comes:
an idle process's buffer waits for the next compile, `flush()`, uninstall or exit). A file a
record covers is re-checked at write time, and a hit served after it changed (the last hit of
its group, as the fast path times it) is marked (`extra["changed_before_hit"]`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any

import xxhash

from cacheaudit.adapter import (
    Adapter,
    Environ,
    Hit,
    HitBuffer,
    ProblemLog,
    Switch,
    environ_data,
    environ_snapshot,
    environ_text,
    memory_state,
)
from cacheaudit.digest import StateCache
from cacheaudit.model import CompileRecord, Event, FileState, IncludeGraph
from cacheaudit.recorder import modified_since, test_id_from
from cacheaudit.runtimes.cuda_core.headers import (
    HeaderFingerprint,
    fingerprint_headers,
    header_digest,
    issued,
)
from cacheaudit.runtimes.cuda_core.keys import (
    ORIGINAL_ATTRIBUTE,
    as_key_bytes,
    covered_reads,
    describe_key,
    hit_key_inputs,
    is_unguarded,
    key_observer,
    observer_switch,
)

__all__ = [
    "ADAPTER",
    "AuditedProgramCache",
    "CudaCoreAdapter",
    "HeaderFingerprint",
    "describe_key",
    "fingerprint_headers",
    "header_digest",
    "is_unguarded",
]

RUNTIME = "cuda-core"
OBSERVER = "adapter:cuda_core"

_CONTEXTS_MAX = 4096
"""Keys whose inputs are remembered (the oldest go first)."""
_PENDING_MAX = 256
"""Distinct (key, entry, bytes, test) hit groups kept before a write."""
_PENDING_AGE_NS = 5_000_000_000

_time_ns = time.time_ns
_xxh3 = xxhash.xxh3_128_hexdigest
_ENVIRON_DATA = environ_data()


class _Local(threading.local):
    quiet = False
    """Set while an AuditedProgramCache calls its inner cache. A class default, not
    `getattr(local, "quiet", False)`: a missing attribute of a thread-local raises and catches
    an AttributeError inside getattr, ~0.45 µs."""


_LOCAL = _Local()
_QUIETING: list[object] = []
"""One token per `quietly` section running in any thread (append and remove are atomic): while
it is empty, which is always without an AuditedProgramCache, hooks skip the thread-local."""


# ------------------------------------------------------------------------------ environment changes

# Comparing the whole environment with the last snapshot (a C-level dict comparison) was half of
# a hit's cost, ~10 ns per variable. While the adapter is installed, the two methods of
# os._Environ that every change made through os.environ or os.environb goes through (setting,
# deleting; update, pop, clear and monkeypatch use them) bump a generation, and a hit compares
# one int. A change that bypasses them (`os.putenv`, C code) is invisible to os.environ, hence
# to the full comparison too.

_ENVIRON_CLASS: Any = getattr(os, "_Environ", None)
if _ENVIRON_CLASS is None or not isinstance(os.environ, _ENVIRON_CLASS):
    _ENVIRON_CLASS = type("_NoEnvironClass", (), {"__setitem__": None, "__delitem__": None})
_NOT_WATCHING = object()
_GENERATIONS = itertools.count(1)
"""next() on it is atomic: two concurrent changes never publish the same generation."""
_environ_generation = 0
_environ_watch: tuple[object, object] = (_NOT_WATCHING, _NOT_WATCHING)
"""Our os._Environ.__setitem__ and __delitem__; a hit trusts the generation only while both are
in place (someone may restore an original they saved before we installed ours)."""


def _next_environ_generation() -> None:
    global _environ_generation
    _environ_generation = next(_GENERATIONS)
    _RECORDER.last = None


def _environ_watcher(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def method(self: Any, *args: Any) -> Any:
        global _environ_generation
        try:
            return original(self, *args)
        finally:
            # After the change, never before it: a hit that reads the old generation keeps
            # the old snapshot (right when that hit began); every hit after this line reads
            # a new one, and snapshots the environment after reading it. Then the repeat
            # memo goes, in that order (the hook's fast path does not read the generation:
            # `last` is set only under the generation it was snapshot at, see `add`).
            _environ_generation = next(_GENERATIONS)
            _RECORDER.last = None

    setattr(method, ORIGINAL_ATTRIBUTE, original)
    return method


def _environ_watched() -> bool:
    return (_ENVIRON_CLASS.__setitem__ is _environ_watch[0]
            and _ENVIRON_CLASS.__delitem__ is _environ_watch[1])


# ------------------------------------------------------------------------------ state


class _Hit(Hit):
    """Hits of one key, served the same bytes from the same cache, under one environment (one
    test), since the last write: one record however many there were (a hit costs ~60 µs, a
    ledger record far more). The fields that group hits are dict keys: they must be hashable."""

    __slots__ = ("digest", "event", "files", "key", "size")

    def __init__(self, ns: int, event: Event, key: Hashable, files: Hashable, digest: str,
                 size: int, environ: Environ) -> None:
        super().__init__(ns, environ)
        self.event = event
        self.key = key
        self.files = files
        """The FileStreamProgramCache that served the hit (its entry path is worked out at
        write time), or None for a cache without files."""
        self.digest = digest
        self.size = size


@dataclasses.dataclass
class _Watch:
    """Files a key's binary was built from, as this process last saw them, and how they relate to
    the key: "untracked" (read from the working directory, outside the key) or "extra-digest"
    (covered by a cacheaudit.headers fingerprint the caller passed)."""

    kind: str
    states: tuple[FileState, ...]


class _Recorder(HitBuffer):
    """The adapter's memory: keys and what they were made from, watched files, and the hit
    buffer (`last`: the group of the last hit and the bytes it served, held until the next
    write, with which the next hit is compared)."""

    # Slots: a hit reads several of these, from the object itself rather than a separate values
    # array (one memory fetch fewer on a path that pays for each).
    __slots__ = ("contexts", "misses", "problems", "seen", "states", "watch")

    def __init__(self) -> None:
        super().__init__(limit=_PENDING_MAX, age_ns=_PENDING_AGE_NS)
        self.contexts: dict[bytes, tuple[int, dict[str, Any]]] = {}
        """Key -> (when it was first made, what from). A key made again is not noted again
        (`keys.key_observer`): equal keys hash equal inputs."""
        self.misses: dict[bytes, int] = {}
        """Key -> when a lookup of it last missed: the start of the compile that a store of
        it ends (a key made again is not timed by the observer)."""
        self.watch: dict[bytes, _Watch] = {}
        self.problems = ProblemLog()
        self.states = StateCache()
        self.seen: tuple[int, Environ | None, bool] = (-1, None, False)
        """(environment generation, snapshot, its `disabled`) at the last hit: the snapshot is
        shared by the next hits while nothing changes. One attribute, so that a hit reads a
        consistent triple; generation -1: not watched, compare the whole environment."""

    # ---------------------------------------------------------------- hot paths

    def note_key(self, key: bytes, kwargs: dict[str, Any]) -> None:
        """A key `make_program_cache_key` returned, and what it was made from (the key
        observer's `note`)."""
        contexts = self.contexts
        contexts[key] = (_time_ns(), kwargs)
        if len(contexts) > _CONTEXTS_MAX:
            self.trim()

    def trim(self) -> None:
        for table in (self.contexts, self.misses):
            while len(table) > _CONTEXTS_MAX:
                try:
                    table.pop(next(iter(table)))  # type: ignore[attr-defined]
                except (StopIteration, KeyError, RuntimeError):
                    break

    def missed(self, key: object) -> None:
        """A lookup of `key` missed: a compile starts (the hooks' exception path only)."""
        misses = self.misses
        misses[as_key_bytes(key)] = _time_ns()
        if len(misses) > _CONTEXTS_MAX:
            self.trim()

    def hit(self, key: Hashable, data: bytes, event: Event, files: Hashable,
            source: object) -> None:
        """One served lookup, the whole way: the hooks' fast path (`_getitem_hook`) counts a
        repeat of the previous hit itself, and comes here for the rest. `source` is the cache
        object that served it (what the fast path compares by identity)."""
        generation, environ, disabled = self.seen
        if (generation != _environ_generation
                or _ENVIRON_CLASS.__setitem__ is not _environ_watch[0]
                or _ENVIRON_CLASS.__delitem__ is not _environ_watch[1]):
            generation, environ, disabled = self.environ_now(environ)
        if disabled:
            return
        now = _time_ns()
        last = self.last
        # Most hits repeat the previous one: same key, cache and environment, same bytes. Those
        # are compared with the previous hit's bytes (the same object from a memory cache, a
        # memcmp from a disk one) instead of hashed: on a disk hit the hash function's code,
        # cold again after the runtime's system calls, cost more than all the rest.
        if (last is not None and type(data) is bytes and last[0].environ is environ
                and last[2] is source and last[0].event == event and last[3] == key
                and (data is last[1] or data == last[1]) and self.count_repeat(last, now)):
            return
        self.add(key, data, event, files, source, environ, generation, now)

    def count_repeat(self, memo: Any, now: int) -> bool:
        """Count one more hit of the group `memo` (`last`, as read before) at `now`, unless it
        is no longer the last one (written or cleared meanwhile); whether it was counted."""
        # acquire/release rather than `with`: the context-manager protocol costs twice as much.
        lock = self.lock
        lock.acquire()
        try:
            counted = self.last is memo
            if counted:
                group = memo[0]
                group.count += 1
                group.last_ns = now
                due = now > self.due_ns
        finally:
            lock.release()
        if counted and due:
            _flush_hits()
        return counted

    def add(self, key: Hashable, data: bytes, event: Event, files: Hashable, source: object,
            environ: Environ, generation: int, now: int) -> None:
        """A hit that does not repeat the previous one: found by key, cache, environment and
        the served bytes' hash."""
        digest = _xxh3(data)
        # The snapshot by id: it is one object while the environment does not change, and the
        # group holds it, so that its id cannot be reused while the group is pending.
        slot = (key, event, files, digest, id(environ))
        # Only immutable bytes are kept to compare with: a buffer the cache may change later
        # must be hashed again. Nor is a hit whose environment is not watched (generation
        # -1): the fast path would not see it change.
        served = ((data, source, key) if type(data) is bytes and generation >= 0 else None)
        due = self.note(slot, now, lambda: _Hit(now, event, key, files, digest, len(data),
                                                 environ), served)
        if generation != _environ_generation:
            # The environment changed since this hit's snapshot, perhaps before its watcher
            # cleared `last` and we set it: the next hit must look again.
            self.last = None
        if due:
            _flush_hits()

    def environ_now(self, last: Environ | None) -> tuple[int, Environ, bool]:
        """The environment of a hit when the generation says it may have changed (or is not
        kept), and whether it disables recording: `last` again while it is equal, so that hits
        keep sharing one snapshot. With the generation it holds at (-1: not watched)."""
        # The generation is read before the environment: a change after this line bumps it
        # again, and the next hit looks again.
        generation = _environ_generation if _environ_watched() else -1
        if last is None or _ENVIRON_DATA is None or last != _ENVIRON_DATA:
            last = environ_snapshot()
        seen = self.seen = (generation, last, last.disabled)
        return seen

    # ---------------------------------------------------------------- problems

    def problem(self, exc: BaseException | str, where: str) -> None:
        text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.problems(f"cuda.core adapter ({where}): {text}", kind=where)

    # ---------------------------------------------------------------- compiles

    def store(self, key: Hashable, value: object, event: Event, entry: str | None) -> None:
        """A store after a compile: build the compile record now, write it with pending hits."""
        environ = environ_snapshot()
        if environ.disabled:
            return
        now = time.time_ns()
        key_bytes = as_key_bytes(key)
        context = self.contexts.get(key_bytes)
        cwd = os.getcwd()
        notes: list[str] = []
        extra: dict[str, Any] = {"cache": event.split("-")[0]}
        modified: tuple[str, ...] = ()
        graph: IncludeGraph | None = None
        tracked: tuple[str, ...] | None = None
        kernel = None
        started_ns = now
        if context is None:
            notes.append("the key's inputs were not observed: cacheaudit's key observer was not "
                         "installed when this key was made")
        else:
            started_ns, kwargs = context
            # The key was timed when first made; a compile after a later miss started then.
            started_ns = max(started_ns, self.misses.pop(key_bytes, 0))
            options = kwargs.get("options")
            kernel = getattr(options, "name", None)
            inputs = describe_key(kwargs.get("code"), kwargs.get("code_type", "c++"), options,
                                  kwargs.get("target_type", "cubin"),
                                  kwargs.get("name_expressions", ()),
                                  kwargs.get("extra_digest"))
            extra["key_inputs"] = inputs
            graph, tracked, watch_kind, graph_notes = covered_reads(kwargs, inputs)
            notes += graph_notes
            if graph is not None and watch_kind is not None:
                self.watch[key_bytes] = _Watch(watch_kind, tuple(f.state for f in graph.files))
            if graph is not None:
                late = modified_since([f.state for f in graph.files], started_ns)
                modified = tuple(s.path for s in late)
                working = [f.path for f in graph.files if not os.path.isabs(f.written)]
                if working:
                    extra["from_working_directory"] = working
        outputs = (self._output(entry, key_bytes, value),)
        record = CompileRecord(
            record_id="", event="compile", started_ns=started_ns, runtime=RUNTIME,
            kernel=kernel, key=key_bytes.hex(), entry=entry, cwd=cwd, graph=graph,
            outputs=outputs, tracked=tracked, exit_code=0, duration_ns=max(0, now - started_ns),
            observer=OBSERVER, notes=tuple(notes), extra=extra, modified_during_compile=modified)
        ADAPTER._write_with_hits(((record, environ),))

    def _output(self, entry: str | None, key: bytes, value: object) -> FileState:
        if entry is not None:
            state = self.states.capture(entry)
            if state.exists:
                return state
        return memory_state(f"program-cache/{key.hex()}", _value_bytes(value))

    # ---------------------------------------------------------------- hits, at flush time

    def hit_records(self, hits: Sequence[_Hit]) -> list[tuple[CompileRecord, Environ]]:
        records = []
        for hit in hits:
            key_bytes = as_key_bytes(hit.key)
            # cuda.core names the entry, as it did for the store: one layout, never copied here.
            entry = entry_path(hit.files, hit.key) if hit.files is not None else None
            context = self.contexts.get(key_bytes)
            extra: dict[str, Any] = {"cache": hit.event.split("-")[0], "hits": hit.count}
            if hit.count > 1:
                extra["last_hit_ns"] = hit.last_ns
            kernel = None
            if context is not None:
                kwargs = context[1]
                kernel = getattr(kwargs.get("options"), "name", None)
                digest = kwargs.get("extra_digest")
                fingerprint = issued(digest) if digest is not None else None
                extra["key_inputs"] = hit_key_inputs(kwargs, fingerprint)
                changes = self._changed_before(key_bytes, fingerprint, hit.last_ns)
                if changes:
                    extra["changed_before_hit"] = changes
            records.append((CompileRecord(
                record_id="", event=hit.event, started_ns=hit.ns,
                duration_ns=hit.last_ns - hit.ns, runtime=RUNTIME, kernel=kernel,
                key=key_bytes.hex(), entry=entry,
                outputs=(FileState(path=entry, exists=True, size=hit.size, digest=hit.digest,
                                   settled=False) if entry is not None else
                         memory_state(f"program-cache/{key_bytes.hex()}", size=hit.size,
                                      digest=hit.digest),),
                observer=OBSERVER, extra=extra), hit.environ))
        return records

    def _changed_before(self, key: bytes, fingerprint: HeaderFingerprint | None,
                        hit_ns: int) -> list[dict[str, Any]]:
        """Watched files whose content differs now and whose change predates the hit: the hit
        served a binary built from the old content."""
        watched: list[tuple[str, tuple[FileState, ...]]] = []
        watch = self.watch.get(key)
        if watch is not None:
            watched.append((watch.kind, watch.states))
        if fingerprint is not None and (watch is None or watch.kind != "extra-digest"):
            watched.append(("extra-digest", fingerprint.states))
        changes = []
        for kind, states in watched:
            for old in states:
                new = self.states.capture(old.path)
                if new.same_content(old):
                    continue
                when = max(new.mtime_ns, new.ctime_ns) if new.exists else 0
                if new.exists and when >= hit_ns:
                    continue  # changed after this hit: no proof the hit was stale
                changes.append({"kind": kind, "path": old.path, "recorded": old.to_dict(),
                                "current": new.to_dict()})
        return changes


def _value_bytes(value: object) -> bytes:
    try:
        from cuda.core.utils._program_cache._abc import _extract_bytes

        return bytes(_extract_bytes(value))
    except Exception:  # noqa: BLE001
        code = getattr(value, "code", value)
        return bytes(code) if isinstance(code, (bytes, bytearray, memoryview)) else b""


_RECORDER = _Recorder()


@contextlib.contextmanager
def quietly() -> Iterator[None]:
    """While an AuditedProgramCache calls its inner cache, the class hooks stay silent: one
    lookup, one record."""
    token = object()
    _QUIETING.append(token)
    previous = _LOCAL.quiet
    _LOCAL.quiet = True
    try:
        yield
    finally:
        _LOCAL.quiet = previous
        _QUIETING.remove(token)


# ------------------------------------------------------------------------------ the hooks


def _getitem_hook(original: Callable[[Any, Any], bytes], event: Event, switch: Switch
                  ) -> Callable[[Any, Any], bytes]:
    disk = event == "disk-hit"
    recorder = _RECORDER
    hit = recorder.hit
    # Made by `_install` after `_watch_environ`: these are the watchers of this installation
    # (or not ours at all, when the watch failed: then every hit takes the whole way).
    environ_class = _ENVIRON_CLASS
    set_watch, del_watch = _environ_watch

    @functools.wraps(original)
    def __getitem__(self: Any, key: Any) -> bytes:
        # The fast path: a repeat of the previous hit (same cache object, key and bytes, and
        # `last` is cleared when the environment changes) is counted here, inline. A hit
        # costs ~30-60 us and its budget is 5%; every object touched after the runtime's
        # system calls is a cache miss, so what can be compared before the call is (`last`
        # is checked again, under the lock, after it).
        memo = None
        if switch.on:
            try:
                last = recorder.last
                if (last is not None and last[2] is self and not _QUIETING and last[3] == key
                        and environ_class.__setitem__ is set_watch
                        and environ_class.__delitem__ is del_watch):
                    memo = last
            except Exception as exc:  # noqa: BLE001 - fail open
                recorder.problem(exc, "hit")
        try:
            data = original(self, key)
        except KeyError:
            if switch.on:
                try:
                    recorder.missed(key)
                except Exception as exc:  # noqa: BLE001 - fail open
                    recorder.problem(exc, "miss")
            raise
        if switch.on:
            try:
                if (memo is not None and (data is memo[1] or data == memo[1])
                        and recorder.count_repeat(memo, _time_ns())):
                    return data
                if not (_QUIETING and _LOCAL.quiet):
                    hit(key, data, event, self if disk else None, self)
            except Exception as exc:  # noqa: BLE001 - fail open
                recorder.problem(exc, "hit")
        return data

    setattr(__getitem__, ORIGINAL_ATTRIBUTE, original)
    return __getitem__


def entry_path(cache: object, key: object) -> str | None:
    path_for_key = getattr(cache, "_path_for_key", None)
    if path_for_key is None:
        return None
    return os.fspath(path_for_key(key))


def _setitem_hook(original: Callable[[Any, Any, Any], None], event: Event, switch: Switch
                  ) -> Callable[[Any, Any, Any], None]:
    disk = event == "disk-hit"

    @functools.wraps(original)
    def __setitem__(self: Any, key: Any, value: Any) -> None:
        original(self, key, value)
        if switch.on and not (_QUIETING and _LOCAL.quiet):
            try:
                _RECORDER.store(key, value, event, entry_path(self, key) if disk else None)
            except Exception as exc:  # noqa: BLE001 - fail open
                _RECORDER.problem(exc, "store")

    setattr(__setitem__, ORIGINAL_ATTRIBUTE, original)
    return __setitem__


class CudaCoreAdapter(Adapter):
    """Installs the key observer and the hooks on cuda.core's two program caches."""

    runtime = RUNTIME
    module = "cuda.core"
    observer = OBSERVER

    def __init__(self) -> None:
        super().__init__(hits=_RECORDER, problems=_RECORDER.problems)
        self._caches_hooked = False

    # ---------------------------------------------------------------- the lifecycle

    def installed(self) -> bool:
        """Whether cuda.core's two caches are hooked. The key observer alone (what an
        AuditedProgramCache asks for) is the first step of an installation, which `install()`
        completes."""
        return self._switch.on and self._caches_hooked

    def _install(self, switch: Switch) -> None:
        """Observe keys and both built-in caches."""
        from cuda.core.utils._program_cache import FileStreamProgramCache, InMemoryProgramCache

        self._observe_keys(switch)
        self._apply((cls, name, hook(getattr(cls, name), event, switch))
                    for cls, event in ((FileStreamProgramCache, "disk-hit"),
                                       (InMemoryProgramCache, "memory-hit"))
                    for name, hook in (("__getitem__", _getitem_hook),
                                       ("__setitem__", _setitem_hook)))
        self._caches_hooked = True

    def _uninstalled(self) -> None:
        self._caches_hooked = False

    def observe_keys(self) -> None:
        """Wrap `make_program_cache_key` where Program.compile and users find it. The first
        step of install(); AuditedProgramCache calls it on its own. Raises what stops it."""
        with self._lock:
            if self._switch.on:
                return
            switch = Switch()
            try:
                self._observe_keys(switch)
            except BaseException:
                switch.on = False
                self._restore()
                raise
            self._switch = switch
            self._arm_exit()

    def _observe_keys(self, switch: Switch) -> None:
        self._watch_environ()
        import cuda.core.utils as utils
        import cuda.core.utils._program_cache as package

        original = package.make_program_cache_key
        live = observer_switch(original)
        if live is not None and live.on:
            return  # observed already, by another copy of this module (a reload)
        observer = key_observer(original, switch, _RECORDER.note_key, _RECORDER.problem,
                                _RECORDER.contexts)
        replacements: list[tuple[object, str, object]] = [
            (package, "make_program_cache_key", observer)]
        if getattr(utils, "make_program_cache_key", None) is original:
            replacements.append((utils, "make_program_cache_key", observer))
        self._apply(replacements)

    def _watch_environ(self) -> None:
        """Count changes made through os.environ, so that a hit need not compare the whole
        environment (see `_environ_watcher`). Without it hits still compare; fails open."""
        global _environ_watch
        if _ENVIRON_CLASS is not getattr(os, "_Environ", None):
            return
        try:
            patches = self._apply((_ENVIRON_CLASS, name, _environ_watcher(
                getattr(_ENVIRON_CLASS, name))) for name in ("__setitem__", "__delitem__"))
        except Exception as exc:  # noqa: BLE001 - fail open: hits compare the environment
            self._report("environment watch", exc)
            return
        # Nonzero from now on, and not what a hit saw before the watch: the next hit looks.
        _next_environ_generation()
        _environ_watch = (patches[0].replacement, patches[1].replacement)

    # ---------------------------------------------------------------- writing

    def _records(self, hits: list[Any], observed: Sequence[Any]
                 ) -> Iterator[tuple[CompileRecord, Mapping[str, str]]]:
        """The pending hits' records, then the observed ones ((record, environment) pairs),
        each completed with what is known at write time: its id, the process, the test, the
        compile environment."""
        from cacheaudit.ledger import new_record_id

        host = socket.gethostname()
        pid = os.getpid()
        for record, environ in [*_RECORDER.hit_records(hits), *observed]:
            env, compile_env = environ_text(environ)
            yield dataclasses.replace(
                record, record_id=new_record_id(), env=compile_env, host=host, pid=pid,
                test_id=record.test_id or test_id_from(env)), env

    def _report(self, where: str, problem: BaseException | str) -> None:
        _RECORDER.problem(problem, where)


ADAPTER = CudaCoreAdapter()


def _flush_hits() -> None:
    """The hit path's write, when the buffer is due."""
    ADAPTER.flush()


def AuditedProgramCache(inner: Any, *, event: str | None = None) -> Any:
    """Wrap a cuda.core `ProgramCacheResource` so that its lookups and stores are recorded; pass
    the result as `Program.compile(..., cache=...)`. `event` says what a hit is ("disk-hit" by
    default, "memory-hit" for an InMemoryProgramCache). See `audited.py`."""
    from cacheaudit.runtimes.cuda_core.audited import audited_class

    return audited_class()(inner, event=event)
