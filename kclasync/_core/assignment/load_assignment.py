"""The leader's view of the fleet for load-aware assignment, and the priority assignment.

Owns: the snapshot types every assignment policy is fed with (``LeaseLoad``, ``WorkerLoad``,
``FleetSnapshot``), the plan it returns (``Move``, ``Plan``), the model of each worker's load
and of what a lease costs on it (``LoadModel``), filling leases without data with the fleet
average (the per-lease throughput EMA is ``throughput``'s, re-exported here), and the priority
assignment of unowned and expired leases (``assign_unowned``): oldest first, each to the
worker with the most headroom, never above a worker's operating range while another worker
has room.

Must not: read clocks, tables or metrics, or use global randomness. The same snapshot always
yields the same plan; ties are broken by worker id and lease key.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from kclasync._core.assignment.capacity import SATURATED_CPU_PERCENT, capacity_from_cores
from kclasync._core.assignment.throughput import (
    CAPACITY_MIN_CPU_PERCENT,
    THROUGHPUT_EMA_ALPHA,
    estimate_capacity,
    renewal_throughput,
    throughput_ema,
)

__all__ = [
    "CAPACITY_MIN_CPU_PERCENT",
    "THROUGHPUT_EMA_ALPHA",
    "FleetSnapshot",
    "LeaseLoad",
    "LoadModel",
    "Move",
    "Plan",
    "WorkerLoad",
    "assign_unowned",
    "estimate_capacity",
    "lease_throughputs",
    "renewal_throughput",
    "throughput_ema",
]

#: A capacity estimate is taken as possibly this many of its standard errors too high: a lease
#: goes to a worker only where it lowers the peak also at that price (``LoadModel.doubt``).
DOUBT_SIGMAS = 2.0
#: ... when that standard error is above this share. A settled worker's is a fraction of a
#: percent, which the minimum gain of a move covers; only a newcomer's first estimates, from a
#: few readings of little load, are this rough.
ROUGH_ERROR = 0.03
#: A worker running less than this (KB/s, one byte a second) gives no CPU cost per KB/s: its
#: CPU over such a throughput is noise, or infinite for a throughput that rounds to nothing.
MIN_PRICED_KBPS = 1e-3


@dataclass(frozen=True, slots=True)
class LeaseLoad:
    """One lease as the leader sees it.

    ``owner`` is ``leaseOwner`` (None: unassigned); ``checkpoint_owner`` is set while a graceful
    handoff from that worker to ``owner`` is still in progress. ``expired`` means the owner's
    counter stood still past the failover time. ``age_order`` orders the priority assignment:
    smaller is older (e.g. when the leader last saw the counter move; unowned leases 0).
    """

    key: str
    owner: str | None
    throughput_kbps: float | None = None
    sticky: bool = False
    expired: bool = False
    checkpoint_owner: str | None = None
    age_order: float = 0.0

    @property
    def in_handoff(self) -> bool:
        return self.checkpoint_owner is not None and self.checkpoint_owner != self.owner


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One live worker: its CPU utilisation in percent (None without a CPU metric), the
    operating range (the most CPU it should run at), when known its capacity in KB/s
    processed at 100 % CPU and that estimate's relative standard error (None: exact, as a
    configured capacity), and the CPUs it may use (a hint, to price it before its capacity is
    known)."""

    worker_id: str
    cpu_percent: float | None = None
    max_cpu_percent: float = 100.0
    capacity_kbps: float | None = None
    cores: float | None = None
    capacity_error: float | None = None


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    leases: tuple[LeaseLoad, ...]
    workers: tuple[WorkerLoad, ...]

    def __post_init__(self) -> None:
        ids = [w.worker_id for w in self.workers]
        if len(set(ids)) != len(ids):
            raise ValueError("worker ids in a snapshot must be unique")
        keys = [lease.key for lease in self.leases]
        if len(set(keys)) != len(keys):
            raise ValueError("lease keys in a snapshot must be unique")


@dataclass(frozen=True, slots=True, order=True)
class Move:
    """Give ``lease_key`` to ``to_worker``; ``from_worker`` None means it had no live owner
    (a plain assignment), otherwise the move is a graceful handoff from that worker."""

    lease_key: str
    from_worker: str | None
    to_worker: str


