"""ToyJIT's key covers the source and TOYJIT_FLAGS, nothing the source includes."""

from __future__ import annotations

from collections.abc import Mapping

from cacheaudit.digest import read_file
from cacheaudit.model import CacheEntry, CompileRecord
from cacheaudit.policy import KeyCheck, KeyComponent, Policy, TrackedSet

from toyjit.runtime import key_of


class ToyPolicy(Policy):
    runtime = "toyjit"

    def tracked(self, entry: CacheEntry, record: CompileRecord | None) -> TrackedSet:
        paths = frozenset({entry.source.path}) if entry.source is not None else frozenset()
        return TrackedSet(paths, how="ToyJIT keys the source and TOYJIT_FLAGS only")

    def check_key(self, entry: CacheEntry, record: CompileRecord | None = None,
                  env: Mapping[str, str] | None = None) -> KeyCheck:
        if entry.source is None:
            return KeyCheck(None, note="no kernel.cpp")
        flags = (record.env if record is not None else env or {}).get("TOYJIT_FLAGS", "")
        source = read_file(entry.source.path)
        return KeyCheck(key_of(source, flags), (KeyComponent("source", entry.source.path),
                                                KeyComponent("TOYJIT_FLAGS", flags)))

    def dependency_command(self, entry: CacheEntry) -> tuple[list[str], str] | None:
        command = entry.meta.get("command")
        return (list(command), entry.path) if command else None


POLICIES = {"toyjit": ToyPolicy()}
