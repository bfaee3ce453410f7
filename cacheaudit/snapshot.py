"""The bug-report snapshot: what a maintainer needs to know about a user's JIT setup, at once.

It holds what PyTorch's and vLLM's `collect_env` hold that matters for JIT kernels (system,
packages, compilers, GPU, environment) and what neither has: the compile-affecting environment
with each `<PREFIX>_JIT_*` setting's value in effect and where it came from, the cache roots, and
from the ledger the latest findings and the four answers for the kernels that ran.

Every probe has a time limit and a fallback of its own: a missing tool or a hanging command makes
its line say so, and the snapshot still completes. Secrets never appear: only the variable
registry's variables are read, values that look like credentials are redacted, and a last pass
redacts credential-shaped text anywhere in the snapshot.
"""

from __future__ import annotations

import getpass
import importlib.metadata
import importlib.util
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from cacheaudit import __version__, bounded, children, contract, envvars, probes
from cacheaudit.findings import ns_iso
from cacheaudit.probes import COULD_NOT_COLLECT

LEGACY_FORMAT = 1
"""`"format": 1`: a snapshot taken before the JSON envelope (`cacheaudit.contract`); its members
are those of version 2 without the envelope's, and `diff` reads it as ever."""
# Packages that decide how kernels are compiled and cached besides those the runtimes' specs
# name (PyTorch's and vLLM's lists, narrowed to JIT stacks), plus every nvidia-* wheel.
OTHER_PACKAGES = ("numba", "numba-cuda", "jax", "jaxlib", "cacheaudit")


def packages_reported() -> frozenset[str]:
    from cacheaudit import runtimes

    return frozenset(name.lower() for declared in runtimes.specs()
                     for name in declared.packages) | frozenset(OTHER_PACKAGES)


def _system() -> dict[str, Any]:
    libc, libc_version = platform.libc_ver()
    return {"os": platform.platform(), "machine": platform.machine(),
            "libc": f"{libc} {libc_version}".strip() or COULD_NOT_COLLECT,
            "python": sys.version.split("\n")[0], "executable": sys.executable,
            "cacheaudit": __version__}


def _packages() -> dict[str, str]:
    found: dict[str, str] = {}
    wanted = packages_reported()
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata.get("Name") or ""
        if name.lower() in wanted or name.lower().startswith("nvidia-"):
            found[name] = distribution.version
    return dict(sorted(found.items(), key=lambda item: item[0].lower()))


def _compilers(env: Mapping[str, str], timeout: float) -> list[dict[str, Any]]:
    from cacheaudit import runtimes

    nvcc = None
    settings = [setting for declared in runtimes.specs()
                for setting in declared.compiler_settings if setting.compiler == "nvcc"]
    # A setting that falls back to another (DeepGEMM's to DeepJIT's) is the more specific one:
    # it is what its runtime runs, so it is asked first; sorted() keeps registry order otherwise.
    for variable in [s.name for s in sorted(settings, key=lambda s: not s.unless_set)]:
        if env.get(variable):
            nvcc = env[variable]
            break
    if nvcc is None and (env.get("CUDA_HOME") or env.get("CUDA_PATH")):
        candidate = os.path.join(env.get("CUDA_HOME") or env.get("CUDA_PATH", ""), "bin", "nvcc")
        nvcc = candidate if os.path.exists(candidate) else None
    found = [probes.compiler("nvcc", nvcc or probes.which("nvcc", env), env, timeout)]
    for name in ("g++", "gcc", "clang++"):
        found.append(probes.compiler(name, probes.which(name, env), env, timeout))
    cxx = env.get("CXX")
    if cxx:
        found.append(probes.compiler(f"CXX ({cxx})", probes.which(cxx, env) or cxx, env,
                                     timeout))
    for declared in runtimes.specs():
        if declared.snapshot is not None:
            try:
                module = importlib.import_module(declared.module(declared.snapshot))
                found.extend(module.compilers(env, timeout))
            except Exception as exc:  # noqa: BLE001 - one runtime's probe never stops a snapshot
                found.append({"name": declared.name,
                              "status": f"{COULD_NOT_COLLECT}: {type(exc).__name__}: {exc}"})
    return found


