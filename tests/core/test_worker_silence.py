"""Early failover's pure decisions: which workers just went silent, what to do with their leases
when read (the expiry rule unchanged), and the registry item's heartbeat (the taker's view for
taking the leases: ``test_early_take_view.py``)."""

from __future__ import annotations

import pytest

from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers import worker_metrics_item as wi
from kclasync._core.workers.worker_silence import (
    RECHECK_SLACK,
    HeartbeatView,
    SilentLeaseCheck,
    after_early_take,
    default_heartbeat_interval,
    handoff_finished_by_other,
    judge_silent_leases,
    stale_entries,
    watch_heartbeats,
    worth_following,
)

F = 10.0


def watch(
    view: HeartbeatView, entries: list[wm.WorkerMetrics], me: str, now: float, **kw: float
) -> tuple[HeartbeatView, frozenset[str]]:
    change = watch_heartbeats(view, entries, me, now, **kw)
    return change.view, change.silent


def entry(worker: str, beat: int | None, interval: float | None = 0.5) -> wm.WorkerMetrics:
    return wm.WorkerMetrics(
        worker_id=worker, last_update=0, heartbeat=beat, heartbeat_interval=interval
    )


def test_the_default_period_is_a_twentieth_of_the_failover_time_and_at_least_half_a_second() -> (
    None
):
    assert default_heartbeat_interval(10.0) == 0.5
    assert default_heartbeat_interval(30.0) == 1.5
    assert default_heartbeat_interval(3.0) == 0.5


