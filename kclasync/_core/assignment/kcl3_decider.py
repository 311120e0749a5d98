"""The KCL 3.x variance-based assignment, as the ``kcl3`` policy (for mixed fleets and comparison).

Owns: ``plan_kcl3``, one assignment run of the Java KCL 3.x leader
(``VarianceBasedLeaseAssignmentDecider``), reproduced from its documented behaviour:

- the fleet average of the worker metric is fixed at the start of the run. The metric is CPU
  percent; when some worker has no CPU metric, every worker gets the default metric, assigned
  throughput as a percentage of the target (total lease throughput / workers) with an operating
  range of 100 (Java averages each metric over the workers reporting it; a fleet mixing CPU and
  default metrics is not reproduced);
- a lease without throughput counts as the average of those with it, 0 when none has; a
  worker's leases and assigned throughput are counted at the lease's actual owner (the
  ``checkpointOwner`` while a handoff is pending);
- workers are served by "percentage to reach the average", (avg - v) / v (1 when v is 0),
  highest first; every lease given to a worker raises its metric by
  ``throughput * avg / (total throughput / workers)`` (``avg / target leases`` without throughput);
- unowned and expired leases go first, oldest first (unowned before expired); a lease whose
  owner is the chosen worker is left where it is;
- when ``balance`` is set (the Java leader does it every ``varianceBalancingFrequency`` = 3rd
  run): if any worker is outside avg * (1 +- threshold/100) or above its operating range, the
  donors are the workers at or above the upper limit or above their range (else the most loaded
  one); each gives ``assigned throughput * (v - avg) / v * dampening / 100``, largest first, as
  shuffled leases whose running total stays below that amount (at least the smallest lease when
  overshoot is allowed; one lease when its throughput is 0); each lease goes to the next worker
  from the queue, and the run stops giving to receivers once one would go above the average or
  its operating range (that receiver then leaves the queue for the rest of the run).

Deviations, stated: the shuffle uses ``random.Random(seed)`` (the Java one is unseeded), the queue
starts from the workers sorted by id, and sticky leases and leases in handoff are never
picked as donations (Java knows neither notion in this form).

Must not: read clocks, tables or metrics, or use global randomness.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, Move, Plan

__all__ = ["Kcl3Settings", "is_balancing_run", "plan_kcl3"]


@dataclass(frozen=True, slots=True)
class Kcl3Settings:
    """The Java defaults: reBalanceThresholdPercentage 10, dampeningPercentage 60,
    allowThroughputOvershoot true, varianceBalancingFrequency 3."""

    rebalance_threshold_percent: float = 10.0
    dampening_percent: int = 60
    allow_throughput_overshoot: bool = True
    variance_balancing_frequency: int = 3


class _Run:
    def __init__(self, snapshot: FleetSnapshot, settings: Kcl3Settings, seed: int) -> None:
        self.settings = settings
        self.rng = random.Random(seed)
        self.tp = _java_throughputs(snapshot.leases)
        workers = sorted(snapshot.workers, key=lambda w: w.worker_id)
        cpu = bool(workers) and all(w.cpu_percent is not None for w in workers)
        self.owner_of: dict[str, str | None] = {}
        self.leases_of: dict[str, list[LeaseLoad]] = {w.worker_id: [] for w in workers}
        self.assigned: dict[str, float] = {w.worker_id: 0.0 for w in workers}
        for lease in sorted(snapshot.leases, key=lambda item: item.key):
            actual = lease.checkpoint_owner if lease.in_handoff else lease.owner
            self.owner_of[lease.key] = actual
            if actual in self.leases_of:
                self.leases_of[actual].append(lease)
                self.assigned[actual] += self.tp[lease.key]
        n = max(len(workers), 1)
        self.target_tp = sum(self.tp.values()) / n
        if cpu:
            self.metric = {w.worker_id: float(w.cpu_percent or 0.0) for w in workers}
            self.op_range = {w.worker_id: w.max_cpu_percent for w in workers}
        else:
            # The default ("T") metric: assigned throughput as a percentage of the target
            # throughput per worker, with an operating range of 100.
            self.metric = {
                wid: (100.0 * tp / self.target_tp if self.target_tp > 0 else 0.0)
                for wid, tp in self.assigned.items()
            }
            self.op_range = {w.worker_id: 100.0 for w in workers}
        self.avg = sum(self.metric.values()) / n
        self.target_leases = max(len(snapshot.leases) // n, 1)
        self.queue: list[str] = []
        for worker in sorted(self.metric):
            self.offer(worker)
        self.assignments: list[Move] = []
        self.moves: list[Move] = []

    def _to_reach_average(self, worker: str) -> float:
        value = self.metric[worker]
        return 1.0 if value == 0 else (self.avg - value) / value

    def _before(self, a: str, b: str) -> bool:
        """Whether ``a`` is strictly ahead of ``b`` in the queue (more room to the average)."""
        return self._to_reach_average(a) > self._to_reach_average(b)

    def offer(self, worker: str) -> None:
        # A binary heap with the sift rules of java.util.PriorityQueue, so that workers with
        # equal keys come out in the same order as on the Java leader.
        heap = self.queue
        heap.append(worker)
        k = len(heap) - 1
        while k > 0:
            parent = (k - 1) >> 1
            if not self._before(worker, heap[parent]):
                break
            heap[k] = heap[parent]
            k = parent
        heap[k] = worker

    def poll(self) -> str | None:
        heap = self.queue
        if not heap:
            return None
        result = heap[0]
        last = heap.pop()
        if heap:
            k, n = 0, len(heap)
            while (child := 2 * k + 1) < n:
                right = child + 1
                if right < n and self._before(heap[right], heap[child]):
                    child = right
                if not self._before(heap[child], last):
                    break
                heap[k] = heap[child]
                k = child
            heap[k] = last
        return result

    def added(self, worker: str, kbps: float) -> float:
        if self.target_tp > 0:
            return self.metric[worker] + kbps * self.avg / self.target_tp
        return self.metric[worker] + self.avg / self.target_leases

    def would_exceed(self, worker: str, kbps: float) -> bool:
        value = self.added(worker, kbps)
        return value > self.avg or value > self.op_range[worker]

    def give(self, lease: LeaseLoad, worker: str, expired: bool) -> None:
        owner = self.owner_of.get(lease.key)
        stuck_handoff = expired and lease.in_handoff
        if not stuck_handoff and owner == worker:
            self.offer(worker)
            return
        kbps = self.tp[lease.key]
        self.metric[worker] = self.added(worker, kbps)
        if owner in self.leases_of and lease in self.leases_of[owner]:
            self.leases_of[owner].remove(lease)
            self.assigned[owner] -= kbps
        self.leases_of[worker].append(lease)
        self.assigned[worker] += kbps
        self.owner_of[lease.key] = worker
        live_owner = owner if owner in self.leases_of and not expired else None
        move = Move(lease.key, live_owner, worker)
        (self.assignments if expired else self.moves).append(move)
        self.offer(worker)

    def assign_expired_or_unassigned(self, pending: list[LeaseLoad]) -> None:
        pending.sort(key=lambda lease: (lease.owner is not None, lease.age_order, lease.key))
        for lease in pending:
            worker = self.poll()
            if worker is None:
                break
            self.give(lease, worker, expired=True)

    def donors(self) -> list[str]:
        threshold = self.settings.rebalance_threshold_percent / 100
        upper, lower = self.avg * (1 + threshold), self.avg * (1 - threshold)
        trigger = False
        above: list[str] = []
        most: str | None = None
        for worker in sorted(self.metric):
            value = self.metric[worker]
            hot = value > self.op_range[worker]
            if value > upper or value < lower or hot:
                trigger = True
            if value >= upper or hot:
                above.append(worker)
            if most is None or self.metric[most] < value:
                most = worker
        if not above and most is not None:
            above.append(most)
        return above if trigger else []

    def leases_to_take(self, donor: str, amount: float) -> list[LeaseLoad]:
        owned = [
            lease for lease in self.leases_of[donor] if not lease.sticky and not lease.in_handoff
        ]
        if not owned:
            return []
        if self.assigned[donor] == 0:
            return owned[:1]
        self.rng.shuffle(owned)
        taken: list[LeaseLoad] = []
        remaining = amount
        for lease in owned:
            if remaining - self.tp[lease.key] <= 0:
                continue
            remaining -= self.tp[lease.key]
            taken.append(lease)
        if not taken and self.settings.allow_throughput_overshoot:
            taken.append(min(owned, key=lambda lease: (self.tp[lease.key], lease.key)))
        return taken

    def balance(self) -> None:
        damp = self.settings.dampening_percent / 100
        amounts: dict[str, float] = {}
        for donor in self.donors():
            value = self.metric[donor]
            share = (value - self.avg) / value if value else 0.0
            amounts[donor] = self.assigned[donor] * share * damp
        for donor in sorted(amounts, key=lambda w: (-amounts[w], w)):
            for lease in self.leases_to_take(donor, amounts[donor]):
                receiver = self.poll()
                if receiver is not None and self.would_exceed(receiver, self.tp[lease.key]):
                    break
                if receiver is not None:
                    self.give(lease, receiver, expired=False)


def _java_throughputs(leases: tuple[LeaseLoad, ...]) -> dict[str, float]:
    """A lease without throughput counts as the average of those with it (0 when none has)."""
    known = [
        lease.throughput_kbps
        for lease in leases
        if lease.throughput_kbps is not None and math.isfinite(lease.throughput_kbps)
    ]
    fill = sum(known) / len(known) if known else 0.0
    return {
        lease.key: lease.throughput_kbps
        if lease.throughput_kbps is not None and math.isfinite(lease.throughput_kbps)
        else fill
        for lease in leases
    }


def plan_kcl3(
    snapshot: FleetSnapshot,
    *,
    balance: bool,
    settings: Kcl3Settings | None = None,
    seed: int = 0,
) -> Plan:
    """One KCL 3.x assignment run; ``balance`` says whether this run is a variance-balancing run
    (the caller counts runs: every ``variance_balancing_frequency``-th one)."""
    run = _Run(snapshot, settings or Kcl3Settings(), seed)
    live = set(run.metric)
    pending = [
        lease
        for lease in snapshot.leases
        if lease.owner is None or lease.expired or lease.owner not in live
    ]
    if live:
        run.assign_expired_or_unassigned(pending)
        if balance:
            run.balance()
    return Plan(assignments=tuple(run.assignments), moves=tuple(run.moves))


def is_balancing_run(run_number: int, settings: Kcl3Settings | None = None) -> bool:
    """Whether run ``run_number`` (counted from 1) balances: every ``frequency``-th run."""
    frequency = (settings or Kcl3Settings()).variance_balancing_frequency
    return run_number % frequency == 0
