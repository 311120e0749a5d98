"""The lease coordinator: the leases this worker holds, and the writes made through them.

Owns: the held leases (their local counters and renewal times), losing a lease (once, with the
listener told) and letting one go (release), staleness, the fenced writes of a held lease
(checkpoints, childShardIds) and what a refused write of a held lease leads to. Its helpers do
the rest on its table: renewal rounds are ``lease_renewals``'s, the steps of graceful handoffs
``lease_handoffs``'s; taking rounds are ``lease_taking``'s and feed ``held``. Decisions (what is
expired, what to take, what a refused write means, when a handoff times out) come from
``kclasync._core`` (``held_lease``, ``lease_taker``, ``expiry``); this module only applies them.
Must not: read any clock but the event loop's, or touch stream records.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics
from kclasync._adapters.protocols import LeaseStore
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._core.held_lease import (
    Event,
    FailedWrite,
    HeldState,
    Verdict,
    check_accepted_write,
    explain_failed_write,
    is_stale,
)
from kclasync._core.lease import Lease
from kclasync._core.lease_taker import LeaseTaker
from kclasync._core.position import Checkpoint
from kclasync._runtime.held import HeldLease, LeaseListener
from kclasync._runtime.lease_handoffs import LeaseHandoffs
from kclasync._runtime.lease_renewals import LeaseRenewals
from kclasync._runtime.lease_taking import LeaseTaking
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.worker_presence import WorkerPresence
from kclasync.errors import AdapterError, LeaseLostError

log = logging.getLogger("kclasync.leases")


__all__ = ["HeldLease", "HeldState", "LeaseCoordinator", "LeaseListener"]


class _Outcome(NamedTuple):
    """How a fenced write of a held lease ended."""

    written: Lease | None  # the lease as written, when the table took the write
    current: Lease | None  # the lease as read after a refusal
    verdict: Verdict | None  # what the refusal means; None when the write went through
    sent: float  # loop time the (last) write was sent


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
        registry: WorkerRegistry | None = None,
        wall_clock: Callable[[], float] | None = None,
        cpu_reader: CpuReader | None = None,
        max_cpu_percent: int = 100,
        capacity_kbps: float | None = None,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.failover_time = failover_time
        self.renewer_interval = renewer_interval
        self.metrics = metrics
        self.labels = (application, worker_id)
        self.listener = listener
        self._clock = clock
        self.handoff_timeout = handoff_timeout
        self.held: dict[str, HeldLease] = {}
        #: This worker's registry entry and its view of the live workers. Without a registry
        #: (a lone coordinator in a test) a private in-memory one, on the loop clock.
        self.presence = WorkerPresence(
            registry if registry is not None else MemoryWorkerMetrics(),
            worker_id,
            wall_clock=wall_clock if wall_clock is not None else self.now,
            worker_timeout=worker_timeout if worker_timeout is not None else failover_time,
            on_corrupt=metrics.corrupt_worker_entries.labels(*self.labels).set,
            cpu=cpu_reader,
            max_cpu_percent=max_cpu_percent,
            capacity_kbps=capacity_kbps,
            processed_kbps=self.processed_kbps,
            heartbeat_interval=heartbeat_interval,
        )
        #: The steps of graceful handoffs, in both directions.
        self.handoffs = LeaseHandoffs(self)
        #: The renewal rounds of the held leases.
        self.renewals = LeaseRenewals(self)
        #: The taking rounds (scan, plan, take, steal) that feed ``held``.
        self.taking = LeaseTaking(
            self,
            taker=taker,
            interval=taker_interval,
            max_leases_for_worker=max_leases_for_worker,
            max_leases_to_steal=max_leases_to_steal,
            rng=rng,
            graceful_handoff=graceful_handoff,
        )
        # Create the worker's series now, so a scrape shows zeros rather than nothing.
        for family in (
            metrics.renewals,
            metrics.leases_lost,
            metrics.takes,
            metrics.steals,
            metrics.released,
        ):
            family.labels(*self.labels)
        self.update_gauge()

    @property
    def rounds(self) -> int:
        """Taking rounds completed."""
        return self.taking.rounds

    def now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def processed_kbps(self) -> float:
        """The throughput (``throughputKBps`` as last written) of the leases this worker
        processes: active ones and those it is still handing away, not incoming ones."""
        return sum(
            held.lease.throughput_kbps or 0.0
            for held in self.held.values()
            if held.state in (HeldState.ACTIVE, HeldState.OUTGOING)
        )

    def update_gauge(self) -> None:
        self.metrics.leases_held.labels(*self.labels).set(len(self.held))

    # -- losing, releasing -----------------------------------------------------------------

    def lose(self, held: HeldLease, reason: str) -> None:
        if held.lost:
            return
        held.apply(Event.LOSE)
        if self.held.get(held.key) is held:
            del self.held[held.key]
        self.metrics.leases_lost.labels(*self.labels).inc()
        self.update_gauge()
        log.warning("worker %s lost lease %s: %s", self.worker_id, held.key, reason)
        self.listener.lease_lost(held, reason)

    def check_stale(self, held: HeldLease) -> None:
        """Stop treating a lease as held once it has gone unrenewed for the failover time."""
        if not held.lost and is_stale(held.renewed_at, self.now(), self.failover_time):
            self.lose(held, f"not renewed for more than {self.failover_time}s")

    def ensure_held(self, held: HeldLease) -> None:
        """Raise ``LeaseLostError`` unless ``held`` is still ours and renewed within the
        failover time (checked before each batch is delivered: after a stall another worker
        may own the lease by now)."""
        self.check_stale(held)
        if held.lost:
            raise LeaseLostError(held.key, "not renewed within the failover time")

    async def release(self, key: str) -> bool:
        """Let a lease go: finish the handoff if one is under way from us, otherwise remove our
        ownership (conditional on still owning it). True if the table took the write."""
        held = self.held.get(key)
        if held is None:
            return False
        async with held.lock:
            if held.lost:
                return False
            # No more writes through this handle, whatever happens next.
            outgoing = held.apply(Event.RELEASE) is HeldState.OUTGOING
            self.held.pop(key, None)
            self.update_gauge()
            try:
                if outgoing:
                    done = await self.store.finish_handoff(held.lease)
                else:
                    done = await self.store.release_lease(held.lease)
            except AdapterError as exc:
                log.warning("could not release lease %s (it will expire): %s", key, exc)
                return False
        if done is not None:
            self.metrics.released.labels(*self.labels).inc()
            verb = "handed over" if outgoing else "released"
            log.info("worker %s %s lease %s", self.worker_id, verb, key)
        return done is not None

    # -- refused writes ---------------------------------------------------------------------

    async def explain_refusal(
        self, held: HeldLease, write: FailedWrite
    ) -> tuple[Lease | None, Verdict]:
        """Read the lease after the table refused ``write`` and say what the refusal means."""
        current = await self.store.get_lease(held.key)
        verdict = explain_failed_write(
            me=self.worker_id, state=held.state, held=held.lease, current=current, write=write
        )
        return current, verdict

    def apply_verdict(
        self,
        held: HeldLease,
        current: Lease | None,
        verdict: Verdict,
        what: str,
        *,
        accepted: bool = False,
    ) -> Lease | None:
        """Do what ``explain_failed_write`` (or, for a write the table ``accepted``,
        ``check_accepted_write``) decided. Returns the lease to adopt, or None."""
        if verdict in (Verdict.OURS, Verdict.HANDOFF_PROGRESS):
            return current
        if verdict is Verdict.HANDOFF_STARTED:
            assert current is not None
            self.handoffs.start_outgoing(held, current)
            return None
        if what == "renewal":
            self.metrics.renewal_failures.labels(*self.labels, "lost").inc()
        if accepted:
            self.lose(held, f"{what} written, but the item returned names another owner")
        elif what == "renewal":
            self.lose(held, "another worker changed the lease (counter or owner)")
        else:
            self.lose(held, f"{what} rejected: another worker changed the lease")
        return None

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
                return await self.handoffs.checkpoint_outgoing(held, checkpoint, pending)
            self.ensure_held(held)
            outcome = await self._fenced_write(
                held,
                lambda lease: self.store.checkpoint(lease, checkpoint, pending),
                lambda lease: FailedWrite.of_checkpoint(lease, checkpoint, pending),
            )
            if outcome.verdict is None:
                assert outcome.written is not None
                late = check_accepted_write(
                    me=self.worker_id, state=held.state, written=outcome.written
                )
                if late is not None:
                    # Our checkpoint is in the table; the item says the lease is moving on.
                    self.apply_verdict(held, outcome.written, late, "checkpoint", accepted=True)
                    if late is not Verdict.HANDOFF_STARTED:
                        raise LeaseLostError(key, "another worker changed the lease")
                return outcome.written
            written = self.apply_verdict(held, outcome.current, outcome.verdict, "checkpoint")
            if outcome.verdict is Verdict.HANDOFF_STARTED:
                # A handoff began under us: checkpoint as the old owner, then let go.
                return await self.handoffs.checkpoint_outgoing(held, checkpoint, pending)
            if written is None:
                raise LeaseLostError(key, "the checkpoint was rejected by the lease table")
            held.lease, held.renewed_at = written, outcome.sent
            return written

    async def write_child_shard_ids(self, key: str, child_ids: frozenset[str]) -> bool:
        """Record a finished lease's children, fenced like a checkpoint and under the lease's
        lock so it never races a renewal. False if the lease changed (the leader's shard sync
        writes them later)."""
        held = self.held.get(key)
        if held is None:
            return False
        async with held.lock:
            if held.lost:
                return False
            outcome = await self._fenced_write(
                held,
                lambda lease: self.store.update_child_shard_ids(lease, child_ids),
                lambda lease: FailedWrite.of_child_shard_ids(child_ids),
            )
            if outcome.verdict is None:
                return True
            # Not being able to write them loses nothing: the lease is finished anyway.
            if outcome.verdict is not Verdict.OURS or outcome.current is None:
                log.warning("could not write childShardIds of %s: the lease changed", key)
                return False
            held.lease, held.renewed_at = outcome.current, outcome.sent
            return True

    async def _fenced_write(
        self,
        held: HeldLease,
        write: Callable[[Lease], Awaitable[Lease | None]],
        failed: Callable[[Lease], FailedWrite],
    ) -> _Outcome:
        """A conditional write of a held lease (called with its lock held), tried again once
        when a renewal of ours went through first. When the table took it, ``held`` carries
        the written lease, credited as a renewal at ``sent``; otherwise ``verdict`` is what
        ``explain_failed_write`` made of the refusal, for the caller to apply."""
        for attempt in (1, 2):
            sent = self.now()
            written = await write(held.lease)
            if written is not None:
                held.lease = written
                held.renewed_at = sent
                return _Outcome(written, None, None, sent)
            current, verdict = await self.explain_refusal(held, failed(held.lease))
            if verdict is Verdict.RETRY and attempt == 1 and current is not None:
                held.lease = current  # a renewal of ours went through first
                continue
            return _Outcome(None, current, verdict, sent)
        raise AssertionError("unreachable")

    # -- renewing (``lease_renewals``) -----------------------------------------------------

    async def renew_all(self) -> None:
        """One renewal round over every held lease."""
        await self.renewals.renew_all()

    async def renewer_loop(self) -> None:
        await self.renewals.loop()
