"""The rebuild oracle's pure parts: which entries to rebuild, how two binaries are compared,
the findings a comparison gives (CA403, CA404, CA501), and what a proof does to a scan's
findings. `cacheaudit.audit.verify` does the compiles."""

from __future__ import annotations

import os
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import xxhash

from cacheaudit.evidence import ContentEvidence
from cacheaudit.findings import make_finding
from cacheaudit.model import CacheEntry, Finding, Severity

if TYPE_CHECKING:
    from cacheaudit.audit.scan import ScanResult


def sample(entries: Sequence[CacheEntry], size: int | None, seed: int) -> list[CacheEntry]:
    """`size` entries chosen by `seed` from `entries` ordered by path: the same seed and the
    same cache give the same entries, in path order."""
    ordered = sorted(entries, key=lambda e: e.path)
    if size is None or size >= len(ordered):
        return ordered
    chosen = random.Random(seed).sample(ordered, max(0, size))
    return sorted(chosen, key=lambda e: e.path)


# An ELF note NT_GNU_BUILD_ID (namesz 4, descsz 20 for SHA-1, type 3, "GNU"): the linker's
# hash of the output, which therefore changes with every embedded path.
_BUILD_ID = re.compile(rb"(\x04\x00\x00\x00\x14\x00\x00\x00\x03\x00\x00\x00GNU\x00)(.{20})",
                       re.DOTALL)


def masked(data: bytes, paths: Sequence[str], root: str) -> bytes:
    """`data` with every occurrence of the build directories replaced by one placeholder (the
    given `paths`, and any build directory under the root's `tmp/`, where the runtimes of the
    layouts build before they publish an entry) and the GNU build id zeroed. The oracle builds in
    a directory as long as the recorded one, so masking moves no other byte."""
    for path in sorted({p for p in paths if p}, key=len, reverse=True):
        data = data.replace(path.encode("utf-8", "surrogateescape"), b"<build-dir>")
    data = _BUILD_ID.sub(lambda m: m.group(1) + b"\0" * len(m.group(2)), data)
    builds = re.escape(os.path.join(root, "tmp").encode("utf-8", "surrogateescape")) + \
        rb"/[^/\x00]+"
    return re.sub(builds, b"<build-dir>", data)


def _digest(data: bytes) -> str:
    return xxhash.xxh3_128_hexdigest(data)


def stale_finding(entry: CacheEntry, cached: bytes, fresh: bytes, how: str) -> Finding:
    name = os.path.basename(entry.binary.path) if entry.binary else "binary"
    return make_finding(
        "CA403", subject=entry.path, entry=entry,
        message=f"a fresh compile of the entry's inputs gives another {name}: the cached "
                "binary is not what its inputs build now (two fresh compiles agree)",
        recorded=ContentEvidence(f"cached {name}", _digest(cached)),
        current=ContentEvidence("fresh compile", _digest(fresh)), how=how)


_ERROR_LINE = re.compile(r"\b(fatal )?error\b", re.IGNORECASE)


def first_error_line(output: str) -> str:
    """The line of a failed compile's output that says what failed: its first error line
    (gcc's and nvcc's `...: error: ...`, `fatal error`), else its first line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return next((line for line in lines if _ERROR_LINE.search(line)),
                lines[0] if lines else "no output")[:300]


def failed_finding(entry: CacheEntry, error: str, how: str) -> Finding:
    name = os.path.basename(entry.binary.path) if entry.binary else "binary"
    return make_finding(
        "CA403", subject=entry.path, entry=entry,
        message=f"a fresh compile now fails: {error}: the cached {name} can no longer be "
                "built from the entry's inputs",
        current="the fresh compile failed", how=how)


def nondeterministic_finding(entry: CacheEntry, first: bytes, second: bytes,
                             how: str) -> Finding:
    name = os.path.basename(entry.binary.path) if entry.binary else "binary"
    return make_finding(
        "CA404", subject=entry.path, entry=entry,
        message=f"two fresh compiles of the same inputs give different {name} files: the "
                "build is not deterministic, so comparing bytes proves nothing about this "
                "entry",
        recorded=ContentEvidence("first fresh compile", _digest(first)),
        current=ContentEvidence("second fresh compile", _digest(second)), how=how)


UNREBUILDABLE_HINT = ("the rebuild oracle cannot settle this entry: judge it from a recorded "
                      "build instead (cacheaudit run, pytest --cacheaudit), or evict it")


def unverified_finding(entry: CacheEntry, why: str, how: str) -> Finding:
    return make_finding("CA501", subject=entry.path, entry=entry,
                        message=f"the rebuild oracle could not compile the entry again: {why}",
                        how=how, hint=UNREBUILDABLE_HINT)


# ------------------------------------------------------------------------------ scan --verify


_SETTLED_BY_PROOF = ("CA501",)
"""Per-entry codes a proof of freshness settles: the entry could not be judged."""

_FUTURE_RISK = ("CA102",)
"""Per-entry codes about what a future edit would do: a proof of freshness today leaves them
true, however their evidence was gathered (a reconstructed include graph is inferred)."""


def suspects(result: ScanResult) -> list[CacheEntry]:
    """The entries of a scan whose verdict is only a suspicion: no finding proves them stale
    (an error that is not inferred), and something is uncertain about them (a warning or an
    inference about the entry, or a warning about the scan's environment)."""
    by_entry: dict[str, list[Finding]] = {}
    for finding in result.findings:
        by_entry.setdefault(finding.entry or "", []).append(finding)
    scan_wide = any(f.severity is not Severity.INFO or f.inferred for f in by_entry.get("", []))
    chosen = []
    for entry in result.entries:
        own = by_entry.get(entry.path, [])
        if any(f.severity.value == "error" and not f.inferred for f in own):
            continue
        if own or scan_wide:
            chosen.append(entry)
    return chosen


def settle(findings: Sequence[Finding], proofs: Mapping[str, tuple[str, str]]) -> list[Finding]:
    """A scan's findings once the oracle has judged some entries (`proofs`: entry path ->
    (outcome, note)). A proven-fresh entry loses its CA501 and its inferred suspicions of
    staleness, and its other findings (a future edit would go unseen: CA102, even one resting on
    a reconstructed graph) say it was proven; the scan's
    environment findings (CA2xx) say how many entries were proven either way."""
    fresh = {path for path, (outcome, _) in proofs.items() if outcome.startswith("identical")}
    stale = sum(1 for outcome, _ in proofs.values() if outcome in ("stale", "fails"))
    settled: list[Finding] = []
    for finding in findings:
        if finding.entry in fresh:
            if finding.code in _SETTLED_BY_PROOF or (
                    finding.inferred and finding.code not in _FUTURE_RISK):
                continue
            finding = replace(finding, message=f"{finding.message} (rebuild oracle: "
                                               f"{proofs[finding.entry][1]})")
        elif finding.entry is None and finding.code.startswith("CA2") and proofs:
            finding = replace(finding, message=(
                f"{finding.message} (rebuild oracle: {len(fresh)} entr"
                f"{'y' if len(fresh) == 1 else 'ies'} proven identical, {stale} proven "
                "different under this environment)"))
        settled.append(finding)
    return settled
