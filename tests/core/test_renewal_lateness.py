"""When renewal rounds are due, and when a late renewal is worth a warning."""

from __future__ import annotations

from kclasync._core.leases.periods import LATE_RENEWAL_SHARE, late_renewals, renewal_round_due


def test_rounds_are_due_one_interval_apart_from_their_due_time() -> None:
    # A round that started 0.2 s late does not push the next one back.
    assert renewal_round_due(10.0, 3.0, started=10.2) == 13.0


def test_a_worker_that_fell_behind_is_not_asked_to_catch_up() -> None:
    # Due at 10, started at 17 (more than an interval late): the next is due at 17, not at 13.
    assert renewal_round_due(10.0, 3.0, started=17.0) == 17.0


def test_late_renewals_are_judged_against_the_failover_time() -> None:
    assert not late_renewals(LATE_RENEWAL_SHARE * 10.0, 10.0)
    assert late_renewals(LATE_RENEWAL_SHARE * 10.0 + 0.001, 10.0)
    assert not late_renewals(0.0, 10.0)
