"""Lease-taking plans.

Owns: deciding which leases this worker should take or steal, given a snapshot of the lease table,
this worker's expiry judgement and the configuration. ``Kcl2LeaseTaker`` reproduces the Java KCL
2.x rules (DynamoDBLeaseTaker) and is the baseline other planners are measured against.
Must not: do I/O, read clocks (``now`` comes in the view), or use global randomness (an ``rng``
is passed in).
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from typing import Protocol

import attrs

from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease, StickyMode


@attrs.frozen
class TakeView:
    """What a taker knows when it plans one round."""

    worker_id: str
    leases: Sequence[Lease]
    now: float
    expiry: ExpiryTracker
    max_leases_for_worker: int | None = None
    #: Leases one worker may steal per round (None: no limit).
    max_leases_to_steal: int | None = 1
    # Workers known to be alive (from a registry); None when there is no registry.
    live_workers: frozenset[str] | None = None


@attrs.frozen
class TakePlan:
    """Leases to take (available: unowned or expired) and leases to steal (owned by others)."""

    take: tuple[Lease, ...] = ()
    steal: tuple[Lease, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.take and not self.steal


#: Extra scans one taking round may make after planned moves lost their conditional writes.
REPLANS_PER_ROUND = 1


def replan_at_once(lost_writes: int, replans_done: int) -> bool:
    """Whether a taking round scans and plans again at once instead of at the next round.

    A planned take or steal whose conditional write failed found the lease already moved by
    another worker. Workers plan from snapshots taken at slightly different moments: one that
    scanned while another's handoffs were half written computes the fleet plan from other
    loads, hands some leases to other receivers, and so collides with the moves the first
    plans made. A fresh scan shows those moves, and the plan made from it completes this
    worker's share, instead of leaving it short until the next round (a taker interval later).
    At most ``REPLANS_PER_ROUND`` extra scans: a conflict that lasts (plans that keep
    disagreeing) costs no more than that per round."""
    return lost_writes > 0 and replans_done < REPLANS_PER_ROUND


class LeaseTaker(Protocol):
    def plan(self, view: TakeView, rng: random.Random) -> TakePlan: ...


def is_assignable(lease: Lease, worker_id: str) -> bool:
    """Whether any worker may hold this lease at all (finished and released leases may not).

    A ``Sticky`` value the worker does not understand counts as normal.
    """
    if lease.is_finished:
        return False
    return lease.sticky_mode is not StickyMode.RELEASE


def is_stealable(lease: Lease) -> bool:
    """Pinned (Sticky=10) and released (Sticky=20) leases are never stolen, nor is a lease in
    the middle of a graceful handoff (``checkpoint_owner`` set)."""
    if lease.checkpoint_owner is not None:
        return False
    return lease.sticky_mode not in (StickyMode.PINNED, StickyMode.RELEASE)


def hands_over(lease: Lease, *, graceful_handoff: bool, owner_live: bool) -> bool:
    """Whether a planned steal asks the owner to hand the lease over (the owner finishes its
    batch and checkpoints before the new owner reads) rather than taking it at once.

    Only a live owner can finish a handoff. One that stopped heartbeating (early failover's
    judgement: only workers that heartbeat can be judged so, never a Java worker) never will,
    and the new owner would wait up to the handoff timeout for it; its lease is taken at once,
    conditional on its counter like any steal (a stopped owner cannot renew it any more, and
    one only paused loses it at its next renewal)."""
    return graceful_handoff and lease.owner is not None and owner_live


def split_available(view: TakeView) -> tuple[list[Lease], list[Lease]]:
    """Partition assignable leases into (available, held by a live owner)."""
    available: list[Lease] = []
    held: list[Lease] = []
    for lease in view.leases:
        if not is_assignable(lease, view.worker_id):
            continue
        if lease.owner is not None and lease.owner == view.worker_id:
            held.append(lease)
        elif view.expiry.is_expired(lease, view.now):
            available.append(lease)
        else:
            held.append(lease)
    return available, held


def target_per_worker(leases: int, workers: int, max_leases_for_worker: int | None) -> int:
    if workers <= 0:
        raise ValueError("there must be at least one worker")
    target = 1 if workers >= leases else math.ceil(leases / workers)
    if max_leases_for_worker is not None:
        target = min(target, max_leases_for_worker)
    return target


@attrs.frozen
class Kcl2LeaseTaker:
    """The Java KCL 2.x taker, rule for rule.

    1. available = unowned or expired; 2. count leases per owner among the others (this worker
    counts even with none); 3. target = ceil(leases / workers), capped; 4. "very old" available
    leases (counter still for ``very_old_multiplier`` x failover, and every never-owned lease)
    are taken first, ignoring the target; 5. otherwise take up to target - mine at random;
    6. with nothing available, steal up to ``max_leases_to_steal`` from the most loaded worker.
    """

    very_old_multiplier: float = 3.0

    def plan(self, view: TakeView, rng: random.Random) -> TakePlan:
        available, held = split_available(view)
        counts: Counter[str] = Counter(lease.owner for lease in held if lease.owner is not None)
        counts.setdefault(view.worker_id, 0)
        assignable = len(available) + len(held)
        if assignable == 0:
            return TakePlan()
        target = target_per_worker(assignable, len(counts), view.max_leases_for_worker)
        mine = counts[view.worker_id]
        cap = view.max_leases_for_worker
        room = (cap - mine) if cap is not None else len(available)

        very_old_after = self.very_old_multiplier * view.expiry.failover_time
        very_old = [
            lease for lease in available if view.expiry.idle_for(lease, view.now) > very_old_after
        ]
        needed = target - mine
        if very_old:
            rng.shuffle(very_old)
            take = very_old[: max(0, room)]
            return TakePlan(take=tuple(take))
        if needed <= 0:
            return TakePlan()
        if available:
            rng.shuffle(available)
            return TakePlan(take=tuple(available[: min(needed, max(0, room))]))
        return TakePlan(steal=tuple(self._choose_steal(view, held, counts, needed, target, rng)))

    @staticmethod
    def _choose_steal(
        view: TakeView,
        held: list[Lease],
        counts: Counter[str],
        needed: int,
        target: int,
        rng: random.Random,
    ) -> list[Lease]:
        most_loaded = max(
            (w for w in counts if w != view.worker_id),
            key=lambda w: (counts[w], w),
            default=None,
        )
        if most_loaded is None:
            return []
        load = counts[most_loaded]
        if load <= target and not (load == target and needed > 1):
            # KCL steals from a worker at the target only when this worker needs 2+ leases
            # (so that a fleet at target, target-1 ... does not churn).
            return []
        n = 1 if load <= target else min(needed, load - target)
        if view.max_leases_to_steal is not None:
            n = min(n, view.max_leases_to_steal)
        candidates = [lease for lease in held if lease.owner == most_loaded and is_stealable(lease)]
        rng.shuffle(candidates)
        return candidates[:n]
