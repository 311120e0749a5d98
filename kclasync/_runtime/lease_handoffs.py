"""Graceful handoffs towards this worker, and a lease handed on before we started it.

Owns: passing on a lease that was handed away before we started it, watching an incoming lease
(also when its old owner is of another implementation and must not be written to), activating
it, and forcing a handoff whose old owner is gone. The outgoing direction (a write refused
because another worker asked for the lease) is ``held``'s, as it follows from any refused write.
The decisions (wait, activate or force) are ``kclasync._core.leases.held_lease``'s; this module only
applies them, on the ``HeldLeases`` it is given.
Must not: import the lease coordinator or its other helpers, read any clock but the held
leases' (the event loop), or touch stream records.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kclasync._core.leases.held_lease import (
    Event,
    HeldLease,
    HeldState,
    IncomingStep,
    incoming_step,
)
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._runtime.held import HeldLeases
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.leases")

__all__ = ["LeaseHandoffs"]


class LeaseHandoffs:
    """The incoming handoff steps of one worker's held leases."""

    def __init__(
        self,
        held: HeldLeases,
        *,
        is_live: Callable[[str | None], bool],
        worker_failover: float,
    ) -> None:
        self.held = held
        #: Whether a worker was live at the last look at the registry (the taking rounds').
        self._is_live = is_live
        #: How long a silent worker counts as live (the registry's worker timeout).
        self._worker_failover = worker_failover

    async def pass_on_unstarted(self, held: HeldLease, current: Lease) -> None:
        """Handed on before we noticed we had it: we never read from it, so there is nothing
        to drain; complete the new handoff at once."""
        h = self.held
        h.let_go(held)
        done = await h.store.finish_handoff(current)
        log.info(
            "worker %s passed lease %s on to %s before starting it (%s)",
            h.worker_id,
            held.key,
            current.owner,
            "done" if done is not None else "the lease changed meanwhile",
        )

    async def after_incoming_renewal(self, held: HeldLease) -> None:
        """An incoming lease was renewed: activate it once the old owner let go (or is not
        live any more), force it after the handoff timeout, otherwise keep waiting."""
        h = self.held
        lease = held.lease
        step = incoming_step(
            lease,
            since=held.since,
            now=h.now(),
            handoff_timeout=h.handoff_timeout,
            old_owner_live=self._is_live(lease.checkpoint_owner),
            worker_failover=self._worker_failover,
        )
        if step is IncomingStep.ACTIVATE:
            self.activate(held, "the old owner finished the handoff")
        elif step is IncomingStep.FORCE:
            async with h.lock(held):
                await self.force_locked(held)

    async def watch_incoming(self, held: HeldLease) -> None:
        """An incoming lease whose old owner is of another implementation: read it, never
        write it, until the old owner has let go (``checkpointOwner`` gone: take it with one
        fenced renewal) or has stopped renewing it for the failover time, or the handoff
        timeout is over (force it). Called with the lease's lock held."""
        h = self.held
        try:
            current = await h.store.get_lease(held.key)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("reading the incoming lease %s failed (%s); will retry", held.key, exc)
            return
        now = h.now()
        if current is None or current.owner != h.worker_id:
            h.lose(held, "assigned elsewhere while waiting for its handoff")
            return
        if current.counter != held.lease.counter:
            held.progress_at = now
        held.lease = current
        step = incoming_step(
            current,
            since=held.since,
            now=now,
            handoff_timeout=h.handoff_timeout,
            old_owner_live=now - held.progress_at <= h.failover_time,
            worker_failover=h.failover_time,
        )
        if step is IncomingStep.WAIT:
            return
        if step is IncomingStep.FORCE:
            held.watch_only = False
            await self.force_locked(held)
            return
        try:
            renewed = await h.store.renew_lease(current)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("taking over %s after its handoff failed (%s); will retry", held.key, exc)
            return
        if renewed is None:
            return  # changed under us: read again at the next renewal
        held.wrote(renewed, now)
        held.watch_only = False
        self.activate(held, "the old owner finished the handoff")

    def activate(self, held: HeldLease, why: str) -> None:
        held.apply(Event.HANDOFF_DONE)
        log.info("worker %s starts lease %s: %s", self.held.worker_id, held.key, why)
        self.held.listener.lease_acquired(held)

    async def force_locked(self, held: HeldLease) -> None:
        """Take an incoming lease whose old owner did not finish the handoff in time.
        Called with the lease's lock held."""
        h = self.held
        if held.lost or held.state is not HeldState.INCOMING:
            return
        sent = h.now()
        try:
            taken = await h.store.take_lease(held.lease, h.worker_id)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("forcing the handoff of %s failed: %s", held.key, exc)
            return
        if taken is None:
            h.lose(held, "the lease changed while waiting for the handoff")
            return
        held.wrote(taken, sent)
        log.warning(
            "the old owner of %s did not finish the handoff (dead, or slower than %ss); "
            "taking the lease over",
            held.key,
            h.handoff_timeout,
        )
        self.activate(held, "handoff forced")
