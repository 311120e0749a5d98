"""BalancedLeaseTaker: unit cases, and a round-count contrast with Kcl2LeaseTaker. The fleet
properties are in test_balanced_fleet.py; the helpers in tests/core/lease_rounds.py.
"""

from __future__ import annotations

import random

import attrs
import pytest

from kclasync._core.assignment.balanced_taker import FROM_VIEW, BalancedLeaseTaker
from kclasync._core.assignment.lease_taker import REPLANS_PER_ROUND, Kcl2LeaseTaker, replan_at_once
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import STICKY_PINNED, STICKY_RELEASE
from tests.core.lease_rounds import (
    FAILOVER,
    T1,
    UNLIMITED,
    keys,
    loads,
    mk,
    owners,
    renew,
    rounds_to_balance,
    simulate_round,
    snapshot,
    view_for,
)

# ---------------------------------------------------------------------------------------------
# Unit cases


def test_fresh_table_is_shared_out_without_steals() -> None:
    table, tracker = snapshot(mk(key) for key in keys("s", 8))
    workers = ["w0", "w1", "w2"]
    result = simulate_round(table, tracker, workers, UNLIMITED, live=workers)
    assert result.conflicts == 0
    assert all(not plan.steal for plan in result.plans.values())
    # All start at zero, so the two extra leases go to the first workers by id.
    assert loads(result.table, workers) == {"w0": 3, "w1": 3, "w2": 2}


def test_scale_out_one_to_four_over_sixteen_leases_in_one_round() -> None:
    table, tracker = snapshot(mk(key, "w0") for key in keys("s", 16))
    workers = ["w0", "w1", "w2", "w3"]
    result = simulate_round(table, tracker, workers, UNLIMITED, live=workers)
    assert result.plans["w0"].empty
    for thief in workers[1:]:
        plan = result.plans[thief]
        assert not plan.take
        assert len(plan.steal) == 4
        assert owners(plan.steal) == {"w0"}
    assert result.conflicts == 0
    assert loads(result.table, workers) == dict.fromkeys(workers, 4)


def test_dead_workers_expired_leases_are_taken_before_any_steal() -> None:
    held = [mk(key, "w0") for key in keys("a", 8)]
    orphans = [mk(key, "dead") for key in keys("d", 2)]
    table, tracker = snapshot(held, stale=orphans)
    plan = UNLIMITED.plan(view_for("w1", table, tracker, live=["w0", "w1"]), random.Random(0))
    # 10 leases over 2 workers: w1 takes both orphans, then steals 3 from w0.
    assert {lease.key for lease in plan.take} == {lease.key for lease in orphans}
    assert len(plan.steal) == 3 and owners(plan.steal) == {"w0"}
    # Even with no steal budget at all, the orphans are still taken.
    no_steals = BalancedLeaseTaker(steal_budget=0)
    plan = no_steals.plan(view_for("w1", table, tracker, live=["w0", "w1"]), random.Random(0))
    assert len(plan.take) == 2 and not plan.steal


def test_dead_workers_leases_are_shared_by_the_survivors() -> None:
    alive = [mk(key, owner) for owner in ("w0", "w1") for key in keys(f"{owner}-", 4)]
    orphans = [mk(key, "dead") for key in keys("d", 4)]
    table, tracker = snapshot(alive, stale=orphans)
    workers = ["w0", "w1"]
    result = simulate_round(table, tracker, workers, UNLIMITED, live=workers)
    assert all(not plan.steal for plan in result.plans.values())
    assert result.conflicts == 0
    assert loads(result.table, workers) == {"w0": 6, "w1": 6}


