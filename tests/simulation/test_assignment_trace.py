"""The tool that judges a planner change change by change (benchmarks/assignment_trace.py):
a flip is the change's own ("direct") only where the trajectories first part in its window."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from assignment_trace import flips


def _shape(owners: list[list[Any]], verdicts: list[list[Any]]) -> dict[str, Any]:
    return {"starts": [0.0, 300.0, 600.0], "owners": owners, "verdicts": verdicts}


PASS = [1.02, 2, 4, 4]
SLOW = [1.02, 5, 4, 4]  # 5 runs
MANY = [1.02, 2, 9, 4]  # 9 moves where the fewest are 4


def test_a_flip_in_the_window_of_the_first_difference_is_direct_and_later_ones_are_not() -> None:
    log = [[20.0, "a", "w1"], [320.0, "b", "w2"], [640.0, "c", "w1"]]
    base = {"s": _shape(log, [["start", *PASS], ["traffic", *MANY], ["join", *PASS]])}
    parted = [*log[:1], [330.0, "b", "w3"], [650.0, "c", "w2"]]
    other = {"s": _shape(parted, [["start", *SLOW], ["traffic", *PASS], ["join", *MANY]])}
    # The start differs in outcome only: same owners, so no code change acted there.
    assert flips(base, other) == [("direct", "s", "traffic", True), ("after", "s", "join", False)]


def test_identical_trajectories_flip_nothing() -> None:
    log = [[20.0, "a", "w1"]]
    base = {"s": _shape(log, [["start", *PASS], ["traffic", *MANY], ["join", *PASS]])}
    assert flips(base, base) == []
    # A run that ends early (fewer owner changes) parts where the shorter log ends.
    longer = {
        "s": _shape(
            [*log, [400.0, "b", "w2"]], [["start", *PASS], ["traffic", *PASS], ["join", *PASS]]
        )
    }
    assert flips(base, longer) == [("direct", "s", "traffic", True)]