def _gpu(env: Mapping[str, str], timeout: float) -> dict[str, Any]:
    # The driver's tools map more address space than a compiler's preprocessor: the limit of a
    # compile (not yet measured on a GPU host).
    output, problem = probes.run(["nvidia-smi", "--query-gpu=name,driver_version,uuid",
                                  "--format=csv,noheader"], timeout, env,
                                 limits=children.COMPILE_LIMITS)
    if output is None:
        return {"status": problem, "gpus": []}
    gpus = []
    for line in output.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3:
            gpus.append({"name": parts[0], "driver": parts[1], "uuid": parts[2]})
    return {"status": "ok", "gpus": gpus}


def _environment(env: Mapping[str, str]) -> dict[str, Any]:
    # The settings in effect come from the runtimes' name families (each value with the
    # variable that supplied it, or its default): the snapshot knows no family of its own.
    return {"variables": envvars.compile_environment(env),
            "jit_settings": envvars.snapshot_settings(env)}


def _tree_size(path: str) -> tuple[int, int]:
    size, newest = 0, 0
    for directory, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(directory, name))
            except OSError:
                continue
            size += st.st_size
            newest = max(newest, st.st_mtime_ns)
    return size, newest


def _caches(env: Mapping[str, str]) -> list[dict[str, Any]]:
    from cacheaudit import runtimes

    roots = []
    for reader in runtimes.layouts():
        for root in reader.default_roots(env):
            if not os.path.isdir(root):
                continue
            cache_dir = os.path.join(root, "cache")
            try:
                count = sum(1 for item in os.scandir(cache_dir) if item.is_dir()) if \
                    os.path.isdir(cache_dir) else sum(1 for _ in os.scandir(root))
            except OSError:
                count = 0
            size, newest = _tree_size(root)
            roots.append({"layout": reader.layout, "root": root, "entries": count,
                          "bytes": size, "last_change": ns_iso(newest) if newest else None})
    return roots


def _ledger(path: str | None, recent: int) -> dict[str, Any]:
    from cacheaudit.documents import record_summary
    from cacheaudit.ledger import default_ledger_path, open_existing

    path = path or default_ledger_path()
    try:
        opened = open_existing(path)
        if opened is None:
            return {"path": path, "status": "no ledger yet"}
        with opened as ledger:
            # Newest first: the snapshot's table leads with what ran last.
            records = ledger.recent_records(limit=recent, with_files=False)[::-1]
            findings = ledger.findings()
            total = ledger.count("records")
    except Exception as exc:  # noqa: BLE001 - a damaged ledger is a line, not a failure
        return {"path": path, "status": f"{COULD_NOT_COLLECT}: {exc}"}
    return {"path": path, "status": "ok", "records": total,
            "latest_findings": [f.to_dict() for f in findings],
            "recent": [_compact(record_summary(r)) for r in records]}


def _compact(summary: dict[str, Any]) -> dict[str, Any]:
    compiler = summary.get("compiler") or {}
    return {"when": summary["started"], "runtime": summary["runtime"],
            "kernel": summary["kernel"], "event": summary["event"],
            "compiler": compiler.get("path"), "version": compiler.get("version"),
            "host": (compiler.get("host") or {}).get("path"),
            "injected": summary["options"]["injected_by_environment"],
            "inputs": (summary["inputs"]["graph"] or {}).get("file_count"),
            "exit_code": summary["exit_code"], "test_id": summary["test_id"]}


