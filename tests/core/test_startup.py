"""The settling wait before a worker's first taking round (kclasync._core.startup)."""

from __future__ import annotations

from kclasync._core.startup import first_round_delay


def test_a_lone_worker_does_not_wait() -> None:
    assert first_round_delay("a", [], 1.0) == 0.0
    # Its own entry, left by a crash or written just now, is no reason to wait.
    assert first_round_delay("a", ["a"], 1.0) == 0.0


def test_another_registered_worker_means_waiting() -> None:
    assert first_round_delay("a", ["a", "b"], 1.0) == 1.0
    assert first_round_delay("a", ["b"], 0.5) == 0.5


def test_no_settle_time_never_waits() -> None:
    assert first_round_delay("a", ["b"], 0.0) == 0.0
