"""One shard's fetcher: records from a starting position into the shard's bounded queue.

Owns: where a lease's checkpoint says to start (``starting_position``), the GetRecords loop
(``ShardCursor``: iterators, throttling backoff, expired iterators) with the pause between reads
from ``_core/records/read_pacing``, the fan-out loop (``FanOutConsumers``), KPL de-aggregation,
and skipping what the starting checkpoint covers. Each batch, then the shard's end, goes into
the queue, whose bound holds the fetcher back while the processor is busy (backpressure).
Must not: call the processor, write the lease table, or read any clock but the event loop's.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

import attrs

from kclasync._adapters.protocols import (
    ChildShard,
    IteratorType,
    ShardNotFoundError,
    StartingPosition,
    StreamClient,
)
from kclasync._config import ConsumerConfig
from kclasync._core.leases.position import Checkpoint, InitialPositionKind, Sentinel
from kclasync._core.records.kpl import KplFormatError, deaggregate, is_aggregated
from kclasync._core.records.read_pacing import ReadPause, next_read_pause
from kclasync._records import Record
from kclasync._runtime.fanout_streams import FanOutConsumers
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.read_slots import ReadSlots
from kclasync._runtime.shard_cursor import ShardCursor
from kclasync.errors import ConfigError, error_code

log = logging.getLogger("kclasync.shard")


@attrs.frozen
class Batch:
    """Records read from the shard, de-aggregated, in order."""

    records: Sequence[Record]
    millis_behind_latest: int | None


@attrs.frozen
class ShardEnd:
    """The shard ended (its children, as the last read reported them)."""

    child_shards: tuple[ChildShard, ...]


def starting_position(checkpoint: Checkpoint, config: ConsumerConfig) -> StartingPosition | None:
    """Where to read from for a lease's checkpoint (None: the shard is finished)."""
    sentinel = checkpoint.sentinel
    if sentinel is None:
        # AT the checkpointed record: the fetcher skips every (sequence, sub-sequence) up to the
        # checkpoint, which resumes correctly inside a KPL-aggregated record too.
        return StartingPosition(IteratorType.AT_SEQUENCE_NUMBER, checkpoint.value)
    if sentinel is Sentinel.SHARD_END:
        return None
    if sentinel is Sentinel.TRIM_HORIZON:
        return StartingPosition(IteratorType.TRIM_HORIZON)
    if sentinel is Sentinel.LATEST:
        return StartingPosition(IteratorType.LATEST)
    if config.initial_position.kind is not InitialPositionKind.AT_TIMESTAMP:
        raise ConfigError(
            "initial_position",
            "a lease is checkpointed at AT_TIMESTAMP but no timestamp is configured",
        )
    return StartingPosition(IteratorType.AT_TIMESTAMP, timestamp=config.initial_position.timestamp)


