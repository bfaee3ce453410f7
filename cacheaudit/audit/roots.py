"""What a scan of the default roots did not find: roots a variable names that do not exist, and
default roots that exist but hold nothing a layout recognises.

A CI guard (`cacheaudit scan --fail-on error`) that scans nothing passes: a typo in
`DG_JIT_CACHE_DIR`, or a job whose cache lives elsewhere, must not read as "no findings". The
scan reports both; the command refuses them unless `--allow-empty` (docs/cli.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from cacheaudit import runtimes
from cacheaudit.layout import Layout


def _normal(path: str) -> str:
    return os.path.normpath(os.path.abspath(os.path.expanduser(path)))


def cache_variables(env: Mapping[str, str]) -> list[str]:
    """The variables that may name cache roots: every runtime's declared `cache_variables`,
    then what layouts read by pattern under `env` (`Layout.root_variables`), each once."""
    names = [name for declared in runtimes.specs() for name in declared.cache_variables]
    names += [name for layout in runtimes.layouts() for name in layout.root_variables(env)]
    return list(dict.fromkeys(names))


def missing_named_roots(env: Mapping[str, str]) -> list[tuple[str, str]]:
    """(variable, its value) for each cache variable set in `env` whose value names default
    roots of some layout (the value itself, or an item of its path list) none of which exists.

    Only variables that name a root itself count: `XDG_CACHE_HOME` or `TRITON_HOME`, under
    which a runtime's root would be a subdirectory, may well point somewhere without one."""
    defaults = {_normal(root) for layout in runtimes.layouts()
                for root in layout.default_roots(env)}
    missing: list[tuple[str, str]] = []
    for name in cache_variables(env):
        value = env.get(name)
        if not value:
            continue
        named = [_normal(item) for item in value.split(os.pathsep) if item]
        named = [path for path in named if path in defaults]
        if named and not any(os.path.isdir(path) for path in named):
            missing.append((name, value))
    return missing


def empty_default_roots(env: Mapping[str, str],
                        found: Sequence[tuple[Layout, str]]) -> list[tuple[str, str]]:
    """(layout, root) for each default root that exists as a directory but that no layout
    takes for a root (no entry yet: `~/.deep_gemm` made before its first commit), as the
    snapshot lists it; none of the roots in `found`."""
    claimed = {_normal(root) for _layout, root in found}
    empty: list[tuple[str, str]] = []
    for layout in runtimes.layouts():
        for root in layout.default_roots(env):
            path = _normal(root)
            if path not in claimed and os.path.isdir(path):
                claimed.add(path)
                empty.append((layout.layout, path))
    return empty