def collect(env: Mapping[str, str] | None = None, *, ledger: str | None = None,
            timeout: float = 10.0, anonymize: bool = False, recent: int = 10) -> dict[str, Any]:
    """The snapshot as plain data. Each part is collected on its own: one that fails says so."""
    env = dict(os.environ if env is None else env)
    problems: list[str] = []

    def part(name: str, make: Callable[[], Any], fallback: Any) -> Any:
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 - every probe has its own fallback
            problems.append(f"{name}: {COULD_NOT_COLLECT}: {type(exc).__name__}: {exc}")
            return fallback

    now = time.time_ns()
    snapshot = {
        "taken": ns_iso(now),
        "system": part("system", _system, {}),
        "packages": part("packages", _packages, {}),
        "compilers": part("compilers", lambda: _compilers(env, timeout), []),
        "gpu": part("gpu", lambda: _gpu(env, timeout), {"status": COULD_NOT_COLLECT}),
        "environment": part("environment", lambda: _environment(env), {}),
        "caches": part("caches", lambda: _caches(env), []),
        "ledger": part("ledger", lambda: _ledger(ledger, recent), {}),
        "problems": problems,
    }
    snapshot = _scrub(snapshot)
    if anonymize:
        snapshot = anonymized(snapshot, env)
    return contract.document("snapshot", "snapshot", snapshot, generated_ns=now)


# ------------------------------------------------------------------------------ privacy


def _scrub(value: Any) -> Any:
    """Redact credential-shaped text anywhere (a token in a version string, a URL with a
    password in a path): the registry is an allowlist, this is the belt to its braces."""
    if isinstance(value, str):
        return envvars.redact("", value) if envvars.looks_secret_value(value) else value
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    if isinstance(value, dict):
        return {k: _scrub(v) for k, v in value.items()}
    return value


