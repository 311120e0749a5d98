"""One owned shard: fetcher -> bounded queue -> processor -> fenced checkpoints.

Owns: the shard's pipeline: the fetcher task (``shard_fetcher``: reading from the lease's
checkpoint into the bounded queue) and the processor side: calling the processor with retries,
the checkpoint flusher, and the shard-end and shutdown hand-offs. The supervisor
(``shard_supervisor``) cancels the pipeline the moment the lease is lost.
Must not: decide lease ownership, read the stream itself, or read any clock but the event
loop's.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable

from prometheus_client import Counter

from kclasync._adapters.protocols import ChildShard, StreamClient
from kclasync._config import ConsumerConfig
from kclasync._core.leases.held_lease import HeldLease
from kclasync._core.leases.lease import CorruptLeaseError
from kclasync._core.leases.position import Checkpoint
from kclasync._core.retry_policy import Backoff
from kclasync._processor import RecordProcessor, ShardInfo
from kclasync._runtime.checkpointer import ShardCheckpointer
from kclasync._runtime.event_wait import wait_event
from kclasync._runtime.fanout_streams import FanOutConsumers
from kclasync._runtime.held import HeldLeases
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.read_slots import ReadSlots
from kclasync._runtime.shard_fetcher import Batch, ShardEnd, ShardFetcher, starting_position
from kclasync.errors import (
    AdapterError,
    LeaseLostError,
    ProcessorFailedError,
    ShutdownCheckpointError,
)

log = logging.getLogger("kclasync.shard")


class ShardOutcome(enum.Enum):
    ENDED = "ended"  # SHARD_END checkpointed
    SHUTDOWN = "shutdown"  # stopped on request after shutdown_requested


class ShardConsumer:
    def __init__(
        self,
        *,
        held: HeldLease,
        stream: str,
        stream_client: StreamClient,
        leases: HeldLeases,
        processor: RecordProcessor,
        config: ConsumerConfig,
        metrics: ConsumerMetrics,
        labels: tuple[str, str],
        create_children: Callable[
            [HeldLease, tuple[ChildShard, ...]], Awaitable[frozenset[str] | None]
        ],
        on_shard_end: Callable[[HeldLease, frozenset[str]], Awaitable[None]],
        wait_for_parents: Callable[[HeldLease], Awaitable[None]],
        fanout: FanOutConsumers | None = None,
        read_slots: ReadSlots | None = None,
    ) -> None:
        self.held = held
        self.stream = stream
        self.shard_id = held.lease.shard_id
        self.client = stream_client
        self.leases = leases
        self.processor = processor
        self.config = config
        self.metrics = metrics
        labels4 = (*labels, stream, self.shard_id)
        self._labels = labels4
        self._labels2 = labels
        # The shard's counters, looked up at the first delivery (``labels`` takes a lock and
        # a dict lookup) and kept: the same children ``labels`` would return.
        self._delivery_counters: tuple[Counter, Counter] | None = None
        #: One attempt at the child leases: their shard ids once all exist, None if deferred.
        self._create_children = create_children
        self._on_shard_end = on_shard_end
        self._wait_for_parents = wait_for_parents
        #: Set: the shard is read with enhanced fan-out instead of GetRecords.
        self._fanout = fanout
        self._read_slots = read_slots
        self._queue: asyncio.Queue[Batch | ShardEnd] = asyncio.Queue(config.max_queued_batches)
        self._shutdown = asyncio.Event()
        self.checkpointer = ShardCheckpointer(
            leases, held, lambda: metrics.checkpoints.labels(*labels4).inc()
        )
        self._flush_interval = config.checkpoint_interval
        self.initialized = False

    def request_shutdown(self) -> None:
        """Finish the batch in flight, then call ``shutdown_requested`` and return."""
        self._shutdown.set()

    async def run(self) -> ShardOutcome:
        await self._wait_for_parents(self.held)
        start = self.held.lease.checkpoint
        position = starting_position(start, self.config)
        await self.processor.initialize(
            ShardInfo(
                stream=self.stream,
                shard_id=self.shard_id,
                lease_key=self.held.key,
                starting_checkpoint=start,
                parent_shard_ids=self.held.lease.parent_shard_ids,
            )
        )
        self.initialized = True
        if position is None:
            return await self._end_of_shard(ShardEnd(()))
        reader = ShardFetcher(
            stream=self.stream,
            shard_id=self.shard_id,
            stream_client=self.client,
            config=self.config,
            metrics=self.metrics,
            labels=self._labels2,
            queue=self._queue,
            skip_upto=start.key() if start.is_sequence else None,
            fanout=self._fanout,
            read_slots=self._read_slots,
        )
        fetcher = asyncio.create_task(reader.run(position), name=f"fetch {self.shard_id}")
        flusher = asyncio.create_task(
            self.checkpointer.flush_every(self._flush_interval), name=f"flush {self.shard_id}"
        )
        try:
            while True:
                item = await self._next(fetcher)
                if item is None:
                    break
                if isinstance(item, ShardEnd):
                    return await self._end_of_shard(item)
                await self._deliver(item)
                if self._shutdown.is_set():
                    break
        finally:
            fetcher.cancel()
            flusher.cancel()
            await asyncio.gather(fetcher, flusher, return_exceptions=True)
        return await self._shut_down()

    async def _next(self, fetcher: asyncio.Task[None]) -> Batch | ShardEnd | None:
        if self._shutdown.is_set():
            return None
        if not self._queue.empty():
            return self._queue.get_nowait()
        getter = asyncio.ensure_future(self._queue.get())
        stopper = asyncio.ensure_future(self._shutdown.wait())
        try:
            await asyncio.wait({getter, stopper, fetcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopper.cancel()
            if not getter.done():
                getter.cancel()
        if getter.done() and not getter.cancelled():
            return getter.result()
        if fetcher.done() and not fetcher.cancelled() and fetcher.exception() is not None:
            raise fetcher.exception()  # type: ignore[misc]
        return None

    async def _deliver(self, batch: Batch) -> None:
        # After a stall (a long GC pause, a blocked loop) batches may be queued for a lease this
        # worker has not renewed within the failover time; another worker may own it by now, so
        # none of them may start (found by the simulation: seed 1, see docs/simulation.md).
        self.leases.ensure_held(self.held)
        records = batch.records
        last = records[-1]
        self.checkpointer.last_delivered_position = Checkpoint(
            last.sequence_number, last.sub_sequence_number
        )
        attempt = 0
        while True:
            try:
                await self.processor.process_records(
                    records, self.checkpointer, batch.millis_behind_latest
                )
                break
            except (LeaseLostError, asyncio.CancelledError):
                raise
            except Exception as exc:
                self.metrics.processor_errors.labels(*self._labels).inc()
                attempt += 1
                if attempt > self.config.processor_retries:
                    self.metrics.processor_failures.labels(*self._labels).inc()
                    raise ProcessorFailedError(
                        self.shard_id, records[0].sequence_number, last.sequence_number, attempt
                    ) from exc
                delay = Backoff(self.config.processor_retry_backoff).delay(attempt)
                log.warning(
                    "processor raised on shard %s (attempt %d of %d), retrying in %.2fs: %r",
                    self.shard_id,
                    attempt,
                    self.config.processor_retries + 1,
                    delay,
                    exc,
                )
                await asyncio.sleep(delay)
        delivered = sum(len(r.data) for r in records)
        self.held.bytes_delivered += delivered
        counters = self._delivery_counters
        if counters is None:
            metrics = self.metrics
            counters = metrics.records.labels(*self._labels), metrics.bytes.labels(*self._labels)
            self._delivery_counters = counters
        counters[0].inc(len(records))
        counters[1].inc(delivered)

    async def _end_of_shard(self, end: ShardEnd) -> ShardOutcome:
        """The KCL's order: child leases first, then the processor's SHARD_END checkpoint, then
        ``childShardIds``. SHARD_END cannot be checkpointed (``shard_end_reached``) before the
        children have leases, so a worker dying after that checkpoint leaves none without."""
        children = await self._create_children_until_done(end.child_shards)
        if children is None:
            return await self._shut_down()
        self.checkpointer.shard_end_reached = True
        if not self.checkpointer.last_checkpoint.is_shard_end:
            await self.checkpointer.flush()
            await self.processor.shard_ended(self.checkpointer)
            if not self.checkpointer.last_checkpoint.is_shard_end:
                raise ShutdownCheckpointError(
                    f"the processor of shard {self.shard_id} returned from shard_ended without "
                    "calling checkpointer.checkpoint_shard_end(); the shard stays open and "
                    "its children wait"
                )
        await self._on_shard_end(self.held, children)
        return ShardOutcome.ENDED

    async def _create_children_until_done(
        self, reported: tuple[ChildShard, ...]
    ) -> frozenset[str] | None:
        """Create the child leases, retrying with backoff (as the KCL retries its shutdown
        task) while the lease is held: after an I/O failure, and while a merge child waits for
        its other parent's lease. Returns the child shard ids, or None when a shutdown was
        requested first (the lease is then released unfinished and its next owner, reading
        to the end again, retries). Raises ``LeaseLostError`` once the lease is lost."""
        backoff = Backoff(self.config.throttle_backoff, self.config.max_backoff)
        attempt = 0
        while True:
            attempt += 1
            delay = backoff.delay(attempt)
            self.leases.ensure_held(self.held)
            try:
                children = await self._create_children(self.held, reported)
            except (AdapterError, CorruptLeaseError) as exc:
                log.warning(
                    "could not create the child leases of shard %s: %s; retrying in %.1fs "
                    "before its SHARD_END checkpoint",
                    self.shard_id,
                    exc,
                    delay,
                )
                children = None
            if children is not None:
                return children
            if await wait_event(self._shutdown, delay):
                return None

    async def _shut_down(self) -> ShardOutcome:
        await self.processor.shutdown_requested(self.checkpointer)
        # Before a handoff, a release or a stop: the newest buffered checkpoint is written.
        await self.checkpointer.flush()
        return ShardOutcome.SHUTDOWN
