"""Findings as the audit and the policies make them: one constructor, with the hint per code."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import time
from collections.abc import Mapping
from typing import Any

from cacheaudit.evidence import (
    EVIDENCE_TYPES,
    CompilerEvidence,
    Evidence,
    EvidenceValue,
    FileEvidence,
)
from cacheaudit.model import (
    FINDING_CODES,
    CacheEntry,
    CompileRecord,
    CompilerIdentity,
    FileState,
    Finding,
)

DEFAULT_KEY_REMEDY = ("make the runtime's key cover {input}: a version string or salt it "
                      "hashes, where it offers one (its page in docs/runtimes/ says)")
"""How an input gets into a runtime's key, when its policy does not say (`Policy.key_remedy`).
`{input}` is the input a hint is about: "the file", "these files", "the variable's value"."""

# What `{input}` names in each hint that offers the runtime's remedy.
REMEDY_INPUTS = {"CA101": "the file", "CA102": "these files", "CA201": "the variable's value"}

HINTS = {
    "CA101": "evict the entry ({entry}) with `cacheaudit evict` so that the runtime compiles "
             "again, or {remedy}",
    "CA102": "{remedy}, or evict the runtime's cache whenever they change",
    "CA103": "the runtime's own keying is broken for this input: evict the entry and report it "
             "to the runtime's maintainers",
    "CA104": "evict the entry: the next compile would read a different set of files",
    "CA105": "evict the entry, or remove the shadowing header",
    "CA106": "restart the process that holds the runtime: it keeps serving what it hashed before",
    "CA201": "{remedy}, or unset it",
    "CA202": "evict the entry (`cacheaudit evict`), or restore the value it was built with",
    "CA203": "set the prefixed variable explicitly if the fallback is not intended",
    "CA204": "restart the process after changing a *_JIT_* setting: the runtime read its "
             "configuration once, when it was constructed",
    "CA301": "evict the runtime's cache after replacing a compiler in place",
    "CA302": "evict the runtime's cache after changing the host compiler",
    "CA401": "evict the entry (`cacheaudit evict`): the binary may come from another version of "
             "the file",
    "CA402": "remove the entry or leftover; the runtime would fail on it or ignore it",
    "CA403": "evict the entry (`cacheaudit evict`), then look for the cause with `cacheaudit "
             "explain`",
    "CA404": "look for timestamps, random seeds or absolute paths that enter the binary",
    "CA501": "make the file or compiler available again, or evict the entry",
}


PROVE_HINT = ("prove it either way with `cacheaudit verify {entry}` (or `cacheaudit scan "
              "--verify`): it rebuilds the entry from its own command and compares the "
              "binaries; or evict the entry")
"""The hint of a verdict that only a rebuild can settle (an input changed after an unrecorded
build)."""


def hint_text(code: str, entry: str | None, remedy: str | None = None) -> str:
    """The hint of `code` for `entry` (a path), with the runtime's own remedy where the hint
    offers one (`Policy.key_remedy`; `DEFAULT_KEY_REMEDY` without)."""
    template = HINTS.get(code, "")
    if not entry:  # "evict the entry (the entry)" says nothing: no path, no parenthesis
        template = template.replace(" ({entry})", "")
    remedy_text = (remedy or DEFAULT_KEY_REMEDY).format(
        input=REMEDY_INPUTS.get(code, "the input"))
    return template.format(entry=entry or "the entry", remedy=remedy_text)


@functools.lru_cache(maxsize=1024)
def shared_text(text: str) -> str:
    """`text`, as the first equal string this was given (of the last 1,024 distinct ones): the
    findings of a scan repeat a few messages, hows and hints word for word (a CA102 of every
    entry sharing a graph, about 1.2 KB of prose), and 100,000 copies of them were a third of
    a scan's memory. Strings are immutable, so sharing one changes nothing that reads it."""
    return text


def with_remedy(finding: Finding, remedy: str | None) -> Finding:
    """`finding` with its hint naming the runtime's own remedy; a hint a check chose itself (not
    the code's) is kept."""
    if remedy is None or finding.code not in REMEDY_INPUTS:
        return finding
    if finding.hint != hint_text(finding.code, finding.entry):
        return finding
    return dataclasses.replace(finding, hint=shared_text(hint_text(finding.code, finding.entry,
                                                                   remedy)))


Shown = str | EvidenceValue | None
"""A finding's recorded or current value: prose, or evidence that makes its own prose."""


def make_finding(code: str, *, subject: str, message: str, entry: CacheEntry | None = None,
                 record: CompileRecord | None = None, recorded: Shown = None,
                 current: Shown = None, how: str = "", inferred: bool = False,
                 hint: str | None = None, evidence: Evidence | None = None) -> Finding:
    """A finding with the code's hint (`HINTS`), or `hint` (formatted with `{entry}`) where the
    check knows a better one for this case.

    `recorded` and `current` given as evidence (`cacheaudit.evidence`) make both the prose and
    the finding's `evidence`; `evidence` given as well is for a check whose prose says more
    than the evidence's own (the side given as prose then keeps that prose)."""
    if code not in FINDING_CODES:
        raise ValueError(f"unknown finding code {code}")
    # A finding on a record names the entry it served (an in-process adapter's hit).
    path = entry.path if entry else (record.entry if record is not None else None)
    hint = (hint.format(entry=path or "the entry") if hint is not None
            else hint_text(code, path))
    if evidence is None and (isinstance(recorded, EVIDENCE_TYPES)
                             or isinstance(current, EVIDENCE_TYPES)):
        evidence = Evidence(recorded=recorded if isinstance(recorded, EVIDENCE_TYPES) else None,
                            current=current if isinstance(current, EVIDENCE_TYPES) else None)
    return Finding(code=code, subject=subject, message=shared_text(message),
                   recorded=_prose(recorded), current=_prose(current), how=shared_text(how),
                   record_id=record.record_id if record else None,
                   entry=entry.path if entry else None,
                   runtime=entry.runtime if entry else (record.runtime if record else None),
                   kernel=entry.kernel if entry else (record.kernel if record else None),
                   inferred=inferred, hint=shared_text(hint), evidence=evidence)


def _prose(value: Shown) -> str | None:
    return value.text() if isinstance(value, EVIDENCE_TYPES) else value  # type: ignore[union-attr]


def file_evidence(state: FileState | Mapping[str, Any]) -> FileEvidence:
    """A file state as evidence; a mapping is a state as JSON holds it (adapters' extra
    fields)."""
    data = state._asdict() if isinstance(state, FileState) else state
    size = data.get("size")
    return FileEvidence(path=str(data.get("path") or ""), exists=bool(data.get("exists")),
                        size=int(size) if isinstance(size, int) and size >= 0 else None,
                        digest=data.get("digest"),
                        mtime_ns=int(data.get("mtime_ns") or 0) or None,
                        error=data.get("error"))


def compiler_evidence(identity: CompilerIdentity) -> CompilerEvidence:
    return CompilerEvidence(path=identity.path, resolved=identity.resolved,
                            version=identity.version_line, digest=identity.digest,
                            kind=identity.kind)


def ns_text(ns: int | None) -> str:
    """A wall-clock time in nanoseconds as people read it everywhere cacheaudit shows one
    (local time, to the second)."""
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9))


def ns_iso(ns: int) -> str:
    """A wall-clock time in nanoseconds for machines: ISO 8601 in UTC, to the second."""
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc).isoformat(
        timespec="seconds")


def state_text(state: FileState | Mapping[str, Any]) -> str:
    """A file state as a finding's prose (`file_evidence` gives it as data too)."""
    return file_evidence(state).text()

