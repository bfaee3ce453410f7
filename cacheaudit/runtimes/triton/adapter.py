"""Triton, seen from the inside: compiles and disk hits from its compilation listener, memory hits
from `JITFunction.run`.

Two layers, two hooks:

- `knobs.compilation.listener(src, metadata, metadata_group, times, cache_hit)` is Triton's
  official hook. `compile()` calls it on every real compile and every disk hit, whether the call
  came through @jit or straight from `triton.compile`. It is one slot: the listener installed here
  calls whatever was there before (sglang and others install one) and `uninstall` puts that back.
- The in-memory layer (`JITFunction.device_caches`) is invisible to the listener, and its key
  leaves the environment out (triton PR #8350): a cache-invalidating variable changed inside a
  process is served from memory, stale. `jit_cache_hook` and `jit_post_compile_hook` fire only on
  a memory miss, so they cannot see it either; `JITFunction.run` is wrapped instead (the class
  attribute, restored on uninstall). A call during which the listener did not fire and which
  returned a kernel was a memory hit; the kernel's metadata holds the cache-invalidating values
  it was compiled under, which are compared with the values now. Only a hit that differs is
  recorded ("memory-hit" with `extra["env_drift"]`, once per kernel and drift): a record per
  launch would cost more than the launch.

What a record holds (kernel = the function's name, key = the metadata hash, entry = the key
directory in the cache manager's root):

- outputs: the binary (`<name>.cubin`), whose xxh3 ties the entry on disk to the record;
- compiler: the ptxas Triton picks for the target (`TRITON_PTXAS_PATH` below sm_90,
  `TRITON_PTXAS_BLACKWELL_PATH` from sm_90, else the bundled one): path, `--version`, digest;
- env: the compile-affecting environment, with the cache-invalidating values that were set;
- compiles only: effective options as `ArgToken`s (`name=value`, origin "options", or
  "env:<VAR>" where an environment variable chose the value), the @jit function's file as the
  source, the extern libraries (libdevice) as the include graph and the tracked set (the key
  reads them by content), and in `extra` the target, the full options, the compile times and
  the key's parts (`triton_key()`, `src.hash()`, `backend.hash()`, `options.hash()`, the
  environment), checked to compose the entry's hash before they are stored;
- disk hits carry no more than the evidence that ties them to their entry (a hit record stays
  under the ledger's 200-byte budget).

Cost (benchmarks/bench_triton.py): a Triton disk hit takes ~0.7-1.4 ms here, a ledger
transaction ~2 ms and a record inside one ~40 us, so writing a record per hit would cost 5-10%
on its own. A hit is therefore only noted on the hit path (the key, the entry's paths, the ptxas
picked, and the environment's dict, shared between hits while it does not change), repeated hits
of one entry under one environment are counted on one note (the `HitBuffer` of
`cacheaudit.adapter`), and the notes are written later in one transaction: at the next compile
(which costs hundreds of milliseconds anyway, and whose record is the one the audit needs, so it
is never deferred), when `flush_every` distinct hits are pending or the oldest is `flush_after_s`
old (checked at the next hit), at uninstall, and at exit (atexit). A process killed with SIGKILL
loses its pending hits, never a compile; a forked child drops its parent's. `flush()` is public
for a harness that reads the ledger in the same process (the pytest plugin). Nothing observed
while `CACHEAUDIT_DISABLE` is set is recorded: the check is made with the observation, against
its environment snapshot, not at the later write.
"""

from __future__ import annotations

import functools
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from cacheaudit import compilers
from cacheaudit.adapter import (
    Adapter,
    Environ,
    Hit,
    HitBuffer,
    Switch,
    environ_data,
    environ_snapshot,
    environ_text,
    jsonable,
)
from cacheaudit.digest import StateCache
from cacheaudit.ledger import new_record_id
from cacheaudit.model import ArgToken, CompileRecord, CompilerIdentity, GraphFile, IncludeGraph
from cacheaudit.recorder import test_id_from
from cacheaudit.runtimes.triton import policy as recipe

RUNTIME = "triton"
OBSERVER = "adapter:triton"
_BINARIES = ("cubin", "hsaco")
_MARK = "_cacheaudit_triton"

