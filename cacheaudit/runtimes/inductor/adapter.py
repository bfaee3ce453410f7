"""Inductor's cache lookups, seen from the inside (torch 2.13.0), so that a hit is recorded
although no compiler runs.

What is wrapped, each seam read in torch 2.13.0:

- `FxGraphCache.load_with_key(key, debug_lines, ...)` (`_inductor/codecache.py` :2273): the FX
  graph key and its labelled components (`debug_lines`, from `compiled_fx_graph_hash`, :1628),
  and whether it hit (the compiled graph, or None). A hit is a "disk-hit" record of the entry
  file under `fxgraph/<k[1:3]>/<key>/`.
- `FxGraphCache._save_graph(key, ...)` (:2132): the entry a miss wrote, a "compile" record (no
  compiler runs for it; the record is the only evidence of what it was built under).
- `AOTAutogradCache._lookup(key, ...)` (`_functorch/_aot_autograd/autograd_cache.py` :1214,
  called by `try_load`, :990): the AOTAutograd key and whether it hit.
- `AOTAutogradCache._write_to_local_cache(key, content)` (:1274, called by `save`, :1350, after
  a miss, and by the cache-artifact loader, :940): the entry written under
  `aotautograd/<key>/`, a "compile" record as for the FX save.
- `CppCodeCache.load_async` (:3691, which `load_pybinding_async`, :4020, and `load` reach): the
  kernel key, its `<key>.main.cpp` path and the hashed command line, taken from the module's
  `write(main_code, "main.cpp", extra=f"{optimized_code} {command line}")` (:3762) while the
  call runs, whether `<key>.main.so` already existed (then it is loaded without a compile,
  :3873), whether the key was in the class's memory cache, and the ISA (`-DCPU_CAPABILITY_*`
  on that command line). A disk hit is a "disk-hit" record of the `.main.so`; a compile is left
  to the shim, which sees the g++ run.
- `torch.library` custom ops (`torch._library.custom_ops.OPDEFS`): a snapshot, on every FX
  record, of each op's schema, `mutates_args`, and digests of its implementation, fake
  implementation, backward and setup_context functions (`snapshot_custom_ops`). None of these is
  in the FX graph key (`FxGraphHashDetails`, :1220, hashes the graph's targets by name). When
  an FX hit is written, the snapshot is compared with the one of the latest compile record of
  the same key in the ledger; what differs, apart from the implementation (dispatched at run
  time: a change reaches the served graph), is `extra["custom_ops_changed"]`, which the policy
  reports. Only the ops the served graph calls are compared: an FX hit inside
  `AOTAutogradCache.try_load(mod, ...)` (:990; an AOTAutograd hit loads its FX graph there,
  `aot_autograd_result.py` :193) records the custom ops of Dynamo's graph `mod`
  (`extra["graph_ops"]`, `graph_custom_ops`); a graph that drops an op's call (a pure op whose
  result is unused) still names it there. An FX lookup outside `try_load` (the AOTAutograd cache
  off) is compared with every op of the process.
- Inductor's custom passes (the config's `*_custom_pass` slots, `PASS_SLOTS`): a snapshot, on
  every FX record, of each pass's class, `uuid()`, class source digest, instance attributes and
  the module-level values its `__call__` names (`snapshot_custom_passes`). The FX key holds the
  `uuid()` alone; what else differs at a hit is `extra["custom_passes_changed"]`.

Fails open: every wrapper calls the original and returns its result or raises its exception
unchanged; anything of ours that fails is reported once on stderr. Records wait in a list and
are written at `flush()` (the pytest plugin, uninstall, exit), so that a warm start pays a
snapshot per lookup and no ledger write on its path.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import xxhash

from cacheaudit.adapter import Adapter, Environ, Switch, environ_snapshot, environ_text
from cacheaudit.model import CompileRecord, Event, FileState
from cacheaudit.recorder import test_id_from

RUNTIME = "inductor"
OBSERVER = "adapter:inductor"
COMPONENTS_KEPT = 64
"""Labelled key components kept per FX record (each cut to `COMPONENT_CHARS`)."""
COMPONENT_CHARS = 240
_ISA = re.compile(r"-DCPU_CAPABILITY_([A-Z0-9_]+)")
_OP_FIELDS = ("schema", "mutates_args", "fake", "backward", "setup_context")
"""What of a custom op the served graph was traced or differentiated with: a change of any is
invisible to the FX key. The implementation is left out: the graph calls the op through the
dispatcher, so a new implementation is what runs."""


def _digest(function: object) -> str | None:
    """A digest of a function's source (its code object's bytes and constants when the source
    cannot be read), or None for no function."""
    if function is None:
        return None
    target = inspect.unwrap(function) if callable(function) else function
    code = getattr(target, "__code__", None)
    try:
        text = inspect.getsource(target)  # type: ignore[arg-type]
    except (OSError, TypeError):
        # No address in it (a repr would change from process to process): the bytecode and
        # constants, else only what the object is.
        text = (repr((code.co_code, code.co_consts)) if code is not None else
                f"{type(target).__module__}.{type(target).__qualname__}")
    return _digest_text(text)


def _digest_text(text: str) -> str:
    return xxhash.xxh3_128_hexdigest(text.encode("utf-8", "surrogateescape"))


def _torch_own(opdef: object) -> bool:
    """An op torch itself defines (`prims::*`, ...): its Python sources are in the FX key
    already (`torch_key`, codecache.py:934)."""
    module = getattr(getattr(opdef, "_init_fn", None), "__module__", None) or ""
    return module == "torch" or module.startswith("torch.")


def snapshot_custom_ops() -> dict[str, dict[str, Any]]:
    """Each `torch.library.custom_op` of this process but torch's own: its schema, the
    arguments it mutates, and digests of its implementation, fake implementation, backward and
    setup_context."""
    from torch._library.custom_ops import OPDEFS

    ops: dict[str, dict[str, Any]] = {}
    for name, opdef in sorted(list(OPDEFS.items())):
        if _torch_own(opdef):
            continue
        schema = str(getattr(opdef, "_schema", ""))
        try:
            arguments = opdef._opoverload._schema.arguments
            mutates = sorted(a.name for a in arguments
                             if a.alias_info is not None and a.alias_info.is_write)
        except Exception:  # noqa: BLE001 - an op not registered yet: its schema says it
            mutates = sorted(re.findall(r"\(\w+!\)\s+(\w+)", schema))
        ops[name] = {
            "schema": schema, "mutates_args": mutates,
            "implementation": _digest(getattr(opdef, "_init_fn", None)),
            "fake": _digest(getattr(opdef, "_abstract_fn", None)),
            "backward": _digest(getattr(opdef, "_backward_fn", None)),
            "setup_context": _digest(getattr(opdef, "_setup_context_fn", None)),
        }
    return ops


PASS_SLOTS = ("pre_grad_custom_pass", "post_grad_custom_pre_pass", "post_grad_custom_post_pass",
              "joint_custom_pre_pass", "joint_custom_post_pass", "_pre_fusion_custom_pass",
              "_post_fusion_custom_pass")
"""The Inductor config values that hold custom passes (torch 2.13.0 `_inductor/config.py`
:300-325), each a pass or a list of them. The FX key holds each pass's `uuid()` alone
(`FxGraphHashDetails._get_custom_pass_detail`, codecache.py:1514-1536)."""
VALUE_CHARS = 120
"""A pass's option is kept as its repr up to this length, else as a digest of the repr."""
_SIMPLE = (bool, int, float, complex, str, bytes, tuple, list, dict, frozenset, set,
           type(None))


