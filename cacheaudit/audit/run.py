"""What the audit of a scope (`scope.py`) asks of a run's records: the findings records carry on
their own (`audit_records`), and the cache roots they touched (`roots_of`)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import overload

from cacheaudit.audit.checks import modified_during_compile
from cacheaudit.findings import make_finding
from cacheaudit.model import CompileRecord, Finding
from cacheaudit.runtimes import layouts, policy_for


class _Earlier(Sequence[CompileRecord]):
    """The first `stop` records of a run, without copying them: a record's history (most
    policies never look at it, and a run may hold thousands of records)."""

    __slots__ = ("_run", "_stop")

    def __init__(self, run: list[CompileRecord], stop: int) -> None:
        self._run = run
        self._stop = stop

    def __len__(self) -> int:
        return self._stop

    @overload
    def __getitem__(self, index: int) -> CompileRecord: ...
    @overload
    def __getitem__(self, index: slice) -> list[CompileRecord]: ...

    def __getitem__(self, index: int | slice) -> CompileRecord | list[CompileRecord]:
        if isinstance(index, slice):
            return self._run[:self._stop][index]
        if index < 0:
            index += self._stop
        if not 0 <= index < self._stop:
            raise IndexError(index)
        return self._run[index]

    def __iter__(self) -> Iterator[CompileRecord]:
        for index in range(self._stop):
            yield self._run[index]

    def __reversed__(self) -> Iterator[CompileRecord]:
        for index in range(self._stop - 1, -1, -1):
            yield self._run[index]


def audit_records(records: Sequence[CompileRecord],
                  judged: frozenset[str] = frozenset()) -> list[Finding]:
    """Findings that records carry on their own, whether or not a cache entry accounts for them:
    each runtime policy's record-level checks (a runtime reusing in-process state after a header
    changed, for example), judged against the earlier records of the same run; and inputs
    modified during a compile (CA401) for records not in `judged` (those an entry audit already
    covered)."""
    runs: dict[str, list[CompileRecord]] = {}
    for record in sorted(records, key=lambda r: (r.started_ns, r.record_id)):
        runs.setdefault(record.run_uuid or "", []).append(record)
    findings: list[Finding] = []
    for run in runs.values():
        for index, record in enumerate(run):
            if record.record_id not in judged:
                findings += modified_during_compile(record)
            if not record.runtime:
                continue
            try:
                policy = policy_for(record.runtime)
            except KeyError:
                continue  # a runtime without a policy carries no record-level checks
            try:
                findings += policy.record_findings(record, _Earlier(run, index))
            except Exception as exc:  # noqa: BLE001 - one runtime's check never stops the audit
                findings.append(make_finding(
                    "CA501", subject=record.runtime, record=record,
                    message=f"the record-level checks of runtime {record.runtime!r} failed: "
                            f"{type(exc).__name__}: {exc}",
                    how="the runtime's policy (record_findings)"))
    return findings


def roots_of(records: Iterable[CompileRecord]) -> list[str]:
    """Cache roots the records touched: for each entry, output and working directory, the
    nearest directory above it (or itself) that a layout calls a root (the shim sees
    `<root>/tmp/<uuid>/kernel.cubin` before the runtime renames it). Only the nearest: a
    directory further up that also looks like a root (one holding other projects' build
    directories, say) is none of the records' business."""
    readers = layouts()
    found: set[str] = set()
    walked: dict[str, str | None] = {}
    for record in records:
        paths = [record.entry or "", record.cwd] + [s.path for s in record.outputs]
        for path in paths:
            directory = os.path.dirname(path) if path and not os.path.isdir(path) else path
            climbed: list[str] = []
            root: str | None = None
            for _ in range(6):
                if not directory or directory == os.path.dirname(directory):
                    break
                if directory in walked:
                    root = walked[directory]
                    break
                climbed.append(directory)
                if os.path.isdir(directory) and any(r.is_root(directory) for r in readers):
                    root = directory
                    break
                directory = os.path.dirname(directory)
            for step in climbed:
                walked[step] = root
            if root is not None:
                found.add(root)
    return sorted(found)
