"""Readers: one module per on-disk cache layout, each turning a cache root into entries.

A reader answers three questions about its layout: where its roots are by default (from the
environment and the runtime's own defaults), whether a given directory is one of its roots, and
what entries (and leftovers) a root holds. Readers only read: they never create, touch or
delete anything in a cache, and they never run a compiler.

Adding a layout: a module here with a `READER` object satisfying `Reader`, and one line in
`_MODULES`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Protocol

from cacheaudit.digest import StateCache
from cacheaudit.model import CacheEntry, CacheLeftover

_MODULES = ("deepjit", "deepgemm", "torch_ext", "triton", "cupy", "cuda_core")


class Reader(Protocol):
    layout: str
    """The layout's name, also the module's name: "deepjit", "deepgemm", ..."""

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        """Cache roots this runtime would use under `env`, existing or not, in lookup order."""
        ...

    def is_root(self, path: str) -> bool:
        """Whether `path` looks like a root of this layout (cheap: a few stats)."""
        ...

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        """Every entry and leftover under `root`. File states come from `cache`."""
        ...


def _load(name: str) -> Reader:
    return importlib.import_module(f"cacheaudit.readers.{name}").READER  # type: ignore[attr-defined, no-any-return]


def all_readers() -> list[Reader]:
    return [_load(name) for name in _MODULES]


def reader_for(layout: str) -> Reader:
    if layout not in _MODULES:
        raise KeyError(f"no reader for layout {layout!r}")
    return _load(layout)
