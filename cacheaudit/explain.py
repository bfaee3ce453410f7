"""`cacheaudit explain`: one entry in full, and what changed since the kernel's previous compile.

Everything here is assembled from the reader, the ledger, the runtime's policy and the auditor;
rendering is `output.py`'s business.
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from cacheaudit.audit import AuditOptions, Auditor, discover
from cacheaudit.audit.scan import entry_at
from cacheaudit.digest import StateCache
from cacheaudit.exceptions import UsageError
from cacheaudit.layout import Layout
from cacheaudit.ledger import Ledger
from cacheaudit.model import CacheEntry, CompileRecord, CompilerIdentity, Finding
from cacheaudit.policy import KeyCheck, TrackedSet
from cacheaudit.runtimes import layouts, policy_for


@dataclass(frozen=True)
class Change:
    """One component that differs between two compiles of the same kernel."""

    component: str
    item: str
    old: str | None
    new: str | None


@dataclass
class Explanation:
    entry: CacheEntry | None
    record: CompileRecord | None
    previous: CompileRecord | None = None
    lookups: list[CompileRecord] = field(default_factory=list)
    tracked: TrackedSet | None = None
    key: KeyCheck | None = None
    changes: list[Change] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


def _roots_to_search(env: Mapping[str, str], ledger: Ledger | None) -> list[tuple[Layout, str]]:
    """The default roots under `env`, then the roots the ledger knows (earlier scans' roots,
    `Ledger.remember_roots`), each with the layouts that take it for a root: a key prefix is
    found where the scan found the entry, whether or not the runtime's variable is set now."""
    found = list(discover([], env))
    seen = {os.path.normpath(root) for _reader, root in found}
    known: list[str] = []
    if ledger is not None:
        with contextlib.suppress(Exception):  # an old or damaged table only narrows the search
            known = sorted(ledger.known_roots())
    for root in known:
        if os.path.normpath(root) in seen or not os.path.isdir(root):
            continue
        seen.add(os.path.normpath(root))
        found += [(reader, root) for reader in layouts() if reader.is_root(root)]
    return found


def _entry_by_key(prefix: str, env: Mapping[str, str], cache: StateCache,
                  ledger: Ledger | None = None) -> CacheEntry | None:
    matches: dict[str, CacheEntry] = {}
    for reader, root in _roots_to_search(env, ledger):
        for item in reader.read(root, cache):
            if isinstance(item, CacheEntry) and item.key and item.key.startswith(prefix):
                matches.setdefault(item.path, item)
    if len(matches) > 1:
        raise UsageError(f"{prefix!r} matches {len(matches)} entries; give more of the key")
    return next(iter(matches.values()), None)


def locate(target: str, env: Mapping[str, str], ledger: Ledger | None,
           cache: StateCache) -> tuple[CacheEntry | None, CompileRecord | None]:
    """An entry path (or a file in it), a key prefix, or a record id."""
    if os.path.exists(target):
        entry = entry_at(target, cache)
        if entry is None:
            raise UsageError(f"{target}: not inside a cache entry of any known runtime")
        return entry, None
    if ledger is not None:
        # A literal prefix: LIKE would read `_` and `%` in the target as wildcards. The range
        # lets the unique index on record_uuid find it (substr alone reads every record).
        condition = ("r.record_uuid >= ? AND r.record_uuid < ?"
                     " AND substr(r.record_uuid, 1, ?) = ?")
        params = (target, target + "\U0010ffff", len(target), target)
        records = ledger.records(where=condition, params=params, limit=2)
        if len(records) > 1:
            count = ledger.conn.execute(
                f"SELECT count(*) FROM records r WHERE {condition}", params).fetchone()[0]
            raise UsageError(f"{target!r} matches {count} records; give more of the record id")
        if len(records) == 1:
            record = records[0]
            entry = entry_at(record.entry, cache) if record.entry and os.path.exists(
                record.entry) else None
            return entry, record
    entry = _entry_by_key(target, env, cache, ledger)
    if entry is None:
        raise UsageError(f"{target}: no entry path, entry key or record id matches")
    return entry, None


