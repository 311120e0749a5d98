"""Early failover's take: the leases just judged expired go through the takers' own plans
(kcl2 and balanced), with the leases other followers took first counted as theirs."""

from __future__ import annotations

import random
from collections.abc import Sequence

from kclasync._core.assignment.balanced_taker import BalancedLeaseTaker
from kclasync._core.assignment.lease_taker import Kcl2LeaseTaker
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_silence import early_take_view

F = 10.0


def take_view(  # type: ignore[no-untyped-def]
    tracker: ExpiryTracker,
    *,
    expired: list[Lease],
    mine: list[Lease],
    scan: list[Lease],
    live: set[str],
    cap: int | None = None,
    taken: Sequence[Lease] = (),
):
    """Worker "me"'s early-take view at 15.0, b silent, the last scan observed at 0.0."""
    tracker.observe(scan, 0.0)
    return early_take_view(
        worker_id="me",
        expired=expired,
        held=mine,
        last_scan=scan,
        silent={"b"},
        tracker=tracker,
        now=15.0,
        live_workers=frozenset(live),
        max_leases_for_worker=cap,
        max_leases_to_steal=1,
        taken_by_others=taken,
    )


def early_view(tracker: ExpiryTracker, expired: list[Lease], **kw: object):  # type: ignore[no-untyped-def]
    mine = [Lease(key=f"m{i}", owner="me", counter=9) for i in range(2)]
    # The last scan was long ago: c's leases carry old stamps but were not read now.
    scan = [
        *mine,
        *(Lease(key=f"c{i}", owner="c", counter=1) for i in range(2)),
        Lease(key="free", owner=None),
        *expired,
    ]
    cap = kw.get("cap")
    assert cap is None or isinstance(cap, int)
    return take_view(tracker, expired=expired, mine=mine, scan=scan, live={"me", "b", "c"}, cap=cap)


def test_only_the_leases_just_judged_expired_are_available_to_the_kcl2_taker() -> None:
    tracker = ExpiryTracker(F)
    expired = [Lease(key=f"b{i}", owner="b", counter=3) for i in range(2)]
    view = early_view(tracker, expired)
    assert view.live_workers == {"me", "c"}
    plan = Kcl2LeaseTaker().plan(view, random.Random(1))
    # 6 leases over {me, c}: target 3, me holds 2 -> one of b's; c's old-stamped leases and
    # the unowned one of the old scan are not candidates.
    assert len(plan.take) == 1 and plan.take[0].key in {"b0", "b1"} and not plan.steal


def test_the_early_take_respects_max_leases_for_worker() -> None:
    tracker = ExpiryTracker(F)
    expired = [Lease(key=f"b{i}", owner="b", counter=3) for i in range(2)]
    plan = Kcl2LeaseTaker().plan(early_view(tracker, expired, cap=2), random.Random(1))
    assert plan.empty


def test_the_balanced_taker_plans_the_early_take_too() -> None:
    tracker = ExpiryTracker(F)
    expired = [Lease(key=f"b{i}", owner="b", counter=3) for i in range(2)]
    plan = BalancedLeaseTaker(steal_budget=None).plan(
        early_view(tracker, expired), random.Random(1)
    )
    # The fleet plan gives me (2) and c (2) one of b's two each: one for me.
    assert len(plan.take) == 1 and plan.take[0].key in {"b0", "b1"} and not plan.steal


def test_a_lease_another_follower_took_first_counts_as_that_workers_in_the_plan() -> None:
    """b held b0 and b1 and went silent; a took b0 first. My last scan still shows b0 as b's,
    so without what my follow read, a and I look equal (one lease each) and the fleet plan can
    give b1 to a, which already took its share: b1 would wait for the retakes."""
    tracker = ExpiryTracker(F)
    mine = [Lease(key="m0", owner="me", counter=9)]
    scan = [
        *mine,
        Lease(key="a0", owner="a", counter=1),
        *(Lease(key=f"b{i}", owner="b", counter=3) for i in range(2)),
    ]
    expired = [Lease(key="b1", owner="b", counter=3)]
    taken_by_a = Lease(key="b0", owner="a", counter=4)

    def plan(taken: list[Lease]):  # type: ignore[no-untyped-def]
        view = take_view(
            tracker, expired=expired, mine=mine, scan=scan, live={"me", "a", "b"}, taken=taken
        )
        return BalancedLeaseTaker(steal_budget=None).plan(view, random.Random(1))

    assert [lease.key for lease in plan([taken_by_a]).take] == ["b1"]
    assert plan([]).empty  # the last scan alone: a (1) and me (1) tie, and a gets b1