def _value_text(value: object) -> str:
    """What a pass's option is, comparable across processes: its repr (a digest of it when
    long), or only its type when the repr holds an address."""
    try:
        text = repr(value)
    except Exception:  # noqa: BLE001 - a repr of the user's that fails: its type says enough
        text = ""
    if not text or " at 0x" in text:
        return f"<{type(value).__module__}.{type(value).__qualname__}>"
    if len(text) <= VALUE_CHARS:
        return text
    return "xxh3:" + _digest_text(text)


def _class_digest(kind: type) -> str | None:
    """A digest of a class's source; where it cannot be read (a module not in sys.modules),
    of its own functions' sources, by name."""
    try:
        return _digest_text(inspect.getsource(kind))
    except (OSError, TypeError):
        return _digest_text(repr(sorted((name, _digest(value)) for name, value in vars(kind).items()
                                        if inspect.isfunction(value))))


def _pass_state(custom_pass: object) -> dict[str, Any]:
    """A custom pass as its run reads it: its class, its `uuid()`, a digest of its class's
    source, its instance attributes, and the module-level values its `__call__` names (options
    kept beside the pass)."""
    kind = type(custom_pass)
    call = getattr(kind, "__call__", None)  # noqa: B004 - the method the pass manager runs
    code = getattr(call, "__code__", None)
    names = getattr(code, "co_names", ()) if code is not None else ()
    module_values = getattr(call, "__globals__", {}) if code is not None else {}
    uuid = getattr(custom_pass, "uuid", None)
    return {
        "class": f"{kind.__module__}.{kind.__qualname__}",
        "uuid": _value_text(uuid()) if callable(uuid) else None,
        "code": _class_digest(kind),
        "attributes": {name: _value_text(value) for name, value in
                       sorted(getattr(custom_pass, "__dict__", {}).items())},
        "globals": {name: _value_text(module_values[name]) for name in sorted(set(names))
                    if name in module_values and isinstance(module_values[name], _SIMPLE)},
    }


