"""The lease coordinator: renewer and taker loops, fenced checkpoints and releases.

Owns: the set of leases this worker holds, their local counters and renewal times, and applying
the taker's plans through the ``LeaseStore``. Decisions (what is expired, what to take) come from
``kclasync._core``.
Must not: read any clock but the event loop's, or touch stream records.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import random
from collections.abc import Callable
from typing import Protocol

import attrs

from kclasync._adapters.protocols import LeaseStore
from kclasync._core.expiry import ExpiryTracker
from kclasync._core.lease import CorruptLeaseError, Lease, StickyMode
from kclasync._core.lease_taker import LeaseTaker, TakePlan, TakeView
from kclasync._core.position import Checkpoint
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync.errors import AdapterError, LeaseLostError, ThrottledError

log = logging.getLogger("kclasync.leases")


class HeldState(enum.Enum):
    ACTIVE = "active"  # ours; its pipeline runs
    INCOMING = "incoming"  # handed to us; waiting for the old owner's final checkpoint
    OUTGOING = "outgoing"  # being handed away; our pipeline finishes, checkpoints, lets go


@attrs.define(eq=False)
class HeldLease:
    """A lease this worker holds, with the local state that fences its writes."""

    lease: Lease
    #: Loop time at which the last successful counter-changing write was sent.
    renewed_at: float
    lock: asyncio.Lock = attrs.field(factory=asyncio.Lock)
    lost: bool = False
    state: HeldState = HeldState.ACTIVE
    #: Loop time a handoff (either way) started.
    since: float = 0.0
    #: Sticky=20 was seen: the pipeline is stopping and the lease will be released.
    release_requested: bool = False

    @property
    def key(self) -> str:
        return self.lease.key


class LeaseListener(Protocol):
    def lease_acquired(self, held: HeldLease) -> None:
        """The lease is ours to process: start its pipeline."""

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        """The lease is gone: stop its pipeline at once."""

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        """Finish the batch in flight, let the processor checkpoint, then call ``release``."""


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
        max_leases_to_steal: int | None,
        metrics: ConsumerMetrics,
        application: str,
        listener: LeaseListener,
        rng: random.Random,
        clock: Callable[[], float] | None = None,
        graceful_handoff: bool = False,
        handoff_timeout: float = 30.0,
        worker_timeout: float | None = None,
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
        self.graceful_handoff = graceful_handoff
        self.handoff_timeout = handoff_timeout
        self.workers = ExpiryTracker(
            worker_timeout if worker_timeout is not None else failover_time
        )
        #: Workers judged live at the last scan (registry heartbeats), this one included.
        self.live_workers: frozenset[str] = frozenset({worker_id})
        self._reported_sticky: set[str] = set()
        #: Taking rounds completed (for tests, benchmarks and the demo).
        self.rounds = 0
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
        """Let a lease go: finish the handoff if one is under way from us, otherwise remove our
        ownership (conditional on still owning it). True if the table took the write."""
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
                if held.state is HeldState.OUTGOING:
                    done = await self.store.finish_handoff(held.lease)
                else:
                    done = await self.store.release_lease(held.lease)
            except AdapterError as exc:
                log.warning("could not release lease %s (it will expire): %s", key, exc)
                return False
        if done is not None:
            self.metrics.released.labels(*self.labels).inc()
            verb = "handed over" if held.state is HeldState.OUTGOING else "released"
            log.info("worker %s %s lease %s", self.worker_id, verb, key)
        return done is not None

    # -- renewing --------------------------------------------------------------------------

    async def renew_all(self) -> None:
        await asyncio.gather(*(self._renew(h) for h in list(self.held.values())))

    async def heartbeat(self) -> None:
        try:
            await self.store.heartbeat_worker(self.worker_id)
        except AdapterError as exc:
            log.info("worker heartbeat failed: %s", exc)

    async def _renew(self, held: HeldLease) -> None:
        async with held.lock:
            if held.lost:
                return
            if held.state is HeldState.OUTGOING:
                # Not ours to renew; the new owner does. We only have until the handoff timeout.
                if self.now() - held.since > self.handoff_timeout:
                    self._lose(held, "the handoff was not finished in time")
                return
            sent = self.now()
            try:
                renewed = await self.store.renew_lease(held.lease)
                confirmed = renewed is not None
                if renewed is None:
                    current = await self.store.get_lease(held.key)
                    if (
                        current is not None
                        and held.state is HeldState.INCOMING
                        and current.checkpoint_owner == self.worker_id
                        and current.owner != self.worker_id
                    ):
                        # Handed back before we noticed we had it: we never read from it, so
                        # there is nothing to drain; complete the new handoff at once.
                        await self._pass_on_unstarted(held, current)
                        return
                    renewed = self._reconcile_renewal(held, current)
            except (AdapterError, CorruptLeaseError) as exc:
                reason = "throttled" if isinstance(exc, ThrottledError) else "error"
                self.metrics.renewal_failures.labels(*self.labels, reason).inc()
                log.info("renewal of %s failed (%s); will retry", held.key, exc)
                self._check_stale(held)
                return
            if renewed is None:
                return  # lost, or now being handed away: handled by _reconcile_renewal
            held.lease = renewed
            if confirmed:
                # Only a write sent now renews the lease now. After a reconciled failure the
                # write that counted was an earlier attempt, sent before ``sent``; crediting
                # ``sent`` would let this worker outlive the expiry others compute (found by
                # the simulation: 50 workers x 500 shards, seed 7). The next renewal refreshes.
                held.renewed_at = sent
            self.metrics.renewals.labels(*self.labels).inc()
        await self._after_renewal(held)

    def _reconcile_renewal(self, held: HeldLease, current: Lease | None) -> Lease | None:
        """Explain a failed renewal condition from a fresh read of the lease."""
        me = self.worker_id
        if current is not None and current.owner == me:
            if current.counter == held.lease.counter + 1:
                return current  # our own earlier attempt went through (a retried request)
            if held.state is HeldState.INCOMING and current.checkpoint_owner in (
                None,
                held.lease.checkpoint_owner,
            ):
                return current  # the old owner finished (or checkpointed) the handoff
        if (
            current is not None
            and current.checkpoint_owner == me
            and current.owner != me
            and held.state is HeldState.ACTIVE
        ):
            self._start_outgoing(held, current)
            return None
        self.metrics.renewal_failures.labels(*self.labels, "lost").inc()
        self._lose(held, "another worker changed the lease (counter or owner)")
        return None

    async def _pass_on_unstarted(self, held: HeldLease, current: Lease) -> None:
        held.lost = True
        if self.held.get(held.key) is held:
            del self.held[held.key]
        self._update_gauge()
        done = await self.store.finish_handoff(current)
        log.info(
            "worker %s passed lease %s on to %s before starting it (%s)",
            self.worker_id,
            held.key,
            current.owner,
            "done" if done is not None else "the lease changed meanwhile",
        )

    def _start_outgoing(self, held: HeldLease, current: Lease) -> None:
        held.state = HeldState.OUTGOING
        held.since = self.now()
        held.lease = current
        log.info("worker %s hands lease %s over to %s", self.worker_id, held.key, current.owner)
        self.listener.lease_stop_requested(held, f"handoff to {current.owner}")

    async def _after_renewal(self, held: HeldLease) -> None:
        lease = held.lease
        if held.state is HeldState.INCOMING:
            waited = self.now() - held.since
            if lease.checkpoint_owner is None:
                self._activate(held, "the old owner finished the handoff")
            elif waited > self.handoff_timeout or (
                # The old owner stopped heartbeating: it will never finish; do not wait for
                # the handoff timeout.
                lease.checkpoint_owner not in self.live_workers
                and waited > self.workers.failover_time
            ):
                await self._force_handoff(held)
            return
        if held.release_requested:
            return
        if lease.sticky_mode is StickyMode.RELEASE:
            why = "Sticky=20"
        elif lease.sticky_mode is StickyMode.PINNED and lease.sticky_worker not in (
            None,
            self.worker_id,
        ):
            why = f"pinned to {lease.sticky_worker}"
        else:
            return
        held.release_requested = True
        log.info("lease %s: %s; finishing its batch and releasing it", held.key, why)
        self.listener.lease_stop_requested(held, why)

    def _activate(self, held: HeldLease, why: str) -> None:
        held.state = HeldState.ACTIVE
        log.info("worker %s starts lease %s: %s", self.worker_id, held.key, why)
        self.listener.lease_acquired(held)

    async def _force_handoff(self, held: HeldLease) -> None:
        async with held.lock:
            if held.lost or held.state is not HeldState.INCOMING:
                return
            sent = self.now()
            try:
                taken = await self.store.take_lease(held.lease, self.worker_id)
            except (AdapterError, CorruptLeaseError) as exc:
                log.info("forcing the handoff of %s failed: %s", held.key, exc)
                return
            if taken is None:
                self._lose(held, "the lease changed while waiting for the handoff")
                return
            held.lease = taken
            held.renewed_at = sent
        log.warning(
            "the old owner of %s did not finish the handoff (dead, or slower than %ss); "
            "taking the lease over",
            held.key,
            self.handoff_timeout,
        )
        self._activate(held, "handoff forced")

    # -- checkpointing ---------------------------------------------------------------------

    async def checkpoint(
        self, key: str, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease:
        """Fenced checkpoint write. Raises LeaseLostError when the lease is not ours any more.

        During a handoff away from this worker the old owner may still checkpoint (fenced by
        ``checkpointOwner``) until the new owner forces the transfer.
        """
        held = self.held.get(key)
        if held is None or held.lost:
            raise LeaseLostError(key)
        async with held.lock:
            if held.lost:
                raise LeaseLostError(key)
            if held.state is HeldState.OUTGOING:
                return await self._checkpoint_outgoing(held, checkpoint, pending)
            self._check_stale(held)
            if held.lost:
                raise LeaseLostError(key, "not renewed within the failover time")
            sent = self.now()
            written = await self.store.checkpoint(held.lease, checkpoint, pending)
            if written is None:
                current = await self.store.get_lease(key)
                expected = held.lease.checkpoint if pending is not None else checkpoint
                if (
                    current is not None
                    and current.owner == self.worker_id
                    and current.counter == held.lease.counter + 1
                    and current.checkpoint == expected
                ):
                    written = current  # our own retried request went through
                elif (
                    current is not None
                    and current.checkpoint_owner == self.worker_id
                    and current.owner != self.worker_id
                ):
                    # A handoff began under us: checkpoint as the old owner, then let go.
                    self._start_outgoing(held, current)
                    return await self._checkpoint_outgoing(held, checkpoint, pending)
            if written is None:
                self._lose(held, "checkpoint rejected: another worker changed the lease")
                raise LeaseLostError(key, "the checkpoint was rejected by the lease table")
            held.lease = written
            held.renewed_at = sent
            return written

    async def _checkpoint_outgoing(
        self, held: HeldLease, checkpoint: Checkpoint, pending: Checkpoint | None
    ) -> Lease:
        if self.now() - held.since > self.handoff_timeout:
            self._lose(held, "the handoff was not finished in time")
            raise LeaseLostError(held.key, "the handoff timed out")
        written = await self.store.checkpoint(held.lease, checkpoint, pending)
        if written is None:
            self._lose(held, "the new owner took over before our final checkpoint")
            raise LeaseLostError(held.key, "the new owner forced the handoff")
        held.lease = written
        return written

    # -- taking ----------------------------------------------------------------------------

    def _report_corrupt(self, corrupt: tuple[CorruptLeaseError, ...]) -> None:
        self.metrics.corrupt_leases.labels(*self.labels).set(len(corrupt))
        keys = {exc.lease_key for exc in corrupt}
        for exc in corrupt:
            if exc.lease_key not in self._reported_corrupt:
                log.error("%s; this lease is skipped until it is repaired", exc)
        self._reported_corrupt = keys

    def _report_sticky(self, leases: tuple[Lease, ...]) -> None:
        for lease in leases:
            if lease.sticky is not None and lease.sticky_mode is None:
                if lease.key not in self._reported_sticky:
                    self._reported_sticky.add(lease.key)
                    log.warning(
                        "lease %s has an unknown Sticky value (%s); treating it as normal "
                        "(use -1/0 normal, 10 pinned, 20 release)",
                        lease.key,
                        lease.sticky,
                    )
            else:
                self._reported_sticky.discard(lease.key)

    async def take_round(self) -> TakePlan:
        """Scan the table once, plan and apply takes. Returns what was actually acquired."""
        scan = await self.store.list_leases()
        now = self.now()
        self._report_corrupt(scan.corrupt)
        self._report_sticky(scan.leases)
        self.last_scan = scan.leases
        self.expiry.observe(scan.leases, now)
        self.workers.observe(
            (Lease(key=w.worker_id, owner=w.worker_id, counter=w.heartbeat) for w in scan.workers),
            now,
        )
        self.live_workers = frozenset(
            w.worker_id
            for w in scan.workers
            if not self.workers.is_expired(
                Lease(key=w.worker_id, owner=w.worker_id, counter=w.heartbeat), now
            )
        ) | {self.worker_id}
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
            live_workers=self.live_workers,
        )
        plan = self.taker.plan(view, self.rng)
        by_key = {lease.key: lease for lease in scan.leases}
        take = [by_key[lease.key] for lease in plan.take]
        steal = [by_key[lease.key] for lease in plan.steal]
        results = await asyncio.gather(
            *(self._take(lease, stolen=False) for lease in take),
            *(self._steal(lease) for lease in steal),
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
            f" from {lease.owner}" if stolen and lease.owner else "",
        )
        self.listener.lease_acquired(held)
        return taken

    async def _steal(self, lease: Lease) -> Lease | None:
        """A planned move. With graceful handoff the old owner finishes and checkpoints first."""
        if not self.graceful_handoff or lease.owner is None:
            return await self._take(lease, stolen=True)
        if lease.key in self.held:
            return None
        sent = self.now()
        try:
            started = await self.store.start_handoff(lease, self.worker_id)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("starting the handoff of %s failed: %s", lease.key, exc)
            return None
        if started is None:
            return None
        held = HeldLease(lease=started, renewed_at=sent, state=HeldState.INCOMING, since=sent)
        self.held[started.key] = held
        self.metrics.steals.labels(*self.labels).inc()
        self._update_gauge()
        log.info("worker %s asked %s to hand over lease %s", self.worker_id, lease.owner, lease.key)
        return started

    # -- loops -----------------------------------------------------------------------------

    async def renewer_loop(self) -> None:
        while True:
            started = self.now()
            await asyncio.gather(self.renew_all(), self.heartbeat())
            await asyncio.sleep(max(0.0, self.renewer_interval - (self.now() - started)))

    async def taker_loop(self, wake: asyncio.Event | None = None, first_delay: float = 0.0) -> None:
        """Take rounds forever. ``first_delay``: register in the worker registry and wait this
        long before the first round, so that workers started together see each other and the
        first round already spreads the leases evenly."""
        if first_delay > 0:
            await self.heartbeat()
            await asyncio.sleep(first_delay)
        while True:
            started = self.now()
            try:
                await self.take_round()
            except AdapterError as exc:
                log.warning("lease taking round failed: %s", exc)
            self.rounds += 1
            delay = max(0.0, self.taker_interval - (self.now() - started))
            if wake is None:
                await asyncio.sleep(delay)
            else:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), delay)
                wake.clear()
