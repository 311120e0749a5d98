"""The KCL 2.x taker, rule by rule (the baseline that later planners are measured against)."""

from __future__ import annotations

import random

from kclasync._core.assignment.lease_taker import Kcl2LeaseTaker, TakeView, hands_over
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import SHARD_END


def view(
    leases: list[Lease],
    me: str = "me",
    now: float = 0.0,
    tracker: ExpiryTracker | None = None,
    **kw: object,
) -> TakeView:
    t = tracker or ExpiryTracker(failover_time=10)
    t.observe(leases, now)
    return TakeView(worker_id=me, leases=leases, now=now, expiry=t, **kw)  # type: ignore[arg-type]


def test_never_owned_leases_are_very_old_and_all_taken() -> None:
    leases = [Lease(key=str(i)) for i in range(5)] + [Lease(key="x", owner="other")]
    plan = Kcl2LeaseTaker().plan(view(leases), random.Random(1))
    assert sorted(lease.key for lease in plan.take) == ["0", "1", "2", "3", "4"]


def test_non_greedy_take_of_expired_leases_stops_at_target() -> None:
    tracker = ExpiryTracker(failover_time=10)
    leases = [Lease(key=str(i), owner="dead") for i in range(3)] + [Lease(key="4", owner="bar")]
    tracker.observe(leases, 0)
    renewed = [*leases[:3], Lease(key="4", owner="bar", counter=1)]
    plan = Kcl2LeaseTaker().plan(view(renewed, now=15, tracker=tracker), random.Random(1))
    # 4 leases over {me, bar} -> target 2: take 2 of dead's 3 expired leases, not all 3.
    assert len(plan.take) == 2 and not plan.steal


def test_steals_one_from_the_most_loaded_when_nothing_is_available() -> None:
    leases = [Lease(key="1", owner="bar")] + [Lease(key=str(i), owner="baz") for i in range(2, 7)]
    plan = Kcl2LeaseTaker().plan(view(leases), random.Random(1))
    assert len(plan.steal) == 1 and plan.steal[0].owner == "baz"


def test_no_steal_when_balanced() -> None:
    leases = [Lease(key="1", owner="a"), Lease(key="2", owner="me")]
    assert Kcl2LeaseTaker().plan(view(leases), random.Random(1)).empty


def test_max_leases_for_worker_caps_taking() -> None:
    leases = [Lease(key=str(i)) for i in range(6)]
    plan = Kcl2LeaseTaker().plan(view(leases, max_leases_for_worker=2), random.Random(1))
    assert len(plan.take) == 2


def test_finished_leases_are_never_taken() -> None:
    leases = [Lease(key="done", checkpoint=SHARD_END), Lease(key="open")]
    plan = Kcl2LeaseTaker().plan(view(leases), random.Random(1))
    assert [lease.key for lease in plan.take] == ["open"]


def test_sticky_release_is_not_taken_and_pinned_is_not_stolen() -> None:
    leases = [Lease(key="r", sticky=20)] + [
        Lease(key=f"p{i}", owner="a", sticky=10) for i in range(4)
    ]
    plan = Kcl2LeaseTaker().plan(view(leases), random.Random(1))
    assert plan.empty


def test_a_steal_asks_for_a_handoff_only_from_a_live_owner() -> None:
    owned = Lease(key="k", owner="a", counter=3)
    assert hands_over(owned, graceful_handoff=True, owner_live=True)
    # A silent owner would never finish it: the lease is taken at once.
    assert not hands_over(owned, graceful_handoff=True, owner_live=False)
    assert not hands_over(owned, graceful_handoff=False, owner_live=True)
    assert not hands_over(Lease(key="k"), graceful_handoff=True, owner_live=True)
