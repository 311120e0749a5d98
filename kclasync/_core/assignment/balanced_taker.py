"""Balanced lease taking: batch stealing that evens out the whole fleet in one taker round.

The KCL 2.x taker lets each worker steal one lease per round from the single most loaded worker,
so a scale-out needs many rounds of 20 s each. LogHub's client (seed 002, section 5.3) steals in
batches: every worker aims at ``ceil(leases / live workers)``, takes expired leases first and then
robs the most loaded workers down to the average. This module does the same, with one refinement:
the targets and the choice of who takes what are computed for the *whole fleet*,
deterministically, from the snapshot alone. Every worker that scans the same table therefore
computes the same fleet plan and executes only its own part of it, so the plans of different
workers never ask for the same lease, and after one round each live worker holds
``floor(N / W)`` or ``ceil(N / W)`` leases.

How the plan is made (``BalancedLeaseTaker.fleet_plan``):

1. Live workers: the heartbeat registry (``view.live_workers``, which also lists idle workers,
   and a worker whose entry is unreadable while it keeps changing: ``presence_marks``),
   plus every owner of a lease that has not expired, plus this worker. Without a registry, only
   the owners of unexpired leases and this worker: idle workers then cannot see each other, and
   their plans may overlap (the conditional write settles it; the next round finishes the job).
   Minus every worker, this one included, that owns an expired lease (not one in a graceful
   handoff) and no unexpired one: the table shows it stopped. The registry lags behind the
   table (an entry counts for the worker timeout, failover + 1 s by default, after its last
   change, and a worker that has just joined counts every entry for that long), so without
   this rule a crashed worker's own expired leases were planned back to it and waited a round
   or more (an 8.1 x failover in the seed sweep).
   Such a worker takes part again in the round after, once its lapsed leases moved on.
2. The pool: leases that are not finished (SHARD_END) and not being released (Sticky=20). A lease
   held by a live worker counts toward its load; an unowned or expired lease is available. A
   pinned lease (Sticky=10) is never stolen, and an expired pinned lease is not taken either
   (seed 004: no automatic failover for sticky shards) unless ``take_expired_pinned`` is set: it
   still counts toward its owner's load if the owner is live, and is left out of the pool if the
   owner is gone. An unowned pinned lease is available like any other. A ``Sticky`` value the
   worker does not understand counts as normal.
   This worker's own leases are judged by the same rule (unlike ``split_available``, which always
   counts them as held): if its counter stood still past the failover time, every other worker
   sees the lease as available, and the plans only agree if this worker sees it so too. Its
   renewer has given such a lease up by then anyway; taking it back is just a fenced write.
3. Targets (water filling): a worker whose pinned leases alone exceed the floor average keeps
   exactly those (target = its pinned count) and leaves the balancing; this is repeated until no
   such worker remains. The rest share what is left: with ``P`` leases over ``M`` workers, every
   one gets ``P // M``, and the ``P % M`` workers that currently hold the most (ties broken by
   worker id) get one more. The targets sum to the pool, so nobody must end below the floor for
   somebody else to reach the ceiling, and the extra leases go where they already are, which
   keeps the number of moves at its minimum. Targets are capped by ``max_leases_for_worker``.
4. Takes: the available leases, in key order, go one by one to the worker still furthest below
   its target (ties by worker id).
5. Steals: workers above their target are the victims. This is LogHub's "first K workers whose
   remaining average stays above worker K+1": the victims are the workers above the water level,
   and each one is cut down to its target, which is that level (+-1). One lease at a time is taken
   from the victim that currently holds the most (its stealable leases in key order) and given to
   the worker still furthest below its target, until every worker reaches its target or the steal
   budget runs out. No victim goes below its own target; no worker goes above its own.
6. Rescue (``rescue_after``, default 2): a plan can still name a worker that is not running (an
   idle worker whose registry entry has not expired yet, or one seen only by a newcomer). A
   lease that is available, planned for another worker, and that this worker has seen unchanged
   for more than ``rescue_after`` x the failover time, i.e. a whole taker round after the plan
   should have moved it, is taken by this worker too (not a lease pinned to a named worker).
   Plans disagree only there; the conditional write lets one taker win, and a later round
   evens the loads out again.

Plans made from snapshots taken at slightly different moments (one worker scanning while
another's handoffs are half written) can hand the same lease to two workers; the conditional
write lets one win, and the loser scans and plans again at once, within the same round
(``lease_taker.replan_at_once``), so it still ends the round with its share.

The steal budget caps how many leases each worker steals per round. It comes from
``view.max_leases_to_steal`` unless ``steal_budget`` overrides it. The KCL default of 1 turns this
into a slow, one-lease-per-round taker again: use a larger budget, or ``None`` (no limit), to get
the one-round convergence this module exists for.

Randomness would not help even where plans cannot agree (idle workers without a registry): two
invisible newcomers that both aim at the same victim collide on the same leases when they choose
deterministically, which leaves the victim above its target (the next round continues); if they
chose at random, both could succeed and rob the victim far below its target, to be stolen back
later. Under-shooting is the safe failure.

Owns: the fleet-wide target and take/steal decisions described above.
Must not: do I/O, read clocks (``now`` comes in the view), or use randomness: plans must agree
across workers, so every choice is a deterministic function of the snapshot.
"""

