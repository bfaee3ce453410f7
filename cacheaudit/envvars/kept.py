"""The names a compile record keeps, built from the registry once and read back from a file.

Every shim process asks which of its environment's variables a record keeps
(`compile_environment`). The answer needs only the registry's exact names, its family heads and
the markers of the families that claim names outside their heads; building the registry to get
them reads every runtime's spec and environment module (some 35 modules, ~10 ms of CPU, a tenth
of the shim's own process). So the first shim builds the registry and writes those names to
`<ledger>.environment.json` (`ledger.places.ENVIRONMENT_TABLE_SUFFIX`, beside the compilers'
identity memo); later ones read the file (~3 ms) while every source file the build read is
unchanged (path, size, mtime) and the package version, the Python version and
`CACHEAUDIT_RUNTIMES` are the same. A name that holds a claiming family's marker, outside the
exact names and heads, is the family's to judge: then the registry is built after all. The kept
variables, their order and their redaction are the registry's own.

Fails open to building the registry: a file that is missing, not this user's own, writable by
others, malformed or stale is ignored (and rewritten); one that cannot be written is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat as stat_module
import sys
from collections.abc import Mapping

from cacheaudit.envvars.redaction import redact

__all__ = ["kept_environment"]

_FORMAT = "cacheaudit-kept-environment-v1"
_MAX_BYTES = 1 << 20
_OPEN_FLAGS = (os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
               | getattr(os, "O_CLOEXEC", 0))


class _Table:
    __slots__ = ("exact", "head_lengths", "heads", "markers")

    def __init__(self, exact: frozenset[str], heads: frozenset[str],
                 markers: tuple[str, ...]) -> None:
        self.exact = exact
        self.heads = heads
        self.head_lengths = tuple(sorted({len(head) for head in heads}))
        self.markers = markers


def kept_environment(env: Mapping[str, str], table_path: str) -> dict[str, str]:
    """`compile_environment(env)` (every registry variable set in `env`, sorted, redacted),
    answered from the table at `table_path` where it is valid, else from the registry (which
    then writes the table)."""
    table = _read(table_path)
    if table is None:
        from cacheaudit import envvars

        table = _build_and_write(table_path)
        if table is None:
            return envvars.compile_environment(env)
    kept: list[tuple[str, str]] = []
    exact, heads, lengths, markers = table.exact, table.heads, table.head_lengths, table.markers
    for name, value in env.items():
        if name in exact or any(len(name) > n and name[:n] in heads for n in lengths):
            kept.append((name, redact(name, value)))
        elif markers and any(marker in name for marker in markers):
            # A family may claim it (DeepJIT's `<P>_JIT_*`): the family's own judgement.
            from cacheaudit import envvars

            return envvars.compile_environment(env)
    kept.sort()
    return dict(kept)


def _key() -> dict[str, object]:
    from cacheaudit import __version__

    return {"version": __version__, "python": list(sys.version_info[:2]),
            "runtimes": os.environ.get("CACHEAUDIT_RUNTIMES", "")}


def _source_stamp(path: str) -> list[int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _build_and_write(table_path: str) -> _Table | None:
    """The registry built in this process, its table written; None when the registry was
    built before (the modules its build read are then unknown) or cannot be read whole."""
    from cacheaudit import envvars

    if envvars.registry.cache_info().currsize:
        return None
    before = set(sys.modules)
    registry = envvars.registry()
    if registry.problems:
        return None  # a runtime left out: not worth remembering, the next process retries
    sources: dict[str, list[int]] = {}
    for name in sorted(set(sys.modules) - before | {"cacheaudit.envvars", "cacheaudit.spec"}
                       | {n for n in sys.modules if n.startswith("cacheaudit.envvars.")}):
        path = getattr(sys.modules.get(name), "__file__", None)
        if not isinstance(path, str):
            continue  # built in or frozen: it changes with the interpreter, which is keyed
        stamp = _source_stamp(path)
        if stamp is None:
            return None
        sources[path] = stamp
    table = _Table(frozenset(registry._exact), registry._all_heads,
                   tuple(dict.fromkeys(f.marker for f in registry._claiming)))
    _write(table_path, {"format": _FORMAT, "key": _key(), "sources": sources,
                        "exact": sorted(table.exact), "heads": sorted(table.heads),
                        "markers": list(table.markers)})
    return table


def _read(path: str) -> _Table | None:
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if (not stat_module.S_ISREG(st.st_mode) or st.st_uid != os.getuid()
                or st.st_mode & 0o022 or st.st_size > _MAX_BYTES):
            return None
        with os.fdopen(fd, "rb", closefd=False) as handle:
            data = json.loads(handle.read(_MAX_BYTES + 1))
    except (OSError, ValueError, RecursionError):
        return None
    finally:
        os.close(fd)
    if not isinstance(data, dict) or data.get("format") != _FORMAT or data.get("key") != _key():
        return None
    sources, exact = data.get("sources"), data.get("exact")
    heads, markers = data.get("heads"), data.get("markers")
    if not (isinstance(sources, dict) and sources and _all_str(exact) and _all_str(heads)
            and _all_str(markers)):
        return None
    for source, stamp in sources.items():
        if _source_stamp(source) != stamp:
            return None
    return _Table(frozenset(exact), frozenset(heads), tuple(markers))  # type: ignore[arg-type]


def _all_str(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) and item for item in value)


def _write(path: str, data: dict[str, object]) -> None:
    """Replace `path` by rename, 0600; nothing when its directory is not there (the ledger's,
    made with the ledger) or cannot be written."""
    staging = f"{path}.{os.getpid()}.tmp"
    try:
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
                     | getattr(os, "O_NOFOLLOW", 0), 0o600)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(data, handle)
        os.replace(staging, path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError):
            os.remove(staging)
