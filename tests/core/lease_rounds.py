"""Building lease-taking snapshots and applying a round of plans the way the lease table would,
for the balanced-taker tests: a take or steal is a write conditioned on the counter the planner
saw, so the first writer wins and later writers on the same lease fail.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import attrs

from kclasync._core.assignment.balanced_taker import BalancedLeaseTaker
from kclasync._core.assignment.lease_taker import (
    LeaseTaker,
    TakePlan,
    TakeView,
    is_assignable,
)
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint

FAILOVER = 10.0
T0 = 0.0
T1 = 20.0  # two failover periods after T0: a counter that stood still since T0 has expired
UNLIMITED = BalancedLeaseTaker(steal_budget=None)


def mk(
    key: str,
    owner: str | None = None,
    *,
    counter: int = 1,
    sticky: int | str | None = None,
    finished: bool = False,
) -> Lease:
    checkpoint = Checkpoint("SHARD_END" if finished else "TRIM_HORIZON")
    return Lease(key=key, owner=owner, counter=counter, sticky=sticky, checkpoint=checkpoint)


def keys(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i:03d}" for i in range(n)]


def snapshot(
    fresh: Iterable[Lease], stale: Iterable[Lease] = ()
) -> tuple[list[Lease], ExpiryTracker]:
    """The table at T1 and a tracker that saw it at T0 and T1.

    ``fresh`` leases were renewed in between (their owners are alive); ``stale`` ones stood still,
    so an owned stale lease is expired at T1. Unowned leases are available either way.
    """
    fresh, stale = list(fresh), list(stale)
    tracker = ExpiryTracker(failover_time=FAILOVER)
    tracker.observe([*fresh, *stale], now=T0)
    table = sorted(
        [*(attrs.evolve(lease, counter=lease.counter + 1) for lease in fresh), *stale],
        key=lambda lease: lease.key,
    )
    tracker.observe(table, now=T1)
    return table, tracker


def view_for(
    worker: str,
    table: Sequence[Lease],
    tracker: ExpiryTracker,
    *,
    now: float = T1,
    live: Iterable[str] | None = None,
    cap: int | None = None,
    max_steal: int = 1,
) -> TakeView:
    return TakeView(
        worker_id=worker,
        leases=tuple(table),
        now=now,
        expiry=tracker,
        max_leases_for_worker=cap,
        max_leases_to_steal=max_steal,
        live_workers=None if live is None else frozenset(live),
    )


@dataclass
class RoundResult:
    table: list[Lease]
    plans: dict[str, TakePlan]
    conflicts: int


def simulate_round(
    table: Sequence[Lease],
    tracker: ExpiryTracker,
    workers: Sequence[str],
    taker: LeaseTaker,
    *,
    now: float = T1,
    live: Iterable[str] | None = None,
    cap: int | None = None,
    max_steal: int = 1,
    write_order: Sequence[str] | None = None,
    seed: int = 0,
) -> RoundResult:
    """Every worker plans against ``table``; the plans are then written in ``write_order``.

    A write succeeds only if the lease's counter still equals the one the planner saw (the
    conditional write of the protocol): first writer wins, later writers on that lease fail.
    """
    live_set = None if live is None else frozenset(live)
    plans = {
        worker: taker.plan(
            view_for(worker, table, tracker, now=now, live=live_set, cap=cap, max_steal=max_steal),
            random.Random(f"{seed}:{worker}"),
        )
        for worker in workers
    }
    return apply_plans(table, plans, write_order)


def apply_plans(
    table: Sequence[Lease],
    plans: Mapping[str, TakePlan],
    write_order: Sequence[str] | None = None,
) -> RoundResult:
    """Write every plan's takes and steals, each conditioned on the counter its planner saw."""
    current = {lease.key: lease for lease in table}
    conflicts = 0
    for worker in write_order if write_order is not None else list(plans):
        for seen in (*plans[worker].take, *plans[worker].steal):
            stored = current[seen.key]
            if stored.counter != seen.counter:
                conflicts += 1
                continue
            current[seen.key] = attrs.evolve(
                stored,
                owner=worker,
                counter=stored.counter + 1,
                owner_switches_since_checkpoint=stored.owner_switches_since_checkpoint + 1,
            )
    return RoundResult([current[lease.key] for lease in table], dict(plans), conflicts)


def renew(table: Iterable[Lease], alive: Iterable[str]) -> list[Lease]:
    """What the renewers of the ``alive`` workers do between two taker rounds."""
    alive = set(alive)
    return [
        attrs.evolve(lease, counter=lease.counter + 1) if lease.owner in alive else lease
        for lease in table
    ]


def loads(table: Iterable[Lease], workers: Iterable[str]) -> dict[str, int]:
    counts = Counter(lease.owner for lease in table if is_assignable(lease, ""))
    return {worker: counts[worker] for worker in workers}


def spread(table: Iterable[Lease], workers: Iterable[str]) -> int:
    held = loads(table, workers).values()
    return max(held) - min(held)


def balanced(table: Sequence[Lease], workers: Sequence[str]) -> bool:
    unowned = [lease for lease in table if is_assignable(lease, "") and lease.owner not in workers]
    return not unowned and spread(table, workers) <= 1


def rounds_to_balance(
    taker: LeaseTaker,
    table: Sequence[Lease],
    workers: Sequence[str],
    *,
    live: Iterable[str] | None = None,
    max_steal: int = 1,
    max_rounds: int = 60,
) -> int:
    """Taker rounds (20 s apart, renewals in between) until every lease is held, spread <= 1."""
    tracker = ExpiryTracker(failover_time=FAILOVER)
    current = list(table)
    now = 0.0
    for round_no in range(1, max_rounds + 1):
        tracker.observe(current, now=now)
        result = simulate_round(
            current, tracker, workers, taker, now=now, live=live, max_steal=max_steal, seed=round_no
        )
        current = renew(result.table, workers)
        now += 2 * FAILOVER
        if balanced(current, workers):
            return round_no
    raise AssertionError(f"not balanced after {max_rounds} rounds: {loads(current, workers)}")


def owners(leases: Iterable[Lease]) -> set[str | None]:
    return {lease.owner for lease in leases}