from __future__ import annotations

import enum
import heapq
import random
from collections.abc import Iterable, Mapping

import attrs

from kclasync._core.assignment.lease_taker import TakePlan, TakeView, is_assignable, is_stealable
from kclasync._core.leases.lease import Lease, StickyMode


class FromView(enum.Enum):
    """Marker type for ``FROM_VIEW``."""

    FROM_VIEW = "from_view"


# Use ``view.max_leases_to_steal`` as the per-round steal budget.
FROM_VIEW = FromView.FROM_VIEW


@attrs.frozen
class FleetPlan:
    """What every live worker should take and steal this round, as this worker computes it."""

    live_workers: tuple[str, ...]
    # Leases being balanced: held by a live worker, or available to take.
    pool: int
    loads: Mapping[str, int]
    targets: Mapping[str, int]
    takes: Mapping[str, tuple[Lease, ...]]
    steals: Mapping[str, tuple[Lease, ...]]

    def for_worker(self, worker_id: str) -> TakePlan:
        return TakePlan(
            take=self.takes.get(worker_id, ()),
            steal=self.steals.get(worker_id, ()),
        )


@attrs.frozen
class BalancedLeaseTaker:
    """Batch-stealing taker whose plans, made independently by each worker, agree.

    ``steal_budget``: leases one worker may steal per round; ``None`` for no limit, or
    ``FROM_VIEW`` (the default) for ``view.max_leases_to_steal``.
    ``take_expired_pinned``: take a pinned lease whose owner let it expire (off by default: a
    pinned shard waits for its owner, or for someone to change its ``Sticky`` value).
    ``rescue_after``: take a lease planned for another worker once this worker has seen it
    unchanged for this many failover times (step 6 of the module doc); ``None``: never.
    """

    steal_budget: int | FromView | None = FROM_VIEW
    take_expired_pinned: bool = False
    rescue_after: float | None = 2.0

    def __attrs_post_init__(self) -> None:
        if isinstance(self.steal_budget, int) and self.steal_budget < 0:
            raise ValueError(f"steal_budget cannot be negative: {self.steal_budget}")

    def plan(self, view: TakeView, rng: random.Random) -> TakePlan:
        """This worker's part of the fleet plan. ``rng`` is unused: see the module docstring."""
        fleet = self.fleet_plan(view)
        plan = fleet.for_worker(view.worker_id)
        rescued = self._rescued(view, fleet)
        if rescued:
            plan = TakePlan(take=(*plan.take, *rescued), steal=plan.steal)
        return plan

    def fleet_plan(self, view: TakeView) -> FleetPlan:
        current: list[tuple[str, Lease]] = []  # owned and not expired
        lapsed: list[Lease] = []  # unowned, or owned and expired
        for lease in view.leases:
            if lease.owner is not None and not view.expiry.is_expired(lease, view.now):
                current.append((lease.owner, lease))
            else:
                lapsed.append(lease)
        live = _live_workers(view, current, lapsed)

        held: dict[str, list[Lease]] = {worker: [] for worker in live}
        for owner, lease in current:
            if is_assignable(lease, view.worker_id):
                held[owner].append(lease)
        available: list[Lease] = []
        # Pinned leases that name a worker (stickyWorker) go to that worker, if it is live.
        named: dict[str, list[Lease]] = {}
        for lease in lapsed:
            if not is_assignable(lease, view.worker_id):
                continue
            if lease.sticky_mode is StickyMode.PINNED and lease.sticky_worker is not None:
                if lease.sticky_worker in held and (
                    lease.owner is None
                    or lease.owner == lease.sticky_worker
                    or self.take_expired_pinned
                ):
                    named.setdefault(lease.sticky_worker, []).append(lease)
                elif lease.owner is not None and lease.owner in held:
                    held[lease.owner].append(lease)
                continue
            if (
                lease.owner is not None
                and lease.sticky_mode is StickyMode.PINNED
                and not self.take_expired_pinned
            ):
                # It stays with its owner: part of the owner's load if the owner is alive,
                # otherwise out of the pool until someone changes its Sticky value.
                if lease.owner in held:
                    held[lease.owner].append(lease)
            else:
                available.append(lease)

        for worker, leases in named.items():
            held[worker].extend(leases)
        loads = {worker: len(leases) for worker, leases in held.items()}
        pinned = {
            worker: sum(1 for lease in leases if not is_stealable(lease))
            for worker, leases in held.items()
        }
        pool = sum(loads.values()) + len(available)
        targets = _targets(loads, pinned, pool, view.max_leases_for_worker)
        need = {worker: max(0, targets[worker] - loads[worker]) for worker in live}

        takes = _hand_out(sorted(available, key=_lease_order), need, budget=None)
        budget = view.max_leases_to_steal if self.steal_budget is FROM_VIEW else self.steal_budget
        steals = _hand_out(_steal_order(held, loads, targets), need, budget=budget)
        for worker, leases in named.items():
            takes.setdefault(worker, []).extend(leases)
        return FleetPlan(
            live_workers=tuple(sorted(live)),
            pool=pool,
            loads=loads,
            targets=targets,
            takes={worker: tuple(leases) for worker, leases in takes.items()},
            steals={worker: tuple(leases) for worker, leases in steals.items()},
        )

    def _rescued(self, view: TakeView, fleet: FleetPlan) -> tuple[Lease, ...]:
        """Step 6 of the module doc: leases planned for other workers that expired so long ago
        that the plan evidently did not get them taken."""
        if self.rescue_after is None:
            return ()
        limit = self.rescue_after * view.expiry.failover_time
        rescued = sorted(
            (
                lease
                for worker, leases in fleet.takes.items()
                if worker != view.worker_id
                for lease in leases
                if view.expiry.unchanged_for(lease, view.now) > limit
                # A lease pinned to a named worker waits for that worker.
                and not (lease.sticky_mode is StickyMode.PINNED and lease.sticky_worker)
            ),
            key=_lease_order,
        )
        if view.max_leases_for_worker is not None:
            load = fleet.loads.get(view.worker_id, 0) + len(fleet.takes.get(view.worker_id, ()))
            rescued = rescued[: max(0, view.max_leases_for_worker - load)]
        return tuple(rescued)


