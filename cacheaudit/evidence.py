"""A finding's evidence as data: what was recorded and what is there now, in fields a program
reads (sizes in bytes, times in integer nanoseconds and UTC ISO 8601, digests with their
algorithm), beside the prose a person reads (`Finding.recorded` and `Finding.current`).

Each value knows its prose (`text()`) and its JSON (`to_dict()`): a finding's two forms come
from one place, so they cannot disagree. docs/json.md describes the JSON.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any

DIGEST_ALGORITHM = "xxh3-128"
"""The project's one content hash (`model.content_digest`), as JSON names it."""


def utc_iso(ns: int) -> str:
    """A wall-clock time in nanoseconds as ISO 8601 in UTC, to the nanosecond, with `Z`:
    `2026-12-01T17:44:41.123456789Z`. Lossless: the digits are the integer's own."""
    seconds, fraction = divmod(int(ns), 1_000_000_000)
    moment = datetime.datetime.fromtimestamp(seconds, tz=datetime.timezone.utc)
    return f"{moment.strftime('%Y-%m-%dT%H:%M:%S')}.{fraction:09d}Z"


def local_time_text(ns: int | None) -> str:
    """A wall-clock time for people: local time to the second, with the zone's name."""
    if not ns:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(ns / 1e9))


def digest_field(value: str | None) -> dict[str, str] | None:
    return None if value is None else {"algorithm": DIGEST_ALGORITHM, "value": value}


def _time_fields(ns: int | None) -> tuple[int | None, str | None]:
    return (None, None) if not ns else (int(ns), utc_iso(ns))


@dataclass(frozen=True)
class FileEvidence:
    """A file as it was recorded or is now: `size` in bytes, `digest` xxh3-128 hex; an absent
    file has `exists` False, an unreadable one no digest and its `error`."""

    path: str
    exists: bool
    size: int | None = None
    digest: str | None = None
    mtime_ns: int | None = None
    error: str | None = None

    def text(self) -> str:
        if not self.exists:
            return "absent"
        if self.digest is None:
            return f"unreadable ({self.error})"
        return (f"xxh3 {self.digest[:16]}, {self.size} bytes, "
                f"mtime {local_time_text(self.mtime_ns)}")

    def to_dict(self) -> dict[str, Any]:
        mtime_ns, mtime = _time_fields(self.mtime_ns)
        return {"type": "file", "path": self.path, "exists": self.exists,
                "bytes": self.size if self.size is not None and self.size >= 0 else None,
                "digest": digest_field(self.digest), "mtime_ns": mtime_ns, "mtime": mtime,
                "error": self.error}


@dataclass(frozen=True)
class ContentEvidence:
    """Bytes that are not a file on disk now: a cached binary as read, a fresh compile's
    output. `what` says which ("cached kernel.so", "fresh compile")."""

    what: str
    digest: str
    size: int | None = None

    def text(self) -> str:
        return f"xxh3 {self.digest} ({self.what})"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "content", "what": self.what, "bytes": self.size,
                "digest": digest_field(self.digest)}


@dataclass(frozen=True)
class VariableEvidence:
    """An environment variable or runtime setting: its value as stored (a credential-shaped
    value is redacted where it was recorded, and stays so), None when unset."""

    name: str
    value: str | None

    def text(self) -> str:
        return "(unset)" if self.value is None else f"{self.name}={self.value}"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "variable", "name": self.name, "value": self.value,
                "set": self.value is not None}


@dataclass(frozen=True)
class CompilerEvidence:
    """A compiler's identity: the path invoked, what it resolved to, its `--version` line
    and the content hash of the binary."""

    path: str
    resolved: str | None = None
    version: str | None = None
    digest: str | None = None
    kind: str | None = None
    exists: bool = True

    def text(self) -> str:
        if not self.exists:
            return "absent"
        return f"{self.resolved} xxh3 {(self.digest or '-')[:16]} ({self.version})"

    def to_dict(self) -> dict[str, Any]:
        return {"type": "compiler", "path": self.path, "exists": self.exists,
                "resolved": self.resolved, "version": self.version,
                "digest": digest_field(self.digest), "kind": self.kind}


@dataclass(frozen=True)
class TimeEvidence:
    """A moment that is the evidence: `what` happened then ("binary written", "mtime")."""

    what: str
    ns: int

    def text(self) -> str:
        return f"{self.what} {local_time_text(self.ns)}"

    def to_dict(self) -> dict[str, Any]:
        ns, iso = _time_fields(self.ns)
        return {"type": "time", "what": self.what, "ns": ns, "time": iso}


@dataclass(frozen=True)
class PathEvidence:
    """A path that is the evidence itself: the header used, the one that shadows it now."""

    path: str

    def text(self) -> str:
        return self.path

    def to_dict(self) -> dict[str, Any]:
        return {"type": "path", "path": self.path}


@dataclass(frozen=True)
class ValueEvidence:
    """Any other value: `what` it is ("key") and the value, None where there is none."""

    what: str
    value: str | None

    def text(self) -> str:
        return "-" if self.value is None else self.value

    def to_dict(self) -> dict[str, Any]:
        return {"type": "value", "what": self.what, "value": self.value}


EvidenceValue = (FileEvidence | ContentEvidence | VariableEvidence | CompilerEvidence
                 | TimeEvidence | PathEvidence | ValueEvidence)
EVIDENCE_TYPES = (FileEvidence, ContentEvidence, VariableEvidence, CompilerEvidence,
                  TimeEvidence, PathEvidence, ValueEvidence)


@dataclass(frozen=True)
class Evidence:
    """The two sides of a finding as data; either may be None (nothing recorded, or nothing
    there now that is worth a field)."""

    recorded: EvidenceValue | None = None
    current: EvidenceValue | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"recorded": None if self.recorded is None else self.recorded.to_dict(),
                "current": None if self.current is None else self.current.to_dict()}