# Options that an environment variable chose (the origin of their ArgToken), by Triton's knobs.
_OPTION_SOURCES: dict[str, tuple[str, ...]] = {
    "enable_fp_fusion": ("TRITON_FORCE_DISABLE_FP_FUSION", "TRITON_DEFAULT_FP_FUSION"),
    "ptx_options": ("PTXAS_OPTIONS",),
    "arch": ("TRITON_OVERRIDE_ARCH",),
    "debug": ("TRITON_DEBUG",),
    "extern_libs": ("TRITON_LIBDEVICE_PATH",),
}
# Metadata fields that are not options: what compile() and the stages add.
_NOT_OPTIONS = frozenset({"hash", "target", "triton_version", "name", "shared", "tmem_size",
                          "global_scratch_size", "global_scratch_align", "profile_scratch_size",
                          "profile_scratch_align", "tensordesc_meta", "cluster_dims",
                          "num_buffers_warp_spec"})


class _Event(Hit):
    """One observation, kept until it is written. The heavy work (hashing the binary, the
    compiler identity, redaction) happens at the write, off the runtime's hit path. Disk hits
    keep only what their record needs (holding every hit's metadata dict alive made the garbage
    collector cost more than the rest of the adapter), and repeated hits of one entry under one
    environment share an event (the hit buffer's group: `count`)."""

    __slots__ = ("binary", "detail", "duration_ns", "event", "json_path", "key", "metadata",
                 "name", "ptxas", "target")

    def __init__(self, event: str, ns: int, duration_ns: int, key: str | None, name: str | None,
                 target: Any, json_path: str | None, binary: str | None, environ: Environ,
                 metadata: Mapping[str, Any] | None = None,
                 detail: dict[str, Any] | None = None,
                 ptxas: tuple[str | None, str | None] = (None, None)) -> None:
        super().__init__(ns, environ)
        self.event = event
        self.duration_ns = duration_ns
        self.key = key
        self.name = name
        self.target = target
        self.json_path = json_path
        self.binary = binary
        self.metadata = metadata
        self.detail = detail
        self.ptxas = ptxas


