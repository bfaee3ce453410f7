"""ToyJIT's cache layout (the grammar is in `runtime.py`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping

from cacheaudit.digest import StateCache
from cacheaudit.layout import Layout, scandir_sorted, unlistable
from cacheaudit.model import CacheEntry, CacheLeftover

_ENTRY = re.compile(r"([A-Za-z0-9_]+)\.([0-9a-f]{16})")


class ToyLayout(Layout):
    layout = "toyjit"
    runtime = "toyjit"

    def default_roots(self, env: Mapping[str, str]) -> list[str]:
        return [env["TOYJIT_CACHE_DIR"]] if env.get("TOYJIT_CACHE_DIR") else []

    def is_root(self, path: str) -> bool:
        return os.path.isfile(os.path.join(path, "toyjit.root"))

    def read(self, root: str, cache: StateCache) -> Iterator[CacheEntry | CacheLeftover]:
        try:
            items = scandir_sorted(root)
        except OSError as exc:
            yield unlistable(self.runtime, self.layout, root, root, exc)
            return
        for item in items:
            match = _ENTRY.fullmatch(item.name)
            if match is None:
                continue
            with open(os.path.join(item.path, "command")) as lines:
                command = lines.read().splitlines()
            yield CacheEntry(runtime=self.runtime, layout=self.layout, root=root,
                             path=item.path, kernel=match.group(1), key=match.group(2),
                             binary=cache.capture(os.path.join(item.path, "kernel.o")),
                             source=cache.capture(os.path.join(item.path, "kernel.cpp")),
                             meta={"command": command})


LAYOUT = ToyLayout()
