"""Iterating a consumer's batches: ``async for batch in consumer.batches()``.

An adapter between the per-shard processor contract and one queue, not a pipeline of its own:
every held lease runs the ordinary shard pipeline (``_runtime.shard_consumer``) with a
``_ShardFeed`` as its processor. ``process_records`` puts the batch on the consumer's queue and
waits until the loop has finished with it (asked for the next batch), so a shard's next batch is
never yielded before the previous one was finished, while batches of different shards
interleave. A lost lease cancels the pipeline as for any processor, which withdraws the shard's
batch still in the queue; commits go through the shard's checkpointer and are fenced like a
processor's.

Owns: the queue between pipelines and the loop, when a batch counts as finished or withdrawn,
and closing the iteration (withdraw what was not yielded, stop the consumer gracefully).
Must not: read Kinesis or write the lease table itself (the pipeline and its checkpointer do),
decide lease ownership or staleness (``_runtime.held``, ``_core.held_lease``), or import the
``Consumer`` (it is given as the ``_Runner`` it uses) or reach into the worker (it is given the
worker's ``HeldLeases``, once there is one).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import TracebackType
from typing import Protocol

from kclasync._core.leases.held_lease import HeldLease
from kclasync._processor import Checkpointer, RecordProcessor, ShardInfo
from kclasync._records import Record
from kclasync._runtime.held import HeldLeases
from kclasync.errors import InvalidCheckpointError, LeaseLostError

__all__ = ["BatchFeed", "BatchIterator", "ShardBatch"]


class _Runner(Protocol):
    """What the iteration needs of the ``Consumer`` it belongs to."""

    worker_id: str
    #: The task running ``run()`` in the background (None until started).
    _background: asyncio.Task[None] | None
    _stop_requested: asyncio.Event

    @property
    def _running(self) -> bool:
        """Whether ``run()`` has built its worker (it runs)."""

    async def run(self) -> None: ...

    async def stop(self) -> None: ...


class ShardBatch:
    """One batch of one shard, as fetched, with its checkpoint handle.

    ``await batch.commit()`` checkpoints at the batch's last record, ``commit(record)`` at one of
    its records; ``persist=False`` buffers the position as ``Checkpointer.checkpoint`` does.
    A commit after the lease was lost raises ``LeaseLostError``; ``stale`` says so beforehand.
    """

    __slots__ = (
        "_checkpointer",
        "_finished",
        "_shard_feed",
        "_yielded",
        "millis_behind_latest",
        "records",
        "shard",
    )

    def __init__(
        self,
        records: Sequence[Record],
        shard: ShardInfo,
        millis_behind_latest: int | None,
        checkpointer: Checkpointer,
        shard_feed: _ShardFeed,
    ) -> None:
        #: The records, in shard order (KPL aggregates already unpacked).
        self.records: Sequence[Record] = records
        #: The shard (stream, shard id, lease key, parents) the records come from.
        self.shard: ShardInfo = shard
        #: How far the read was behind the tip of the shard, when Kinesis said.
        self.millis_behind_latest: int | None = millis_behind_latest
        self._checkpointer = checkpointer
        self._shard_feed = shard_feed
        # Done once the loop finished with the batch, or when it was withdrawn unyielded.
        self._finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._yielded = False

    @property
    def shard_id(self) -> str:
        return self.shard.shard_id

    @property
    def stream(self) -> str:
        return self.shard.stream

    @property
    def stale(self) -> bool:
        """True once this worker no longer holds the shard's lease for this batch (lost, let
        go, or unrenewed for the failover time): a ``commit()`` would raise LeaseLostError."""
        return self._shard_feed.stale()

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[Record]:
        return iter(self.records)

    def __repr__(self) -> str:
        first, last = self.records[0], self.records[-1]
        return (
            f"ShardBatch({self.shard.lease_key}, {len(self.records)} records, "
            f"{first.sequence_number}..{last.sequence_number})"
        )

    async def commit(self, record: Record | None = None, *, persist: bool = True) -> None:
        """Checkpoint at ``record`` (one of this batch's), or at the batch's last record.

        Raises ``LeaseLostError`` when the lease is not this worker's any more (the write is
        fenced by the lease counter, as a processor's), ``InvalidCheckpointError`` for a record
        of another batch or a position before the current checkpoint, and
        ``ThrottledError``/``TransientError`` when the table could not be reached (safe to
        call again). ``persist=False`` keeps the position in memory; it is written within
        ``checkpoint_interval`` seconds and always before a stop, a handoff or SHARD_END."""
        target = self.records[-1] if record is None else record
        if record is not None and not self._contains(record):
            raise InvalidCheckpointError(
                f"record {record.sequence_number}/{record.sub_sequence_number} of shard "
                f"{record.shard_id} is not in this batch of shard {self.shard.lease_key}"
            )
        self._shard_feed.ensure_held()
        await self._checkpointer.checkpoint(
            target.sequence_number, target.sub_sequence_number, persist=persist
        )

    def _contains(self, record: Record) -> bool:
        first, last = self.records[0], self.records[-1]
        return (
            record.shard_id == self.shard.shard_id
            and record.stream == first.stream
            and first.position <= record.position <= last.position
        )

    def _finish(self) -> None:
        if not self._finished.done():
            self._finished.set_result(None)


class _ShardFeed:
    """The record processor of one shard: hands each batch to the queue and waits for it."""

    def __init__(self, feed: BatchFeed) -> None:
        self._feed = feed
        self._shard: ShardInfo | None = None
        self._held: HeldLease | None = None
        #: A batch of this shard was withdrawn unprocessed: SHARD_END must not be written.
        self._withdrew = False

    def stale(self) -> bool:
        held, leases = self._held, self._feed.leases()
        if held is None or held.lost or leases is None:
            return True
        return leases.is_stale(held)

    def ensure_held(self) -> None:
        """The check a pipeline makes before each batch: raises LeaseLostError if the lease is
        lost or stale (a stale one is then lost through the route that stops its pipeline)."""
        held, leases = self._held, self._feed.leases()
        if held is None or leases is None:
            raise LeaseLostError(self._shard.lease_key if self._shard else "?")
        leases.ensure_held(held)

    def stop_pipeline(self) -> None:
        """Ask this shard's pipeline to stop after the batch in flight, as a stop does."""
        held, leases = self._held, self._feed.leases()
        if held is not None and leases is not None and not held.lost:
            leases.request_stop(held, "the batch iteration ended")

    async def initialize(self, shard: ShardInfo) -> None:
        self._shard = shard
        leases = self._feed.leases()
        self._held = leases.get(shard.lease_key) if leases is not None else None
        self._feed.shards.add(self)

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        assert self._shard is not None
        batch = ShardBatch(records, self._shard, millis_behind_latest, checkpointer, self)
        if not self._feed.closed:
            self._feed.queue.put_nowait(batch)
            try:
                await batch._finished
            except asyncio.CancelledError:
                # The lease was lost (or the consumer cancelled): the loop skips the batch.
                self._withdrew = True
                raise
        if not batch._yielded:
            # Withdrawn: the iteration ended first. Not checkpointed; the pipeline stops.
            self._withdrew = True
            self.stop_pipeline()

    async def lease_lost(self) -> None:
        self._feed.shards.discard(self)

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        self._feed.shards.discard(self)
        if not self._withdrew:  # every batch of the shard was handed to the loop
            await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        # Only what the loop committed is checkpointed; the pipeline writes the buffered
        # (persist=False) position after this returns.
        self._feed.shards.discard(self)


class BatchFeed:
    """A consumer's end of the queue: the processors feeding it and the loop reading it."""

    def __init__(self, leases: Callable[[], HeldLeases | None]) -> None:
        #: The running worker's held leases (None before it runs).
        self.leases = leases
        #: At most one batch per shard: each shard's processor waits until its batch finished.
        self.queue: asyncio.Queue[ShardBatch] = asyncio.Queue()
        self.shards: set[_ShardFeed] = set()
        self.closed = False
        #: The error that stopped the consumer was raised from the iteration already.
        self.failure_raised = False
        self.iterating = False
        #: The batch the loop is working on (yielded, not finished yet).
        self.current: ShardBatch | None = None

    def new_processor(self) -> RecordProcessor:
        return _ShardFeed(self)

    def accept(self, batch: ShardBatch) -> bool:
        """Whether a batch taken from the queue may be yielded: not if its pipeline was
        cancelled (a lost lease), nor if the lease went stale meanwhile."""
        if batch._finished.done():
            return False
        try:
            batch._shard_feed.ensure_held()
        except LeaseLostError:
            batch._finish()
            return False
        batch._yielded = True
        return True

    def close(self, *, finish_current: bool = True) -> None:
        """No more batches are yielded: every pipeline stops after its batch in flight, and the
        batches not yielded yet are withdrawn (not checkpointed: the next owner reads them).
        The batch in the loop finishes now, or (``finish_current=False``: a ``stop()`` while
        the loop runs) when the loop moves on."""
        if not self.closed:
            self.closed = True
            for shard in list(self.shards):
                shard.stop_pipeline()
            while not self.queue.empty():
                self.queue.get_nowait()._finish()
        if finish_current and self.current is not None:
            self.current._finish()
            self.current = None


class BatchIterator:
    """What ``Consumer.batches()`` returns: an async iterator of ``ShardBatch``, and an async
    context manager that stops the consumer gracefully on exit.

    The first step of the iteration starts the consumer unless ``async with consumer`` runs it
    already. The iteration ends when the consumer stops (``stop()``), raising the error that
    stopped it, if any; leaving it (break, an exception, cancellation) stops the consumer
    gracefully."""

    def __init__(self, consumer: _Runner, feed: BatchFeed) -> None:
        self._consumer = consumer
        self._feed = feed

    def __aiter__(self) -> AsyncIterator[ShardBatch]:
        if self._feed.iterating:
            raise RuntimeError("a consumer's batches can be iterated only once")
        self._feed.iterating = True
        # The generator does not reference this object, so leaving a bare ``async for`` drops
        # it at once and the event loop closes it, which stops the consumer.
        return _iterate(self._consumer, self._feed)

    async def aclose(self) -> None:
        """Stop the consumer gracefully and wait for it: the pipelines finish their batch in
        flight, buffered positions are written, and the leases are released."""
        self._feed.close()
        await self._consumer.stop()

    async def __aenter__(self) -> BatchIterator:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
        failure = _failure(self._consumer)
        if exc is None and failure is not None and not self._feed.failure_raised:
            self._feed.failure_raised = True
            raise failure


def _failure(consumer: _Runner) -> BaseException | None:
    task = consumer._background
    if task is None or not task.done() or task.cancelled():
        return None
    return task.exception()


async def _next(consumer: _Runner, feed: BatchFeed) -> ShardBatch | None:
    """The next batch to yield, or None once the consumer stops or its run ended."""
    run, stopping = consumer._background, consumer._stop_requested
    assert run is not None
    while True:
        if stopping.is_set() or run.done():
            return None
        if feed.queue.empty():
            getter = asyncio.ensure_future(feed.queue.get())
            stopper = asyncio.ensure_future(stopping.wait())
            try:
                await asyncio.wait({getter, stopper, run}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopper.cancel()
                if not getter.done():
                    getter.cancel()
            if not getter.done() or getter.cancelled():
                continue
            batch = getter.result()
            if stopping.is_set() or run.done():
                batch._finish()  # withdrawn: the consumer stops
                return None
        else:
            batch = feed.queue.get_nowait()
        if feed.accept(batch):
            return batch


async def _iterate(consumer: _Runner, feed: BatchFeed) -> AsyncIterator[ShardBatch]:
    if consumer._background is None:
        if consumer._running:
            raise RuntimeError("iterate batches() instead of running the consumer yourself")
        consumer._background = asyncio.create_task(
            consumer.run(), name=f"consumer {consumer.worker_id}"
        )
    try:
        while True:
            if feed.current is not None:
                feed.current._finish()  # the loop asked for more: the shard may go on
                feed.current = None
            feed.current = await _next(consumer, feed)
            if feed.current is None:
                break
            yield feed.current
    finally:
        feed.close()
        await consumer.stop()
    failure = _failure(consumer)
    if failure is not None and not feed.failure_raised:
        feed.failure_raised = True
        raise failure
