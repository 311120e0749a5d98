"""BalancedLeaseTaker fleet properties: every live worker plans against one snapshot, the plans
are applied the way the lease table would (a take or steal is a write conditioned on the counter
the planner saw, so the first writer wins and later writers on the same lease fail), and one
round must balance the fleet safely.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import attrs
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from kclasync._core.assignment.balanced_taker import FROM_VIEW, BalancedLeaseTaker, FromView
from kclasync._core.assignment.lease_taker import is_assignable
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import STICKY_PINNED, STICKY_RELEASE, Lease
from tests.core.lease_rounds import (
    FAILOVER,
    T1,
    UNLIMITED,
    apply_plans,
    keys,
    loads,
    mk,
    renew,
    rounds_to_balance,
    simulate_round,
    snapshot,
    view_for,
)

# ---------------------------------------------------------------------------------------------
# Fleet properties


@dataclass
class Fleet:
    workers: list[str]  # the live workers; every one of them plans
    registry: list[str]  # what view.live_workers says (idle workers are always in it)
    fresh: list[Lease]
    stale: list[Lease]

    def __repr__(self) -> str:
        def brief(leases: list[Lease]) -> list[tuple[str, str | None, int | str | None, bool]]:
            return [(lease.key, lease.owner, lease.sticky, lease.is_finished) for lease in leases]

        return (
            f"Fleet(workers={self.workers}, registry={self.registry}, "
            f"fresh={brief(self.fresh)}, stale={brief(self.stale)})"
        )


DEAD = ["dead0", "dead1", "dead2"]
NORMAL_STICKY: list[int | str | None] = [None, None, None, 0, -1, 7, "junk"]


@st.composite
def fleets(draw: st.DrawFn, *, pinned: bool) -> Fleet:
    n_workers = draw(st.integers(1, 30))
    workers = [f"w{i:02d}" for i in range(n_workers)]
    # Only the first `holders` workers own leases at T0: the rest are newcomers (scale-out).
    holders = draw(st.integers(1, n_workers))
    sticky_choices: list[int | str | None] = [*NORMAL_STICKY, STICKY_RELEASE]
    if pinned:
        sticky_choices.append(STICKY_PINNED)
    # One integer per lease (cheap to draw, and it shrinks towards a plain unowned lease).
    n_leases = draw(st.integers(0, 300))
    codes = draw(st.lists(st.integers(0, 2**24), min_size=n_leases, max_size=n_leases))
    fresh: list[Lease] = []
    stale: list[Lease] = []
    for i, code in enumerate(codes):
        code, kind = divmod(code, 6)  # 0 free, 1-3 held by a live worker, 4 stale, 5 dead
        code, sticky_index = divmod(code, len(sticky_choices))
        code, finish_roll = divmod(code, 10)
        lease = mk(f"shard-{i:04d}", sticky=sticky_choices[sticky_index], finished=finish_roll == 9)
        if kind == 0:
            fresh.append(lease)
        elif kind <= 3:
            fresh.append(attrs.evolve(lease, owner=workers[code % holders]))
        elif kind == 4:
            stale.append(attrs.evolve(lease, owner=workers[code % holders]))
        else:
            stale.append(attrs.evolve(lease, owner=DEAD[code % len(DEAD)]))
    # The registry may lag behind for workers that prove their liveness through a lease.
    visible = {lease.owner for lease in fresh if lease.owner is not None}
    hidden = draw(st.sets(st.sampled_from(workers))) & visible
    registry = [worker for worker in workers if worker not in hidden]
    return Fleet(workers, registry, fresh, stale)


def held_before_and_after(
    before: Sequence[Lease], after: Sequence[Lease], tracker: ExpiryTracker, workers: Sequence[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """Assignable leases each worker really holds before and after a round.

    An expired lease does not count for its owner (its renewer has given it up), unless the
    owner wrote it again this round, or it is pinned (nobody else may take it, so the taker
    counts it toward its live owner's load).
    """
    was: list[str | None] = []
    now: list[str | None] = []
    for old, new in zip(before, after, strict=True):
        if not is_assignable(old, ""):
            continue
        held = old.owner in workers and (
            old.sticky == STICKY_PINNED or not tracker.is_expired(old, T1)
        )
        was.append(old.owner if held else None)
        now.append(new.owner if new.counter != old.counter or held else None)
    counted_was, counted_now = Counter(was), Counter(now)
    return (
        {worker: counted_was[worker] for worker in workers},
        {worker: counted_now[worker] for worker in workers},
    )


def sitting_out(table: Iterable[Lease], tracker: ExpiryTracker, workers: Iterable[str]) -> set[str]:
    """Workers that own an expired assignable lease and no unexpired one: the table shows them
    as stopped, so every plan (their own included) leaves them out for this round."""
    table = list(table)
    holding = {lease.owner for lease in table if lease.owner and not tracker.is_expired(lease, T1)}
    lapsed = {
        lease.owner
        for lease in table
        if lease.owner and is_assignable(lease, "") and tracker.is_expired(lease, T1)
    }
    return (lapsed - holding) & set(workers)


def pool_size(table: Iterable[Lease]) -> int:
    return sum(1 for lease in table if is_assignable(lease, ""))


def assert_untouchables_stayed(before: Iterable[Lease], after: Iterable[Lease]) -> None:
    """Finished, released and owned pinned leases keep their owner and counter."""
    now = {lease.key: lease for lease in after}
    for lease in before:
        if not is_assignable(lease, "") or (
            lease.sticky == STICKY_PINNED and lease.owner is not None
        ):
            assert now[lease.key] == lease, f"{lease.key} moved"


PROPERTY_SETTINGS = settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def check_one_round_balances(
    fleet: Fleet,
    slack: int | None,
    order: Sequence[str],
    record: Callable[[str, str], object] = lambda name, value: None,
) -> None:
    """The balancing property for one fleet, cap slack (None: no cap) and write order."""
    table, tracker = snapshot(fleet.fresh, fleet.stale)
    workers = fleet.workers
    out = sitting_out(table, tracker, workers)
    active = [worker for worker in workers if worker not in out]
    n = pool_size(table)
    record("leases", "> 100" if n > 100 else "<= 100")
    record("workers", "> 10" if len(workers) > 10 else "<= 10")
    record("a worker sits out", str(bool(out)))
    # A cap that does not bind: it must leave room for ceil(n / w) over the workers this
    # round balances, the active ones. Counting the ones that sit out as well gives a lower
    # ceiling (22 workers, one sitting out, 132 leases: ceil(132 / 22) = 6 < 7 = ceil(132 / 21))
    # that binds, so the taker rightly leaves leases unheld and an over-loaded worker above
    # the others. The next round brings the workers that sat out back: more workers, a lower
    # ceil(n / w), so this cap does not bind there either.
    cap = None if slack is None else math.ceil(n / max(1, len(active))) + slack
    result = simulate_round(
        table, tracker, workers, UNLIMITED, live=fleet.registry, cap=cap, write_order=order
    )

    before, after = held_before_and_after(table, result.table, tracker, workers)
    record("steals", "some" if any(plan.steal for plan in result.plans.values()) else "none")
    assert result.conflicts == 0, "the workers' plans overlap"
    assert_untouchables_stayed(table, result.table)
    assert all(after[worker] == 0 for worker in out), "a worker the table shows stopped took"
    if active:
        w = len(active)
        got = [after[worker] for worker in active]
        assert sum(got) == n, "an assignable lease was left behind"
        assert max(got) - min(got) <= 1
        assert set(got) <= {n // w, math.ceil(n / w)}
        for worker in active:
            if before[worker] > after[worker]:  # a victim is never taken below the floor average
                assert after[worker] >= n // w
    else:
        assert all(plan.empty for plan in result.plans.values())

    # The next round (everyone renewed what it holds) includes the workers that sat out and
    # balances the whole fleet; balanced means stable: the round after plans nothing (every
    # worker computes this plan).
    now, current = T1, result.table
    if out:
        now, current = now + 2 * FAILOVER, renew(current, workers)
        tracker.observe(current, now=now)
        views = {
            w: view_for(w, current, tracker, now=now, live=fleet.registry, cap=cap) for w in workers
        }
        plans = {w: UNLIMITED.plan(views[w], random.Random(0)) for w in workers}
        current = apply_plans(current, plans, order).table
    now, current = now + 2 * FAILOVER, renew(current, workers)
    tracker.observe(current, now=now)
    view = view_for(workers[0], current, tracker, now=now, live=fleet.registry, cap=cap)
    again = UNLIMITED.fleet_plan(view)
    assert not any(again.takes.values()) and not any(again.steals.values())


@PROPERTY_SETTINGS
@given(fleet=fleets(pinned=False), data=st.data())
def test_one_round_balances_the_fleet(fleet: Fleet, data: st.DataObject) -> None:
    slack = data.draw(st.none() | st.integers(0, 3), label="cap slack")
    order = data.draw(st.permutations(fleet.workers), label="write order")
    check_one_round_balances(fleet, slack, order, record=event)


def test_a_cap_sized_for_the_whole_registry_binds_when_a_worker_sits_out() -> None:
    # Shrunk from a failing example of the property above (22 workers, 132 leases, w19's only
    # lease lapsed). w2's only lease lapsed, so w2 sits this round out and w0 and w1 share the
    # 9 leases: 5 and 4. A cap of ceil(9 / 3) = 3 would bind: w1 stops at 3 and one lease is
    # left unheld, w0 keeps 5; the property's cap leaves room for ceil(9 / 2) = 5.
    fleet = Fleet(
        workers=["w0", "w1", "w2"],
        registry=["w0", "w1", "w2"],
        fresh=[*(mk(key, "w0") for key in keys("h", 5)), *(mk(key) for key in keys("f", 3))],
        stale=[mk("lapsed", "w2")],
    )
    check_one_round_balances(fleet, slack=0, order=fleet.workers)
    # The taker honours a cap that does bind, and that is what the old oracle asked it to
    # violate: w1 fills up to the cap, the leftover lease stays unheld, nobody steals.
    table, tracker = snapshot(fleet.fresh, fleet.stale)
    result = simulate_round(table, tracker, fleet.workers, UNLIMITED, live=fleet.registry, cap=3)
    assert loads(result.table, fleet.workers) == {"w0": 5, "w1": 3, "w2": 1}
    leftover = {lease.key: lease for lease in result.table}["lapsed"]
    assert (leftover.owner, leftover.counter) == ("w2", 1)  # untouched: nobody had room
    assert all(not plan.steal for plan in result.plans.values())


BUDGETS: list[int | FromView | None] = [None, 0, 1, 2, 5, FROM_VIEW]


@PROPERTY_SETTINGS
@given(fleet=fleets(pinned=True), data=st.data())
def test_one_round_is_safe_with_pins_caps_budgets_and_no_registry(
    fleet: Fleet, data: st.DataObject
) -> None:
    table, tracker = snapshot(fleet.fresh, fleet.stale)
    workers = fleet.workers
    use_registry = data.draw(st.booleans(), label="registry")
    live = fleet.registry if use_registry else None
    cap = data.draw(st.none() | st.integers(0, 15), label="cap")
    budget = data.draw(st.sampled_from(BUDGETS), label="budget")
    max_steal = data.draw(st.integers(1, 3), label="view max_leases_to_steal")
    taker = BalancedLeaseTaker(steal_budget=budget)
    order = data.draw(st.permutations(workers), label="write order")

    fleet_plans = {
        worker: taker.fleet_plan(
            view_for(worker, table, tracker, live=live, cap=cap, max_steal=max_steal)
        )
        for worker in workers
    }
    plans = {worker: fleet_plans[worker].for_worker(worker) for worker in workers}
    result = apply_plans(table, plans, order)
    effective_budget = max_steal if budget is FROM_VIEW else budget
    before, after = held_before_and_after(table, result.table, tracker, workers)

    assert_untouchables_stayed(table, result.table)
    for worker in workers:
        plan, own = plans[worker], fleet_plans[worker]
        if worker not in own.live_workers:
            assert worker in sitting_out(table, tracker, workers) and plan.empty
            continue
        target = own.targets[worker]
        if effective_budget is not None:
            assert len(plan.steal) <= effective_budget
        for lease in plan.take:
            assert lease.owner is None or tracker.is_expired(lease, T1)
        for lease in plan.steal:
            assert lease.owner not in (None, worker) and not tracker.is_expired(lease, T1)
        # Nobody takes past its own target (nor the cap).
        if after[worker] > before[worker]:
            assert after[worker] <= target <= math.ceil(own.pool / len(own.live_workers))
            assert cap is None or after[worker] <= cap

    if use_registry:
        # Every worker computed the same fleet plan, so the writes never collide ...
        first = fleet_plans[workers[0]]
        for other in fleet_plans.values():
            assert (other.targets, other.takes, other.steals) == (
                first.targets,
                first.takes,
                first.steals,
            )
        assert result.conflicts == 0
        # ... and no victim is taken below its target, nor below a gainer's final load - 1.
        gains = [after[w] for w in workers if after[w] > before[w]]
        for worker in workers:
            if after[worker] < before[worker]:
                assert after[worker] >= first.targets[worker]
                assert not gains or after[worker] >= max(gains) - 1


@settings(max_examples=60, deadline=None)
@given(
    n_workers=st.integers(1, 12),
    holders=st.integers(1, 12),
    n_leases=st.integers(0, 120),
    budget=st.integers(1, 4),
    seed=st.integers(0, 2**32),
)
def test_a_steal_budget_still_converges_and_then_stays_put(
    n_workers: int, holders: int, n_leases: int, budget: int, seed: int
) -> None:
    rng = random.Random(seed)
    workers = [f"w{i:02d}" for i in range(n_workers)]
    holders = min(holders, n_workers)
    table = [mk(key, rng.choice(workers[:holders])) for key in keys("s", n_leases)]
    taker = BalancedLeaseTaker(steal_budget=budget)
    worst_need = math.ceil(n_leases / n_workers)  # what an idle newcomer has to steal
    rounds = rounds_to_balance(taker, table, workers, live=workers)
    assert rounds <= max(1, math.ceil(worst_need / budget))
