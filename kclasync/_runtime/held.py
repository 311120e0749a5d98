"""The leases this worker holds, and the writes made through them.

Owns: ``HeldLeases``, the one table of held leases (``kclasync._core.leases.held_lease.HeldLease``
states, each with a lock so that its writes never race), adding a lease taken or handed to us,
losing a lease (once, with the listener told), letting one go (release), staleness, the fenced
writes of a held lease (checkpoints, childShardIds; during an outgoing handoff the old owner's
checkpoints), and applying what a refused write means; and the ``LeaseListener`` protocol.
The decisions (what a refused write means, when a lease is stale, when an outgoing handoff has
timed out) are ``kclasync._core.leases.held_lease``'s; this module only applies them.
Must not: take, renew or hand over leases on its own (``lease_taking``, ``lease_renewals``,
``lease_handoffs`` do, through this object), import any of those modules, or read any clock
but the one it is given (the event loop's).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable, ItemsView, Iterator, Mapping, ValuesView
from typing import Literal, NamedTuple, Protocol

from kclasync._adapters.protocols import LeaseStore
from kclasync._core.leases.held_lease import (
    Event,
    FailedWrite,
    HeldLease,
    HeldState,
    Verdict,
    WriteKind,
    check_accepted_write,
    explain_failed_write,
    is_stale,
    outgoing_timed_out,
)
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync.errors import AdapterError, LeaseLostError

log = logging.getLogger("kclasync.leases")

__all__ = ["HeldLease", "HeldLeases", "HeldState", "LeaseListener"]


class LeaseListener(Protocol):
    def lease_acquired(self, held: HeldLease) -> None:
        """The lease is ours to process: start its pipeline."""

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        """The lease is gone: stop its pipeline at once."""

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        """Finish the batch in flight, let the processor checkpoint, then call ``release``."""


class _Outcome(NamedTuple):
    """How a fenced write of a held lease ended."""

    written: Lease | None  # the lease as written, when the table took the write
    current: Lease | None  # the lease as read after a refusal
    verdict: Verdict | None  # what the refusal means; None when the write went through
    sent: float  # loop time the (last) write was sent


_WHAT = {
    WriteKind.RENEWAL: "renewal",
    WriteKind.CHECKPOINT: "checkpoint",
    WriteKind.CHILD_SHARD_IDS: "childShardIds",
}


class HeldLeases(Mapping[str, HeldLease]):
    """The held leases of one worker, by key; every write of a held lease goes through here."""

    def __init__(
        self,
        *,
        store: LeaseStore,
        worker_id: str,
        failover_time: float,
        handoff_timeout: float,
        metrics: ConsumerMetrics,
        application: str,
        listener: LeaseListener,
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self.failover_time = failover_time
        self.handoff_timeout = handoff_timeout
        self.metrics = metrics
        self.labels = (application, worker_id)
        #: Told when a lease starts, must stop, or is lost (the shard supervisor, once built).
        self.listener = listener
        self.now = clock
        self._held: dict[str, HeldLease] = {}
        #: Bumped whenever a lease is added or dropped: the renewer re-reads the held leases
        #: only when it changed.
        self.version = 0
        self._locks: weakref.WeakKeyDictionary[HeldLease, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
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

    # -- the table --------------------------------------------------------------------------

    def __getitem__(self, key: str) -> HeldLease:
        return self._held[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._held)

    def __len__(self) -> int:
        return len(self._held)

    # The dict's own lookups and views: the renewer asks them for every held lease at every
    # wake-up, and ``Mapping``'s defaults go through ``__getitem__`` and a caught KeyError.
    def __contains__(self, key: object) -> bool:
        return key in self._held

    def items(self) -> ItemsView[str, HeldLease]:
        return self._held.items()

    def values(self) -> ValuesView[HeldLease]:
        return self._held.values()

    def lock(self, held: HeldLease) -> asyncio.Lock:
        """The lock every write of ``held`` is made under."""
        lock = self._locks.get(held)
        if lock is None:
            lock = self._locks[held] = asyncio.Lock()
        return lock

    def add(self, held: HeldLease, *, counted_as: Literal["take", "steal"] | None) -> None:
        """Hold a lease just taken or stolen, or handed to us (counted as a take, a steal, or
        not at all: a leader's assignment); an ACTIVE one starts its pipeline."""
        self._held[held.key] = held
        self.version += 1
        if counted_as is not None:
            family = self.metrics.takes if counted_as == "take" else self.metrics.steals
            family.labels(*self.labels).inc()
        self.update_gauge()
        if held.state is HeldState.ACTIVE:
            self.listener.lease_acquired(held)

    def update_gauge(self) -> None:
        self.metrics.leases_held.labels(*self.labels).set(len(self._held))

    def processed_kbps(self) -> float:
        """The throughput (``throughputKBps`` as last written) of the leases this worker
        processes: active ones and those it is still handing away, not incoming ones."""
        return sum(
            held.lease.throughput_kbps or 0.0
            for held in self._held.values()
            if held.state in (HeldState.ACTIVE, HeldState.OUTGOING)
        )

    def _drop(self, held: HeldLease) -> None:
        if self._held.get(held.key) is held:
            del self._held[held.key]
            self.version += 1
        self.update_gauge()

    # -- losing, stopping, releasing ------------------------------------------------------

    def lose(self, held: HeldLease, reason: str) -> None:
        if held.lost:
            return
        held.apply(Event.LOSE)
        self._drop(held)
        self.metrics.leases_lost.labels(*self.labels).inc()
        log.warning("worker %s lost lease %s: %s", self.worker_id, held.key, reason)
        self.listener.lease_lost(held, reason)

    def is_stale(self, held: HeldLease) -> bool:
        return is_stale(held.renewed_at, self.now(), self.failover_time)

    def check_stale(self, held: HeldLease) -> None:
        """Stop treating a lease as held once it has gone unrenewed for the failover time."""
        if not held.lost and self.is_stale(held):
            self.lose(held, f"not renewed for more than {self.failover_time}s")

    def ensure_held(self, held: HeldLease) -> None:
        """Raise ``LeaseLostError`` unless ``held`` is still ours and renewed within the
        failover time (checked before each batch is delivered: after a stall another worker
        may own the lease by now)."""
        self.check_stale(held)
        if held.lost:
            raise LeaseLostError(held.key, "not renewed within the failover time")

    def request_stop(self, held: HeldLease, reason: str) -> None:
        """Ask the lease's pipeline to finish its batch, checkpoint, and let the lease go."""
        self.listener.lease_stop_requested(held, reason)

    def let_go(self, held: HeldLease) -> HeldState:
        """No more writes through ``held`` (it is released, or passed on); returns the state
        it left."""
        left = held.apply(Event.RELEASE)
        self._drop(held)
        return left

    async def release(self, key: str) -> bool:
        """Let a lease go: finish the handoff if one is under way from us, otherwise remove our
        ownership (conditional on still owning it). True if the table took the write."""
        held = self._held.get(key)
        if held is None:
            return False
        async with self.lock(held):
            if held.lost:
                return False
            # No more writes through this handle, whatever happens next.
            outgoing = self.let_go(held) is HeldState.OUTGOING
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
        kind: WriteKind,
        *,
        accepted: bool = False,
    ) -> Lease | None:
        """Do what ``explain_failed_write`` (or, for a write the table ``accepted``,
        ``check_accepted_write``) decided about a write of ``kind``. Returns the lease to
        adopt, or None."""
        if verdict in (Verdict.OURS, Verdict.HANDOFF_PROGRESS):
            return current
        if verdict is Verdict.HANDOFF_STARTED:
            assert current is not None
            self.start_outgoing(held, current)
            return None
        what = _WHAT[kind]
        if kind is WriteKind.RENEWAL:
            self.metrics.renewal_failures.labels(*self.labels, "lost").inc()
        if accepted:
            self.lose(held, f"{what} written, but the item returned names another owner")
        elif kind is WriteKind.RENEWAL:
            self.lose(held, "another worker changed the lease (counter or owner)")
        else:
            self.lose(held, f"{what} rejected: another worker changed the lease")
        return None

    # -- handing a lease away -------------------------------------------------------------

    def start_outgoing(self, held: HeldLease, current: Lease) -> None:
        """The table names a new owner: stop the shard; its final checkpoint may still be
        written (fenced by ``checkpointOwner``) until the handoff timeout."""
        held.handed_away(current, self.now())
        log.info("worker %s hands lease %s over to %s", self.worker_id, held.key, current.owner)
        self.request_stop(held, f"handoff to {current.owner}")

    async def _checkpoint_outgoing(
        self, held: HeldLease, checkpoint: Checkpoint, pending: Checkpoint | None
    ) -> Lease:
        """The old owner's checkpoint during the handoff. Raises ``LeaseLostError`` once the
        handoff timed out or the new owner forced it."""
        if outgoing_timed_out(held.since, self.now(), self.handoff_timeout):
            self.lose(held, "the handoff was not finished in time")
            raise LeaseLostError(held.key, "the handoff timed out")
        written = await self.store.checkpoint(held.lease, checkpoint, pending)
        if written is None:
            self.lose(held, "the new owner took over before our final checkpoint")
            raise LeaseLostError(held.key, "the new owner forced the handoff")
        held.lease = written
        return written

    # -- fenced writes ----------------------------------------------------------------------

    async def checkpoint(
        self, key: str, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease:
        """Fenced checkpoint write. Raises LeaseLostError when the lease is not ours any more.

        During a handoff away from this worker the old owner may still checkpoint (fenced by
        ``checkpointOwner``) until the new owner forces the transfer.
        """
        held = self._held.get(key)
        if held is None or held.lost:
            raise LeaseLostError(key)
        async with self.lock(held):
            if held.lost:
                raise LeaseLostError(key)
            if held.state is HeldState.OUTGOING:
                return await self._checkpoint_outgoing(held, checkpoint, pending)
            self.ensure_held(held)
            outcome = await self._fenced_write(
                held,
                lambda lease: self.store.checkpoint(lease, checkpoint, pending),
                lambda lease: FailedWrite.of_checkpoint(lease, checkpoint, pending),
            )
            kind = WriteKind.CHECKPOINT
            if outcome.verdict is None:
                assert outcome.written is not None
                late = check_accepted_write(
                    me=self.worker_id, state=held.state, written=outcome.written
                )
                if late is not None:
                    # Our checkpoint is in the table; the item says the lease is moving on.
                    self.apply_verdict(held, outcome.written, late, kind, accepted=True)
                    if late is not Verdict.HANDOFF_STARTED:
                        raise LeaseLostError(key, "another worker changed the lease")
                return outcome.written
            written = self.apply_verdict(held, outcome.current, outcome.verdict, kind)
            if outcome.verdict is Verdict.HANDOFF_STARTED:
                # A handoff began under us: checkpoint as the old owner, then let go.
                return await self._checkpoint_outgoing(held, checkpoint, pending)
            if written is None:
                raise LeaseLostError(key, "the checkpoint was rejected by the lease table")
            held.wrote(written, outcome.sent)
            return written

    async def write_child_shard_ids(self, key: str, child_ids: frozenset[str]) -> bool:
        """Record a finished lease's children, fenced like a checkpoint and under the lease's
        lock so it never races a renewal. False if the lease changed (the leader's shard sync
        writes them later)."""
        held = self._held.get(key)
        if held is None:
            return False
        async with self.lock(held):
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
            held.wrote(outcome.current, outcome.sent)
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
                held.wrote(written, sent)
                return _Outcome(written, None, None, sent)
            current, verdict = await self.explain_refusal(held, failed(held.lease))
            if verdict is Verdict.RETRY and attempt == 1 and current is not None:
                held.lease = current  # a renewal of ours went through first
                continue
            return _Outcome(None, current, verdict, sent)
        raise AssertionError("unreachable")
