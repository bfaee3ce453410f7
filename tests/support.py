"""Helpers shared by the tests: toolchain probes that say why they skip, the shim harness."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cacheaudit.model import CompileRecord

NVCC = shutil.which("nvcc")
GXX = shutil.which("g++")
GCC = shutil.which("gcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not on PATH: nvcc checks skipped")
needs_gxx = pytest.mark.skipif(GXX is None or GCC is None, reason="g++/gcc is not on PATH")


@dataclass
class ShimEnv:
    """A masquerade directory first on PATH and a private ledger, for real shim subprocesses."""

    bin: Path
    ledger: Path
    env: dict[str, str]

    def run(self, argv: list[str], *, cwd: Path, env: Mapping[str, str] | None = None,
            **kwargs: object) -> subprocess.CompletedProcess[bytes]:
        merged = dict(self.env)
        merged.update(env or {})
        return subprocess.run(argv, cwd=cwd, env=merged, capture_output=True, timeout=300,
                              **kwargs)  # type: ignore[call-overload]

    def bare_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The same environment without the shim on PATH."""
        env = dict(self.env)
        env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                      if p != str(self.bin))
        env.update(extra or {})
        return env

    def records(self) -> list[CompileRecord]:
        from cacheaudit.ledger import Ledger, ingest_spool

        with Ledger.open(str(self.ledger)) as ledger:
            ingest_spool(ledger)
            return ledger.records()


def clean_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CACHEAUDIT", "NVCC_", "PYTEST_")) and k not in (
               "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH")}
    env["CACHEAUDIT_LEDGER"] = str(tmp_path / "ledger.db")
    env["TMPDIR"] = str(tmp_path / "tmp")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env


class Blocked(Exception):
    """Raised by `deadline`; not an OSError, which the code under test may rightly catch."""