def _live_workers(
    view: TakeView, current: list[tuple[str, Lease]], lapsed: list[Lease]
) -> set[str]:
    """Step 1 of the module doc: who takes part in this round's plan."""
    # Any unexpired lease shows that its owner is heartbeating, even a finished one.
    holding = {owner for owner, _ in current}
    live = {view.worker_id} | holding
    if view.live_workers is not None:
        live |= view.live_workers
    # A worker whose every assignable lease lapsed is not running as far as the table shows,
    # whatever the registry (which lags the lease table by up to a worker timeout) says.
    # A lease in a graceful handoff (checkpoint_owner set) is no such evidence: the new owner
    # waits for the old one to finish and does not renew it meanwhile.
    gone = {
        lease.owner
        for lease in lapsed
        if lease.owner is not None
        and lease.checkpoint_owner is None
        and is_assignable(lease, view.worker_id)
    }
    return live - (gone - holding)


def _lease_order(lease: Lease) -> str:
    return lease.key


def _targets(
    loads: Mapping[str, int], pinned: Mapping[str, int], pool: int, cap: int | None
) -> dict[str, int]:
    """Per-worker targets summing to ``pool`` (before the cap); see step 3 of the module doc."""
    targets: dict[str, int] = {}
    free = sorted(loads)
    left = pool
    while free:
        floor = left // len(free)
        over = [worker for worker in free if pinned[worker] > floor]
        if not over:
            break
        for worker in over:
            targets[worker] = pinned[worker]
            left -= pinned[worker]
        free = [worker for worker in free if worker not in targets]
    if free:
        floor, extra = divmod(left, len(free))
        by_load = sorted(free, key=lambda worker: (-loads[worker], worker))
        for rank, worker in enumerate(by_load):
            target = floor + 1 if rank < extra else floor
            targets[worker] = target if cap is None else min(target, cap)
    return targets


def _steal_order(
    held: Mapping[str, list[Lease]], loads: Mapping[str, int], targets: Mapping[str, int]
) -> Iterable[Lease]:
    """Leases victims give up, one at a time from whichever victim currently holds the most."""
    stealable = {
        worker: sorted((lease for lease in leases if is_stealable(lease)), key=_lease_order)
        for worker, leases in held.items()
    }
    given = dict.fromkeys(held, 0)
    victims = [
        (-loads[worker], worker)
        for worker in held
        if loads[worker] > targets[worker] and stealable[worker]
    ]
    heapq.heapify(victims)
    while victims:
        negative_load, worker = heapq.heappop(victims)
        yield stealable[worker][given[worker]]
        given[worker] += 1
        load = -negative_load - 1
        if load > targets[worker] and given[worker] < len(stealable[worker]):
            heapq.heappush(victims, (-load, worker))


def _hand_out(
    leases: Iterable[Lease], need: dict[str, int], budget: int | None
) -> dict[str, list[Lease]]:
    """Give each lease to the worker with the largest remaining need (ties by id).

    Decrements ``need`` in place. A worker receives at most ``budget`` leases (None: no limit).
    Stops consuming ``leases`` as soon as nobody can receive more.
    """
    got: dict[str, list[Lease]] = {}
    if budget == 0:
        return got
    receivers = [(-n, worker) for worker, n in need.items() if n > 0]
    heapq.heapify(receivers)
    if not receivers:
        return got
    for lease in leases:
        negative_need, worker = heapq.heappop(receivers)
        mine = got.setdefault(worker, [])
        mine.append(lease)
        need[worker] = -negative_need - 1
        if need[worker] > 0 and (budget is None or len(mine) < budget):
            heapq.heappush(receivers, (-need[worker], worker))
        if not receivers:
            break
    return got
