"""The rebuild oracle over the truth table: every stale scenario proven different, every fresh
one proven identical.

Each scenario of tests/truth_table.py runs as in test_truth_table.py; right after each of its
scans, `cacheaudit verify <cache> --json --ledger <ledger>` runs under the scan's environment
(the environment a fresh compile now sees), caches built without recording included. The
ground truth is the scenario's own: the served binary compared byte for byte with a fresh
compile into an empty cache.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_truth_table import EXPECTED

from support import NVCC, needs_gxx
from truth_table import GXX_ONLY, NVCC_ONLY, SCENARIOS, Outcome, run

pytestmark = needs_gxx

CASES = [pytest.param(name, "gxx", id=f"g++-{name}") for name in SCENARIOS
         if name not in NVCC_ONLY]
CASES += [pytest.param(name, "nvcc", id=f"nvcc-{name}", marks=pytest.mark.skipif(
    NVCC is None, reason="nvcc is not on PATH")) for name in SCENARIOS if name not in GXX_ONLY]

# scenario -> the oracle's outcome for the served entry, where it is not "stale" / "identical"
OUTCOME = {"dependency_deleted": "fails"}


def _report(outcome: Outcome) -> tuple[int, dict[str, Any], str]:
    assert outcome.project is not None and outcome.project.verified, outcome
    return outcome.project.verified[-1]


def _verdict(report: dict[str, Any], entry: str) -> dict[str, Any]:
    [verdict] = [v for v in report["verdicts"] if v["entry"] == entry]
    return verdict


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_oracle_agrees_with_the_ground_truth(name: str, backend: str, tmp_path: Path):
    outcome = run(name, backend, tmp_path, verify_scans=True)
    assert outcome.stale is EXPECTED[name][1], outcome  # the ground truth, as test_scenario has it
    if outcome.stale is None:
        # The runtime refused before compiling: no entry, nothing to rebuild.
        assert outcome.project is not None and outcome.project.verified == []
        return
    code, report, stderr = _report(outcome)
    assert code == 0 and report, stderr
    served = outcome.served["path"]
    verdict = _verdict(report, served)
    proofs = [(f["code"], f["subject"]) for f in report["findings"]
              if f["code"] in ("CA403", "CA404")]
    if outcome.stale:
        # No false negative: the served entry is proven different from a fresh compile now.
        assert verdict["outcome"] == OUTCOME.get(name, "stale"), verdict
        assert ("CA403", served) in proofs, (report["findings"], stderr)
    else:
        # No false alarm: the served entry is proven identical, and no entry of the cache gets
        # a proof of staleness (an entry the runtime's key no longer leads to is superseded).
        assert verdict["outcome"] in ("identical", "identical-but-paths"), verdict
        assert [p for p in proofs if p[1] == served] == [], (report["findings"], stderr)
        # Another entry of the cache is either superseded (the runtime's key no longer leads
        # to it) or, where its key cannot be recomputed, proven different and saying so.
        for other in report["findings"]:
            if other["code"] in ("CA403", "CA404"):
                assert "key cannot be recomputed" in other["message"], other
        others = {v["outcome"] for v in report["verdicts"] if v["entry"] != served}
        assert others <= {"identical", "identical-but-paths", "superseded", "stale"}, \
            report["verdicts"]
    if name in SUBJECTS:
        SUBJECTS[name](outcome, report)


def _proof(report: dict[str, Any], entry: str) -> dict[str, Any]:
    [finding] = [f for f in report["findings"] if f["code"] == "CA403" and f["subject"] == entry]
    return finding


def _names_variable(variable: str) -> Any:
    def check(outcome: Outcome, report: dict[str, Any]) -> None:
        # Environment drift: rebuilt under the current environment, the verdict naming the
        # variable whose value differs from the recorded one.
        finding = _proof(report, outcome.served["path"])
        assert f"differs from the recorded one in {variable} (recorded" in finding["how"], finding
    return check


def _dependency_deleted(outcome: Outcome, report: dict[str, Any]) -> None:
    finding = _proof(report, outcome.served["path"])
    assert finding["message"].startswith("a fresh compile now fails: "), finding
    assert "detail.h" in finding["message"], finding  # the compiler's own error line


def _compiler_replaced(outcome: Outcome, report: dict[str, Any]) -> None:
    # The compiler the configuration names now (the same path, other behaviour) is what runs.
    assert outcome.project is not None
    finding = _proof(report, outcome.served["path"])
    assert f"&& {outcome.project.root / 'tools' / outcome.project.compiler_name} " in \
        finding["how"], finding


def _unknown_tracked_set(outcome: Outcome, report: dict[str, Any]) -> None:
    # The entry without meta.json: its binary differs from a fresh compile, and whether the
    # runtime's key leads to it cannot be computed: proven different, saying it is unknown.
    finding = _proof(report, outcome.notes["entry"])
    assert "meta.json" in finding["message"], finding


def _rewritten_binary(outcome: Outcome, report: dict[str, Any]) -> None:
    # Before the edit (the first scan), the post hook's rewrite is no staleness: a fresh compile
    # gives what the compiler wrote then.
    assert outcome.project is not None
    _, first, stderr = outcome.project.verified[0]
    assert [f for f in first["findings"] if f["code"] in ("CA403", "CA404")] == [], stderr
    [verdict] = first["verdicts"]
    assert verdict["outcome"] == "identical" and "rewritten after its compile" in \
        verdict["note"], verdict


def _superseded(outcome: Outcome, report: dict[str, Any]) -> None:
    # The entry the tracked edit orphaned differs from a fresh compile, but its key is dead.
    [old] = [v for v in report["verdicts"] if v["entry"] != outcome.served["path"]]
    assert old["outcome"] == "superseded" and "a new process misses it" in old["note"], old


SUBJECTS = {
    "cpath_switched": _names_variable("CPATH"),
    "append_flags_changed": _names_variable("NVCC_APPEND_FLAGS"),
    "dependency_deleted": _dependency_deleted,
    "compiler_replaced": _compiler_replaced,
    "tracked_header_edited": _superseded,
    "tracked_header_shadowed": _superseded,
    "unknown_tracked_set": _unknown_tracked_set,
    "rewritten_binary": _rewritten_binary,
}
