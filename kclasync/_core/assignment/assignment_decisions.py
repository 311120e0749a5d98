"""Leader-based assignment: what the leader writes for a plan, and what a follower does with
the leases the owner index shows it.

Owns: building the leader's ``FleetSnapshot`` from one lease-table scan and the worker metrics
(``fleet_snapshot``, ``worker_loads``), turning a ``Plan`` into conditional writes
(``leader_writes``: an assignment is a take in the new owner's name, a move a graceful handoff),
the follower's decision for one lease read after an index query (``follower_step``), and the
rule that three consecutive failed assignment runs give up leadership (``FailureStreak``).
Must not: do I/O, read clocks (``now`` is passed in) or draw randomness. The runtime
(``kclasync._runtime.assignment``) and the simulation apply these unchanged.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping

import attrs

from kclasync._core.assignment.load_assignment import (
    CAPACITY_MIN_CPU_PERCENT,
    FleetSnapshot,
    LeaseLoad,
    Plan,
    WorkerLoad,
)
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease, StickyMode
from kclasync._core.workers.worker_metrics import CPU, WorkerMetrics

__all__ = [
    "MAX_CONSECUTIVE_FAILURES",
    "FailureStreak",
    "FollowerStep",
    "LeaderWrite",
    "WriteKind",
    "fleet_snapshot",
    "follower_step",
    "leader_writes",
    "may_rebalance",
    "rebalance_step",
    "renewing_owners",
    "throughputs_in_flux",
    "throughputs_moving",
    "worker_loads",
]

#: Seed 003: the leader gives the lock up after this many failed assignment runs in a row.
MAX_CONSECUTIVE_FAILURES = 3
#: A worker's CPU and the load predicted from its leases' throughputs and its capacity disagree
#: beyond a reading's noise when they differ by more than this many points and this share of
#: the higher of the two (``throughputs_in_flux``).
FLUX_MIN_POINTS = 5.0
FLUX_MIN_SHARE = 0.2
#: The leases' throughputs are still moving when, since the previous run's snapshot, they
#: changed by more than this share of their total (summed absolute changes; ``throughputs_moving``).
MOVING_MIN_SHARE = 0.15


def worker_loads(
    live_ids: Iterable[str],
    metrics: Mapping[str, WorkerMetrics],
    *,
    capacities: Mapping[str, float] | None = None,
) -> tuple[WorkerLoad, ...]:
    """One ``WorkerLoad`` per live worker, sorted by id. CPU is the latest sample of the
    ``C`` metric (None without one, or when it failed: -1), the operating range its ``opr``
    maximum (100 without one); the capacity (KB/s at 100 % CPU) the worker reported in its
    entry, unless ``capacities`` gives one; the CPUs it may use as its entry says (``cor``)."""
    out: list[WorkerLoad] = []
    for wid in sorted(set(live_ids)):
        entry = metrics.get(wid)
        cpu: float | None = None
        limit = 100.0
        if entry is not None:
            samples = entry.metric_stats.get(CPU, ())
            if samples and samples[-1] >= 0 and math.isfinite(samples[-1]):
                cpu = float(samples[-1])
            rng = entry.operating_range.get(CPU, ())
            if rng and rng[0] > 0:
                limit = float(rng[0])
        cap = (capacities or {}).get(wid)
        error: float | None = None
        if cap is None and entry is not None:
            cap, error = entry.capacity_kbps, entry.capacity_error
        out.append(
            WorkerLoad(
                wid,
                cpu_percent=cpu,
                max_cpu_percent=limit,
                capacity_kbps=cap,
                capacity_error=error,
                cores=entry.cores if entry is not None else None,
            )
        )
    return tuple(out)


def renewing_owners(leases: Iterable[Lease], expiry: ExpiryTracker, now: float) -> set[str]:
    """Owners of leases whose counter still moves: live whatever the registry says (a worker
    that renews is alive; a new leader that has not watched long enough keeps them)."""
    return {
        lease.owner
        for lease in leases
        if lease.owner is not None and not expiry.is_expired(lease, now)
    }


def fleet_snapshot(
    leases: Iterable[Lease],
    workers: tuple[WorkerLoad, ...],
    expiry: ExpiryTracker,
    now: float,
) -> FleetSnapshot:
    """The leader's snapshot of one scan. ``expiry`` must have observed this scan at ``now``.

    Finished leases (SHARD_END) are left out: nobody needs to process them. A lease is expired
    when its counter stood still past the failover time on the leader's clock (a new leader
    judges nothing expired before it has watched for that long: it resumes from the table
    alone). Older leases (counter still for longer) come first in the priority assignment.
    """
    loads: list[LeaseLoad] = []
    for lease in leases:
        if lease.checkpoint.is_shard_end:
            continue
        expired = lease.owner is not None and expiry.is_expired(lease, now)
        idle = expiry.idle_for(lease, now)
        loads.append(
            LeaseLoad(
                key=lease.key,
                owner=lease.owner,
                throughput_kbps=lease.throughput_kbps,
                sticky=lease.sticky_mode is StickyMode.PINNED,
                expired=expired,
                checkpoint_owner=lease.checkpoint_owner,
                age_order=-idle if math.isfinite(idle) else 0.0,
            )
        )
    return FleetSnapshot(leases=tuple(loads), workers=workers)


class WriteKind(enum.Enum):
    #: ``take_lease(lease, to)``: the lease had no live owner; fenced on its counter.
    ASSIGN = "assign"
    #: ``start_handoff(lease, to)``: leaseOwner = to, checkpointOwner = the old owner, which
    #: finishes its batch, checkpoints and lets go; fenced on owner and counter.
    HANDOFF = "handoff"


@attrs.frozen
class LeaderWrite:
    kind: WriteKind
    lease: Lease
    to_worker: str


def leader_writes(plan: Plan, scanned: Mapping[str, Lease]) -> tuple[LeaderWrite, ...]:
    """The conditional writes for ``plan`` against the leases as scanned, in the plan's order
    (assignments oldest first, then moves). A move of a lease whose owner is unknown in the
    scan, or that is already being handed off, becomes nothing (the planners do not plan these;
    this is the guard)."""
    out: list[LeaderWrite] = []
    for move in plan.assignments:
        lease = scanned.get(move.lease_key)
        if lease is not None and lease.owner != move.to_worker:
            out.append(LeaderWrite(WriteKind.ASSIGN, lease, move.to_worker))
    for move in plan.moves:
        lease = scanned.get(move.lease_key)
        if lease is None or lease.owner is None or lease.owner == move.to_worker:
            continue
        if lease.checkpoint_owner is not None:
            continue
        out.append(LeaderWrite(WriteKind.HANDOFF, lease, move.to_worker))
    return tuple(out)


class FollowerStep(enum.Enum):
    #: Not ours (the index lags, or it moved on): nothing to do.
    SKIP = "skip"
    #: Assigned to us with no handoff under way: take it in our name (counter+1) and start.
    TAKE = "take"
    #: Handed to us: hold it as incoming and renew it; the pipeline starts once the old owner
    #: has checkpointed and removed ``checkpointOwner`` (or the handoff timed out).
    INCOMING = "incoming"


def follower_step(worker_id: str, lease: Lease | None, held: bool) -> FollowerStep:
    """What a worker does with one lease the owner index listed under its id, as read strongly."""
    if held or lease is None or lease.owner != worker_id or lease.checkpoint.is_shard_end:
        return FollowerStep.SKIP
    if lease.checkpoint_owner is None or lease.checkpoint_owner == worker_id:
        return FollowerStep.TAKE
    return FollowerStep.INCOMING


def throughputs_in_flux(snapshot: FleetSnapshot) -> bool:
    """Whether some worker's CPU disagrees with the load its leases' throughputs predict (their
    sum over its capacity) beyond noise: the throughputs are averages over renewal periods, and
    right after traffic changes they are part old, part new. Only workers with a capacity and a
    CPU within the range a capacity is estimated from, and no lease in handoff to or from them
    (the CPU lags a handoff by design), are compared."""
    busy: set[str | None] = set()
    owned: dict[str, float] = {}
    for lease in snapshot.leases:
        if lease.in_handoff:
            busy |= {lease.owner, lease.checkpoint_owner}
        tp = lease.throughput_kbps
        if lease.owner is not None and not lease.expired and tp is not None and math.isfinite(tp):
            owned[lease.owner] = owned.get(lease.owner, 0.0) + max(tp, 0.0)
    for w in snapshot.workers:
        cpu = w.cpu_percent
        if (
            not w.capacity_kbps
            or cpu is None
            or w.worker_id in busy
            or not CAPACITY_MIN_CPU_PERCENT <= cpu <= 98.0
        ):
            continue
        predicted = 100.0 * owned.get(w.worker_id, 0.0) / w.capacity_kbps
        gap = abs(cpu - predicted)
        if gap > FLUX_MIN_POINTS and gap > FLUX_MIN_SHARE * max(cpu, predicted):
            return True
    return False


def throughputs_moving(snapshot: FleetSnapshot, previous: FleetSnapshot | None) -> bool:
    """Whether the leases' throughputs changed, since the ``previous`` run's snapshot, by more
    than ``MOVING_MIN_SHARE`` of their total: each is an EMA over renewal periods, and right
    after traffic changes it is still on its way (half the gap closed per renewal). The CPU
    cannot tell this early: its last sample may predate the change, or read 100 %. Leases in
    only one of the two snapshots are left out (a new shard, a finished one). Grows with the
    leases, once per run."""
    if previous is None:
        return False
    before = {
        lease.key: lease.throughput_kbps
        for lease in previous.leases
        if lease.throughput_kbps is not None and math.isfinite(lease.throughput_kbps)
    }
    total = change = 0.0
    for lease in snapshot.leases:
        tp, old = lease.throughput_kbps, before.get(lease.key)
        if tp is None or old is None or not math.isfinite(tp):
            continue
        total += max(tp, 0.0)
        change += abs(max(tp, 0.0) - max(old, 0.0))
    return total > 0 and change > MOVING_MIN_SHARE * total


def may_rebalance(
    snapshot: FleetSnapshot,
    moved_last_run: bool,
    *,
    watched_enough: bool = True,
    held_last_run: bool = False,
    previous: FleetSnapshot | None = None,
) -> bool:
    """Whether this run may move leases, or only assign (``rebalance_step``'s first half)."""
    return rebalance_step(
        snapshot,
        moved_last_run,
        watched_enough=watched_enough,
        held_last_run=held_last_run,
        previous=previous,
    )[0]


def rebalance_step(
    snapshot: FleetSnapshot,
    moved_last_run: bool,
    *,
    watched_enough: bool = True,
    held_last_run: bool = False,
    previous: FleetSnapshot | None = None,
) -> tuple[bool, bool]:
    """Whether this run may move leases, or only assign; and whether it only assigns because
    the throughputs are in flux (the leader passes that back as ``held_last_run``).

    Not before the leader has watched the table for the failover time (``watched_enough``): a
    new leader cannot yet tell a crashed worker's leases from live ones, and moves planned
    without them are undone once they are reassigned. When every live worker reports a
    capacity, the plan predicts each load from the throughput of the leases it owns (a lease in
    handoff counted at its new owner): nothing lags, so every run may move, except one run
    (not two in a row: ``held_last_run``) while the throughputs are in flux
    (``throughputs_in_flux``), or still moving since the ``previous`` run's snapshot
    (``throughputs_moving``): a plan on half-old throughputs moves leases the next run moves
    back. Otherwise the plan uses measured CPU for some worker, which lags the moves (a worker
    that just received leases still looks idle, and planning on that reading overshoots and
    oscillates): then not while a handoff is still under way nor right after a run that moved,
    nor (one run), where some worker reports a capacity, while the throughputs are in flux: a
    newcomer that never reports a capacity (it holds crumbs) must not switch that check off
    for the fleet. A fleet where no worker reports one keeps the measured-CPU rule alone."""
    if not watched_enough:
        return False, False
    priced = [w for w in snapshot.workers if w.capacity_kbps]
    held = (
        bool(priced)
        and not held_last_run
        and (throughputs_in_flux(snapshot) or throughputs_moving(snapshot, previous))
    )
    if snapshot.workers and len(priced) == len(snapshot.workers):
        return not held, held
    calm = not moved_last_run and not any(lease.in_handoff for lease in snapshot.leases)
    return calm and not held, held


@attrs.define
class FailureStreak:
    """Consecutive failed assignment runs; ``failed()`` says when to give the lock up."""

    limit: int = MAX_CONSECUTIVE_FAILURES
    count: int = 0

    def succeeded(self) -> None:
        self.count = 0

    def failed(self) -> bool:
        """Count a failure; True when the streak reaches the limit (and restart counting)."""
        self.count += 1
        if self.count >= self.limit:
            self.count = 0
            return True
        return False
