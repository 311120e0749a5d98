"""The leader's watch of the registry reports (leader-based modes): which workers become
suspects, when, and that a suspect's leases are still judged by their own counters only."""

from __future__ import annotations

from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint, Sentinel
from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers.report_watch import (
    LUT_RESOLUTION,
    ReportView,
    failover_view,
    lut_period,
    stalled_workers,
    suspect_after,
    suspect_previous_leader,
    watch_interval,
    watch_reports,
)
from kclasync._core.workers.worker_silence import judge_silent_leases

F = 10.0
R = F / 3 - 0.01  # the renewer interval: the report period in the leader-based modes


def entry(
    worker: str, lut: int, *, impl: str | None = wm.KCLASYNC, hb: int | None = None
) -> wm.WorkerMetrics:
    return wm.WorkerMetrics(
        worker_id=worker,
        last_update=lut,
        implementation=impl,
        heartbeat=hb,
        heartbeat_interval=None if hb is None else 0.5,
    )


def test_the_leader_reads_six_times_a_period_and_suspects_a_period_and_a_margin_late() -> None:
    assert watch_interval(R) == R / 6
    assert suspect_after(12.0) == 12.0 + 0.15 * 12.0  # 15 % of the period late ...
    assert suspect_after(R) == R + 0.5  # ... at least half a second (the default failover)
    # Reports under a second apart can carry the same lut (whole seconds): the whole number
    # of periods that spans a second, then the margin.
    assert lut_period(0.64) == 1.28
    assert suspect_after(0.64) == 1.28 + 0.5
    assert lut_period(R) == R and LUT_RESOLUTION == 1.0