def snapshot_custom_passes() -> dict[str, dict[str, Any]]:
    """Each custom pass in Inductor's config, by its slot (`slot[i]` in a list)."""
    from torch._inductor import config

    passes: dict[str, dict[str, Any]] = {}
    for slot in PASS_SLOTS:
        value = getattr(config, slot, None)
        if value is None:
            continue
        listed = isinstance(value, (list, tuple))
        for index, custom_pass in enumerate(value if listed else (value,)):
            passes[f"{slot}[{index}]" if listed else slot] = _pass_state(custom_pass)
    return passes


def custom_pass_changes(then: Mapping[str, Any], now: Mapping[str, Any]
                        ) -> list[dict[str, Any]]:
    """(pass, class, field, recorded, current) for each pass of `then` whose state outside its
    `uuid()` differs now; field is `code`, `attribute <name>` or `global <name>`. A pass whose
    uuid changed is left out: the key holds it, so that FX entry is not what is served."""
    changes = []
    for slot in sorted(then):
        old, new = then[slot], now.get(slot)
        if not isinstance(old, Mapping):
            continue
        if not isinstance(new, Mapping) or new.get("class") != old.get("class"):
            changes.append({"pass": slot, "class": old.get("class"), "field": "pass",
                            "recorded": old.get("class"),
                            "current": new.get("class") if isinstance(new, Mapping) else None})
            continue
        if new.get("uuid") != old.get("uuid"):
            continue
        fields = [("code", old.get("code"), new.get("code"))]
        for group, label in (("attributes", "attribute"), ("globals", "global")):
            before, after = old.get(group) or {}, new.get(group) or {}
            fields.extend((f"{label} {name}", before.get(name), after.get(name))
                          for name in sorted(set(before) | set(after)))
        changes.extend({"pass": slot, "class": old.get("class"), "field": field,
                        "recorded": recorded, "current": current}
                       for field, recorded, current in fields if recorded != current)
    return changes


def graph_custom_ops(module: object) -> tuple[str, ...]:
    """The qualified names (`ns::name`) of the ops a Dynamo graph module and its subgraphs
    call, as node targets or as a higher-order op's operands (`auto_functionalized(op, ...)`)."""
    names: set[str] = set()
    modules = getattr(module, "modules", None)
    for part in modules() if callable(modules) else ():
        graph = getattr(part, "graph", None)
        for node in getattr(graph, "nodes", ()):
            for target in (node.target, *node.args):
                name = getattr(getattr(target, "_schema", None), "name", None)
                if isinstance(name, str):
                    names.add(name)
    return tuple(sorted(names))


def custom_op_changes(then: Mapping[str, Any], now: Mapping[str, Any],
                      called: Iterable[str] | None = None, *,
                      forward: bool = False) -> list[dict[str, Any]]:
    """(op, field, recorded, current) for each op of `then` whose traced-in state differs now;
    only the ops in `called` when the served graph's ops are known. A `forward` graph (AOT's
    forward half) is not told of a new backward formula: the backward graph it is served
    with is, and a forward graph the new formula leaves alone is what a fresh compile makes."""
    changes = []
    wanted = None if called is None else set(called)
    fields = [f for f in _OP_FIELDS if not (forward and f == "backward")]
    for name in sorted(then):
        if wanted is not None and name not in wanted:
            continue
        old, new = then[name], now.get(name)
        if not isinstance(old, Mapping):
            continue
        for field in fields:
            current = new.get(field) if isinstance(new, Mapping) else None
            if old.get(field) != current:
                changes.append({"op": name, "field": field, "recorded": old.get(field),
                                "current": current})
    return changes