class ShardFetcher:
    """Reads one shard into ``queue``; run as its own task beside the shard's processor."""

    def __init__(
        self,
        *,
        stream: str,
        shard_id: str,
        stream_client: StreamClient,
        config: ConsumerConfig,
        metrics: ConsumerMetrics,
        labels: tuple[str, str],
        queue: asyncio.Queue[Batch | ShardEnd],
        skip_upto: tuple[int, int] | None,
        fanout: FanOutConsumers | None = None,
        read_slots: ReadSlots | None = None,
    ) -> None:
        self.stream = stream
        self.shard_id = shard_id
        self.client = stream_client
        self.config = config
        self.metrics = metrics
        self._labels2 = labels
        self._labels = (*labels, stream, shard_id)
        self.queue = queue
        #: Positions at or below this were processed before (the starting checkpoint).
        self._skip_upto = skip_upto
        #: Set: the shard is read with enhanced fan-out instead of GetRecords.
        self._fanout = fanout
        #: The worker's GetRecords calls in flight (``max_reads_in_flight``), shared by its shards.
        self._read_slots = read_slots

    def expand(self, fetched: Sequence[Record]) -> list[Record]:
        """De-aggregate KPL records and drop what the starting checkpoint already covers."""
        out: list[Record] = []
        for record in fetched:
            if is_aggregated(record.data):
                try:
                    users = deaggregate(record.data)
                except KplFormatError as exc:
                    self.metrics.malformed_aggregates.labels(*self._labels).inc()
                    log.warning(
                        "record %s on shard %s has the KPL magic bytes but is malformed (%s); "
                        "delivering it as one ordinary record",
                        record.sequence_number,
                        self.shard_id,
                        exc,
                    )
                    out.append(record)
                    continue
                out.extend(
                    attrs.evolve(
                        record,
                        data=user.data,
                        partition_key=user.partition_key,
                        sub_sequence_number=index,
                    )
                    for index, user in enumerate(users)
                )
            else:
                out.append(record)
        if self._skip_upto is not None and fetched:
            skip = self._skip_upto
            out = [r for r in out if (int(r.sequence_number), r.sub_sequence_number) > skip]
            if int(fetched[-1].sequence_number) > skip[0]:
                self._skip_upto = None  # past the checkpointed record: nothing more to skip
        return out

    def _count_retry(self, operation: str, exc: BaseException) -> None:
        retries = self.metrics.retries
        retries.labels(*self._labels2, "kclasync", "kinesis", operation, error_code(exc)).inc()

    async def run(self, position: StartingPosition) -> None:
        """Read the shard from ``position`` into the queue until it ends (a ``ShardEnd`` last)."""
        if self._fanout is not None:
            return await self._run_fanout(self._fanout, position)
        cfg = self.config
        cursor = ShardCursor(
            self.client,
            self.stream,
            self.shard_id,
            position,
            backoff=cfg.throttle_backoff,
            max_backoff=cfg.max_backoff,
            on_throttle=self.metrics.throttles.labels(*self._labels2, "kinesis").inc,
            on_retry=self._count_retry,
            read_slots=self._read_slots,
        )
        pause = ReadPause(0.0, 0)
        behind = self.metrics.millis_behind.labels(*self._labels)
        behind_set: int | None = None  # the gauge's value as last set here
        while True:
            try:
                result = await cursor.next(cfg.max_records)
            except ShardNotFoundError:
                log.warning("shard %s no longer exists; treating it as ended", self.shard_id)
                await self.queue.put(ShardEnd(()))
                return
            lag = result.millis_behind_latest
            if lag is not None and lag != behind_set:
                behind.set(lag)  # a gauge: setting the value it holds changes nothing
                behind_set = lag
            records = self.expand(result.records)
            if records:
                await self.queue.put(Batch(records, result.millis_behind_latest))
            if result.next_iterator is None:
                await self.queue.put(ShardEnd(result.child_shards))
                return
            pause = next_read_pause(
                records=len(result.records),
                millis_behind=result.millis_behind_latest,
                idle_streak=pause.idle_streak,
                busy=cfg.min_time_between_reads,
                idle=cfg.idle_time_between_reads,
                max_idle=cfg.effective_max_idle_time,
            )
            await asyncio.sleep(pause.delay)

    async def _run_fanout(self, fanout: FanOutConsumers, position: StartingPosition) -> None:
        """Fan-out: the next event is read only after the last one is in the queue, so a full
        queue holds the subscription back (see docs/fanout.md)."""
        m, labels = self.metrics, self._labels
        cursor = await fanout.cursor(
            self.stream,
            self.shard_id,
            position,
            on_subscribe=m.fanout_subscriptions.labels(*labels).inc,
            on_resubscribe=lambda reason: m.fanout_resubscriptions.labels(*labels, reason).inc(),
            on_throttle=m.throttles.labels(*self._labels2, "kinesis").inc,
        )
        try:
            async with contextlib.aclosing(cursor.events()) as events:
                async for event in events:
                    if event.millis_behind_latest is not None:
                        m.millis_behind.labels(*labels).set(event.millis_behind_latest)
                    records = self.expand(event.records)
                    if records:
                        await self.queue.put(Batch(records, event.millis_behind_latest))
                    if event.shard_ended:
                        await self.queue.put(ShardEnd(event.child_shards))
                        return
        except ShardNotFoundError:
            log.warning("shard %s no longer exists; treating it as ended", self.shard_id)
            await self.queue.put(ShardEnd(()))