def test_pinned_leases_are_never_stolen() -> None:
    pinned = [mk(key, "w0", sticky=STICKY_PINNED) for key in keys("p", 4)]
    normal = [mk(key, "w0") for key in keys("n", 2)]
    table, tracker = snapshot([*pinned, *normal])
    workers = ["w0", "w1"]
    fleet = UNLIMITED.fleet_plan(view_for("w1", table, tracker, live=workers))
    # w0's four pinned leases exceed the average of 3: it keeps them, w1 gets the other two.
    assert fleet.targets == {"w0": 4, "w1": 2}
    result = simulate_round(table, tracker, workers, UNLIMITED, live=workers)
    assert {lease.key for lease in result.plans["w1"].steal} == {lease.key for lease in normal}
    assert all(lease.owner == "w0" for lease in result.table if lease.sticky == STICKY_PINNED)

    all_pinned, tracker = snapshot(mk(key, "w0", sticky=STICKY_PINNED) for key in keys("p", 6))
    plan = UNLIMITED.plan(view_for("w1", all_pinned, tracker, live=workers), random.Random(0))
    assert plan.empty


def test_unowned_pinned_lease_is_taken_but_an_orphaned_one_waits() -> None:
    free_pinned = mk("free", sticky=STICKY_PINNED)
    orphan_pinned = mk("orphan", "dead", sticky=STICKY_PINNED)
    table, tracker = snapshot([free_pinned], stale=[orphan_pinned])
    view = view_for("w1", table, tracker, live=["w1"])
    assert [lease.key for lease in UNLIMITED.plan(view, random.Random(0)).take] == ["free"]
    failover = BalancedLeaseTaker(steal_budget=None, take_expired_pinned=True)
    assert {lease.key for lease in failover.plan(view, random.Random(0)).take} == {
        "free",
        "orphan",
    }


def test_unknown_sticky_values_count_as_normal() -> None:
    values: list[int | str | None] = [-1, 0, 7, 15, 99, "junk"]
    odd = [mk(f"s{i}", "w0", sticky=value) for i, value in enumerate(values)]
    table, tracker = snapshot(odd)
    plan = UNLIMITED.plan(view_for("w1", table, tracker, live=["w0", "w1"]), random.Random(0))
    assert len(plan.steal) == 3


def test_finished_and_released_leases_are_never_taken() -> None:
    table, tracker = snapshot(
        [mk("end", finished=True), mk("rel", sticky=STICKY_RELEASE)],
        stale=[mk("end-dead", "dead", finished=True), mk("rel-dead", "dead", sticky=20)],
    )
    plan = UNLIMITED.plan(view_for("w0", table, tracker, live=["w0"]), random.Random(0))
    assert plan.empty


def test_max_leases_for_worker_is_respected() -> None:
    table, tracker = snapshot(mk(key) for key in keys("s", 20))
    workers = ["w0", "w1"]
    result = simulate_round(table, tracker, workers, UNLIMITED, live=workers, cap=5)
    assert loads(result.table, workers) == {"w0": 5, "w1": 5}
    assert sum(lease.owner is None for lease in result.table) == 10

    table, tracker = snapshot(mk(key, "w0") for key in keys("s", 10))
    plan = UNLIMITED.plan(view_for("w1", table, tracker, live=workers, cap=3), random.Random(0))
    assert len(plan.steal) == 3


def test_steal_budget_is_respected() -> None:
    table, tracker = snapshot(mk(key, "w0") for key in keys("s", 16))
    workers = ["w0", "w1", "w2", "w3"]
    budget_two = BalancedLeaseTaker(steal_budget=2)
    result = simulate_round(table, tracker, workers, budget_two, live=workers)
    assert [len(result.plans[w].steal) for w in workers] == [0, 2, 2, 2]
    assert loads(result.table, workers) == {"w0": 10, "w1": 2, "w2": 2, "w3": 2}

    # By default the budget is the view's max_leases_to_steal.
    default = BalancedLeaseTaker()
    assert default.steal_budget is FROM_VIEW
    result = simulate_round(table, tracker, workers, default, live=workers, max_steal=3)
    assert [len(result.plans[w].steal) for w in workers] == [0, 3, 3, 3]

    # A budget limits how many rounds the scale-out takes.
    assert rounds_to_balance(budget_two, table, workers, live=workers) == 2
    assert rounds_to_balance(BalancedLeaseTaker(steal_budget=1), table, workers, live=workers) == 4


