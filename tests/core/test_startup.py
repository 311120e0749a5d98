"""The settling wait before a worker's first taking round (kclasync._core.assignment.startup)."""

from __future__ import annotations

from kclasync._core.assignment.startup import SETTLE_CAP, first_round_delay, settle_time


def test_a_lone_worker_does_not_wait() -> None:
    assert first_round_delay("a", [], 1.0) == 0.0
    # Its own entry, left by a crash or written just now, is no reason to wait.
    assert first_round_delay("a", ["a"], 1.0) == 0.0


def test_another_registered_worker_means_waiting() -> None:
    assert first_round_delay("a", ["a", "b"], 1.0) == 1.0
    assert first_round_delay("a", ["b"], 0.5) == 0.5


def test_no_settle_time_never_waits() -> None:
    assert first_round_delay("a", ["b"], 0.0) == 0.0


def test_settle_time_is_for_the_balanced_taker_and_capped() -> None:
    assert settle_time(batch_taker=True, renewer_interval=3.3) == SETTLE_CAP == 1.0
    assert settle_time(batch_taker=True, renewer_interval=0.3) == 0.3
    # The KCL 2.x rules take a fair share a round: no reason to wait, as in the Java KCL.
    assert settle_time(batch_taker=False, renewer_interval=3.3) == 0.0
