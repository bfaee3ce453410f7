"""Every stale case is flagged, and an unchanged cache gets no error: the truth table, for real.

See tests/truth_table.py for the scenarios; the ground truth is a fresh compile into an empty
cache, compared byte for byte with what the runtime served.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support import NVCC
from truth_table import NVCC_ONLY, SCENARIOS, run

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
}

CASES = [pytest.param(name, "gxx", id=f"g++-{name}") for name in SCENARIOS
         if name not in NVCC_ONLY]
CASES += [pytest.param(name, "nvcc", id=f"nvcc-{name}", marks=pytest.mark.skipif(
    NVCC is None, reason="nvcc is not on PATH")) for name in SCENARIOS]


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