def explain(target: str, env: Mapping[str, str], ledger: Ledger | None) -> Explanation:
    auditor = Auditor(env=env, ledger=ledger, options=AuditOptions(verify_keys=True),
                      full_records=True)
    if ledger is not None:
        # Finding the entry reads its whole cache root: known states make that a stat a file.
        auditor.cache.remember(ledger.seen_states())
    entry, record = locate(target, env, ledger, auditor.cache)
    explanation = Explanation(entry=entry, record=record)
    if entry is not None:
        auditor.load([entry])
        explanation.findings = auditor.audit_entry(entry)
        auditor.save_attributions()
        explanation.record = record = auditor.record_for(entry) or record
        explanation.lookups = auditor.lookups_for(entry)
        try:
            policy = policy_for(entry.runtime)
        except KeyError:
            policy = None
        if policy is not None:
            explanation.tracked = policy.tracked(entry, record)
            explanation.key = policy.check_key(entry, record, env=env)
    if record is not None and ledger is not None:
        explanation.previous = previous_compile(ledger, record, entry)
        if explanation.previous is not None:
            explanation.changes = diff_records(explanation.previous, record)
    return explanation


def previous_compile(ledger: Ledger, record: CompileRecord,
                     entry: CacheEntry | None) -> CompileRecord | None:
    runtime = entry.runtime if entry else record.runtime
    kernel = entry.kernel if entry else record.kernel
    if kernel is None:
        return None
    earlier = ledger.records(
        where="r.runtime IS ? AND r.kernel = ? AND r.event = 'compile' AND r.record_uuid != ?"
              " AND (r.started_ns < ? OR (r.started_ns = ? AND r.record_uuid < ?))",
        params=(runtime, kernel, record.record_id, record.started_ns, record.started_ns,
                record.record_id),
        order="r.started_ns DESC, r.id DESC", limit=1)
    return earlier[0] if earlier else None


def _compiler_changes(label: str, old: CompilerIdentity | None,
                      new: CompilerIdentity | None) -> list[Change]:
    if old is None or new is None:
        return [] if old is new else [Change(label, "identity", str(old and old.path),
                                             str(new and new.path))]
    changes = [Change(label, name, str(a), str(b)) for name, a, b in (
        ("path", old.path, new.path), ("resolved", old.resolved, new.resolved),
        ("version", old.version_line, new.version_line), ("digest", old.digest, new.digest))
        if a != b]
    if old.version_text != new.version_text and old.version_line == new.version_line:
        changes.append(Change(label, "version text", old.version_text, new.version_text))
    return changes + _compiler_changes(f"{label} host", old.host, new.host) if (
        old.host or new.host) else changes


def diff_records(old: CompileRecord, new: CompileRecord) -> list[Change]:
    """What differs between two compiles, component by component, in the design's order."""
    changes = _compiler_changes("1 compiler", old.compiler, new.compiler)
    old_tokens = Counter((t.text, t.origin) for t in old.effective_argv)
    new_tokens = Counter((t.text, t.origin) for t in new.effective_argv)
    for (text, origin), count in sorted((old_tokens - new_tokens).items()):
        changes += [Change("2 options", f"token ({origin})", text, None)] * count
    for (text, origin), count in sorted((new_tokens - old_tokens).items()):
        changes += [Change("2 options", f"token ({origin})", None, text)] * count
    for name in sorted(set(old.env) | set(new.env)):
        if old.env.get(name) != new.env.get(name):
            changes.append(Change("2 environment", name, old.env.get(name), new.env.get(name)))
    old_sources = {os.path.basename(s.path): s.digest for s in old.sources}
    new_sources = {os.path.basename(s.path): s.digest for s in new.sources}
    for name in sorted(set(old_sources) | set(new_sources)):
        if old_sources.get(name) != new_sources.get(name):
            changes.append(Change("4 source", name, old_sources.get(name),
                                  new_sources.get(name)))
    old_files = {f.path: f.state for f in old.graph.files} if old.graph else {}
    new_files = {f.path: f.state for f in new.graph.files} if new.graph else {}
    for path in sorted(set(old_files) | set(new_files)):
        before, after = old_files.get(path), new_files.get(path)
        if before is None or after is None:
            changes.append(Change("4 inputs", path, "read" if before else None,
                                  "read" if after else None))
        elif not before.same_content(after):
            changes.append(Change("4 inputs", path, before.digest, after.digest))
    if old.key != new.key:
        changes.append(Change("key", "key", old.key, new.key))
    old_out = [s.digest for s in old.outputs]
    new_out = [s.digest for s in new.outputs]
    if old_out != new_out:
        changes.append(Change("output", "binary", ", ".join(d or "-" for d in old_out),
                              ", ".join(d or "-" for d in new_out)))
    return changes