def test_a_report_that_stops_makes_its_worker_a_suspect_once() -> None:
    view = ReportView()
    found: list[tuple[float, frozenset[str]]] = []
    step = watch_interval(R)
    # "a" reports every R until t=10 and then stops; "b" reports every R throughout.
    for i in range(40):
        now = i * step
        a_lut = int(min(now, 10.0) // R) * 4
        b_lut = int(now // R) * 4
        change = watch_reports(
            view, [entry("a", a_lut), entry("b", b_lut)], "leader", now, report_period=R
        )
        view = change.view
        if change.suspects:
            found.append((now, change.suspects))
    assert len(found) == 1
    at, who = found[0]
    assert who == {"a"}
    # a's last value was written at 3R (~9.97) and first read one read later at most: a suspect
    # at the first read after that read + suspect_after.
    since = view.reports["a"].since
    assert 3 * R <= since <= 3 * R + step + 1e-9
    assert since + suspect_after(R) < at <= since + suspect_after(R) + step
    assert view.is_suspect("a") and not view.is_suspect("b")
    assert view.suspects() == {"a"}


def test_a_report_that_moves_again_clears_the_suspicion() -> None:
    view = watch_reports(ReportView(), [entry("a", 1)], "me", 0.0, report_period=R).view
    change = watch_reports(view, [entry("a", 1)], "me", 5.0, report_period=R)
    assert change.suspects == {"a"}
    change = watch_reports(change.view, [entry("a", 1)], "me", 6.0, report_period=R)
    assert change.suspects == frozenset()  # reported once
    change = watch_reports(change.view, [entry("a", 2)], "me", 7.0, report_period=R)
    assert not change.view.is_suspect("a")


def test_a_slow_read_is_measured_up_to_when_it_was_sent() -> None:
    view = watch_reports(ReportView(), [entry("a", 1)], "me", 0.0, report_period=R).view
    # Sent before the limit, answered long after: nothing new was visible when it was sent.
    change = watch_reports(view, [entry("a", 1)], "me", 30.0, report_period=R, sent=3.5)
    assert change.suspects == frozenset()


def test_own_java_and_heartbeating_entries_are_not_watched() -> None:
    entries = [
        entry("me", 1),
        entry("java", 1, impl=None),
        entry("taker", 1, hb=7),
    ]
    view = watch_reports(ReportView(), entries, "me", 0.0, report_period=R).view
    change = watch_reports(view, entries, "me", 100.0, report_period=R)
    assert change.suspects == frozenset()
    assert dict(change.view.reports) == {}


def test_an_entry_that_left_is_forgotten() -> None:
    view = watch_reports(ReportView(), [entry("a", 1)], "me", 0.0, report_period=R).view
    view = watch_reports(view, [], "me", 1.0, report_period=R).view
    assert "a" not in view.reports


def lease(key: str, owner: str, counter: int) -> Lease:
    return Lease(key=key, owner=owner, counter=counter)


def test_a_suspect_that_still_renews_keeps_its_leases() -> None:
    """The report is only where to look: a worker whose registry writes fail but whose
    renewals succeed is never judged expired."""
    tracker = ExpiryTracker(F)
    check = judge_silent_leases(tracker, "a", [lease("s1", "a", 5)], 4.0, recheck=False)
    assert check.expired == () and check.recheck_at is not None
    # At the re-check the counter moved (renewed every R): left alone, nothing to re-check.
    renewed = judge_silent_leases(
        tracker, "a", [lease("s1", "a", 8)], check.recheck_at, recheck=True
    )
    assert renewed.expired == () and renewed.recheck_at is None


def test_a_crashed_suspects_leases_expire_a_failover_time_after_the_leaders_first_read() -> None:
    tracker = ExpiryTracker(F)
    # The leader's last scan saw counter 3 at t=0; the worker renewed to 5, then crashed at 9.
    tracker.observe([lease("s1", "a", 3)], 0.0)
    first = judge_silent_leases(tracker, "a", [lease("s1", "a", 5)], 13.0, recheck=False)
    assert first.expired == ()
    assert first.recheck_at is not None and 23.0 < first.recheck_at < 23.1
    later = judge_silent_leases(tracker, "a", [lease("s1", "a", 5)], first.recheck_at, recheck=True)
    assert [x.key for x in later.expired] == ["s1"]


def test_a_failover_run_gives_nothing_to_a_suspect_and_leaves_its_unexpired_leases_alone() -> None:
    tracker = ExpiryTracker(F)
    # At t=0 the leader saw every lease. "a" (a suspect) then stopped: s1 stood still; s2's
    # counter moved (its old owner finishing a handoff to "a", or "a" still renewing it).
    # "b" renews s3; "c" is live in the registry and owns nothing.
    tracker.observe([lease("s1", "a", 1), lease("s2", "a", 1), lease("s3", "b", 1)], 0.0)
    now = 12.0
    leases = [lease("s1", "a", 1), lease("s2", "a", 2), lease("s3", "b", 2)]
    tracker.observe(leases, now)
    planned, live = failover_view(leases, {"a", "c", "me"}, {"a"}, tracker, now)
    # "a" is no target, even though a lease of it moved; "b" renews: live.
    assert live == {"b", "c", "me"}
    # s1 (expired) is planned; s2 (not expired, maybe still renewed by "a") is not.
    assert [x.key for x in planned] == ["s1", "s3"]
    assert tracker.is_expired(leases[0], now)


def test_a_suspect_that_is_not_a_suspect_anymore_is_planned_as_usual() -> None:
    tracker = ExpiryTracker(F)
    leases = [lease("s1", "a", 1)]
    tracker.observe(leases, 0.0)
    planned, live = failover_view(leases, {"a", "me"}, set(), tracker, 1.0)
    assert planned == leases and live == {"a", "me"}


def test_a_new_leader_suspects_the_previous_lock_owner_at_its_first_read() -> None:
    view = watch_reports(
        ReportView(), [entry("old", 5), entry("b", 5)], "me", 0.0, report_period=R
    ).view
    change = suspect_previous_leader(view, "old", "me")
    assert change.suspects == {"old"} and change.view.is_suspect("old")
    assert not change.view.is_suspect("b")
    # Once only; and nothing for itself, no previous owner, or an owner without an entry.
    assert suspect_previous_leader(change.view, "old", "me").suspects == frozenset()
    assert suspect_previous_leader(view, "me", "me").suspects == frozenset()
    assert suspect_previous_leader(view, None, "me").suspects == frozenset()
    assert suspect_previous_leader(view, "gone", "me").suspects == frozenset()
    # Alive after all (it gave the lock up): its next report ends the suspicion.
    later = watch_reports(change.view, [entry("old", 9)], "me", 1.0, report_period=R)
    assert not later.view.is_suspect("old")


def test_a_java_worker_that_renews_none_of_its_leases_is_stalled_until_it_reports() -> None:
    tracker = ExpiryTracker(F)
    done = Lease(key="end", owner="j2", counter=1, checkpoint=Checkpoint.of(Sentinel.SHARD_END))
    first = [
        lease("s1", "j1", 1),
        lease("s2", "j1", 1),
        lease("s3", "j2", 1),
        done,
        lease("s4", "py", 1),
    ]
    tracker.observe(first, 0.0)
    entries = [entry("j1", 100, impl=None), entry("j2", 100, impl=None), entry("py", 100)]
    # Nothing judged before a failover time of watching.
    assert stalled_workers({}, first, entries, tracker, 5.0) == {}
    # j1 renews none; j2 renews s3 (its finished lease stands still: that says nothing); the
    # kclasync worker "py" renews none, but the report watch is what follows it.
    later = [lease("s1", "j1", 1), lease("s2", "j1", 1), lease("s3", "j2", 2), done, first[4]]
    tracker.observe(later, 12.0)
    stalled = stalled_workers({}, later, entries, tracker, 12.0)
    assert stalled == {"j1": 100}
    # Its leases gone to others, it stays stalled while its entry stands still ...
    moved = [lease("s1", "py", 2), lease("s2", "py", 2), lease("s3", "j2", 3), done]
    tracker.observe(moved, 13.0)
    assert stalled_workers(stalled, moved, entries, tracker, 13.0) == {"j1": 100}
    # ... and not once it reports again, nor once its entry is gone.
    reported = [entry("j1", 130, impl=None), *entries[1:]]
    assert stalled_workers(stalled, moved, reported, tracker, 14.0) == {}
    assert stalled_workers(stalled, moved, entries[1:], tracker, 14.0) == {}
    # A worker holding only finished leases is not stalled.
    assert stalled_workers({}, [done], entries, tracker, 30.0) == {}
