"""The renewal rounds of the leases a worker holds.

Owns: one conditional renewal per held lease every renewer interval (with the registry report
when early failover's heartbeats do not write it), the throughput written with it, and what a
renewal's outcome leads to: a refused one explained and applied through the coordinator (ours
after all, handed on, lost), a failed one retried at the next round unless the lease has gone
stale, an outgoing lease lost once its handoff timed out, an incoming one watched or activated
(``lease_handoffs``), and a lease the table says we must give up (``release_reason``) stopped.
The decisions are ``kclasync._core``'s (``held_lease``, ``load_assignment.renewal_throughput``).
Must not: take, checkpoint or release leases, or read any clock but the coordinator's (the
event loop).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kclasync._core.held_lease import (
    FailedWrite,
    HeldState,
    Verdict,
    check_accepted_write,
    credits_renewal,
    outgoing_timed_out,
    release_reason,
)
from kclasync._core.lease import CorruptLeaseError
from kclasync._core.load_assignment import renewal_throughput
from kclasync._runtime.held import HeldLease
from kclasync.errors import AdapterError, ThrottledError

if TYPE_CHECKING:
    from kclasync._runtime.lease_coordinator import LeaseCoordinator

log = logging.getLogger("kclasync.leases")

__all__ = ["LeaseRenewals"]


class LeaseRenewals:
    """The renewal rounds of one worker's lease coordinator."""

    def __init__(self, coordinator: LeaseCoordinator) -> None:
        self._c = coordinator

    async def renew_all(self) -> None:
        """Renew every held lease once, all at once."""
        await asyncio.gather(*(self._renew(h) for h in list(self._c.held.values())))

    async def _renew(self, held: HeldLease) -> None:
        c = self._c
        async with held.lock:
            if held.lost:
                return
            if held.state is HeldState.OUTGOING:
                # Not ours to renew; the new owner does. We only have until the handoff timeout.
                if outgoing_timed_out(held.since, c.now(), c.handoff_timeout):
                    c.lose(held, "the handoff was not finished in time")
                return
            if held.state is HeldState.INCOMING and held.watch_only:
                await c.handoffs.watch_incoming(held)
                return
            sent = c.now()
            verdict: Verdict | None = None
            delivered = held.bytes_delivered
            kbps = renewal_throughput(
                held.lease.throughput_kbps, delivered, held.throughput_since, sent
            )
            try:
                renewed = await c.store.renew_lease(held.lease, kbps)
                if renewed is None:
                    current, verdict = await c.explain_refusal(held, FailedWrite.renewal())
                    if verdict is Verdict.PASS_ON:
                        # Handed on before we noticed we had it: we never read from it, so
                        # there is nothing to drain; complete the new handoff at once.
                        assert current is not None
                        await c.handoffs.pass_on_unstarted(held, current)
                        return
                    renewed = c.apply_verdict(held, current, verdict, "renewal")
            except (AdapterError, CorruptLeaseError) as exc:
                reason = "throttled" if isinstance(exc, ThrottledError) else "error"
                c.metrics.renewal_failures.labels(*c.labels, reason).inc()
                log.info("renewal of %s failed (%s); will retry", held.key, exc)
                c.check_stale(held)
                return
            if renewed is None:
                return  # lost, or now being handed away: handled by apply_verdict
            late = check_accepted_write(me=c.worker_id, state=held.state, written=renewed)
            if late is not None:
                c.apply_verdict(held, renewed, late, "renewal", accepted=True)
                return
            held.lease = renewed
            if verdict is None:  # our renewal (and its throughput) went through
                held.bytes_delivered -= delivered
                held.throughput_since = sent
            # After a reconciled failure the write that counted was sent before ``sent``
            # (found by the simulation: 50 workers x 500 shards, seed 7).
            if credits_renewal(verdict, FailedWrite.renewal()):
                held.renewed_at = sent
            c.metrics.renewals.labels(*c.labels).inc()
        await self._after_renewal(held)

    async def _after_renewal(self, held: HeldLease) -> None:
        """Activate an incoming lease once its handoff allows, or ask the shard to let a lease
        go that it must not keep (``release_reason``)."""
        c = self._c
        if held.state is HeldState.INCOMING:
            await c.handoffs.after_incoming_renewal(held)
            return
        lease = held.lease
        if held.release_requested:
            return
        why = release_reason(lease, c.worker_id)
        if why is None:
            return
        held.release_requested = True
        log.info("lease %s: %s; finishing its batch and releasing it", held.key, why)
        c.listener.lease_stop_requested(held, why)

    async def loop(self) -> None:
        """Renew every renewer interval (with the registry report, unless early failover's
        heartbeats write it)."""
        c = self._c
        while True:
            started = c.now()
            if c.presence.heartbeat_interval is None:
                await asyncio.gather(self.renew_all(), c.presence.report())
            else:  # the heartbeat loop writes the entry (``early_failover``)
                await self.renew_all()
            await asyncio.sleep(max(0.0, c.renewer_interval - (c.now() - started)))