def test_negative_steal_budget_is_rejected() -> None:
    with pytest.raises(ValueError, match="steal_budget"):
        BalancedLeaseTaker(steal_budget=-1)


def test_a_balanced_fleet_does_not_churn() -> None:
    sizes = {"w0": 5, "w1": 4, "w2": 5, "w3": 4}
    table, tracker = snapshot(
        mk(key, worker) for worker, n in sizes.items() for key in keys(f"{worker}-", n)
    )
    result = simulate_round(table, tracker, list(sizes), UNLIMITED, live=sizes)
    assert all(plan.empty for plan in result.plans.values())


def test_over_target_worker_takes_nothing() -> None:
    table, tracker = snapshot([mk(key, "w0") for key in keys("s", 6)], stale=[mk("free")])
    plan = UNLIMITED.plan(view_for("w0", table, tracker, live=["w0", "w1"]), random.Random(0))
    assert plan.empty


def test_a_registered_worker_whose_leases_all_lapsed_is_left_out() -> None:
    # The registry still lists "dead" (its entry outlives its leases by up to a worker
    # timeout), but every lease it owns has expired: it would get them back in the plan and
    # nobody would take them. Found as an 8.1 x failover in the seed sweep (seed 20062).
    alive = [mk(key, owner) for owner in ("w0", "w1") for key in keys(f"{owner}-", 3)]
    orphans = [mk(key, "dead") for key in keys("d", 3)]
    table, tracker = snapshot(alive, stale=orphans)
    registry = ["w0", "w1", "dead"]
    fleet = UNLIMITED.fleet_plan(view_for("w0", table, tracker, live=registry))
    assert fleet.live_workers == ("w0", "w1")
    result = simulate_round(table, tracker, ["w0", "w1"], UNLIMITED, live=registry)
    assert result.conflicts == 0
    assert sorted(loads(result.table, ["w0", "w1"]).values()) == [4, 5]
    # A lease in a graceful handoff is no evidence: its new owner waits for the old one.
    handing = [attrs.evolve(lease, checkpoint_owner="w1") for lease in orphans]
    table, tracker = snapshot(alive, stale=handing)
    fleet = UNLIMITED.fleet_plan(view_for("w0", table, tracker, live=registry))
    assert fleet.live_workers == ("dead", "w0", "w1")
    # A worker that owns a lapsed lease but also renews another one still counts.
    partly = [*alive, mk("d-fresh", "dead")]
    table, tracker = snapshot(partly, stale=orphans)
    fleet = UNLIMITED.fleet_plan(view_for("w0", table, tracker, live=registry))
    assert fleet.live_workers == ("dead", "w0", "w1")


def test_a_lease_the_plan_gives_to_a_silent_worker_is_rescued_a_round_later() -> None:
    # "ghost" is in the registry and owns nothing: the plan hands it the free lease. If the
    # lease is still untouched more than two failover periods after this worker first saw it
    # so, the plan evidently failed and this worker takes it as well.
    held = [mk(key, "w0") for key in keys("h", 2)]
    table, tracker = snapshot(held, stale=[mk("free")])
    registry = ["w0", "ghost"]
    fleet = UNLIMITED.fleet_plan(view_for("w0", table, tracker, live=registry))
    assert [lease.key for lease in fleet.takes["ghost"]] == ["free"]
    assert UNLIMITED.plan(view_for("w0", table, tracker, live=registry), random.Random(0)).empty
    later = T1 + 1.0
    table = renew(table, ["w0"])
    tracker.observe(table, now=later)
    view = view_for("w0", table, tracker, now=later, live=registry)
    assert [lease.key for lease in UNLIMITED.plan(view, random.Random(0)).take] == ["free"]
    assert UNLIMITED.fleet_plan(view).takes == fleet.takes  # the shared plan is unchanged
    never = BalancedLeaseTaker(steal_budget=None, rescue_after=None)
    assert never.plan(view, random.Random(0)).empty
    capped = view_for("w0", table, tracker, now=later, live=registry, cap=2)
    assert UNLIMITED.plan(capped, random.Random(0)).empty
    # A lease pinned to a named worker is never rescued: it waits for that worker.
    named = attrs.evolve(mk("free", sticky=STICKY_PINNED), sticky_worker="ghost")
    table, tracker = snapshot(held, stale=[named])
    table = renew(table, ["w0"])
    tracker.observe(table, now=later)
    view = view_for("w0", table, tracker, now=later, live=registry)
    assert [lease.key for lease in UNLIMITED.fleet_plan(view).takes["ghost"]] == ["free"]
    assert UNLIMITED.plan(view, random.Random(0)).empty


