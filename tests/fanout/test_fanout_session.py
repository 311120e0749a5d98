"""The resubscription decision, without asyncio or I/O."""

from __future__ import annotations

import random

import pytest

from kclasync._core.records.fanout_session import (
    Action,
    Decision,
    Ending,
    Progress,
    ResubscribePolicy,
    backoff,
    decide,
    resume_point,
    should_refresh,
)

POLICY = ResubscribePolicy(base_backoff=0.1, max_backoff=2.0, in_use_backoff=1.0)


def run(progress: Progress, ending: Ending, *, age: float = 10.0, events: int = 0) -> Decision:
    return decide(progress, ending, age=age, events=events, policy=POLICY, rng=random.Random(7))


def test_nothing_delivered_resumes_from_the_original_start() -> None:
    d = run(Progress(), Ending.COMPLETED, events=3)
    assert d.action is Action.RESUBSCRIBE
    assert d.resume_after is None
    assert d.delay == 0.0


def test_resumes_after_the_later_of_continuation_and_last_record() -> None:
    # Sequence numbers compare as integers, not as strings.
    assert resume_point(Progress(continuation="99", last_delivered="100")) == "100"
    assert resume_point(Progress(continuation="1000", last_delivered="999")) == "1000"
    assert resume_point(Progress(last_delivered="5")) == "5"
    d = run(Progress(continuation="120", last_delivered="110"), Ending.DROPPED)
    assert d.resume_after == "120"


def test_after_event_keeps_older_values_when_an_event_lacks_them() -> None:
    p = Progress(continuation="10", last_delivered="9", failures=3)
    assert p.after_event(None, None) == Progress("10", "9", 0)
    assert p.after_event("20", None) == Progress("20", "9", 0)
    assert p.after_event("30", "29") == Progress("30", "29", 0)


@pytest.mark.parametrize("ending", [Ending.COMPLETED, Ending.REFRESHED])
def test_a_clean_end_resubscribes_at_once(ending: Ending) -> None:
    d = run(Progress(continuation="5", failures=0), ending, age=300.0, events=40)
    assert (d.action, d.delay, d.resume_after) == (Action.RESUBSCRIBE, 0.0, "5")
    assert d.progress.failures == 0


def test_a_clean_end_at_once_without_events_backs_off() -> None:
    d = run(Progress(continuation="5"), Ending.COMPLETED, age=0.01, events=0)
    assert d.action is Action.RESUBSCRIBE
    assert d.delay > 0
    assert d.progress.failures == 1


@pytest.mark.parametrize(
    ("ending", "reason"),
    [
        (Ending.SHARD_ENDED, "the shard ended"),
        (Ending.SHARD_GONE, "the shard or its stream no longer exists"),
        (Ending.CONSUMER_GONE, "the stream consumer no longer exists"),
    ],
)
def test_give_up_to_the_caller(ending: Ending, reason: str) -> None:
    d = run(Progress(continuation="5"), ending)
    assert d.action is Action.GIVE_UP
    assert d.reason == reason


@pytest.mark.parametrize("ending", [Ending.DROPPED, Ending.THROTTLED, Ending.IN_USE])
def test_errors_back_off_exponentially_up_to_the_cap(ending: Ending) -> None:
    progress = Progress(continuation="5")
    delays = []
    for _ in range(12):
        d = run(progress, ending)
        assert d.action is Action.RESUBSCRIBE
        assert d.resume_after == "5"
        delays.append(d.delay)
        progress = d.progress
    assert progress.failures == 12
    base = 1.0 if ending is Ending.IN_USE else 0.1
    assert base * 0.5 <= delays[0] < base
    assert all(d <= 2.0 for d in delays)
    assert delays[-1] >= 1.0  # reached the cap's lower half
    # Doubling (jitter is within [0.5, 1) of the step, so a step later is at least as long).
    assert delays[3] > delays[0]


def test_in_use_waits_longer_than_a_drop() -> None:
    assert run(Progress(), Ending.IN_USE).delay >= 0.5
    assert run(Progress(), Ending.DROPPED).delay < 0.1


def test_an_event_resets_the_failure_count() -> None:
    p = Progress(continuation="5", failures=6)
    d = run(p, Ending.DROPPED, events=2)
    assert d.progress.failures == 1
    assert d.delay < 0.1


def test_gives_up_after_max_failures() -> None:
    policy = ResubscribePolicy(max_failures=3)
    progress = Progress()
    actions = []
    for _ in range(3):
        d = decide(progress, Ending.DROPPED, age=1, events=0, policy=policy, rng=random.Random(1))
        actions.append(d.action)
        progress = d.progress
    assert actions == [Action.RESUBSCRIBE, Action.RESUBSCRIBE, Action.GIVE_UP]
    assert "3 failed subscriptions" in d.reason


def test_jitter_comes_from_the_injected_generator_only() -> None:
    a = [backoff(n, 0.1, 5.0, random.Random(42)) for n in range(1, 8)]
    b = [backoff(n, 0.1, 5.0, random.Random(42)) for n in range(1, 8)]
    c = [backoff(n, 0.1, 5.0, random.Random(43)) for n in range(1, 8)]
    assert a == b
    assert a != c


def test_refresh_before_the_five_minute_limit() -> None:
    assert not should_refresh(284.9, POLICY)
    assert should_refresh(285.0, POLICY)
    with pytest.raises(ValueError, match="300"):
        ResubscribePolicy(refresh_after=300.0)
    with pytest.raises(ValueError):
        ResubscribePolicy(base_backoff=3.0, max_backoff=1.0)


def test_a_resubscription_waits_for_the_services_subscribe_limits() -> None:
    """Within 5 s of a call the service accepted, SubscribeToShard is refused
    (ResourceInUse); above one call per second it is throttled (LimitExceeded)."""
    rng = random.Random(1)
    policy = ResubscribePolicy()
    dropped = decide(
        Progress(), Ending.DROPPED, age=0.3, events=1, policy=policy, rng=rng, since_accepted=0.3
    )
    assert dropped.action is Action.RESUBSCRIBE and dropped.delay == pytest.approx(4.7)
    in_use = decide(
        Progress(), Ending.IN_USE, age=0.05, events=0, policy=policy, rng=rng, since_accepted=2.0
    )
    assert in_use.delay == pytest.approx(3.0)
    refused = decide(Progress(), Ending.THROTTLED, age=0.05, events=0, policy=policy, rng=rng)
    assert refused.delay >= 0.95
    renewed = decide(
        Progress(),
        Ending.REFRESHED,
        age=285.0,
        events=9,
        policy=policy,
        rng=rng,
        since_accepted=285,
    )
    assert renewed.delay == 0.0
