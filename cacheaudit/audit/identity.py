"""Entry identity: which recorded compile built an entry a reader found on disk.

The rule (docs/design.md, "Tying an entry to its compile"), in the order it is applied:

1. a compile already attributed to the entry's path (an in-process observer that knew the
   entry, or an earlier scan that tied it by this rule);
2. else a compile of this entry's source (a primary source at the entry source's path, or with
   its content digest) made for this cache root (its working directory, arguments or outputs
   lie in one of the layout's `build_places`, or its key is the entry's), with an output whose
   digest is the entry binary's, unless the policy says the runtime rewrites the binary after
   the compile; an entry without a source file is matched by its binary's digest, under the
   same root;
3. among several, the newest that started before the entry was published (the binary's mtime).

Never a record whose on-disk outputs all went outside the entry's cache (twin caches sharing one
ledger), never a link step (a record that compiled no source of the entry: its inputs are
objects), never a compile that started after the entry was published.

Pure functions over records the scan loaded in a few indexed queries (`Ledger.
identity_candidates`): nothing here reads the ledger or the disk beyond `os.path.realpath` of
the entry's build places.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cacheaudit.model import MEMORY_PREFIX, CacheEntry, CompileRecord

OBJECT_SUFFIXES = (".o", ".obj", ".a", ".lo", ".so", ".dylib", ".lib", ".dll")
"""What a link step takes as its inputs: no source of an entry ends like these."""


@dataclass
class Candidates:
    """The candidate records of one scan, indexed by what an entry is matched on."""

    by_entry: dict[str, list[CompileRecord]] = field(default_factory=dict)
    by_source: dict[str, list[CompileRecord]] = field(default_factory=dict)
    """Source path or source content digest -> records that compiled it."""
    by_output: dict[str, list[CompileRecord]] = field(default_factory=dict)
    """Output content digest -> records that wrote it."""

    @classmethod
    def index(cls, records: Iterable[CompileRecord]) -> Candidates:
        found = cls()
        for record in records:
            if record.entry:
                found.by_entry.setdefault(record.entry, []).append(record)
            for source in record.sources:
                found.by_source.setdefault(source.path, []).append(record)
                if source.digest:
                    found.by_source.setdefault(source.digest, []).append(record)
            for output in record.outputs:
                if output.digest:
                    found.by_output.setdefault(output.digest, []).append(record)
        return found


@functools.lru_cache(maxsize=1024)
def _forms(directory: str) -> tuple[str, ...]:
    # Thousands of entries share a handful of roots: each is resolved once.
    return tuple(dict.fromkeys((os.path.normpath(directory), os.path.realpath(directory))))


def places_of(directories: Sequence[str]) -> tuple[str, ...]:
    """Each build place as written and resolved, normalised, for prefix comparisons."""
    return tuple(dict.fromkeys(form for directory in directories for form in _forms(directory)))


def _under(path: str, places: Sequence[str]) -> bool:
    path = os.path.normpath(path)
    return any(path == place or path.startswith(place.rstrip(os.sep) + os.sep)
               for place in places)


def _named_paths(record: CompileRecord) -> list[str]:
    """The absolute paths a record names: working directory, sources, outputs, arguments
    (`--output-file=/x` counts by its value)."""
    named = [record.cwd] if record.cwd else []
    named += [s.path for s in (*record.sources, *record.outputs)]
    for token in record.argv:
        value = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
        if value.startswith(os.sep):
            named.append(value)
    return [p for p in named if p and not p.startswith(MEMORY_PREFIX)]


def went_elsewhere(record: CompileRecord, places: Sequence[str]) -> bool:
    """The record wrote files, and none of them inside the entry's build places: it built an
    entry of another cache, whatever it shares with this one (a key, a source, a binary)."""
    on_disk = [o.path for o in record.outputs if not o.path.startswith(MEMORY_PREFIX)]
    return bool(on_disk) and not any(_under(path, places) for path in on_disk)


def made_for(record: CompileRecord, entry: CacheEntry, places: Sequence[str]) -> bool:
    """The record names a path in the entry's build places, or carries the entry's key."""
    if record.key is not None and record.key == entry.key:
        return True
    return any(_under(path, places) for path in _named_paths(record))


def link_step(record: CompileRecord) -> bool:
    """A record that compiled nothing: no include graph, and its inputs are all objects."""
    if record.graph is not None or record.graph_id is not None:
        return False
    return all(s.path.endswith(OBJECT_SUFFIXES) for s in record.sources)


def compiled_source(record: CompileRecord, entry: CacheEntry) -> bool:
    """One of the record's primary sources is the entry's source, by path or by content."""
    source = entry.source
    if source is None:
        return False
    return any(s.path == source.path or (source.digest is not None and s.digest == source.digest)
               for s in record.sources)


def wrote_binary(record: CompileRecord, entry: CacheEntry) -> bool:
    """One of the record's outputs has the entry binary's content digest."""
    digest = entry.binary.digest if entry.binary is not None else None
    return digest is not None and any(o.digest == digest for o in record.outputs)


def _usable(record: CompileRecord) -> bool:
    return record.event == "compile" and record.succeeded and record.runtime_error is None


def published_before(entry: CacheEntry, records: Iterable[CompileRecord]
                     ) -> CompileRecord | None:
    """The newest record that started before the entry was published (the binary written);
    any of them, the newest, when the disk does not say when that was."""
    built = entry.built_ns
    pool = [r for r in records if built is None or r.started_ns <= built]
    return max(pool, key=lambda r: r.started_ns) if pool else None


def choose(entry: CacheEntry, candidates: Candidates, *, places: Sequence[str],
           rewrites_binary: bool = False) -> CompileRecord | None:
    """The compile that built `entry`, by the rule of this module's docstring; None when no
    recorded compile is its build."""
    digest = entry.binary.digest if entry.binary is not None else None

    def confirmed(record: CompileRecord, lenient: bool) -> bool:
        if rewrites_binary or digest is None or wrote_binary(record, entry):
            return True
        # An observer that named the entry but hashed no output has nothing to confirm with.
        return lenient and not any(o.digest for o in record.outputs)

    attributed = [r for r in candidates.by_entry.get(entry.path, ())
                  if _usable(r) and not went_elsewhere(r, places) and confirmed(r, True)]
    chosen = published_before(entry, attributed)
    if chosen is not None:
        return chosen
    if entry.source is not None:
        pool = list(candidates.by_source.get(entry.source.path, ()))
        if entry.source.digest:
            pool += candidates.by_source.get(entry.source.digest, ())
        matching = [r for r in pool if compiled_source(r, entry)]
    elif digest is not None:
        matching = [r for r in candidates.by_output.get(digest, ()) if not link_step(r)]
    else:
        return None
    unique = {r.record_id: r for r in matching}
    return published_before(entry, [
        r for r in unique.values()
        if _usable(r) and not went_elsewhere(r, places) and made_for(r, entry, places)
        and confirmed(r, False)])