@contextlib.contextmanager
def deadline(seconds: int = 30) -> Iterator[None]:
    """Fail, instead of hanging the suite, when a read blocks (a FIFO opened without a writer)."""
    def expired(signum: int, frame: Any) -> None:
        # Re-armed: code that swallows the first interruption must not block forever after it.
        signal.alarm(1)
        raise Blocked(f"still blocked after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def deepgemm_library(tmp_path: Path) -> Path:
    """A DeepGEMM-2.x-like installed tree: `deep_gemm/include/deep_gemm/common.cuh` (tracked)
    including `cute/tile.hpp` (in no key), the tile dated five seconds back so that an edit in
    the test moves its mtime."""
    library = tmp_path / "deep_gemm"
    (library / "include" / "deep_gemm").mkdir(parents=True)
    (library / "include" / "cute").mkdir(parents=True)
    (library / "include" / "deep_gemm" / "common.cuh").write_text(
        "#pragma once\n#include <cute/tile.hpp>\n#define DG_VALUE 1\n")
    tile = library / "include" / "cute" / "tile.hpp"
    tile.write_text("#pragma once\n#define TILE_VALUE 10\n")
    stamp = time.time_ns() - 5_000_000_000
    os.utime(tile, ns=(stamp, stamp))
    return library


# ------------------------------------------------------------------ the reliability suite's figures

FIGURES_DIR = Path(__file__).resolve().parent.parent / ".reliability"
"""Where reliability tests leave their figures (one JSON file per case, any xdist worker);
tests/conftest.py writes docs/reliability.md from them when the session ends."""


def reliability_figure(section: str, case: str, **figures: Any) -> None:
    """Keep the figures of one reliability case (writers, records, kills, faults, fuzz inputs,
    leaks: whatever the case counted) for docs/reliability.md. `section` groups cases in the
    document ("concurrency", "kills", "faults", "fuzzing", ...); `case` names what was tried,
    as a person would read it. A later run of the same case replaces its figures."""
    import json
    import re

    FIGURES_DIR.mkdir(exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{section}--{case}")[:180]
    path = FIGURES_DIR / f"{name}.json"
    temporary = path.with_suffix(f".{os.getpid()}.tmp")
    temporary.write_text(json.dumps({"section": section, "case": case, "figures": figures,
                                     "recorded": time.time(), "machine": _machine()},
                                    default=str))
    os.replace(temporary, path)


def _machine() -> str:
    import platform

    return (f"{os.cpu_count()} cores, {platform.machine()}, Python "
            f"{platform.python_version()} ({platform.python_implementation()})")


SECTION_ORDER = ("concurrency", "kills", "faults", "fuzzing")
"""Sections in the order the document gives them; any other section follows, by name."""

SECTION_TITLES = {
    "concurrency": "Concurrency: many writers on one ledger",
    "kills": "Kills: SIGKILL at random points",
    "faults": "Faults",
    "fuzzing": "Fuzzing: every parser of untrusted text",
}

# Figures that count harm: each must be 0 for a case to have lost nothing. Matched by name, so
# that a new case's `records_lost` or `processes_left` joins the summary without a change here.
_HARM_WORDS = ("lost", "duplicated", "torn", "half_written", "failures", "left", "leaked")

_INTRO = """\
# Reliability

Written by the test suite itself (tests/conftest.py, at the end of a pytest session, from the
figures each reliability case leaves in `.reliability/`): do not edit by hand. What the suite
does: real writers of every kind on one ledger at once (shim compiles with the real g++,
in-process recorders, a scan writing reconstructions), counted against what each writer says it
wrote; SIGKILLs of shim compiles at random points beside compiles that go on; the faults of
issue 13; property-based fuzzing (hypothesis, derandomized) of every parser of text cacheaudit
did not write itself. How the figures were made: the README's test command,

    .venv/bin/python -m pytest -n auto

which CI runs as it is, slow cases included (`-m "not slow"` leaves out the long versions;
the file is rewritten from whatever figures the run left, so a partial run keeps the figures of
the cases it did not run from the run before).
"""


def _cell(value: Any) -> str:
    text = str(value) if not isinstance(value, float) else f"{value:g}"
    return text.replace("|", "\\|").replace("\n", " ")


def reliability_document(figures_dir: Path = FIGURES_DIR) -> str | None:
    """docs/reliability.md from every case's figures, or None when no case left any. The same
    figures always give the same text (sections, cases and columns in a fixed order)."""
    import datetime
    import json

    cases: list[dict[str, Any]] = []
    for path in sorted(figures_dir.glob("*.json")) if figures_dir.is_dir() else ():
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and isinstance(data.get("figures"), dict):
            cases.append(data)
    if not cases:
        return None
    sections = sorted({str(c["section"]) for c in cases}, key=lambda s: (
        SECTION_ORDER.index(s) if s in SECTION_ORDER else len(SECTION_ORDER), s))
    harm_total: dict[str, int] = {}
    lines = [_INTRO]
    for section in sections:
        rows = sorted((c for c in cases if c["section"] == section), key=lambda c: str(c["case"]))
        columns: list[str] = []
        for row in rows:
            columns.extend(k for k in row["figures"] if k not in columns)
        lines.append(f"## {SECTION_TITLES.get(section, section.capitalize())}\n")
        lines.append("| case | " + " | ".join(c.replace("_", " ") for c in columns)
                     + " | date (UTC) |")
        lines.append("|---" * (len(columns) + 2) + "|")
        section_harm: dict[str, int] = {}
        for row in rows:
            figures = row["figures"]
            when = datetime.datetime.fromtimestamp(float(row.get("recorded", 0)),
                                                   datetime.timezone.utc)
            lines.append("| " + " | ".join(
                [_cell(row["case"])] + [_cell(figures.get(c, "")) for c in columns]
                + [when.strftime("%Y-%m-%d %H:%M")]) + " |")
            for key, value in figures.items():
                if any(word in key for word in _HARM_WORDS) and isinstance(value, int):
                    section_harm[key] = section_harm.get(key, 0) + value
        lines.append("")
        lines.append(_summary(section_harm, len(rows)) + "\n")
        for key, value in section_harm.items():
            harm_total[key] = harm_total.get(key, 0) + value
    machines = sorted({str(c.get("machine") or "not recorded") for c in cases})
    lines.insert(1, "**" + _summary(harm_total, len(cases)) + "**\n\nMachine: "
                 + "; ".join(machines) + ".\n")
    return "\n".join(lines).rstrip("\n") + "\n"


def _summary(harm: Mapping[str, int], cases: int) -> str:
    counted = ", ".join(f"{value} {key.replace('_', ' ')}" for key, value in sorted(harm.items()))
    bad = {key: value for key, value in harm.items() if value}
    where = f"{cases} case" + ("s" if cases != 1 else "")
    if not bad:
        return f"Nothing lost in {where} ({counted or 'no harm counted'})."
    return (f"Not clean in {where}: "
            + ", ".join(f"{value} {key.replace('_', ' ')}" for key, value in sorted(bad.items()))
            + f" (all counted: {counted}).")


def write_reliability_document(figures_dir: Path = FIGURES_DIR,
                               document: Path | None = None) -> bool:
    """Rewrite docs/reliability.md when figures exist and the text changed; True if written."""
    text = reliability_document(figures_dir)
    if text is None:
        return False
    document = document or Path(__file__).resolve().parent.parent / "docs" / "reliability.md"
    with contextlib.suppress(OSError):
        if document.read_text() == text:
            return False
    temporary = document.with_name(f".{document.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, document)
    return True


# ------------------------------------------------------------------------------ JSON contract


@functools.cache
def _schema_validator() -> Any:
    import jsonschema

    from cacheaudit import contract

    return jsonschema.Draft202012Validator(contract.schema(),
                                           format_checker=jsonschema.FormatChecker())


def valid_document(data: bytes, kind: str) -> dict[str, Any]:
    """`data` is one JSON document and nothing else, strict UTF-8, in the envelope of `kind`,
    valid against the shipped schema (docs/json.md)."""
    import json

    from cacheaudit import contract

    text = data.decode("utf-8")  # strict: a raw byte that is not UTF-8 fails here
    document = json.loads(text)  # the whole of stdout: a hint after the JSON fails here
    errors = [f"{list(e.absolute_path)}: {e.message}"
              for e in _schema_validator().iter_errors(document)]
    assert errors == [], errors[:5]
    assert (document.get("format"), document.get("version")) == (
        contract.format_name(kind), contract.VERSIONS.get(kind, "a kind VERSIONS names"))
    assert document["generated"].endswith("Z")
    return document
