"""Graceful handoffs of held leases: what this worker does once the table says a lease it holds
is changing hands, in either direction.

Owns: starting an outgoing handoff (stop the shard, keep checkpointing under ``checkpointOwner``
until the handoff timeout), the old owner's final checkpoint, passing on a lease that was handed
away before we started it, watching an incoming lease (also when its old owner is of another
implementation and must not be written to), activating it, and forcing a handoff whose old owner
is gone. The decisions (wait, activate or force; when an outgoing handoff has timed out) are
``kclasync._core.held_lease``'s; this module only applies them for the lease coordinator.
Must not: read any clock but the coordinator's (the event loop), or touch stream records.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kclasync._core.held_lease import (
    Event,
    HeldState,
    IncomingStep,
    incoming_step,
    outgoing_timed_out,
)
from kclasync._core.lease import CorruptLeaseError, Lease
from kclasync._core.position import Checkpoint
from kclasync._runtime.held import HeldLease
from kclasync.errors import AdapterError, LeaseLostError

if TYPE_CHECKING:
    from kclasync._runtime.lease_coordinator import LeaseCoordinator

log = logging.getLogger("kclasync.leases")

__all__ = ["LeaseHandoffs"]


class LeaseHandoffs:
    """The handoff steps of one worker's lease coordinator."""

    def __init__(self, coordinator: LeaseCoordinator) -> None:
        self.coordinator = coordinator

    # -- away from this worker -------------------------------------------------------------

    def start_outgoing(self, held: HeldLease, current: Lease) -> None:
        """The table names a new owner: stop the shard; its final checkpoint may still be
        written (fenced by ``checkpointOwner``) until the handoff timeout."""
        c = self.coordinator
        held.apply(Event.HANDOFF_AWAY)
        held.since = c.now()
        held.lease = current
        log.info("worker %s hands lease %s over to %s", c.worker_id, held.key, current.owner)
        c.listener.lease_stop_requested(held, f"handoff to {current.owner}")

    async def checkpoint_outgoing(
        self, held: HeldLease, checkpoint: Checkpoint, pending: Checkpoint | None
    ) -> Lease:
        """The old owner's checkpoint during the handoff. Raises ``LeaseLostError`` once the
        handoff timed out or the new owner forced it."""
        c = self.coordinator
        if outgoing_timed_out(held.since, c.now(), c.handoff_timeout):
            c.lose(held, "the handoff was not finished in time")
            raise LeaseLostError(held.key, "the handoff timed out")
        written = await c.store.checkpoint(held.lease, checkpoint, pending)
        if written is None:
            c.lose(held, "the new owner took over before our final checkpoint")
            raise LeaseLostError(held.key, "the new owner forced the handoff")
        held.lease = written
        return written

    async def pass_on_unstarted(self, held: HeldLease, current: Lease) -> None:
        """Handed on before we noticed we had it: we never read from it, so there is nothing
        to drain; complete the new handoff at once."""
        c = self.coordinator
        held.apply(Event.RELEASE)
        if c.held.get(held.key) is held:
            del c.held[held.key]
        c.update_gauge()
        done = await c.store.finish_handoff(current)
        log.info(
            "worker %s passed lease %s on to %s before starting it (%s)",
            c.worker_id,
            held.key,
            current.owner,
            "done" if done is not None else "the lease changed meanwhile",
        )

    # -- towards this worker ---------------------------------------------------------------

    async def after_incoming_renewal(self, held: HeldLease) -> None:
        """An incoming lease was renewed: activate it once the old owner let go (or is not
        live any more), force it after the handoff timeout, otherwise keep waiting."""
        c = self.coordinator
        lease = held.lease
        step = incoming_step(
            lease,
            since=held.since,
            now=c.now(),
            handoff_timeout=c.handoff_timeout,
            old_owner_live=lease.checkpoint_owner in c.taking.live_workers,
            worker_failover=c.presence.tracker.failover_time,
        )
        if step is IncomingStep.ACTIVATE:
            self.activate(held, "the old owner finished the handoff")
        elif step is IncomingStep.FORCE:
            async with held.lock:
                await self.force_locked(held)

    async def watch_incoming(self, held: HeldLease) -> None:
        """An incoming lease whose old owner is of another implementation: read it, never
        write it, until the old owner has let go (``checkpointOwner`` gone: take it with one
        fenced renewal) or has stopped renewing it for the failover time, or the handoff
        timeout is over (force it). Called with ``held.lock`` held."""
        c = self.coordinator
        try:
            current = await c.store.get_lease(held.key)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("reading the incoming lease %s failed (%s); will retry", held.key, exc)
            return
        now = c.now()
        if current is None or current.owner != c.worker_id:
            c.lose(held, "assigned elsewhere while waiting for its handoff")
            return
        if current.counter != held.lease.counter:
            held.progress_at = now
        held.lease = current
        step = incoming_step(
            current,
            since=held.since,
            now=now,
            handoff_timeout=c.handoff_timeout,
            old_owner_live=now - held.progress_at <= c.failover_time,
            worker_failover=c.failover_time,
        )
        if step is IncomingStep.WAIT:
            return
        if step is IncomingStep.FORCE:
            held.watch_only = False
            await self.force_locked(held)
            return
        try:
            renewed = await c.store.renew_lease(current)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("taking over %s after its handoff failed (%s); will retry", held.key, exc)
            return
        if renewed is None:
            return  # changed under us: read again at the next renewal
        held.lease, held.renewed_at, held.watch_only = renewed, now, False
        self.activate(held, "the old owner finished the handoff")

    def activate(self, held: HeldLease, why: str) -> None:
        c = self.coordinator
        held.apply(Event.HANDOFF_DONE)
        log.info("worker %s starts lease %s: %s", c.worker_id, held.key, why)
        c.listener.lease_acquired(held)

    async def force_locked(self, held: HeldLease) -> None:
        """Take an incoming lease whose old owner did not finish the handoff in time.
        Called with ``held.lock`` held."""
        c = self.coordinator
        if held.lost or held.state is not HeldState.INCOMING:
            return
        sent = c.now()
        try:
            taken = await c.store.take_lease(held.lease, c.worker_id)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("forcing the handoff of %s failed: %s", held.key, exc)
            return
        if taken is None:
            c.lose(held, "the lease changed while waiting for the handoff")
            return
        held.lease = taken
        held.renewed_at = sent
        log.warning(
            "the old owner of %s did not finish the handoff (dead, or slower than %ss); "
            "taking the lease over",
            held.key,
            c.handoff_timeout,
        )
        self.activate(held, "handoff forced")