@dataclass(frozen=True, slots=True)
class Plan:
    assignments: tuple[Move, ...] = ()
    moves: tuple[Move, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def all(self) -> tuple[Move, ...]:
        return self.assignments + self.moves


def lease_throughputs(leases: Iterable[LeaseLoad]) -> dict[str, float]:
    """Each lease's throughput; a lease without data counts as the average of those with data
    (1.0 when no lease has data, so the plan then balances counts)."""
    leases = list(leases)
    known = [
        lease.throughput_kbps
        for lease in leases
        if lease.throughput_kbps is not None
        and math.isfinite(lease.throughput_kbps)
        and lease.throughput_kbps >= 0
    ]
    fill = sum(known) / len(known) if known else 1.0
    if fill <= 0:
        fill = 0.0
    out: dict[str, float] = {}
    for lease in leases:
        tp = lease.throughput_kbps
        ok = tp is not None and math.isfinite(tp) and tp >= 0
        out[lease.key] = tp if ok and tp is not None else fill
    return out


class LoadModel:
    """Predicted load of each worker, in the unit the plan balances, and the cost of a lease.

    CPU mode (every worker reports CPU): load is CPU percent; a lease costs its throughput times
    the worker's percent per KB/s, from its capacity if known (then the load itself is predicted
    from the leases it owns), else from its observed CPU over its assigned throughput (unless
    other workers have capacities and that CPU is below ``CAPACITY_MIN_CPU_PERCENT``; and at
    least at its guess, its load predicted from its leases, when that CPU is saturated,
    ``SATURATED_CPU_PERCENT``), else a guess: the fleet's known capacity per CPU times the CPUs
    it reports (``WorkerLoad.cores``), else the fleet's (the mean known capacity, else CPU over
    throughput summed over the fleet).
    Leases still in handoff are counted at their new owner and taken off the old one.
    Throughput mode (some worker has no CPU metric, or no worker has both CPU and throughput
    yet, e.g. at start-up): load is assigned throughput divided by capacity (relative units
    when capacities are unknown).
    """

    def __init__(self, snapshot: FleetSnapshot, throughputs: Mapping[str, float]) -> None:
        self.workers = {w.worker_id: w for w in snapshot.workers}
        #: Workers whose load is their measured CPU (CPU mode, no capacity), not predicted.
        self.measured: set[str] = set()
        #: Workers priced from the fleet's guess (CPU mode, no capacity and no usable reading
        #: of their own yet): what they cost is only learnt once they carry some load.
        self.guessed: set[str] = set()
        reporting = bool(snapshot.workers) and all(
            w.cpu_percent is not None for w in snapshot.workers
        )
        assigned: dict[str, float] = dict.fromkeys(self.workers, 0.0)
        running: dict[str, float] = dict.fromkeys(self.workers, 0.0)
        for lease in snapshot.leases:
            tp = throughputs[lease.key]
            if lease.owner in assigned and not lease.expired:
                assigned[lease.owner] += tp
            runner = lease.checkpoint_owner if lease.in_handoff else lease.owner
            if runner in running and not lease.expired:
                running[runner] += tp
        self.assigned_kbps = assigned
        all_known = all(w.capacity_kbps for w in snapshot.workers)
        pairs = [
            (w.cpu_percent or 0.0, running[w.worker_id])
            for w in snapshot.workers
            if running[w.worker_id] >= MIN_PRICED_KBPS and (w.cpu_percent or 0.0) > 0
        ]
        tp_sum = sum(t for _, t in pairs)
        fleet_rate = sum(c for c, _ in pairs) / tp_sum if tp_sum > 0 else 0.0
        known = [w.capacity_kbps for w in snapshot.workers if w.capacity_kbps]
        if known:
            # A worker that has not reported a capacity yet (it just joined) is priced as the
            # fleet's average worker: the best guess without data, off by less than pricing it
            # as the smallest or the largest, and it gives the newcomer enough load for its own
            # estimate to come in quickly (a lightly loaded worker's CPU is mostly noise).
            fleet_rate = 100.0 * len(known) / sum(known)
        # CPU is only usable with a way to predict what a lease costs: a capacity or a ratio.
        self.cpu_mode = reporting and fleet_rate > 0
        self.rate: dict[str, float] = {}
        #: Each worker's capacity estimate's relative standard error, as it reports it (0: a
        #: configured capacity, none yet, or not a finite number >= 0).
        self.error: dict[str, float] = {
            w.worker_id: w.capacity_error
            if w.capacity_kbps
            and w.capacity_error is not None
            and math.isfinite(w.capacity_error)
            and w.capacity_error > 0
            else 0.0
            for w in snapshot.workers
        }
        #: How far a worker's capacity may be above the truth, as a share of its cost: its
        #: estimate's relative standard error times ``DOUBT_SIGMAS`` (0: a configured
        #: capacity, a guess, or a fleet priced in throughput).
        self.doubt: dict[str, float] = dict.fromkeys(self.workers, 0.0)
        if self.cpu_mode:
            # Without a capacity, a worker is priced from its own CPU over its throughput; but
            # while that CPU is below what a capacity estimate needs, it is mostly noise (1.9 %
            # for 101 KB/s reads a 3000 KB/s worker as 5300) and the fleet's average is closer.
            floor = CAPACITY_MIN_CPU_PERCENT if known else 0.0
            per_core = [(w.capacity_kbps, w.cores) for w in snapshot.workers]
            saturated: set[str] = set()
            for w in snapshot.workers:
                cpu = w.cpu_percent or 0.0
                if w.capacity_kbps:
                    self.rate[w.worker_id] = 100.0 / w.capacity_kbps
                    if self.error[w.worker_id] > ROUGH_ERROR:
                        self.doubt[w.worker_id] = DOUBT_SIGMAS * self.error[w.worker_id]
                elif running[w.worker_id] >= MIN_PRICED_KBPS and cpu > 0 and cpu >= floor:
                    self.rate[w.worker_id] = cpu / running[w.worker_id]
                    if cpu >= SATURATED_CPU_PERCENT:
                        # A saturated CPU is censored: the worker does less than its leases
                        # ask, so CPU over throughput prices it as large as its backlog makes
                        # it look (a 1000 KB/s worker given 3290 KB/s read as a 3290 one). It
                        # costs at least its guess, and its load is predicted from its leases.
                        hinted = capacity_from_cores(w.cores, per_core)
                        guess = 100.0 / hinted if hinted else fleet_rate
                        self.rate[w.worker_id] = max(self.rate[w.worker_id], guess)
                        saturated.add(w.worker_id)
                else:
                    # The guess: from the CPUs it may use and the fleet's capacity per CPU
                    # when both are known (a 2-CPU newcomer beside 8-CPU workers is not the
                    # fleet's average), else the fleet's average.
                    hinted = capacity_from_cores(w.cores, per_core)
                    self.rate[w.worker_id] = 100.0 / hinted if hinted else fleet_rate
                    self.guessed.add(w.worker_id)
            # A worker with a capacity: its CPU calibrated the capacity, and its load is predicted
            # from the leases it now owns (current throughput, handoffs at the new owner, no lag
            # of the CPU window, no saturation at 100 %). Without one: its measured CPU, with
            # handoffs in progress moved from the old owner (which the CPU still shows) to the new.
            # A worker whose CPU reads 0 while it owns leases has not measured them yet (every
            # worker's first sample is 0, and a newcomer was just given its leases): predicted
            # from them too, or it looks empty and draws ever more.
            self.load = {}
            for w in snapshot.workers:
                if (
                    w.capacity_kbps
                    or (not w.cpu_percent and assigned[w.worker_id] > 0)
                    or w.worker_id in saturated
                ):
                    self.load[w.worker_id] = assigned[w.worker_id] * self.rate[w.worker_id]
                else:
                    self.load[w.worker_id] = float(w.cpu_percent or 0.0)
            measured = self.measured = {
                w.worker_id
                for w in snapshot.workers
                if not w.capacity_kbps
                and not (not w.cpu_percent and assigned[w.worker_id] > 0)
                and w.worker_id not in saturated
            }
            # Summed first and applied once per worker, so that the floor at 0 does not make
            # the result depend on the order of the leases.
            leaving: dict[str, float] = dict.fromkeys(measured, 0.0)
            arriving: dict[str, float] = dict.fromkeys(measured, 0.0)
            for lease in snapshot.leases:
                if not lease.in_handoff or lease.expired:
                    continue
                tp = throughputs[lease.key]
                old, new = lease.checkpoint_owner, lease.owner
                if old in measured:
                    leaving[old] += tp * self.rate[old]
                if new in measured:
                    arriving[new] += tp * self.rate[new]
            for wid in measured:
                self.load[wid] = max(0.0, self.load[wid] - leaving[wid]) + arriving[wid]
            self.limit = {w.worker_id: w.max_cpu_percent for w in snapshot.workers}
        else:
            for w in snapshot.workers:
                cap = w.capacity_kbps if all_known and w.capacity_kbps else 1.0
                self.rate[w.worker_id] = (100.0 / cap) if all_known else 1.0
            self.load = {wid: assigned[wid] * self.rate[wid] for wid in self.workers}
            self.limit = dict.fromkeys(self.workers, math.inf)

    def cost(self, worker_id: str, kbps: float) -> float:
        return kbps * self.rate[worker_id]

    def dear(self, worker_id: str, kbps: float) -> float:
        """What ``kbps`` may cost on the worker should its capacity estimate be high by
        ``doubt``: a move is judged at this price on its receiver."""
        return kbps * self.rate[worker_id] * (1.0 + self.doubt[worker_id])

    def headroom(self, worker_id: str) -> float:
        limit = self.limit[worker_id]
        if math.isinf(limit):
            return -self.load[worker_id]
        return limit - self.load[worker_id]

    def mean(self) -> float:
        return sum(self.load.values()) / len(self.load) if self.load else 0.0

    def level(self) -> float:
        """The fleet's load: the mean weighted by capacity (1 / rate), i.e. the load every
        worker would have if the total were spread in proportion to capacity. Unlike the plain
        mean it does not move when load goes from a large worker to a small one."""
        weights = {wid: 1.0 / r for wid, r in self.rate.items() if r > 0}
        total = sum(weights.get(wid, 0.0) for wid in self.load)
        if total <= 0:
            return self.mean()
        return sum(load * weights.get(wid, 0.0) for wid, load in self.load.items()) / total


def _needs_owner(lease: LeaseLoad, live: Mapping[str, WorkerLoad]) -> bool:
    return lease.owner is None or lease.expired or lease.owner not in live


def assign_unowned(
    snapshot: FleetSnapshot,
    model: LoadModel,
    throughputs: Mapping[str, float],
    *,
    take_expired_sticky: bool = False,
) -> list[Move]:
    """Unowned and expired leases (and leases of workers no longer live), oldest first, each to
    the worker with the most headroom that stays within its operating range; only when no worker
    has room does the lease go to the one with the most headroom anyway. Updates ``model``.

    An expired sticky lease is left alone (no automatic failover for pinned shards) unless
    ``take_expired_sticky``.
    """
    if not snapshot.workers:
        return []
    live = model.workers
    pending = [
        lease
        for lease in snapshot.leases
        if _needs_owner(lease, live)
        and not (lease.sticky and lease.owner is not None and not take_expired_sticky)
    ]
    pending.sort(key=lambda lease: (lease.owner is not None, lease.age_order, lease.key))
    moves: list[Move] = []
    for lease in pending:
        tp = throughputs[lease.key]
        fits = [
            wid for wid in sorted(live) if model.load[wid] + model.cost(wid, tp) <= model.limit[wid]
        ]
        candidates = fits or sorted(live)
        target = min(candidates, key=lambda wid: (-model.headroom(wid), wid))
        model.load[target] += model.cost(target, tp)
        model.assigned_kbps[target] += tp
        prior = lease.owner if lease.owner is not None and lease.owner != target else None
        moves.append(Move(lease.key, prior, target))
    return moves
