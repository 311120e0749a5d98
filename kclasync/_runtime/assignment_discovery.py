"""Every worker's side of leader-based assignment (``lease_taker`` = ``kcl3`` or ``load``):
find the leases the leader assigned to this worker through the owner index, read the new ones
strongly, and take them or hold them as incoming handoffs; delete finished leases assigned to it
once their children have started, as a Java worker does with the ones a KCL 3.x leader gives it.

Owns: ``AssignmentDiscovery``. The decision per lease is
``kclasync._core.assignment.assignment_decisions.follower_step``; holding and renewing is the
lease coordinator's job.
Must not: decide what a listed lease means, plan assignments (``_runtime/assignment.py``), or
read any clock but the coordinator's.
"""

from __future__ import annotations

import asyncio
import logging

from kclasync._adapters.protocols import LeaseStore
from kclasync._core.assignment.assignment_decisions import FollowerStep, follower_step
from kclasync._core.leases.held_lease import HeldLease, HeldState
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.leases.lease_cleanup import ready_for_deletion
from kclasync._runtime.event_wait import wait_event
from kclasync._runtime.lease_coordinator import LeaseCoordinator
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.assignment")


class AssignmentDiscovery:
    """Every worker's side: find what the leader assigned here through the owner index."""

    def __init__(self, *, holder: LeaseCoordinator, interval: float) -> None:
        self._holder = holder
        self.interval = interval
        self.queries = 0
        self.reads = 0

    @property
    def store(self) -> LeaseStore:
        return self._holder.store

    async def discover_once(self) -> list[str]:
        """One index query; returns the keys taken or held as incoming."""
        holder = self._holder
        me = holder.worker_id
        self.queries += 1
        keys = await self.store.lease_keys_of(me)
        acquired: list[str] = []
        finished: list[Lease] = []
        for key in keys:
            if key in holder.held or holder.taking.is_excluded(key) or not holder.taking.enabled:
                continue
            self.reads += 1
            try:
                lease = await self.store.get_lease(key)
            except CorruptLeaseError as exc:
                log.error("%s; this lease is skipped until it is repaired", exc)
                continue
            if lease is not None and lease.owner == me and lease.is_finished:
                finished.append(lease)
            step = follower_step(me, lease, key in holder.held)
            if lease is None or step is FollowerStep.SKIP:
                continue
            if await self._apply(step, lease):
                acquired.append(key)
        if finished:
            await self.settle_finished(finished)
        return acquired

    async def settle_finished(self, finished: list[Lease]) -> list[str]:
        """Finished (SHARD_END) leases a leader assigned to this worker. A KCL 3.x leader
        assigns them like any other until the worker holding one deletes it (the Java worker's
        own lease cleanup); left alone they expire and are assigned again at every run. Delete
        those whose children have all started (``core.lease_cleanup.ready_for_deletion``, the
        leader's rule); the others stay, as the lineage's tombstone, for a later round."""
        scan = await self.store.list_leases()
        by_key = {lease.key: lease for lease in scan.leases}
        deleted: list[str] = []
        for lease in finished:
            current = by_key.get(lease.key)
            if current is None or current.owner != self._holder.worker_id:
                continue
            if ready_for_deletion(current, by_key) and await self.store.delete_lease(current):
                log.info("deleted finished lease %s assigned to this worker", current.key)
                deleted.append(current.key)
        return deleted

    async def _apply(self, step: FollowerStep, lease: Lease) -> bool:
        holder = self._holder
        sent = holder.now()
        if step is FollowerStep.INCOMING and not await holder.presence.is_kclasync(
            lease.checkpoint_owner
        ):
            # A Java KCL old owner renews the lease while it drains and makes its final
            # checkpoint under the lease counter: a write of ours would make it lose the lease
            # before that checkpoint. Watch the lease instead until it lets go.
            if lease.key in holder.held:
                return False
            holder.held.add(HeldLease.incoming(lease, sent, watch_only=True), counted_as=None)
            log.info(
                "worker %s takes over lease %s once %s (another implementation) has "
                "checkpointed; not writing it until then",
                holder.worker_id,
                lease.key,
                lease.checkpoint_owner,
            )
            return True
        if step is FollowerStep.INCOMING:
            # One fenced write of our own (a renewal: counter+1 on owner = us) before holding it,
            # so the time we count from is a write we made, not a read.
            try:
                renewed = await self.store.renew_lease(lease)
            except (AdapterError, CorruptLeaseError) as exc:
                log.info("renewing the incoming lease %s failed: %s", lease.key, exc)
                return False
            if renewed is None or lease.key in holder.held:
                return False
            holder.held.add(HeldLease.incoming(renewed, sent), counted_as=None)
            log.info(
                "worker %s takes over lease %s once %s has checkpointed",
                holder.worker_id,
                lease.key,
                lease.checkpoint_owner,
            )
            return True
        return await holder.taking.take_assigned(lease)

    async def refresh_liveness(self) -> None:
        """While a lease waits for its old owner to finish a handoff, keep the view of live
        workers current: it decides whether to wait for the handoff timeout (a live old owner,
        a Java worker checkpointing in ``shutdownRequested``) or only for the failover time (a
        dead one). The taker rounds that refresh it in the other modes do not run here."""
        holder = self._holder
        if not any(h.state is HeldState.INCOMING for h in holder.held.values()):
            return
        try:
            holder.taking.live_workers = await holder.presence.live_workers(holder.now())
        except AdapterError as exc:
            log.info("reading the worker registry failed (keeping the last view): %s", exc)

    async def run(self, wake: asyncio.Event | None = None) -> None:
        while True:
            started = self._holder.now()
            try:
                if self._holder.taking.leader_assigns:
                    await self.discover_once()
                    await self.refresh_liveness()
            except AdapterError as exc:
                log.info("assignment discovery failed: %s", exc)
            delay = max(0.0, self.interval - (self._holder.now() - started))
            if wake is None:
                await asyncio.sleep(delay)
            else:
                await wait_event(wake, delay)
                wake.clear()
