"""The renewals of the leases a worker holds.

Owns: one conditional renewal per held lease every renewer interval, each lease at its own
point of the interval (``core.leases.periods.first_renewal_due``: a steady trickle, not one
burst per interval), the registry report when early failover's heartbeats do not write it, the
throughput written with each renewal, and what a
renewal's outcome leads to: a refused one explained and applied through ``HeldLeases`` (ours
after all, handed on, lost), a failed one retried at the next round unless the lease has gone
stale, an outgoing lease lost once its handoff timed out, an incoming one watched or activated
(``lease_handoffs``), and a lease the table says we must give up (``release_reason``) stopped.
The decisions are ``kclasync._core``'s (``held_lease``, ``throughput.renewal_throughput``).
Must not: import the lease coordinator, take, checkpoint or release leases, or read any clock
but the held leases' (the event loop).

One renewal, top to bottom (``_renew``): under the lease's lock, an outgoing lease is only
checked against its handoff timeout and a watched incoming one only read; otherwise the renewal
is sent with the throughput since the last one; a refusal is explained (``HeldLeases.
explain_refusal``) and either passed on (``LeaseHandoffs.pass_on_unstarted``) or applied
(``HeldLeases.apply_verdict``); an accepted write whose item names another owner is applied
the same way; else the core state takes the outcome (``HeldLease.renewal_done``). Outside the
lock, ``_after_renewal`` activates an incoming lease or asks the pipeline to let a lease go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kclasync._core.assignment.throughput import renewal_throughput
from kclasync._core.leases.held_lease import (
    FailedWrite,
    HeldLease,
    HeldState,
    Verdict,
    WriteKind,
    check_accepted_write,
    outgoing_timed_out,
    release_reason,
)
from kclasync._core.leases.lease import CorruptLeaseError
from kclasync._core.leases.periods import (
    first_renewal_due,
    late_renewals,
    renewal_round_due,
    renewals_due,
)
from kclasync._runtime.held import HeldLeases
from kclasync._runtime.lease_handoffs import LeaseHandoffs
from kclasync._runtime.worker_presence import WorkerPresence
from kclasync.errors import AdapterError, ThrottledError

log = logging.getLogger("kclasync.leases")

__all__ = ["LeaseRenewals"]


class LeaseRenewals:
    """The renewal rounds of one worker's held leases."""

    def __init__(
        self,
        held: HeldLeases,
        handoffs: LeaseHandoffs,
        presence: WorkerPresence,
        *,
        interval: float,
        failover_time: float | None = None,
    ) -> None:
        self.held = held
        self.handoffs = handoffs
        self.presence = presence
        self.interval = interval
        self.failover_time = failover_time if failover_time is not None else 3 * interval
        #: The latest lateness (seconds) of a renewal, and the most seen: read by tests and
        #: benchmarks; operators read the histogram.
        self.last_lateness = 0.0
        self.max_lateness = 0.0
        self._warned_at: float | None = None
        #: Told each renewal's lateness (the worker's read slots: renewals first).
        self.on_lateness: Callable[[float], None] | None = None
        # The labelled series, looked up once (a lookup per renewal shows at 1,000 leases).
        self._lateness = held.metrics.renewal_lateness.labels(*held.labels)
        self._renewed = held.metrics.renewals.labels(*held.labels)

    async def renew_all(self, due: float | None = None) -> None:
        """Renew every held lease once, all at once (``due``: when the round was due)."""
        await asyncio.gather(*(self._renew(h, due) for h in list(self.held.values())))

    def _sent_late(self, due: float | None, sent: float) -> None:
        """Record how late a renewal was sent, and warn (at most once a minute) when it was
        late enough to put leases at risk (``core.periods.late_renewals``)."""
        if due is None:
            return
        lateness = max(0.0, sent - due)
        h = self.held
        self._lateness.observe(lateness)
        if self.on_lateness is not None:
            self.on_lateness(lateness)
        self.last_lateness = lateness
        self.max_lateness = max(self.max_lateness, lateness)
        if not late_renewals(lateness, self.failover_time):
            return
        if self._warned_at is not None and sent - self._warned_at < 60.0:
            return
        self._warned_at = sent
        log.warning(
            "worker %s sends lease renewals late: %.2f s after they were due (%.0f %% of the "
            "failover time, %d leases held); a worker that stays this busy loses leases it is "
            "still processing: give it fewer shards (max_leases_for_worker) or more CPU",
            h.worker_id,
            lateness,
            100 * lateness / self.failover_time,
            len(h),
        )

    async def _renew(self, held: HeldLease, due: float | None = None) -> None:
        h = self.held
        async with h.lock(held):
            if held.lost:
                return
            if held.state is HeldState.OUTGOING:
                # Not ours to renew; the new owner does. We only have until the handoff timeout.
                if outgoing_timed_out(held.since, h.now(), h.handoff_timeout):
                    h.lose(held, "the handoff was not finished in time")
                return
            if held.state is HeldState.INCOMING and held.watch_only:
                await self.handoffs.watch_incoming(held)
                return
            sent = h.now()
            self._sent_late(due, sent)
            verdict: Verdict | None = None
            delivered = held.bytes_delivered
            kbps = renewal_throughput(
                held.lease.throughput_kbps, delivered, held.throughput_since, sent
            )
            try:
                renewed = await h.store.renew_lease(held.lease, kbps)
                if renewed is None:
                    current, verdict = await h.explain_refusal(held, FailedWrite.renewal())
                    if verdict is Verdict.PASS_ON:
                        # Handed on before we noticed we had it: nothing to drain.
                        assert current is not None
                        await self.handoffs.pass_on_unstarted(held, current)
                        return
                    renewed = h.apply_verdict(held, current, verdict, WriteKind.RENEWAL)
            except (AdapterError, CorruptLeaseError) as exc:
                reason = "throttled" if isinstance(exc, ThrottledError) else "error"
                h.metrics.renewal_failures.labels(*h.labels, reason).inc()
                log.info("renewal of %s failed (%s); will retry", held.key, exc)
                h.check_stale(held)
                return
            if renewed is None:
                return  # lost, or now being handed away: applied by apply_verdict
            late = check_accepted_write(me=h.worker_id, state=held.state, written=renewed)
            if late is not None:
                h.apply_verdict(held, renewed, late, WriteKind.RENEWAL, accepted=True)
                return
            held.renewal_done(renewed, sent=sent, verdict=verdict, delivered=delivered)
            self._renewed.inc()
        await self._after_renewal(held)

    async def _after_renewal(self, held: HeldLease) -> None:
        """Activate an incoming lease once its handoff allows, or ask the shard to let a lease
        go that it must not keep (``release_reason``)."""
        if held.state is HeldState.INCOMING:
            await self.handoffs.after_incoming_renewal(held)
            return
        if held.release_requested:
            return
        why = release_reason(held.lease, self.held.worker_id)
        if why is None:
            return
        held.release_requested = True
        log.info("lease %s: %s; finishing its batch and releasing it", held.key, why)
        self.held.request_stop(held, why)

    async def loop(self) -> None:
        """Renew each held lease every renewer interval, at its own point of the interval; and
        report to the registry every interval, unless early failover's heartbeats write the
        entry. A renewal still under way when its lease is due again is not doubled; the
        renewals run in this loop's task group, so an unexpected error stops the worker."""
        now = self.held.now
        report_due = now()
        reporting: asyncio.Task[None] | None = None
        in_flight: set[str] = set()
        # key -> the handle scheduled (a lease lost and taken again is a new handle, scheduled
        # afresh), and key -> when its renewal is due; the two in the same key order.
        handles: dict[str, HeldLease] = {}
        due_at: dict[str, float] = {}
        synced: int | None = None  # the held leases' version the schedule follows
        async with asyncio.TaskGroup() as renewing:
            while True:
                started = now()
                if synced != self.held.version:
                    synced = self.held.version
                    self._follow_held(handles, due_at, started)
                waiting = (
                    {k: at for k, at in due_at.items() if k not in in_flight}
                    if in_flight
                    else due_at
                )
                due, wake = renewals_due(waiting, started, self.interval)
                for key in due:
                    held, at = handles[key], due_at[key]
                    due_at[key] = renewal_round_due(at, self.interval, started)
                    in_flight.add(key)
                    renewing.create_task(self._renew_scheduled(held, at, in_flight))
                if self.presence.heartbeat_interval is None:
                    if started >= report_due:
                        if reporting is None or reporting.done():
                            reporting = renewing.create_task(self.presence.report())
                        report_due = renewal_round_due(report_due, self.interval, started)
                    wake = min(wake, report_due)
                await asyncio.sleep(max(0.0, wake - now()))

    def _follow_held(
        self, handles: dict[str, HeldLease], due_at: dict[str, float], now: float
    ) -> None:
        """Bring the renewal schedule in line with the held leases: a lease no longer held is
        dropped, one newly held (or lost and taken again: a new handle) is first due at its
        next slot."""
        for key in [k for k in handles if k not in self.held]:
            del handles[key], due_at[key]
        for key, held in self.held.items():
            if handles.get(key) is not held:
                handles[key] = held
                due_at[key] = first_renewal_due(key, now, self.interval)

    async def _renew_scheduled(self, held: HeldLease, due: float, in_flight: set[str]) -> None:
        try:
            await self._renew(held, due)
        finally:
            in_flight.discard(held.key)
