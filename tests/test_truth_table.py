"""Every stale case is flagged, and an unchanged cache gets no error: the truth table, for real.

See tests/truth_table.py for the scenarios; the ground truth is a fresh compile into an empty
cache, compared byte for byte with what the runtime served.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from support import NVCC
from truth_table import GXX_ONLY, NVCC_ONLY, SCENARIOS, Outcome, run

# scenario -> (the runtime's answer, whether it served a stale binary, the code that must flag it)
EXPECTED = {
    "nothing_changed": ("disk-hit", False, None),
    "tracked_header_edited": ("compile", False, None),
    "untracked_header_edited": ("disk-hit", True, "CA101"),
    "quoted_include": ("error", None, None),
    "cpath_switched": ("disk-hit", True, "CA202"),
    "append_flags_changed": ("disk-hit", True, "CA202"),
    "compiler_replaced": ("disk-hit", True, "CA301"),
    "header_edited_while_runtime_lives": ("memory-hit", True, "CA106"),
    "header_shadowed": ("disk-hit", True, "CA105"),
    "tracked_header_shadowed": ("compile", False, None),
    "dependency_deleted": ("disk-hit", True, "CA104"),
    "edited_during_compile": ("disk-hit", True, "CA401"),
    # Entry identity and the age of evidence (issue 11).
    "twin_caches": ("disk-hit", False, None),
    "identical_binaries_new_key": ("compile", False, None),
    "link_step_taken_as_build": ("disk-hit", True, "CA101"),
    "rewritten_binary": ("disk-hit", True, "CA101"),
    "rebuilt_inputs_restored": ("disk-hit", False, None),
    "unknown_tracked_set": ("compile", False, None),
    # Caches built without recording: the newest DeepJIT, a killed first build (issue 12).
    "quoted_command_unrecorded": ("disk-hit", True, "CA501"),
    "killed_first_build": ("killed", None, None),
}

CASES = [pytest.param(name, "gxx", id=f"g++-{name}") for name in SCENARIOS
         if name not in NVCC_ONLY]
CASES += [pytest.param(name, "nvcc", id=f"nvcc-{name}", marks=pytest.mark.skipif(
    NVCC is None, reason="nvcc is not on PATH")) for name in SCENARIOS if name not in GXX_ONLY]


def test_every_scenario_has_an_expectation():
    assert set(EXPECTED) == set(SCENARIOS)


@pytest.mark.parametrize(("name", "backend"), CASES)
def test_scenario(name: str, backend: str, tmp_path: Path):
    event, stale, code = EXPECTED[name]
    outcome = run(name, backend, tmp_path)
    assert outcome.event == event, outcome
    assert outcome.stale is stale, outcome
    if stale:
        # No false negative: the stale case is flagged, with the code that names its cause.
        assert code in outcome.codes, outcome
    else:
        # No false alarm: a fresh or refused answer gets no error.
        assert outcome.errors == [], outcome
    if name == "quoted_include":
        assert any("non-standard include" in error for error in outcome.recorded), outcome
    if name in SUBJECTS:
        SUBJECTS[name](outcome)


def _named(findings: list[dict], code: str, subject: str) -> list[dict]:
    return [f for f in findings if f["code"] == code and f["subject"] == subject]


def _twin_caches(outcome: Outcome) -> None:
    # B is judged against B's own compile: nothing of A's tree is named, before or after A's
    # tree is deleted.
    a_tree = outcome.notes["a_tree"]
    for findings in (outcome.findings, outcome.notes["after_a_deleted"]):
        named = [f for f in findings if any(f["subject"].startswith(t + "/") for t in a_tree)]
        assert named == [], named
    assert [f for f in outcome.notes["after_a_deleted"] if f["severity"] == "error"] == []


def _identical_binaries(outcome: Outcome) -> None:
    notes = outcome.notes
    assert notes["same_binary"] and len(notes["entries"]) == 2, notes
    tied = notes["tied"]
    records = [tied.get(entry, {}).get("record") for entry in notes["entries"]]
    assert None not in records and len(set(records)) == 2, tied  # each entry its own compile
    for entry in notes["entries"]:
        # None judged against a compile that started after the entry was published.
        assert tied[entry]["started_ns"] <= notes["binary_ns"][entry], (entry, tied[entry])


def _link_step(outcome: Outcome) -> None:
    [link] = outcome.notes["links"]
    first = outcome.notes["first"]
    assert first["matched"] == 0 and first["reconstructed"] == 1, first["summary"]
    assert not any(f["record_id"] == link for f in first["findings"] + outcome.findings)
    [stale] = [f for f in outcome.findings if f["code"] == "CA101"]
    assert stale["subject"].endswith("/third/cutlite/detail.h"), stale


def _rewritten_binary(outcome: Outcome) -> None:
    first = outcome.notes["first"]
    assert (first["matched"], first["reconstructed"]) == (1, 0), first["summary"]
    [stale] = [f for f in outcome.findings if f["code"] == "CA101"]
    assert stale["subject"].endswith("/third/cutlite/detail.h"), stale
    assert stale["inferred"] is False  # the observed compile's own evidence


def _rebuilt_inputs_restored(outcome: Outcome) -> None:
    for path in outcome.notes["edited"]:
        for findings in (outcome.notes["first"]["findings"], outcome.findings):
            assert not _named(findings, "CA101", path) and not _named(findings, "CA103", path)
        # What the compiler read of a file changed after the build is unknown: said, as such.
        unknown = [f for f in outcome.findings if f["subject"] == path]
        assert all(f["inferred"] and f["severity"] != "error" for f in unknown), unknown
    assert [f for f in outcome.notes["first"]["findings"] if f["severity"] == "error"] == []


def _unknown_tracked_set(outcome: Outcome) -> None:
    header = outcome.notes["header"]
    assert [f for f in outcome.findings if f["code"] == "CA101"] == []
    [unverified] = _named(outcome.findings, "CA501", header)
    assert unverified["entry"] == outcome.notes["entry"] and "meta.json" in unverified["message"]


def _quoted_command_unrecorded(outcome: Outcome) -> None:
    notes = outcome.notes
    entry, header = notes["entry"], notes["header"]
    assert notes["command"].startswith("'"), notes["command"]  # the newest DeepJIT's form
    # Reconstructed from the quoted command: the edited header itself is named, for this entry,
    # unverified because it changed after an unrecorded build, with the way to settle it.
    [unknown] = _named(outcome.findings, "CA501", header)
    assert unknown["entry"] == entry and "changed after the binary was written" in (
        unknown["message"]), unknown
    assert f"cacheaudit verify {entry}" in unknown["hint"], unknown
    assert [f for f in outcome.findings if f["code"] == "CA501" and f["subject"] != header] == []
    assert "DeepJIT's extra signature" in next(
        f for f in outcome.findings if f["code"] == "CA102")["hint"]
    # The oracle, from the same quoted command, proves the served binary stale.
    code, stdout, stderr = notes["verified"]
    assert code == 0, stderr
    assert _named(json.loads(stdout)["findings"], "CA403", entry), stdout


def _killed_first_build(outcome: Outcome) -> None:
    notes = outcome.notes
    build, cache = notes["build"], notes["cache"]
    assert build and build.startswith(cache + "/tmp/") and not os.path.exists(cache + "/cache")
    assert notes["explicit"][0] == 0, notes["explicit"]  # a cache root, not a usage error
    [leftover] = _named(outcome.findings, "CA402", build)
    assert leftover["severity"] == "warning", leftover
    code, stdout, stderr = notes["default"]
    assert code == 0, stderr
    assert [f["subject"] for f in json.loads(stdout)["findings"] if f["code"] == "CA402"] == [
        build], stdout  # the default scan finds the root through DG_JIT_CACHE_DIR
    assert notes["failing"] == 1  # the exit status follows the findings: a warning, asked for


SUBJECTS = {
    "twin_caches": _twin_caches,
    "identical_binaries_new_key": _identical_binaries,
    "link_step_taken_as_build": _link_step,
    "rewritten_binary": _rewritten_binary,
    "rebuilt_inputs_restored": _rebuilt_inputs_restored,
    "unknown_tracked_set": _unknown_tracked_set,
    "quoted_command_unrecorded": _quoted_command_unrecorded,
    "killed_first_build": _killed_first_build,
}
