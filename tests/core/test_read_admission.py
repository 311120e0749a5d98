"""Reads in flight give way to late renewals: halve on trouble, back one step at a time."""

from __future__ import annotations

from kclasync._core.records.read_admission import (
    LATE_SHARE,
    ON_TIME_SHARE,
    STEP_SHARE,
    ReadAdmission,
    admit_reads,
)

FAILOVER = 10.0
STEP = STEP_SHARE * FAILOVER
LATE = LATE_SHARE * FAILOVER * 1.5
ON_TIME = ON_TIME_SHARE * FAILOVER / 2
BETWEEN = (LATE_SHARE + ON_TIME_SHARE) / 2 * FAILOVER


def step(state: ReadAdmission, lateness: float | None, now: float) -> ReadAdmission:
    return admit_reads(state, lateness=lateness, now=now, failover_time=FAILOVER, ceiling=32)


def test_late_renewals_halve_the_limit_once_per_step() -> None:
    state = ReadAdmission(32, 0.0)
    state = step(state, LATE, STEP / 2)
    assert state.limit == 32 and state.worst == LATE  # within the step: only remembered
    state = step(state, ON_TIME, STEP)
    assert (state.limit, state.since, state.worst) == (16, STEP, None)  # the step's worst decides
    state = step(state, LATE, STEP * 1.5)
    assert state.limit == 16
    state = step(state, LATE, STEP * 2)
    assert state.limit == 8


def test_the_limit_never_falls_below_one() -> None:
    state = ReadAdmission(1, 0.0)
    assert step(state, LATE * 10, STEP).limit == 1


def test_on_time_renewals_add_one_back_up_to_the_ceiling() -> None:
    state = ReadAdmission(4, 0.0)
    for n in range(1, 4):
        state = step(state, ON_TIME, n * STEP)
    assert state.limit == 7
    assert step(ReadAdmission(32, 0.0), ON_TIME, STEP).limit == 32
    # A ceiling lowered by configuration caps a limit above it.
    lowered = admit_reads(
        ReadAdmission(32, 0.0), lateness=BETWEEN, now=STEP, failover_time=FAILOVER, ceiling=8
    )
    assert lowered.limit == 8


def test_lateness_in_between_keeps_the_limit() -> None:
    state = step(ReadAdmission(12, 0.0), BETWEEN, STEP)
    assert (state.limit, state.since) == (12, STEP)


def test_without_a_renewal_the_limit_waits_for_one() -> None:
    state = step(ReadAdmission(12, 0.0), None, 5 * STEP)
    assert (state.limit, state.since, state.worst) == (12, 0.0, None)
    # The next renewal decides at once: the step has long passed.
    assert step(state, LATE, 5 * STEP).limit == 6


def test_the_shares_keep_their_order() -> None:
    # Cut before the lateness worth a WARNING, and react within a fraction of a failover.
    from kclasync._core.leases.periods import LATE_RENEWAL_SHARE

    assert ON_TIME_SHARE < LATE_SHARE < LATE_RENEWAL_SHARE
    assert STEP_SHARE < 0.1


def test_a_short_failover_time_is_not_held_back_by_a_hiccup() -> None:
    # At a 1 s failover, 50 ms late is 5 % of it but endangers nothing: the floors decide.
    state = admit_reads(
        ReadAdmission(8, 0.0), lateness=0.05, now=1.0, failover_time=1.0, ceiling=32
    )
    assert state.limit == 8
    state = admit_reads(ReadAdmission(8, 0.0), lateness=0.2, now=1.0, failover_time=1.0, ceiling=32)
    assert state.limit == 4
    state = admit_reads(
        ReadAdmission(8, 0.0), lateness=0.02, now=1.0, failover_time=1.0, ceiling=32
    )
    assert state.limit == 9
