"""The pause between reads of a shard (``_core/read_pacing``): busy after records or lag, idle
pauses that grow from the idle time to the maximum and never beyond it, reset by any record;
and the settings that feed it."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kclasync import ConsumerConfig
from kclasync._core.records.read_pacing import IDLE_GROWTH, ReadPause, idle_ceiling, next_read_pause
from kclasync.errors import ConfigError

seconds = st.floats(min_value=0.001, max_value=600, allow_nan=False, allow_infinity=False)


def pauses(idle: float, max_idle: float, reads: int, busy: float = 0.2) -> list[float]:
    """The pauses after ``reads`` caught-up reads in a row."""
    out: list[float] = []
    streak = 0
    for _ in range(reads):
        pause = next_read_pause(
            records=0, millis_behind=0, idle_streak=streak, busy=busy, idle=idle, max_idle=max_idle
        )
        out.append(pause.delay)
        streak = pause.idle_streak
    return out


def test_idle_pauses_double_up_to_the_maximum() -> None:
    assert pauses(1.5, 6.0, 6) == [1.5, 3.0, 6.0, 6.0, 6.0, 6.0]
    assert pauses(1.0, 5.0, 5) == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_a_maximum_at_or_below_the_idle_time_keeps_the_fixed_pause() -> None:
    assert pauses(1.5, 1.5, 4) == [1.5] * 4
    assert pauses(1.5, 0.5, 4) == [1.5] * 4


def test_records_or_lag_mean_the_busy_pause_and_reset_the_streak() -> None:
    common = {"busy": 0.2, "idle": 1.0, "max_idle": 8.0}
    assert next_read_pause(records=3, millis_behind=0, idle_streak=5, **common) == ReadPause(0.2, 0)
    # Nothing returned but behind the tip: read again soon, the shard is not idle.
    assert next_read_pause(records=0, millis_behind=7, idle_streak=5, **common) == ReadPause(0.2, 0)
    # After the reset the next empty read starts again from the idle time.
    assert next_read_pause(records=0, millis_behind=0, idle_streak=0, **common).delay == 1.0


def test_an_unreported_lag_counts_as_caught_up() -> None:
    pause = next_read_pause(
        records=0, millis_behind=None, idle_streak=1, busy=0.2, idle=1.0, max_idle=8.0
    )
    assert pause == ReadPause(2.0, 2)


def test_a_non_positive_idle_time_is_refused() -> None:
    with pytest.raises(ValueError, match="idle"):
        next_read_pause(records=0, millis_behind=0, idle_streak=0, busy=0, idle=0, max_idle=1)


@given(idle=seconds, max_idle=seconds, busy=seconds, reads=st.integers(1, 200))
def test_idle_pauses_stay_within_the_idle_time_and_the_maximum(
    idle: float, max_idle: float, busy: float, reads: int
) -> None:
    got = pauses(idle, max_idle, reads, busy)
    ceiling = max(idle, max_idle)
    assert got[0] == idle
    assert all(idle <= p <= ceiling for p in got)
    assert all(a <= b for a, b in itertools.pairwise(got))  # never shrinks while idle
    # The ceiling is reached after a bounded number of reads, and then held.
    steps = math.ceil(math.log(ceiling / idle, IDLE_GROWTH)) + 1 if ceiling > idle else 1
    if reads > steps:
        assert got[steps:] == [ceiling] * (reads - steps)


@given(
    idle=seconds,
    max_idle=seconds,
    streak=st.integers(0, 10_000),
    records=st.integers(0, 10_000),
    behind=st.none() | st.integers(0, 10**9),
)
def test_any_record_resets_and_the_streak_stays_small(
    idle: float, max_idle: float, streak: int, records: int, behind: int | None
) -> None:
    pause = next_read_pause(
        records=records,
        millis_behind=behind,
        idle_streak=streak,
        busy=0.2,
        idle=idle,
        max_idle=max_idle,
    )
    if records or behind:
        assert pause == ReadPause(0.2, 0)
    else:
        assert idle <= pause.delay <= max(idle, max_idle)
        assert pause.idle_streak <= max(streak, 1) and pause.idle_streak <= streak + 1


def test_settings_give_the_maximum_idle_time() -> None:
    assert ConsumerConfig().effective_max_idle_time == 1.5  # opt-in: the KCL's fixed pause
    assert ConsumerConfig(idle_time_between_reads=0.1).effective_max_idle_time == 0.1
    assert ConsumerConfig(max_idle_time_between_reads=10).effective_max_idle_time == 10
    # At or below the idle time: no growth (the Java KCL's fixed pause).
    fixed = ConsumerConfig(idle_time_between_reads=2.0, max_idle_time_between_reads=1.0)
    assert fixed.effective_max_idle_time == 2.0
    for bad in (0, -1, float("nan"), "5", True):
        with pytest.raises(ConfigError, match="max_idle_time_between_reads"):
            ConsumerConfig(max_idle_time_between_reads=bad)  # type: ignore[arg-type]


def test_the_idle_ceiling_is_the_maximum_never_below_the_idle_time() -> None:
    assert idle_ceiling(1.5, None) == 1.5
    assert idle_ceiling(1.5, 6.0) == 6.0
    assert idle_ceiling(2.0, 1.0) == 2.0
    pause = next_read_pause(
        records=0, millis_behind=0, idle_streak=50, busy=0.2, idle=2.0, max_idle=1.0
    )
    assert pause.delay == idle_ceiling(2.0, 1.0)
