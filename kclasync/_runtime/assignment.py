"""Leader-based assignment (``lease_taker`` = ``kcl3`` or ``load``): the leader's assignment
loop and every worker's discovery of the leases assigned to it.

Owns: ``LeaderAssignment`` (while this worker holds the leader lock: every assignment interval,
one lease-table scan plus the worker metrics, a plan, and the plan's conditional writes;
three failed runs in a row give the lock up) and ``assignment_tasks``, which pairs it with every
worker's ``AssignmentDiscovery`` (``_runtime/assignment_discovery.py``). The decisions are
``kclasync._core.assignment.assignment_decisions`` and the
planners; holding and renewing is the lease coordinator's job.
Must not: decide what to assign or what a listed lease means, or read any clock but the
coordinator's.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Callable, Sequence

from kclasync._adapters.protocols import LeaseScan
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import LeaseTakerKind
from kclasync._core.assignment.assignment_decisions import (
    FailureStreak,
    LeaderWrite,
    WriteKind,
    fleet_snapshot,
    leader_writes,
    rebalance_step,
    worker_loads,
)
from kclasync._core.assignment.kcl3_decider import Kcl3Settings, is_balancing_run, plan_kcl3
from kclasync._core.assignment.load_assignment import FleetSnapshot, Plan
from kclasync._core.assignment.load_balancer import BalancerSettings, plan_load_aware
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.workers.report_watch import failover_view, stalled_workers
from kclasync._core.workers.worker_metrics import WorkerMetrics, entry_timeout
from kclasync._runtime.assignment_discovery import AssignmentDiscovery
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.lease_coordinator import LeaseCoordinator
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.assignment")


class LeaderAssignment:
    """The leader's loop. Resumes from the table alone: a new leader judges expiry from its own
    observations, so it assigns an owned lease only after watching it stand still."""

    def __init__(
        self,
        *,
        holder: LeaseCoordinator,
        elector: LeaderElector,
        policy: LeaseTakerKind,
        interval: float,
        registry: WorkerRegistry | None,
        rng: random.Random,
        balancer: BalancerSettings | None = None,
        kcl3: Kcl3Settings | None = None,
    ) -> None:
        if not policy.leader_based:
            raise ValueError(f"{policy.value} is not a leader-based assignment mode")
        self._holder = holder
        self._elector = elector
        self.policy = policy
        self.interval = interval
        self.registry = registry
        self._rng = rng
        self.balancer = balancer or BalancerSettings()
        self.kcl3 = kcl3 or Kcl3Settings()
        self.expiry: ExpiryTracker = holder.taking.expiry
        worker_timeout = holder.presence.tracker.failover_time
        #: Registry entries' ``lut`` changes, one tracker per liveness window
        #: (``core.worker_metrics.entry_timeout``: kclasync's entries, the Java KCL's).
        self._workers: dict[float, ExpiryTracker] = {}
        self._worker_timeout = worker_timeout
        self.streak = FailureStreak()
        #: Assignment runs completed as leader (kcl3 balances on every 3rd).
        self.runs = 0
        self.writes_ok = 0
        self.writes_refused = 0
        #: The last snapshot and plan (for the CLI, tests and the simulation report).
        self.last_snapshot: FleetSnapshot | None = None
        self.last_plan: Plan = Plan()
        #: The last run only assigned because the throughputs were in flux (one run at most).
        self._held = False
        #: The elector's term this loop last ran in, and when (loop clock) it first ran in it.
        self._term = -1
        self._term_started = 0.0
        #: Runs one at a time: the periodic ones and the failover runs (``failover_run``).
        self._running = asyncio.Lock()
        #: Failover runs completed (not counted in ``runs``: kcl3's balancing cadence is kept).
        self.failover_runs = 0
        #: The workers this leader's report watch suspects now (``LeaderFailover`` sets it;
        #: none without early failover). A periodic run gives them nothing either.
        self.suspects: Callable[[], frozenset[str]] = frozenset
        #: Java workers found renewing none of their leases, with their entry's ``lut`` then
        #: (``core.report_watch.stalled_workers``): no targets until they report again.
        self.stalled: dict[str, int] = {}

    # -- the worker metrics ----------------------------------------------------------------

    async def live_workers(
        self, scan: LeaseScan, now: float
    ) -> tuple[set[str], dict[str, WorkerMetrics]]:
        """The live workers and their metrics. THE one place that knows where liveness comes
        from: the ``WorkerRegistry`` entries (``<app>-WorkerMetricStats``; an entry is live while
        its ``lut`` keeps changing on this clock), plus this worker."""
        beats: dict[float, list[Lease]] = {}
        metrics: dict[str, WorkerMetrics] = {}
        if self.registry is not None:
            decoded = await self.registry.list_workers()
            for entry in decoded.entries:
                metrics[entry.worker_id] = entry
                window = entry_timeout(entry, self._worker_timeout)
                beats.setdefault(window, []).append(
                    Lease(key=entry.worker_id, owner=entry.worker_id, counter=entry.last_update)
                )
        live = {self._holder.worker_id}
        for window in set(beats) | set(self._workers):
            tracker = self._workers.setdefault(window, ExpiryTracker(window))
            tracker.observe(beats.get(window, ()), now)
            live |= {b.key for b in beats.get(window, ()) if not tracker.is_expired(b, now)}
        return live, metrics

    # -- one run ---------------------------------------------------------------------------

    def plan(self, snapshot: FleetSnapshot, *, watched_enough: bool = True) -> Plan:
        if self.policy is LeaseTakerKind.KCL3:
            balance = is_balancing_run(self.runs + 1, self.kcl3)
            return plan_kcl3(
                snapshot, balance=balance, settings=self.kcl3, seed=self._rng.getrandbits(32)
            )
        allowed, self._held = rebalance_step(
            snapshot,
            bool(self.last_plan.moves),
            watched_enough=watched_enough,
            held_last_run=self._held,
            previous=self.last_snapshot,
        )
        if not allowed:
            return plan_load_aware(snapshot, dataclasses.replace(self.balancer, max_moves=0))
        return plan_load_aware(snapshot, self.balancer)

    def failover_plan(self, snapshot: FleetSnapshot) -> Plan:
        """The plan of a failover run: the expired and unowned leases only, no balancing."""
        if self.policy is LeaseTakerKind.KCL3:
            return plan_kcl3(
                snapshot, balance=False, settings=self.kcl3, seed=self._rng.getrandbits(32)
            )
        return plan_load_aware(snapshot, dataclasses.replace(self.balancer, max_moves=0))

    async def run_once(self) -> Plan:
        """One assignment run: scan, plan, write. Raises AdapterError when the scan or the
        metrics cannot be read; refused conditional writes are normal and only counted."""
        async with self._running:
            return await self._run(frozenset())

    async def failover_run(self, suspects: frozenset[str]) -> Plan:
        """A run for expired leases only (``core.report_watch``): as ``run_once``, but it
        plans no balancing, gives nothing to the ``suspects`` and leaves their unexpired leases
        alone (``failover_view``), and leaves the periodic runs' count and state alone."""
        async with self._running:
            return await self._run(suspects, failover=True)

    async def _run(self, suspects: frozenset[str], *, failover: bool = False) -> Plan:
        scan = await self._holder.store.list_leases()
        now = self._holder.now()
        self.expiry.observe(scan.leases, now)
        live, metrics = await self.live_workers(scan, now)
        # The suspects are no targets, and their unexpired leases stay out of the plan, in
        # periodic runs as in failover runs: a new leader's registry trackers count every
        # entry live for a worker timeout from their first read, a crashed worker's included.
        # So are Java workers that renew none of their leases (the report watch does not
        # follow their entries, which the registry counts live for 60 s).
        if not failover:
            suspects = self.suspects()
        self.stalled = stalled_workers(
            self.stalled, scan.leases, metrics.values(), self.expiry, now
        )
        suspects = suspects | frozenset(self.stalled)
        planned: Sequence[Lease]
        planned, targets = failover_view(scan.leases, live, suspects, self.expiry, now)
        live = set(targets)
        self._holder.taking.live_workers = frozenset(live)
        self._holder.taking.last_scan = scan.leases
        snapshot = fleet_snapshot(planned, worker_loads(live, metrics), self.expiry, now)
        if self._elector.terms != self._term:
            self._term, self._term_started = self._elector.terms, now
        watched = now - self._term_started >= self._holder.failover_time
        if failover:
            plan = self.failover_plan(snapshot)
            self.failover_runs += 1
        else:
            plan = self.plan(snapshot, watched_enough=watched)
            self.runs += 1
            self.last_plan = plan
        self.last_snapshot = snapshot
        writes = leader_writes(plan, {lease.key: lease for lease in scan.leases})
        results = await asyncio.gather(*(self._write(w) for w in writes))
        for write, ok in zip(writes, results, strict=True):
            if ok:
                log.info(
                    "leader %s %s lease %s to %s",
                    self._holder.worker_id,
                    "assigned" if write.kind is WriteKind.ASSIGN else "is handing",
                    write.lease.key,
                    write.to_worker,
                )
        return plan

    async def _write(self, write: LeaderWrite) -> bool:
        store = self._holder.store
        try:
            if write.kind is WriteKind.ASSIGN:
                done = await store.take_lease(write.lease, write.to_worker)
            else:
                done = await store.start_handoff(write.lease, write.to_worker)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("assignment write for %s failed: %s", write.lease.key, exc)
            done = None
        if done is None:
            self.writes_refused += 1
            return False
        self.writes_ok += 1
        return True

    async def run(self) -> None:
        while True:
            started = self._holder.now()
            taking = self._holder.taking
            if self._elector.is_leader() and taking.enabled and taking.leader_assigns:
                try:
                    await self.run_once()
                    self.streak.succeeded()
                except AdapterError as exc:
                    log.warning("assignment run failed: %s", exc)
                    if self.streak.failed():
                        log.warning(
                            "worker %s gives up leadership after repeated assignment failures",
                            self._holder.worker_id,
                        )
                        await self._elector.release()
            else:
                self.streak.succeeded()
            await asyncio.sleep(max(0.0, self.interval - (self._holder.now() - started)))


def assignment_tasks(
    holder: LeaseCoordinator,
    elector: LeaderElector,
    *,
    policy: LeaseTakerKind,
    interval: float,
    discovery_interval: float,
    registry: WorkerRegistry | None,
    rng: random.Random,
    balancer: BalancerSettings | None = None,
    kcl3: Kcl3Settings | None = None,
) -> tuple[LeaderAssignment, AssignmentDiscovery]:
    return (
        LeaderAssignment(
            holder=holder,
            elector=elector,
            policy=policy,
            interval=interval,
            registry=registry,
            rng=rng,
            balancer=balancer,
            kcl3=kcl3,
        ),
        AssignmentDiscovery(holder=holder, interval=discovery_interval),
    )
