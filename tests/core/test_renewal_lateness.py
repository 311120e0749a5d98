"""When each lease's renewal is due (spread over the interval), and when a late renewal is worth
a warning."""

from __future__ import annotations

import math

from kclasync._core.leases.periods import (
    LATE_RENEWAL_SHARE,
    RENEWAL_BATCH_SHARE,
    RENEWER_WAKE_SHARE,
    first_renewal_due,
    late_renewals,
    renewal_phase,
    renewal_round_due,
    renewals_due,
)


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


def test_phases_spread_leases_evenly_over_the_interval_and_stay_fixed() -> None:
    keys = [f"shardId-{i:012d}" for i in range(2000)]
    phases = [renewal_phase(k) for k in keys]
    assert all(0 <= p < 1 for p in phases)
    # Ten equal slices of the interval: each holds 10 % of the keys, give or take 3 points.
    for i in range(10):
        share = sum(i / 10 <= p < (i + 1) / 10 for p in phases) / len(phases)
        assert 0.07 <= share <= 0.13, (i, share)
    assert renewal_phase(keys[0]) == renewal_phase(keys[0])  # no per-process hash seed


def test_a_lease_is_first_renewed_at_its_next_slot_within_one_interval() -> None:
    offset = 3.0 * renewal_phase("k")
    for seen in (100.0, 100.5, 101.7, 102.9, offset + 300.0):
        at = first_renewal_due("k", seen, 3.0)
        assert seen <= at < seen + 3.0 + 1e-9
        # On the key's slot: its phase past a whole multiple of the interval.
        assert math.isclose((at - offset) / 3.0, round((at - offset) / 3.0), abs_tol=1e-9)


def test_due_renewals_go_out_in_one_batch_and_the_renewer_wakes_for_the_next() -> None:
    interval = 10.0
    window = RENEWAL_BATCH_SHARE * interval
    schedule = {"a": 5.0, "b": 5.0 + window / 2, "c": 7.0, "d": 50.0}
    due, wake = renewals_due(schedule, 5.0, interval)
    assert sorted(due) == ["a", "b"] and wake == 7.0
    # Nothing due soon: wake anyway within a share of the interval, to see new leases.
    due, wake = renewals_due({"d": 50.0}, 5.0, interval)
    assert due == [] and wake == 5.0 + RENEWER_WAKE_SHARE * interval
    assert renewals_due({}, 5.0, interval) == ([], 5.0 + RENEWER_WAKE_SHARE * interval)
