"""The lease coordinator: renewer and taker loops, fenced checkpoints and releases.

Owns: the set of leases this worker holds, their local counters and renewal times, and applying
the taker's plans through the ``LeaseStore``. Decisions (what is expired, what to take) come from
``kclasync.core``.
Must not: read any clock but the event loop's, or touch stream records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from typing import Protocol

import attrs

from kclasync.adapters.protocols import AdapterError, LeaseStore, ThrottledError
from kclasync.core.expiry import ExpiryTracker
from kclasync.core.lease import CorruptLeaseError, Lease
from kclasync.core.lease_taker import LeaseTaker, TakePlan, TakeView
from kclasync.core.position import Checkpoint
from kclasync.errors import LeaseLostError
from kclasync.runtime.metrics import ConsumerMetrics

log = logging.getLogger("kclasync.leases")


@attrs.define(eq=False)
class HeldLease:
    """A lease this worker holds, with the local state that fences its writes."""

    lease: Lease
    #: Loop time at which the last successful counter-changing write was sent.
    renewed_at: float
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    lost: bool = False

    @property
    def key(self) -> str:
        return self.lease.key


class LeaseListener(Protocol):
    def lease_acquired(self, held: HeldLease) -> None: ...

    def lease_lost(self, held: HeldLease, reason: str) -> None: ...


class LeaseCoordinator:
    def __init__(
        self,
        *,
        store: LeaseStore,
        worker_id: str,
        failover_time: float,
        renewer_interval: float,
        taker_interval: float,
        taker: LeaseTaker,
        max_leases_for_worker: int | None,
        max_leases_to_steal: int,
        metrics: ConsumerMetrics,
        application: str,
        listener: LeaseListener,
        rng: random.Random,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.failover_time = failover_time
        self.renewer_interval = renewer_interval
        self.taker_interval = taker_interval
        self.taker = taker
        self.max_leases_for_worker = max_leases_for_worker
        self.max_leases_to_steal = max_leases_to_steal
        self.metrics = metrics
        self.labels = (application, worker_id)
        self.listener = listener
        self.rng = rng
        self._clock = clock
        self.expiry = ExpiryTracker(failover_time)
        self.held: dict[str, HeldLease] = {}
        #: Lease keys this worker will not take until the given loop time.
        self.excluded: dict[str, float] = {}
        self.taking_enabled = True
        self._reported_corrupt: set[str] = set()
        self.last_scan: tuple[Lease, ...] = ()
        # Create the worker's series now, so a scrape shows zeros rather than nothing.
        for family in (
            metrics.renewals,
            metrics.leases_lost,
            metrics.takes,
            metrics.steals,
            metrics.released,
        ):
            family.labels(*self.labels)
        self._update_gauge()

    def now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _update_gauge(self) -> None:
        self.metrics.leases_held.labels(*self.labels).set(len(self.held))

    # -- losing, releasing -----------------------------------------------------------------

    def _lose(self, held: HeldLease, reason: str) -> None:
        if held.lost:
            return
        held.lost = True
        if self.held.get(held.key) is held:
            del self.held[held.key]
        self.metrics.leases_lost.labels(*self.labels).inc()
        self._update_gauge()
        log.warning("worker %s lost lease %s: %s", self.worker_id, held.key, reason)
        self.listener.lease_lost(held, reason)

    def _check_stale(self, held: HeldLease) -> None:
        """Stop treating a lease as held once it has gone unrenewed for the failover time."""
        if self.now() - held.renewed_at > self.failover_time:
            self._lose(held, f"not renewed for more than {self.failover_time}s")

    async def release(self, key: str) -> bool:
        """Give a lease up (conditional on still owning it). True if the table says released."""
        held = self.held.get(key)
        if held is None:
            return False
        async with held.lock:
            if held.lost:
                return False
            held.lost = True  # no more writes through this handle, whatever happens next
            self.held.pop(key, None)
            self._update_gauge()
            try:
                released = await self.store.release_lease(held.lease)
            except AdapterError as exc:
                log.warning("could not release lease %s (it will expire): %s", key, exc)
                return False
        if released is not None:
            self.metrics.released.labels(*self.labels).inc()
            log.info("worker %s released lease %s", self.worker_id, key)
        return released is not None

    # -- renewing --------------------------------------------------------------------------

    async def renew_all(self) -> None:
        await asyncio.gather(*(self._renew(h) for h in list(self.held.values())))

    async def _renew(self, held: HeldLease) -> None:
        async with held.lock:
            if held.lost:
                return
            sent = self.now()
            try:
                renewed = await self.store.renew_lease(held.lease)
                if renewed is None:
                    renewed = await self._reconcile(held.lease, held.lease.counter + 1)
            except (AdapterError, CorruptLeaseError) as exc:
                reason = "throttled" if isinstance(exc, ThrottledError) else "error"
                self.metrics.renewal_failures.labels(*self.labels, reason).inc()
                log.info("renewal of %s failed (%s); will retry", held.key, exc)
                self._check_stale(held)
                return
            if renewed is None:
                self.metrics.renewal_failures.labels(*self.labels, "lost").inc()
                self._lose(held, "another worker changed the lease (counter or owner)")
                return
            held.lease = renewed
            held.renewed_at = sent
            self.metrics.renewals.labels(*self.labels).inc()

    async def _reconcile(self, expected: Lease, counter: int) -> Lease | None:
        """After a failed condition: did our own earlier attempt (a retried request) succeed?"""
        current = await self.store.get_lease(expected.key)
        if current is not None and current.owner == self.worker_id and current.counter == counter:
            return current
        return None

    # -- checkpointing ---------------------------------------------------------------------

    async def checkpoint(
        self, key: str, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease:
        """Fenced checkpoint write. Raises LeaseLostError when the lease is not ours any more."""
        held = self.held.get(key)
        if held is None or held.lost:
            raise LeaseLostError(key)
        async with held.lock:
            if held.lost:
                raise LeaseLostError(key)
            self._check_stale(held)
            if held.lost:
                raise LeaseLostError(key, "not renewed within the failover time")
            sent = self.now()
            written = await self.store.checkpoint(held.lease, checkpoint, pending)
            if written is None:
                written = await self._reconcile(held.lease, held.lease.counter + 1)
                if written is not None and written.checkpoint != (
                    held.lease.checkpoint if pending is not None else checkpoint
                ):
                    written = None
            if written is None:
                self._lose(held, "checkpoint rejected: another worker changed the lease")
                raise LeaseLostError(key, "the checkpoint was rejected by the lease table")
            held.lease = written
            held.renewed_at = sent
            return written

    # -- taking ----------------------------------------------------------------------------

    def _report_corrupt(self, corrupt: tuple[CorruptLeaseError, ...]) -> None:
        self.metrics.corrupt_leases.labels(*self.labels).set(len(corrupt))
        keys = {exc.lease_key for exc in corrupt}
        for exc in corrupt:
            if exc.lease_key not in self._reported_corrupt:
                log.error("%s; this lease is skipped until it is repaired", exc)
        self._reported_corrupt = keys

    async def take_round(self) -> TakePlan:
        """Scan the table once, plan and apply takes. Returns what was actually acquired."""
        scan = await self.store.list_leases()
        now = self.now()
        self._report_corrupt(scan.corrupt)
        self.last_scan = scan.leases
        self.expiry.observe(scan.leases, now)
        if not self.taking_enabled:
            return TakePlan()
        for key, until in list(self.excluded.items()):
            if until <= now:
                del self.excluded[key]
        candidates: list[Lease] = []
        # Leases recorded under our id that we do not hold (a restart with a fixed worker id):
        # take them back through the counter condition like any other lease.
        for lease in scan.leases:
            if lease.key in self.excluded:
                continue
            if lease.owner == self.worker_id and lease.key not in self.held:
                candidates.append(attrs.evolve(lease, owner=None))
            else:
                candidates.append(lease)
        view = TakeView(
            worker_id=self.worker_id,
            leases=candidates,
            now=now,
            expiry=self.expiry,
            max_leases_for_worker=self.max_leases_for_worker,
            max_leases_to_steal=self.max_leases_to_steal,
        )
        plan = self.taker.plan(view, self.rng)
        by_key = {lease.key: lease for lease in scan.leases}
        take = [by_key[lease.key] for lease in plan.take]
        steal = [by_key[lease.key] for lease in plan.steal]
        results = await asyncio.gather(
            *(self._take(lease, stolen=False) for lease in take),
            *(self._take(lease, stolen=True) for lease in steal),
        )
        taken = tuple(lease for lease in results[: len(take)] if lease is not None)
        stolen = tuple(lease for lease in results[len(take) :] if lease is not None)
        return TakePlan(take=taken, steal=stolen)

    async def _take(self, lease: Lease, *, stolen: bool) -> Lease | None:
        if lease.key in self.held:
            return None
        sent = self.now()
        try:
            taken = await self.store.take_lease(lease, self.worker_id)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("taking %s failed: %s", lease.key, exc)
            return None
        if taken is None:
            return None  # someone else was faster; normal
        held = HeldLease(lease=taken, renewed_at=sent)
        self.held[taken.key] = held
        (self.metrics.steals if stolen else self.metrics.takes).labels(*self.labels).inc()
        self._update_gauge()
        log.info(
            "worker %s %s lease %s%s",
            self.worker_id,
            "stole" if stolen else "took",
            taken.key,
            f" from {lease.owner}" if stolen else "",
        )
        self.listener.lease_acquired(held)
        return taken

    # -- loops -----------------------------------------------------------------------------

    async def renewer_loop(self) -> None:
        while True:
            started = self.now()
            await self.renew_all()
            await asyncio.sleep(max(0.0, self.renewer_interval - (self.now() - started)))

    async def taker_loop(self, wake: asyncio.Event | None = None) -> None:
        while True:
            started = self.now()
            try:
                await self.take_round()
            except AdapterError as exc:
                log.warning("lease taking round failed: %s", exc)
            delay = max(0.0, self.taker_interval - (self.now() - started))
            if wake is None:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                wake.clear()