def test_a_heartbeat_that_stops_is_reported_silent_once_after_two_periods() -> None:
    view = HeartbeatView()
    reported: list[tuple[float, frozenset[str]]] = []
    # Reads every 0.25 s; "b" beats every 0.5 s until t=2.0 (value 4), "a" keeps beating.
    for step in range(20):
        now = step * 0.25
        beat_b = min(step // 2, 4)
        view, silent = watch(view, [entry("a", step // 2), entry("b", beat_b)], "me", now)
        if silent:
            reported.append((now, silent))
    # Last change seen at 2.0; up to 3.0 is within two periods; 3.25 is past them.
    assert reported == [(3.25, frozenset({"b"}))]
    assert view.silent_workers() == {"b"}


def test_only_change_counts_never_the_heartbeats_value_against_the_local_clock() -> None:
    # Values far from the local clock (another host's wall clock, a restarted counter) do not
    # matter: a new value is a beat, an unchanged one is silence measured locally.
    view, _ = watch(HeartbeatView(), [entry("b", 10**15)], "me", 100.0)
    view, silent = watch(view, [entry("b", 3)], "me", 100.7)
    assert not silent and view.beats["b"].since == 100.7
    view, silent = watch(view, [entry("b", 3)], "me", 101.7)
    assert not silent  # 1.0 s: within two periods
    view, silent = watch(view, [entry("b", 3)], "me", 101.8)
    assert silent == {"b"}


def test_a_worker_that_beats_again_is_no_longer_silent_and_can_be_reported_again() -> None:
    view, _ = watch(HeartbeatView(), [entry("b", 1)], "me", 0.0)
    view, silent = watch(view, [entry("b", 1)], "me", 1.5)
    assert silent == {"b"}
    view, silent = watch(view, [entry("b", 1)], "me", 5.0)
    assert not silent  # reported once per silence
    view, silent = watch(view, [entry("b", 2)], "me", 5.5)
    assert not silent and not view.silent_workers()
    view, silent = watch(view, [entry("b", 2)], "me", 7.0)
    assert silent == {"b"}


def test_a_slow_read_does_not_make_a_heartbeat_look_silent() -> None:
    # Seen at 10.0 (answer of a read); the next read is sent at 10.5 but answered at 12.0 (a
    # stalled server): silence is measured to the send, 0.5 s, not 2 s.
    view, _ = watch(HeartbeatView(), [entry("b", 1)], "me", 10.0)
    view, silent = watch(view, [entry("b", 1)], "me", 12.0, sent=10.5)
    assert not silent
    # A new value is stamped with the answer: the write may have landed just before it.
    view, _ = watch(view, [entry("b", 2)], "me", 13.0, sent=12.1)
    assert view.beats["b"].since == 13.0
    view, silent = watch(view, [entry("b", 2)], "me", 14.2, sent=14.1)
    assert silent == {"b"}


def test_entries_without_a_heartbeat_period_and_this_workers_own_are_not_watched() -> None:
    java = entry("java", None, None)
    view, _ = watch(HeartbeatView(), [java, entry("me", 1)], "me", 0.0)
    view, silent = watch(view, [java, entry("me", 1)], "me", 100.0)
    assert not silent and not view.beats


def test_the_silence_threshold_is_the_writers_period_not_the_readers() -> None:
    view, _ = watch(HeartbeatView(), [entry("slow", 1, interval=4.0)], "me", 0.0)
    view, silent = watch(view, [entry("slow", 1, interval=4.0)], "me", 7.9)
    assert not silent
    view, silent = watch(view, [entry("slow", 1, interval=4.0)], "me", 8.1)
    assert silent == {"slow"}


def test_a_worker_that_left_the_registry_is_forgotten_and_reported_as_left() -> None:
    view, _ = watch(HeartbeatView(), [entry("b", 1)], "me", 0.0)
    change = watch_heartbeats(view, [], "me", 10.0)
    assert not change.silent and not change.view.beats and change.left == {"b"}


def test_a_new_entry_after_the_first_read_is_reported_as_joined() -> None:
    # The first read only learns who is there; later, a new entry is a worker that just started
    # and a taking round gives it its share at once.
    first = watch_heartbeats(HeartbeatView(), [entry("b", 1)], "me", 0.0)
    assert first.joined == frozenset()
    entries = [entry("b", 2), entry("c", 1), entry("me", 1)]
    change = watch_heartbeats(first.view, entries, "me", 0.25)
    assert change.joined == {"c"}
    again = watch_heartbeats(change.view, [entry("b", 3), entry("c", 2)], "me", 0.5)
    assert again.joined == frozenset()


def test_an_entry_removed_after_its_worker_went_silent_is_not_a_graceful_leave() -> None:
    # A removed silent entry released nothing: waking the taker for it would scan for nothing.
    view, _ = watch(HeartbeatView(), [entry("dead", 1), entry("b", 1)], "me", 0.0)
    view, silent = watch(view, [entry("dead", 1), entry("b", 2)], "me", 1.1)
    assert silent == {"dead"}
    change = watch_heartbeats(view, [], "me", 1.2)
    assert change.left == {"b"}


def test_a_silent_entry_never_seen_moving_and_owning_nothing_is_not_followed() -> None:
    # "dead" was SIGKILLed before this worker started: its value never changes under our watch.
    view, _ = watch(HeartbeatView(), [entry("dead", 7), entry("b", 1)], "me", 0.0)
    view, silent = watch(view, [entry("dead", 7), entry("b", 1)], "me", 1.1)
    assert silent == {"dead", "b"}
    scan = [Lease(key="s1", owner="me", counter=3), Lease(key="s2", owner="me", counter=3)]
    assert worth_following(silent, view, scan) == frozenset()


def test_a_silent_worker_seen_beating_or_owning_a_lease_is_followed() -> None:
    view, _ = watch(HeartbeatView(), [entry("seen", 1), entry("owner", 5)], "me", 0.0)
    view, _ = watch(view, [entry("seen", 2), entry("owner", 5)], "me", 0.5)
    view, silent = watch(view, [entry("seen", 2), entry("owner", 5)], "me", 1.6)
    assert silent == {"seen", "owner"}
    assert view.beats["seen"].moved and not view.beats["owner"].moved
    scan = [Lease(key="s1", owner="owner", counter=3), Lease(key="s2", owner="me", counter=3)]
    assert worth_following(silent, view, scan) == {"seen", "owner"}
    assert worth_following(silent, view, []) == {"seen"}


def test_the_leader_removes_an_entry_long_silent_and_owning_nothing_in_a_later_scan() -> None:
    view, _ = watch(HeartbeatView(), [entry("dead", 7), entry("b", 1)], "me", 0.0)
    view, silent = watch(view, [entry("dead", 7), entry("b", 2)], "me", 1.1)
    assert silent == {"dead"}
    mine = [Lease(key="s1", owner="me", counter=3)]
    theirs = [*mine, Lease(key="s2", owner="dead", counter=3)]
    # Silent since 0.0 (the first read of 7): not before 3 failover times ...
    assert stale_entries(view, mine, 25.0, 29.0, F) == {}
    # ... nor while the last scan shows it owning a lease, or was sent before the silence.
    assert stale_entries(view, theirs, 25.0, 31.0, F) == {}
    assert stale_entries(view, mine, None, 31.0, F) == {}
    early = watch_heartbeats(HeartbeatView(), [entry("dead", 7)], "me", 5.0).view
    early = watch_heartbeats(early, [entry("dead", 7)], "me", 6.1).view
    assert stale_entries(early, mine, 4.0, 40.0, F) == {}
    # Then removed, conditional on the silent value; a live one never is.
    assert stale_entries(view, mine, 25.0, 31.0, F) == {"dead": 7}


# -- judging a silent worker's leases ------------------------------------------------------------


def test_first_look_restarts_the_clock_of_a_changed_counter_and_schedules_the_check() -> None:
    tracker = ExpiryTracker(F)
    tracker.observe([Lease(key="k", owner="b", counter=4)], 0.0)  # the last periodic scan
    check = judge_silent_leases(
        tracker, "b", [Lease(key="k", owner="b", counter=7)], 12.0, recheck=False
    )
    assert not check.expired and check.waiting == ("k",)
    assert check.recheck_at == 12.0 + F + RECHECK_SLACK
    assert tracker.last_change("k") == 12.0


def test_an_unchanged_counter_keeps_its_earlier_first_seen_time() -> None:
    tracker = ExpiryTracker(F)
    tracker.observe([Lease(key="k", owner="b", counter=4)], 3.0)
    check = judge_silent_leases(
        tracker, "b", [Lease(key="k", owner="b", counter=4)], 8.0, recheck=False
    )
    assert check.recheck_at == 3.0 + F + RECHECK_SLACK
    # ... and when that time has passed already, the lease is expired at the first look.
    check = judge_silent_leases(
        tracker, "b", [Lease(key="k", owner="b", counter=4)], 13.5, recheck=False
    )
    assert [lease.key for lease in check.expired] == ["k"] and not check.waiting


def test_at_the_check_an_unchanged_counter_is_expired_by_the_unchanged_rule() -> None:
    tracker = ExpiryTracker(F)
    lease = Lease(key="k", owner="b", counter=7)
    first = judge_silent_leases(tracker, "b", [lease], 12.0, recheck=False)
    assert first.recheck_at is not None
    check = judge_silent_leases(tracker, "b", [lease], first.recheck_at, recheck=True)
    assert check.expired == (lease,)
    assert tracker.is_expired(lease, first.recheck_at)


def test_a_stalled_owner_that_resumed_is_never_taken() -> None:
    tracker = ExpiryTracker(F)
    first = judge_silent_leases(
        tracker, "b", [Lease(key="k", owner="b", counter=7)], 12.0, recheck=False
    )
    assert first.recheck_at is not None
    # The owner came back and renewed before the check: nothing is expired, nothing waits,
    # and the renewal restarted the lease's clock as a scan would have.
    resumed = Lease(key="k", owner="b", counter=8)
    for at in (first.recheck_at, first.recheck_at + 3 * F):
        check = judge_silent_leases(tracker, "b", [resumed], at, recheck=True)
        assert not check.expired and not check.waiting
        resumed = Lease(key="k", owner="b", counter=resumed.counter + 1)
    assert not tracker.is_expired(Lease(key="k", owner="b", counter=8), first.recheck_at + 1)


def test_a_handoff_finished_by_the_old_owner_is_not_the_silent_owners_renewal() -> None:
    """``b`` asked ``a`` for the lease and went silent; ``a`` finished the handoff after the
    first look. At the check that write neither means ``b`` came back nor restarts the clock:
    the lease is expired then, a failover time after the first look."""
    tracker = ExpiryTracker(F)
    during = Lease(key="k", owner="b", counter=7, checkpoint_owner="a")
    first = judge_silent_leases(tracker, "b", [during], 12.0, recheck=False)
    assert first.waiting == ("k",) and first.recheck_at == 12.0 + F + RECHECK_SLACK
    finished = Lease(key="k", owner="b", counter=8)
    check = judge_silent_leases(
        tracker, "b", [finished], first.recheck_at, recheck=True, before={"k": during}
    )
    assert check.expired == (finished,)
    assert tracker.last_change("k") == 12.0
    # Without what the previous look read, the change counts as the owner's.
    tracker = ExpiryTracker(F)
    judge_silent_leases(tracker, "b", [during], 12.0, recheck=False)
    check = judge_silent_leases(tracker, "b", [finished], first.recheck_at, recheck=True)
    assert not check.expired and not check.waiting


@pytest.mark.parametrize(
    ("after", "why"),
    [
        (Lease(key="k", owner="b", counter=9), "the owner renewed too"),
        (Lease(key="k", owner="b", counter=8, checkpoint_owner="a"), "still under way"),
        (Lease(key="k", owner="c", counter=8), "another owner"),
    ],
)
def test_other_changes_after_a_handoff_are_not_the_old_owners_finish(
    after: Lease, why: str
) -> None:
    during = Lease(key="k", owner="b", counter=7, checkpoint_owner="a")
    assert not handoff_finished_by_other(during, after), why
    assert handoff_finished_by_other(during, Lease(key="k", owner="b", counter=8))
    # No handoff under way before: a +1 is the owner's own write.
    assert not handoff_finished_by_other(
        Lease(key="k", owner="b", counter=7), Lease(key="k", owner="b", counter=8)
    )


def test_leases_of_another_owner_now_or_deleted_are_left_alone() -> None:
    tracker = ExpiryTracker(F)
    tracker.observe([Lease(key="x", owner="b", counter=1)], 0.0)
    check = judge_silent_leases(
        tracker, "b", [Lease(key="x", owner="c", counter=2), None], 30.0, recheck=False
    )
    assert check == type(check)()


def test_expired_leases_left_by_the_plan_are_planned_again_a_few_times() -> None:
    a, b = Lease(key="a", owner="dead"), Lease(key="b", owner="dead")
    check = SilentLeaseCheck(expired=(a, b), waiting=("c",), recheck_at=30.0)
    # "b" went to another worker's share (or its take raced): read it again a period later.
    again = after_early_take(check, {"a"}, 20.0, 0.5, rounds_left=3)
    assert again == SilentLeaseCheck(waiting=("c", "b"), recheck_at=20.5)
    # All taken: only the waiting ones remain. Out of rounds: "b" is left to a full round.
    done = after_early_take(check, {"a", "b"}, 20.0, 0.5, rounds_left=3)
    assert done == SilentLeaseCheck(waiting=("c",), recheck_at=30.0)
    done = after_early_take(check, {"a"}, 20.0, 0.5, rounds_left=0)
    assert done == SilentLeaseCheck(waiting=("c",), recheck_at=30.0, unplanned=("b",))


# -- the registry item ---------------------------------------------------------------


def test_the_heartbeat_round_trips_and_a_bad_period_reads_as_none() -> None:
    item = wi.encode_item(entry("b", 1234567, 0.5))
    assert item[wi.HEARTBEAT] == {"N": "1234567"} and item[wi.HEARTBEAT_INTERVAL] == {"N": "500"}
    decoded = wi.decode_item(item)
    assert decoded.heartbeat == 1234567 and decoded.heartbeat_interval == 0.5
    for bad in ({"N": "0"}, {"N": "x"}, {"S": "500"}):
        decoded = wi.decode_item({**item, wi.HEARTBEAT_INTERVAL: bad})
        assert decoded.heartbeat is None and decoded.heartbeat_interval is None
    assert wi.HEARTBEAT not in wi.encode_item(entry("b", None, None))


async def test_a_report_without_heartbeat_removes_an_earlier_one() -> None:
    registry = MemoryWorkerMetrics()
    await registry.report(entry("b", 1))
    assert wi.HEARTBEAT in registry.items["b"]
    await registry.report(entry("b", None, None))
    assert (
        wi.HEARTBEAT not in registry.items["b"] and wi.HEARTBEAT_INTERVAL not in registry.items["b"]
    )