_GPU_UUID = re.compile(r"GPU-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


# A name is replaced only where it stands as a whole word or path component: a user `root`
# must not turn `rootfs` into `<user>fs`, nor a host `vm` turn `vmware` into `<host>ware`.
_NAME_CHARS = r"[A-Za-z0-9_-]"


def _whole(name: str) -> re.Pattern[str]:
    return re.compile(rf"(?<!{_NAME_CHARS}){re.escape(name)}(?!{_NAME_CHARS})")


def anonymized(snapshot: Any, env: Mapping[str, str]) -> Any:
    """The home directory, user and host names, and GPU UUIDs replaced by placeholders, in
    values only: the keys are the snapshot's own structure (a cache's `root`, say)."""
    home = (env.get("HOME") or os.path.expanduser("~")).rstrip("/")
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name is nothing to hide
        user = ""
    host = socket.gethostname()
    replacements: list[tuple[re.Pattern[str], str]] = []
    if home:
        # The home directory as a leading path: /home/al must not match inside /home/alice.
        replacements.append((re.compile(rf"{re.escape(home)}(?=/|$|[^A-Za-z0-9_.-])"), "~"))
    replacements += [(_whole(name), placeholder) for name, placeholder in
                     ((host, "<host>"), (user, "<user>")) if name and len(name) > 1]

    def clean(value: Any) -> Any:
        if isinstance(value, str):
            for pattern, new in replacements:
                value = pattern.sub(new, value)
            return _GPU_UUID.sub("GPU-<uuid>", value)
        if isinstance(value, list):
            return [clean(v) for v in value]
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        return value

    return clean(snapshot)


# ------------------------------------------------------------------------------ markdown


def _cell(value: Any) -> str:
    text = "-" if value is None or value == "" else str(value)
    return text.replace("|", "\\|").replace("\n", "<br>")


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def _details(summary: str, body: list[str]) -> list[str]:
    # GitHub renders Markdown inside <details> only after a blank line.
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>", ""]


def to_markdown(snapshot: Mapping[str, Any]) -> str:
    system = snapshot.get("system", {})
    gpu = snapshot.get("gpu", {})
    gpus = ", ".join(f"{g['name']} (driver {g['driver']})" for g in gpu.get("gpus", [])) or \
        gpu.get("status", COULD_NOT_COLLECT)
    lines = ["## cacheaudit snapshot", "",
             *_table(["", ""], [["taken", snapshot.get("taken")],
                                ["cacheaudit", system.get("cacheaudit")],
                                ["Python", system.get("python")], ["OS", system.get("os")],
                                ["libc", system.get("libc")], ["GPU", gpus]]), ""]
    compilers = snapshot.get("compilers", [])
    lines += _details(f"Compilers ({len(compilers)})", _table(
        ["compiler", "path", "resolved", "version", "xxh3", "host compiler", "status"],
        [[c.get("name"), c.get("path"), c.get("resolved"), c.get("version"),
          (c.get("xxh3") or "")[:16], (c.get("host") or {}).get("path"), c.get("status")]
         for c in compilers]))
    packages = snapshot.get("packages", {})
    lines += _details(f"Packages ({len(packages)})",
                      _table(["package", "version"], [[k, v] for k, v in packages.items()]))
    environment = snapshot.get("environment", {})
    variables = environment.get("variables", {})
    settings = environment.get("jit_settings", [])
    lines += _details(
        f"Compile-affecting environment ({len(variables)} set)",
        [*_table(["variable", "value"], [[k, v] for k, v in variables.items()]), "",
         envvars.settings_title(), "",
         *_table(["setting", "value", "from"],
                 [[s["setting"], s["value"], s["from"]] for s in settings])])
    caches = snapshot.get("caches", [])
    lines += _details(f"Cache roots ({len(caches)})", _table(
        ["layout", "root", "entries", "bytes", "last change"],
        [[c["layout"], c["root"], c["entries"], c["bytes"], c["last_change"]] for c in caches]))
    ledger = snapshot.get("ledger", {})
    findings = ledger.get("latest_findings", [])
    lines += _details(f"Latest findings ({len(findings)})", _table(
        ["code", "severity", "kernel", "subject", "recorded", "now"],
        [[f["code"], f["severity"], f.get("kernel"), f["subject"], f.get("recorded"),
          f.get("current")] for f in findings]) if findings else [
        f"ledger {ledger.get('path', '-')}: {ledger.get('status', 'no findings')}"])
    recent = ledger.get("recent", [])
    lines += _details(f"Recent kernels ({len(recent)})", _table(
        ["when", "kernel", "event", "1 compiler", "host", "2 injected options", "4 inputs",
         "test"],
        [[r["when"], f"{r.get('runtime') or '-'}:{r.get('kernel')}", r["event"],
          f"{r.get('compiler')} ({r.get('version')})", r.get("host"),
          " ".join(r.get("injected") or []), r.get("inputs"), r.get("test_id")]
         for r in recent]) if recent else ["no recorded kernels"])
    if snapshot.get("problems"):
        lines += _details("Probes that failed", [f"- {p}" for p in snapshot["problems"]])
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ diff


SNAPSHOT_BYTES = bounded.RECORD_BYTES
"""How large a snapshot given to `diff` may be: one from a bug report is data from elsewhere."""

# The parts `diff` reads, and the shape each must have: (key, container, keys each item holds).
_SHAPES: tuple[tuple[tuple[str, ...], type, str | None], ...] = (
    (("compilers",), list, "name"), (("packages",), dict, None),
    (("environment",), dict, None), (("environment", "variables"), dict, None),
    (("environment", "jit_settings"), list, "setting"), (("caches",), list, "root"),
    (("system",), dict, None))


def load_snapshot(path: str) -> dict[str, Any]:
    """A snapshot file (taken with --json, perhaps on another machine) for `diff`, read within
    `bounded`'s limits and checked for the shape `diff` reads. Raises UsageError, one line."""
    from cacheaudit.exceptions import UsageError

    try:
        data = bounded.load_file(path, max_bytes=SNAPSHOT_BYTES)
    except (OSError, bounded.Refused) as exc:
        reason = exc.reason if isinstance(exc, bounded.Refused) else (
            f"{type(exc).__name__}: {exc.strerror or exc}")
        raise UsageError(f"{path}: not a snapshot taken with --json ({reason})") from None
    if not isinstance(data, dict) or "format" not in data:
        raise UsageError(f"{path}: not a snapshot taken with --json")
    if (problem := _version_problem(data)) is not None:
        raise UsageError(f"{path}: {problem}")
    if (problem := _shape_problem(data)) is not None:
        raise UsageError(f"{path}: not a snapshot taken with --json ({problem})")
    return data


def _version_problem(data: Mapping[str, Any]) -> str | None:
    """Why `diff` cannot read a document by its envelope: another kind, or a version newer
    than this cacheaudit knows (a rename or removal may have happened since)."""
    if data["format"] == LEGACY_FORMAT:
        return None
    wanted = contract.format_name("snapshot")
    if data["format"] != wanted:
        return f"not a snapshot taken with --json (its format is {data['format']!r})"
    version, known = data.get("version"), contract.VERSIONS["snapshot"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return f"a snapshot without a valid version ({version!r})"
    if version > known:
        return (f"a snapshot of version {version}, taken by a newer cacheaudit; this one "
                f"reads versions up to {known}")
    return None


def _shape_problem(data: Mapping[str, Any]) -> str | None:
    for keys, container, item_key in _SHAPES:
        value: Any = data
        for key in keys:
            value = value.get(key) if isinstance(value, Mapping) else None
        if value is None:
            continue  # an older or partial snapshot: diff compares what both have
        where = ".".join(keys)
        if not isinstance(value, container):
            return f"{where} is a JSON {type(value).__name__}, not {container.__name__}"
        if item_key is not None and not all(
                isinstance(item, Mapping) and isinstance(item.get(item_key), str)
                for item in value):
            return f"an item of {where} is not an object with a {item_key!r} string"
    return None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _by(part: Any, key: str, name: str) -> dict[str, Any]:
    """The objects of the list `part[name]`, by their `key` string (others left out)."""
    items = _mapping(part).get(name)
    if not isinstance(items, list):
        return {}
    return {item[key]: item for item in items
            if isinstance(item, Mapping) and isinstance(item.get(key), str)}


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """What differs between two snapshots, grouped: compilers, packages, environment, caches,
    system. Each difference is {item, field, before, after}."""
    groups: dict[str, list[dict[str, Any]]] = {
        "compilers": [], "packages": [], "environment": [], "caches": [], "system": []}

    def compare(group: str, old: Any, new: Any, fields: tuple[str, ...] | None = None) -> None:
        # Either side may come from another machine's snapshot with any shape: what is not an
        # object compares as a whole value, never as fields.
        old, new = _mapping(old), _mapping(new)
        for item in sorted(set(old) | set(new), key=str):
            a, b = old.get(item), new.get(item)
            if not isinstance(a, Mapping) or not isinstance(b, Mapping):
                if a != b:
                    groups[group].append({"item": item, "field": "", "before": a, "after": b})
                continue
            for name in fields or tuple(sorted(set(a) | set(b), key=str)):
                if a.get(name) != b.get(name):
                    groups[group].append({"item": item, "field": name, "before": a.get(name),
                                          "after": b.get(name)})

    compare("compilers", _by(before, "name", "compilers"), _by(after, "name", "compilers"),
            ("path", "resolved", "version", "xxh3", "host", "status"))
    compare("packages", _mapping(before).get("packages"), _mapping(after).get("packages"))
    env_a = _mapping(_mapping(before).get("environment"))
    env_b = _mapping(_mapping(after).get("environment"))
    compare("environment", env_a.get("variables"), env_b.get("variables"))
    compare("environment",
            {f"jit {key}": s for key, s in _by(env_a, "setting", "jit_settings").items()},
            {f"jit {key}": s for key, s in _by(env_b, "setting", "jit_settings").items()},
            ("value", "from"))
    compare("caches", _by(before, "root", "caches"), _by(after, "root", "caches"),
            ("layout", "entries", "bytes", "last_change"))
    compare("system", _mapping(before).get("system"), _mapping(after).get("system"))
    return groups