class _Capture(threading.local):
    """What `write` saw during the `load_async` call running in this thread."""

    depth = 0
    cache: Any = None
    found: tuple[str, str, str, bool, bool] | None = None
    """(key, main.cpp path, command line, .so existed, in the memory cache)."""
    graph_ops: tuple[str, ...] | None = None
    """The custom ops of the Dynamo graph whose `AOTAutogradCache.try_load` runs in this thread."""


_CAPTURE = _Capture()


@dataclasses.dataclass
class _Pending:
    record: CompileRecord
    environ: Environ


class InductorAdapter(Adapter):
    """Wraps Inductor's FX graph, AOTAutograd and C++ code cache lookups."""

    runtime = RUNTIME
    module = "torch._inductor.codecache"
    observer = OBSERVER

    def __init__(self) -> None:
        super().__init__(label="cacheaudit inductor adapter")
        self._pending: list[_Pending] = []
        self._pending_lock = threading.Lock()
        self._atexit = False

    # ---------------------------------------------------------------- the lifecycle

    def _replacements(self, switch: Switch) -> Iterable[tuple[object, str, object]]:
        from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache
        from torch._inductor import codecache

        fx = codecache.FxGraphCache
        cpp = codecache.CppCodeCache
        return [
            (fx, "load_with_key", staticmethod(self._fx_lookup(
                vars(fx)["load_with_key"].__func__, switch))),
            (fx, "_save_graph", staticmethod(self._fx_save(
                vars(fx)["_save_graph"].__func__, switch))),
            (AOTAutogradCache, "try_load", staticmethod(self._aot_try_load(
                vars(AOTAutogradCache)["try_load"].__func__, switch))),
            (AOTAutogradCache, "_lookup", staticmethod(self._aot_lookup(
                vars(AOTAutogradCache)["_lookup"].__func__, switch))),
            (AOTAutogradCache, "_write_to_local_cache", staticmethod(self._aot_save(
                vars(AOTAutogradCache)["_write_to_local_cache"].__func__, switch))),
            (cpp, "load_async", classmethod(self._cpp_load(
                vars(cpp)["load_async"].__func__, switch))),
            (codecache, "write", self._write_hook(codecache.write, switch)),
        ]

    def _install(self, switch: Switch) -> None:
        super()._install(switch)
        if not self._atexit:
            import atexit

            atexit.register(self.flush)
            self._atexit = True

    def _uninstalled(self) -> None:
        _CAPTURE.depth = 0

    def _after_fork_in_child(self) -> None:
        self._pending_lock = threading.Lock()
        self._pending = []

    # ---------------------------------------------------------------- hooks

    def _note(self, where: str, make: Callable[[], CompileRecord | None]) -> None:
        try:
            environ = environ_snapshot()
            if environ.disabled:
                return
            record = make()
            if record is not None:
                with self._pending_lock:
                    self._pending.append(_Pending(record, environ))
        except Exception as exc:  # noqa: BLE001 - fail open
            self._report(where, exc)

    def _fx_lookup(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def load_with_key(key: str, debug_lines: list[str], *args: Any, **kwargs: Any) -> Any:
            result = original(key, debug_lines, *args, **kwargs)
            if switch.on:
                backward = kwargs.get("is_backward", args[3] if len(args) > 3 else None)
                self._note("fxgraph lookup",
                           lambda: _fx_record(key, debug_lines, result, backward))
            return result

        return load_with_key

    def _fx_save(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def _save_graph(key: str, *args: Any, **kwargs: Any) -> Any:
            started = time.time_ns()
            result = original(key, *args, **kwargs)
            if switch.on:
                self._note("fxgraph save", lambda: _fx_saved(key, started))
            return result

        return _save_graph

    def _aot_try_load(self, original: Callable[..., Any], switch: Switch
                      ) -> Callable[..., Any]:
        @functools.wraps(original)
        def try_load(mod: Any, *args: Any, **kwargs: Any) -> Any:
            capture = _CAPTURE
            outer = capture.graph_ops
            if switch.on:
                try:
                    capture.graph_ops = graph_custom_ops(mod)
                except Exception as exc:  # noqa: BLE001 - fail open: every op is compared
                    capture.graph_ops = None
                    self._report("aotautograd try_load", exc)
            try:
                return original(mod, *args, **kwargs)
            finally:
                capture.graph_ops = outer

        return try_load

    def _aot_lookup(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def _lookup(key: str, *args: Any, **kwargs: Any) -> Any:
            result = original(key, *args, **kwargs)
            if switch.on and result is not None:
                self._note("aotautograd lookup", lambda: _aot_record(key))
            return result

        return _lookup

    def _aot_save(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def _write_to_local_cache(key: str, *args: Any, **kwargs: Any) -> Any:
            started = time.time_ns()
            result = original(key, *args, **kwargs)
            if switch.on:
                self._note("aotautograd save", lambda: _aot_saved(key, started))
            return result

        return _write_to_local_cache

    def _cpp_load(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def load_async(cls: Any, *args: Any, **kwargs: Any) -> Any:
            capture = _CAPTURE
            outer = capture.depth == 0
            if outer:
                capture.cache, capture.found = getattr(cls, "cache", None), None
            capture.depth += 1
            try:
                return original(cls, *args, **kwargs)
            finally:
                capture.depth -= 1
                if outer and switch.on and capture.found is not None:
                    found, capture.found = capture.found, None
                    self._note("cpp load", lambda: _cpp_record(*found))

        return load_async

    def _write_hook(self, original: Callable[..., Any], switch: Switch) -> Callable[..., Any]:
        @functools.wraps(original)
        def write(content: Any, extension: str, *args: Any, **kwargs: Any) -> Any:
            result = original(content, extension, *args, **kwargs)
            capture = _CAPTURE
            if capture.depth and extension == "main.cpp" and capture.found is None:
                try:
                    key, path = result
                    extra = kwargs.get("extra", args[0] if args else "")
                    command = str(extra).split(" ", 1)[1] if " " in str(extra) else ""
                    cache = capture.cache
                    capture.found = (key, path, command,
                                     os.path.exists(path[:-len(".cpp")] + ".so"),
                                     cache is not None and key in cache)
                except Exception as exc:  # noqa: BLE001 - fail open
                    self._report("cpp write", exc)
            return result

        return write

    # ---------------------------------------------------------------- writing

    def flush(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            self._write(self._completed(pending))
        except Exception as exc:  # noqa: BLE001 - fail open
            self._report("flush", exc)

    def _completed(self, pending: Sequence[_Pending]
                   ) -> Iterable[tuple[CompileRecord, Mapping[str, str]]]:
        from cacheaudit.ledger import new_record_id

        host, pid = socket.gethostname(), os.getpid()
        for item in pending:
            env, compile_env = environ_text(item.environ)
            record = item.record
            if record.event == "disk-hit" and record.extra.get("layer") == "fxgraph":
                record = _with_custom_op_changes(record, env)
            yield dataclasses.replace(
                record, record_id=new_record_id(), env=compile_env, host=host, pid=pid,
                test_id=record.test_id or test_id_from(env)), env

    def _records(self, hits: list[Any], observed: Sequence[Any]
                 ) -> Iterable[tuple[CompileRecord, Mapping[str, str]]]:
        return ()


# ------------------------------------------------------------------------------ the records


def _record(event: Event, key: str, entry: str | None, extra: dict[str, Any],
            started_ns: int | None = None, kernel: str | None = None) -> CompileRecord:
    now = time.time_ns()
    outputs: tuple[FileState, ...] = ()
    if entry is not None and os.path.isfile(entry):
        from cacheaudit.digest import StateCache

        outputs = (StateCache().capture(entry),)
    return CompileRecord(record_id="", event=event, started_ns=started_ns or now,
                         duration_ns=now - (started_ns or now), runtime=RUNTIME, kernel=kernel,
                         key=key, entry=entry, outputs=outputs, observer=OBSERVER,
                         extra=extra)


def _entry_file(directory: str) -> str | None:
    """The one entry of a key directory (Inductor names it by its content's sha256); the
    newest when there are several (guards of other shapes)."""
    try:
        with os.scandir(directory) as listing:
            files = [e for e in listing if e.is_file(follow_symlinks=False)]
    except OSError:
        return None
    if not files:
        return None
    return max(files, key=lambda e: (e.stat().st_mtime_ns, e.name)).path


def _fx_directory(key: str) -> str:
    from torch._inductor.codecache import FxGraphCache

    return str(FxGraphCache._get_tmp_dir_for_key(key))


def _components(debug_lines: Sequence[str]) -> list[str]:
    return [str(line)[:COMPONENT_CHARS] for line in list(debug_lines)[:COMPONENTS_KEPT]]


def _fx_record(key: str, debug_lines: Sequence[str], result: Any, backward: object
               ) -> CompileRecord | None:
    graph = result[0] if isinstance(result, tuple) and result else None
    if graph is None:
        return None  # a miss: the save that follows is the record
    extra: dict[str, Any] = {
        "layer": "fxgraph", "components": _components(debug_lines),
        "custom_ops": snapshot_custom_ops(), "custom_passes": snapshot_custom_passes()}
    if isinstance(backward, bool):
        extra["is_backward"] = backward
    if _CAPTURE.graph_ops is not None:
        extra["graph_ops"] = list(_CAPTURE.graph_ops)
    return _record("disk-hit", key, _entry_file(_fx_directory(key)), extra)


def _fx_saved(key: str, started_ns: int) -> CompileRecord | None:
    return _record("compile", key, _entry_file(_fx_directory(key)), {
        "layer": "fxgraph", "custom_ops": snapshot_custom_ops(),
        "custom_passes": snapshot_custom_passes()}, started_ns=started_ns)


def _aot_record(key: str) -> CompileRecord:
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    return _record("disk-hit", key, _entry_file(AOTAutogradCache._get_tmp_dir_for_key(key)),
                   {"layer": "aotautograd", "custom_ops": snapshot_custom_ops()})


def _aot_saved(key: str, started_ns: int) -> CompileRecord:
    from torch._functorch._aot_autograd.autograd_cache import AOTAutogradCache

    return _record("compile", key, _entry_file(AOTAutogradCache._get_tmp_dir_for_key(key)),
                   {"layer": "aotautograd", "custom_ops": snapshot_custom_ops(),
                    "custom_passes": snapshot_custom_passes()}, started_ns=started_ns)


def _cpp_record(key: str, path: str, command: str, existed: bool, in_memory: bool
                ) -> CompileRecord | None:
    if in_memory or not existed:
        return None  # a memory hit re-serves what this process loaded; a compile is the shim's
    library = path[:-len(".cpp")] + ".so"
    isa = _ISA.search(command)
    return _record("disk-hit", key, library, {
        "layer": "cpp", "source": path, "command_line": command, "existed": existed,
        "isa": isa.group(1).lower() if isa else "none"}, kernel=os.path.basename(library))


def _with_custom_op_changes(record: CompileRecord, env: Mapping[str, str]) -> CompileRecord:
    """The FX hit with what differs between the custom ops it was traced with (the latest
    compile record of its key in the ledger) and those of the process it was served to."""
    from cacheaudit.ledger import Ledger, default_ledger_path

    path = default_ledger_path(env)
    if not os.path.exists(path):
        return record
    with Ledger.open(path, create=False) as ledger:
        built = ledger.records(where="r.key = ? AND r.event = 'compile'", params=(record.key,),
                               order="r.id DESC", limit=1, with_graphs=False)
    if not built:
        return record
    then = built[0].extra
    extra = dict(record.extra, built_record=built[0].record_id)
    changes = custom_op_changes(then.get("custom_ops") or {}, record.extra.get("custom_ops") or {},
                                record.extra.get("graph_ops"),
                                forward=record.extra.get("is_backward") is False)
    if changes:
        extra["custom_ops_changed"] = changes
    passes = custom_pass_changes(then.get("custom_passes") or {},
                                 record.extra.get("custom_passes") or {})
    if passes:
        extra["custom_passes_changed"] = passes
    return dataclasses.replace(record, extra=extra)


ADAPTER = InductorAdapter()