def test_unchanged_for_counts_from_the_first_scan_that_saw_the_current_state() -> None:
    tracker = ExpiryTracker(failover_time=FAILOVER)
    free, owned = mk("free"), mk("owned", "w0")
    assert tracker.unchanged_for(free, 5.0) == 0.0  # never seen
    tracker.observe([free, owned], now=5.0)
    assert tracker.unchanged_for(free, 17.0) == 12.0
    assert tracker.unchanged_for(owned, 17.0) == 12.0
    moved = attrs.evolve(owned, counter=2)
    assert tracker.unchanged_for(moved, 17.0) == 0.0  # a state this worker has not seen
    tracker.observe([free, moved], now=20.0)
    assert tracker.unchanged_for(moved, 26.0) == 6.0
    assert tracker.unchanged_for(free, 26.0) == 21.0


def test_without_a_registry_the_owners_of_unexpired_leases_are_the_fleet() -> None:
    table, tracker = snapshot(mk(key, "w0") for key in keys("s", 16))
    fleet = UNLIMITED.fleet_plan(view_for("w1", table, tracker, live=None))
    assert fleet.live_workers == ("w0", "w1")
    assert len(fleet.steals["w1"]) == 8
    # Idle workers cannot see each other: w1 and w2 both aim at 8 and collide on some leases.
    result = simulate_round(table, tracker, ["w1", "w2"], UNLIMITED, live=None)
    assert result.conflicts > 0


def test_kcl2_needs_several_rounds_where_balanced_needs_one() -> None:
    table = [mk(key, "w0") for key in keys("s", 16)]
    workers = ["w0", "w1", "w2", "w3"]
    # KCL 2.x: the newcomers are invisible until they own something, and each steals one lease
    # per round: 16/0/0/0 -> 13/1/1/1 -> 10/2/2/2 -> 7/3/3/3 -> 4/4/4/4 at best.
    kcl2_rounds = rounds_to_balance(Kcl2LeaseTaker(), table, workers, live=workers)
    assert kcl2_rounds >= 4
    assert rounds_to_balance(UNLIMITED, table, workers, live=workers) == 1
    # Without a registry the three newcomers cannot see each other and collide: still only 3
    # rounds (16/0/0/0 -> 8/8/0/0 -> 6/5/5/0 -> 4/4/4/4).
    assert rounds_to_balance(UNLIMITED, table, workers, live=None) == 3
    # A single newcomer, registry or not: one round, against eight for KCL 2.x.
    assert rounds_to_balance(UNLIMITED, table, ["w0", "w1"], live=None) == 1
    assert rounds_to_balance(Kcl2LeaseTaker(), table, ["w0", "w1"], live=None) == 8


def test_a_round_scans_again_once_after_planned_moves_lost_their_writes() -> None:
    assert not replan_at_once(lost_writes=0, replans_done=0)
    assert replan_at_once(lost_writes=1, replans_done=0)
    assert not replan_at_once(lost_writes=3, replans_done=REPLANS_PER_ROUND)