def _paths(group: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(metadata json, binary) of a metadata group: `{"<name>.<ext>": "<absolute path>"}`."""
    json_path = binary = None
    for child, path in group.items():
        ext = child.rpartition(".")[2]
        if ext == "json":
            json_path = path
        elif ext in _BINARIES:
            binary = path
    return json_path, binary


class _Listener:
    """The chained compilation listener: cacheaudit first (it never raises), then whatever was
    installed before, whose return value and exceptions pass through untouched."""

    def __init__(self, adapter: TritonAdapter, previous: Callable[..., Any] | None,
                 switch: Switch) -> None:
        self.adapter = adapter
        self.previous = previous
        self.switch = switch
        setattr(self, _MARK, True)

    def __call__(self, **kwargs: Any) -> Any:
        if self.switch.on:
            self.adapter._observe(kwargs)
        if self.previous is not None:
            return self.previous(**kwargs)
        return None


def _wrap_run(original: Callable[..., Any], adapter: TritonAdapter,
              switch: Switch) -> Callable[..., Any]:
    """`JITFunction.run` with a memory-hit check after it. The call itself is untouched: same
    arguments, same result, same exceptions."""

    environ = environ_data()  # the same dict for the interpreter's life

    @functools.wraps(original)
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        before = adapter._events
        kernel = original(self, *args, **kwargs)
        if kernel is not None and adapter._events == before and switch.on:
            # A memory hit. Fast path, inlined (this is every launch): the environment is the
            # one of the last check and this kernel passed it.
            if environ is not None and id(kernel) in adapter._mem_ok and (
                    environ == adapter._mem_env):
                return kernel
            adapter._memory_hit(self, kernel)
        return kernel

    setattr(run, _MARK, True)
    return run


class TritonAdapter(Adapter):
    """The chained listener, and `JITFunction.run` wrapped (see the module doc)."""

    runtime = RUNTIME
    module = "triton"
    observer = OBSERVER

    def __init__(self) -> None:
        # The buffer's own name, typed as always there (the base's `_hits` is optional).
        self._buffer = HitBuffer(limit=4096, age_ns=60e9)
        super().__init__(hits=self._buffer)
        self.observe_memory = True
        """Wrap `JITFunction.run` to see memory hits; set False before `install()` to leave the
        launch path alone (only the listener is installed then)."""
        self._events = 0
        self._states = StateCache()
        self._identities = compilers.DictMemo()
        self._ptxas_memo: dict[tuple[int, int], tuple[str | None, str | None, Any]] = {}
        # Memory layer: the environment at the last check, the kernels (by id) verified under
        # it, and the drifts already recorded.
        self._mem_env: Mapping[Any, Any] | None = None
        self._mem_now: dict[str, str] | None = None
        self._mem_ok: set[int] = set()
        self._mem_reported: set[tuple[str, tuple[tuple[str, Any], ...]]] = set()

    @property
    def flush_every(self) -> int:
        """Distinct pending hits that make the next hit write them (bounds the memory held)."""
        return self._buffer.limit

    @flush_every.setter
    def flush_every(self, hits: int) -> None:
        self._buffer.limit = hits

    @property
    def flush_after_s(self) -> float:
        """Age of the oldest pending hit that makes the next hit write them (bounds the loss
        when the process is killed)."""
        return self._buffer.age_ns / 1e9

    @flush_after_s.setter
    def flush_after_s(self, seconds: float) -> None:
        buffer = self._buffer
        with buffer.lock:
            # The oldest pending hit's age is compared with the new value from now on.
            buffer.due_ns += seconds * 1e9 - buffer.age_ns
            buffer.age_ns = seconds * 1e9

    # ---------------------------------------------------------------- install / uninstall

    def _replacements(self, switch: Switch) -> list[tuple[object, str, object]]:
        """The listener, chained to whatever is there, and `JITFunction.run` (the class
        attribute) unless `observe_memory` is off."""
        from triton import knobs

        compilation = knobs.compilation
        replacements: list[tuple[object, str, object]] = [
            (compilation, "listener", _Listener(self, compilation.listener, switch))]
        if self.observe_memory:
            from triton.runtime.jit import JITFunction

            current = JITFunction.__dict__.get("run")
            if current is None:
                raise RuntimeError("triton.runtime.jit.JITFunction has no run method")
            replacements.append((JITFunction, "run", _wrap_run(current, self, switch)))
        return replacements

    def installed(self) -> bool:
        """Whether our listener records and still holds the slot. A listener set or chained on
        top of ours displaces it: `install()` then puts a fresh one on top, and the old one
        passes through (it cannot tell a chain from a replacement)."""
        return self._switch.on and bool(self._patches) and self._patches[0].on_top()

    def _left_in_place(self, left: Sequence[str]) -> None:
        # A listener chained on top of ours is how the slot is shared (sglang and others chain
        # theirs): ours passes everything through under it, and there is nothing to report.
        pass

    # ---------------------------------------------------------------- observing

    def _observe(self, kwargs: Mapping[str, Any]) -> None:
        """The listener's work on the runtime's path: note the event, nothing heavier."""
        self._events += 1  # also under CACHEAUDIT_DISABLE: the call was no memory hit
        try:
            environ = environ_snapshot()
            if environ.disabled:
                return
            now = time.time_ns()
            times = kwargs.get("times")
            metadata = kwargs["metadata"]
            key = metadata.get("hash")
            if not isinstance(key, str):
                raise ValueError("the listener was called without a metadata hash")
            if kwargs.get("cache_hit"):
                # The key and the environment name the entry (the cache root comes from the
                # environment): a repeat only counts.
                def first_hit() -> _Event:
                    # A hit's time is all "ir_initialization": no stage runs.
                    duration = times.ir_initialization * 1000 if times is not None else 0
                    json_path, binary = _paths(kwargs["metadata_group"])
                    target = metadata.get("target")
                    return _Event("disk-hit", now, duration, key, metadata.get("name"), target,
                                  json_path, binary, environ, ptxas=self._ptxas(environ, target))

                if self._buffer.note((key, id(environ)), now, first_hit):
                    self.flush()
                return
            duration = int(times.total * 1000) if times is not None else 0
            json_path, binary = _paths(kwargs["metadata_group"])
            detail = self._compile_detail(kwargs.get("src"), metadata, times)
            # Never deferred: the compile's record is the one the audit needs, and a compile
            # costs hundreds of milliseconds anyway. The pending hits go with it.
            self._write_with_hits((_Event(
                "compile", now, duration, key, metadata.get("name"), metadata.get("target"),
                json_path, binary, environ, dict(metadata), detail),))
        except Exception as exc:  # noqa: BLE001 - fail open inside triton.compile
            self._problem(f"{type(exc).__name__}: {exc}")

    def _compile_detail(self, src: Any, metadata: Mapping[str, Any], times: Any) -> dict[str, Any]:
        """What only the compiling moment knows: the key's parts, the ptxas picked, the @jit
        function's file. Each piece fails on its own, into a note."""
        detail: dict[str, Any] = {"notes": []}
        target = metadata.get("target")
        arch = getattr(target, "arch", None)
        detail["target"] = jsonable(target)
        if times is not None:
            detail["times_us"] = {"ir_initialization": times.ir_initialization,
                                  "lowering": dict(times.lowering_stages),
                                  "store_results": times.store_results}
        file_name = getattr(getattr(src, "fn", None), "file_name", None) or getattr(
            src, "path", None)
        detail["source"] = str(file_name) if file_name else None
        if getattr(target, "backend", None) == "cuda" and arch is not None:
            try:
                from triton.backends.nvidia.compiler import get_ptxas

                detail["ptxas"] = get_ptxas(int(arch)).path
            except Exception as exc:  # noqa: BLE001 - evidence, not a reason to fail
                detail["notes"].append(f"ptxas not identified: {type(exc).__name__}: {exc}")
        try:
            detail["key_parts"] = _key_parts(src, metadata)
        except Exception as exc:  # noqa: BLE001
            detail["notes"].append(f"key parts not recorded: {type(exc).__name__}: {exc}")
        return detail

    def _memory_hit(self, fn: Any, kernel: Any) -> None:
        """After a `run` served from `device_caches`: was the kernel compiled under the
        cache-invalidating environment in force now? Fast path: the environment is the dict
        seen at the last check and this kernel was verified under it."""
        try:
            data = environ_data()
            if data is None:
                data = dict(os.environ)
            if data != self._mem_env:
                self._mem_env = dict(data)
                self._mem_now = None
                self._mem_ok = set()
            elif id(kernel) in self._mem_ok:
                return
            self._memory_slow(fn, kernel)
        except Exception as exc:  # noqa: BLE001 - fail open on the launch path
            self._problem(f"memory-hit check: {type(exc).__name__}: {exc}")

    def _memory_slow(self, fn: Any, kernel: Any) -> None:
        # A FutureKernel (async compile) resolves on attribute access: look, never touch.
        served = id(kernel)  # what the next run returns, and the fast path checks
        environ = environ_snapshot()
        if environ.disabled:
            # Passed for this environment: the check runs again once the variable is gone,
            # since that changes the environment the fast path compares.
            self._mem_ok.add(served)
            return
        state = vars(kernel) if hasattr(kernel, "__dict__") else {}
        if "metadata" not in state and state.get("kernel") is not None:
            kernel = state["kernel"]
            state = vars(kernel)
        metadata = state.get("metadata")
        if metadata is None or not hasattr(metadata, "_asdict"):
            return  # still compiling, or not a kernel Triton made
        if self._mem_now is None:
            from triton._C.libtriton import get_cache_invalidating_env_vars

            self._mem_now = dict(get_cache_invalidating_env_vars())
        fields = metadata._asdict()
        built = recipe.build_env(fields)
        now = self._mem_now
        if built == now:
            self._mem_ok.add(served)
            return
        drift = {name: [built.get(name), now.get(name)] for name in sorted(set(built) | set(now))
                 if built.get(name) != now.get(name)}
        signature = (str(fields.get("hash")), tuple((n, tuple(v)) for n, v in drift.items()))
        self._mem_ok.add(served)
        if signature in self._mem_reported:
            return
        self._mem_reported.add(signature)
        json_path, binary = _paths(state.get("metadata_group") or {})
        detail = {"env_drift": drift, "notes": [],
                  "memory_layer": "JITFunction.device_caches (compute_cache_key: specialisation "
                                  "and call options, no environment)",
                  "function": getattr(fn, "_fn_name", None)}
        self._write_with_hits((_Event(
            "memory-hit", time.time_ns(), 0, fields.get("hash"), fields.get("name"),
            fields.get("target"), json_path, binary, environ, fields, detail,
            ptxas=self._ptxas(environ, fields.get("target"))),))

    # ---------------------------------------------------------------- writing

    def _records(self, hits: list[Any], observed: Sequence[Any]
                 ) -> Iterator[tuple[CompileRecord, Mapping[str, str]]]:
        identities: dict[tuple[str, int], CompilerIdentity | None] = {}
        for event in sorted([*observed, *hits], key=lambda e: e.ns):
            yield self._record(event, identities)

    def _ptxas(self, environ: Mapping[Any, Any], target: Any) -> tuple[str | None, str | None]:
        """(path, problem) of the ptxas Triton picks for `target` now, by Triton's own
        `get_ptxas`; called while the process environment is `environ`, once per snapshot."""
        if getattr(target, "backend", None) != "cuda":
            return None, None
        arch = int(target.arch)
        memo_key = (id(environ), arch)
        found = self._ptxas_memo.get(memo_key)
        if found is None or found[2] is not environ:
            try:
                from triton.backends.nvidia.compiler import get_ptxas

                found = (get_ptxas(arch).path, None, environ)
            except Exception as exc:  # noqa: BLE001
                found = (None, f"ptxas not identified: {type(exc).__name__}: {exc}", environ)
            if len(self._ptxas_memo) > 64:
                self._ptxas_memo.clear()
            self._ptxas_memo[memo_key] = found
        return found[0], found[1]

    def _compiler(self, path: str | None, env: Mapping[str, str],
                  identities: dict[tuple[str, int], CompilerIdentity | None]
                  ) -> CompilerIdentity | None:
        """The ptxas's identity, once per flush and environment (memoised across flushes by
        its files' stat, in `compilers.identify`)."""
        if not path:
            return None
        memo_key = (path, id(env))
        if memo_key not in identities:
            identities[memo_key] = compilers.identify("ptxas", env=env, path=path,
                                                      memo=self._identities)
        return identities[memo_key]

    def _record(self, event: _Event, identities: dict[tuple[str, int], CompilerIdentity | None]
                ) -> tuple[CompileRecord, Mapping[str, str]]:
        kept, compile_env = environ_text(event.environ)
        metadata = event.metadata or {}
        detail = event.detail or {}
        notes = list(detail.get("notes") or ())
        target = event.target
        backend = getattr(target, "backend", None) or (
            target.get("backend") if isinstance(target, dict) else None)
        entry = os.path.dirname(event.json_path) if event.json_path else None
        binary = event.binary
        outputs = (self._states.capture(binary),) if binary else ()
        if binary is None:
            notes.append("no binary in the metadata group")
        ptxas = detail.get("ptxas") or event.ptxas[0]
        if event.ptxas[1]:
            notes.append(event.ptxas[1])
        elif ptxas is None and backend == "cuda":
            notes.append("ptxas path not known")
        fields: dict[str, Any] = {
            "key": event.key, "entry": entry, "outputs": outputs,
            "compiler": self._compiler(ptxas, kept, identities), "env": compile_env,
            "started_ns": event.ns - event.duration_ns,
            "duration_ns": event.duration_ns,
        }
        extra: dict[str, Any] = {}
        if event.event == "compile":
            fields["exit_code"] = 0
            fields.update(self._compile_fields(metadata, detail, kept))
            extra = fields.pop("extra")
        elif event.event == "memory-hit":
            extra = {k: v for k, v in detail.items() if k != "notes"}
        if event.count > 1:
            extra = {**extra, "repeats": event.count - 1, "last_ns": event.last_ns}
        record = CompileRecord(
            record_id=new_record_id(), event=event.event, runtime=RUNTIME,  # type: ignore[arg-type]
            kernel=str(event.name or "") or None, pid=os.getpid(),
            host=socket.gethostname(), test_id=test_id_from(kept), observer=OBSERVER,
            notes=tuple(notes), extra=extra, **fields)
        return record, kept

    def _compile_fields(self, metadata: Mapping[str, Any], detail: Mapping[str, Any],
                        kept: Mapping[str, str]) -> dict[str, Any]:
        options = {k: v for k, v in metadata.items()
                   if k not in _NOT_OPTIONS and not k.isupper()}
        tokens: list[ArgToken] = [ArgToken(f"target={_target_text(metadata.get('target'))}",
                                           "target")]
        # The options as the backend parsed them (recorded with the key's parts), else as the
        # metadata holds them.
        parts = detail.get("key_parts") or {}
        texts = {str(n): str(t) for n, t in parts.get("options_items") or ()}
        if texts:
            texts["extern_libs"] = ",".join(f"{n}:{p}" for n, p in parts.get("extern_libs") or ())
        else:
            texts = {name: _option_text(value) for name, value in options.items()}
        for name in sorted(texts):
            origin = next((f"env:{var}" for var in _OPTION_SOURCES.get(name, ()) if kept.get(var)),
                          "options")
            tokens.append(ArgToken(f"{name}={texts[name]}", origin))
        for name, value in sorted(recipe.build_env(metadata).items()):
            tokens.append(ArgToken(f"{name}={value}", f"env:{name}"))
        libs = [str(path) for _, path in (metadata.get("extern_libs") or ())]
        lib_states = tuple(self._states.capture(os.path.realpath(p)) for p in libs)
        graph = IncludeGraph(tuple(GraphFile(s, w) for s, w in zip(lib_states, libs, strict=True)),
                             "triton extern_libs") if lib_states else None
        source = detail.get("source")
        sources = (self._states.capture(source),) if source and os.path.isfile(source) else ()
        extra: dict[str, Any] = {
            "triton_version": metadata.get("triton_version"),
            "target": detail.get("target"),
            "options": jsonable(options),
            "env_in_key": recipe.build_env(metadata),
        }
        for name in ("times_us", "key_parts"):
            if detail.get(name) is not None:
                extra[name] = detail[name]
        return {"effective_argv": tuple(tokens), "graph": graph, "sources": sources,
                "tracked": tuple(s.path for s in lib_states), "extra": extra}


def _target_text(target: Any) -> str:
    if isinstance(target, dict):
        return f"{target.get('backend')}:{target.get('arch')}:{target.get('warp_size')}"
    return f"{getattr(target, 'backend', '?')}:{getattr(target, 'arch', '?')}:" \
           f"{getattr(target, 'warp_size', '?')}"


def _option_text(value: Any) -> str:
    if isinstance(value, tuple) and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return ",".join(f"{k}:{v}" for k, v in value)  # extern_libs
    return str(value)


def _key_parts(src: Any, metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Each part of the key `compile` computed, and whether they compose the metadata's hash
    (they do not when `knobs.runtime.add_stages_inspection_hook` extended the key)."""
    from triton.compiler.compiler import make_backend
    from triton.runtime.cache import triton_key

    target = metadata["target"]
    backend = make_backend(target)
    options = backend.parse_options({k: v for k, v in metadata.items() if not k.isupper()})
    items = [[name, str(value)] for name, value in sorted(vars(options).items())
             if name != "extern_libs"]
    libs = [[str(name), str(path)] for name, path in (options.extern_libs or ())]
    env = recipe.build_env(metadata)
    parts: dict[str, Any] = {
        "triton_key": triton_key(), "src": src.hash(), "backend": backend.hash(),
        "options": options.hash(), "env": env, "options_items": items, "extern_libs": libs,
        "arch": getattr(target, "arch", None), "triton_version": metadata.get("triton_version"),
        "mock_ptx_version": os.environ.get("TRITON_MOCK_PTX_VERSION"),
    }
    mine = recipe.options_hash(items, libs)
    key = recipe.compose_key(parts["triton_key"], parts["src"], parts["backend"],
                             parts["options"], recipe.env_key_part(env))
    parts["verified"] = key == metadata.get("hash") and mine == parts["options"]
    if not parts["verified"]:
        parts["why_unverified"] = (
            "options.hash() recomputed differently" if mine != parts["options"] else
            "the parts do not compose the metadata hash (a stages inspection hook?)")
    return parts


ADAPTER = TritonAdapter()
