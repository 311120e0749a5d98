"""``spark.readStream.format("kinesis")``: a Spark 4 Python streaming source over kclasync.

Owns: the ``DataSource`` and its stream reader: options, offsets in Spark's checkpoint, planning a
batch on the driver (``kclasync.spark.offsets``), registering the stream consumer once per
query for enhanced fan-out, one input partition per shard read on the executors
(``kclasync.spark.shard_task``), the progress records that make replays exact
(``kclasync.spark.progress``), and the optional lease-table positions (``lease_sync``).
Must not: hold lineage rules of its own (they come from ``kclasync._core.lineage.shard_lineage`` and
``shard_end``).

Spark constructs the reader on the driver and again on the executors, so AWS clients are made
lazily: on the driver ``kclasync.spark.driver_io`` keeps one set for the query; on an executor
the Python worker's clients (``kclasync.spark.worker_io``) serve every task it runs.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Awaitable, Iterator
from datetime import UTC, datetime
from typing import Any

import attrs
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._core.leases.position import InitialPositionKind
from kclasync._core.lineage.shard import Shard
from kclasync.spark.driver_io import DriverClients, DriverIO
from kclasync.spark.errors_first import user_facing, user_facing_rows
from kclasync.spark.fetch import has_new_records, shard_iterator
from kclasync.spark.lease_sync import SPARK_OWNER_PREFIX, read_positions, write_positions
from kclasync.spark.offsets import (
    ShardPosition,
    ShardProgress,
    SourceOffset,
    add_new_shards,
    allocate_quotas,
    drained_shards,
    initial_positions,
    readable_shards,
    state_after,
)
from kclasync.spark.options import ConsumerType, SourceOptions
from kclasync.spark.probing import EarlyIterators, probe_shards, take_iterators
from kclasync.spark.progress import ProgressStore
from kclasync.spark.shard_task import (
    ShardGroupPartition,
    ShardPartition,
    arrow_batches,
    group_partitions,
    parse_time,
    read_partition,
)

__all__ = [
    "KinesisStreamReader",
    "ShardPartition",
    "SourceOptions",
    "read_partition",
]

log = logging.getLogger("kclasync.spark")


async def _none() -> None:
    return None


class KinesisStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets per shard; children after their parents' SHARD_END; one partition per shard."""

    def __init__(self, options: SourceOptions, latest_at: datetime | None = None) -> None:
        self.options = options
        self.latest_at = latest_at
        self._clients = DriverClients(options)
        self._initial: dict[str, Any] | None = None
        self._listed: list[Shard] | None = None
        self._listed_at = float("-inf")
        self._until: datetime | None = None
        #: AvailableNow: (shard, position) pairs known to hold nothing that arrived by
        #: ``_until`` (``drained_shards``), so the run's last planning need not probe them.
        self._drained: set[tuple[str, str]] = set()
        self._lease_state: dict[str, ShardPosition] | None = None
        self._consumer_arn: str | None = None
        #: The last planning's probes: their shard iterators, by (shard, position), handed to
        #: the batch's reads of those shards (each saves a GetShardIterator while fresh).
        self._iterators: dict[tuple[str, str], str] = {}
        #: The iterators of the shards the first planning left unasked, taken while Spark
        #: launches the batch; ``partitions`` waits for them.
        self._early = EarlyIterators()

    # Executors get a copy without the driver's clients.
    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    def open_early(self) -> None:
        """Open the driver's clients on a thread now, not in the first planning."""
        self._clients.open_early()

    @property
    def _driver(self) -> DriverIO:
        return self._clients.get()

    def _kinesis(self) -> KinesisStreamClient:
        kinesis = self._driver.kinesis
        assert kinesis is not None
        return kinesis

    def _progress(self) -> ProgressStore:
        progress = self._driver.progress
        assert progress is not None
        return progress

    def _listing_due(self) -> bool:
        return (
            self._listed is None
            or time.monotonic() - self._listed_at >= self.options.shard_list_interval
        )

    def _listing(self, force: bool = False) -> list[Shard] | None:
        """The stream's shards, listed again at most every ``shardListIntervalSec``."""
        if force or self._listing_due():
            stream = self.options.stream_name
            self._set_listing(self._driver.run(lambda: self._kinesis().list_shards(stream)))
        return self._listed

    def _set_listing(self, listed: list[Shard]) -> None:
        self._listed = listed
        self._listed_at = time.monotonic()

    def _fanout_consumer(self) -> str | None:
        """With ``consumerType=EFO``: the stream consumer's ARN, registered (or the existing one
        reused) and ACTIVE, once per query; executors subscribe through it."""
        opts = self.options
        if opts.consumer_type is not ConsumerType.EFO:
            return None
        if self._consumer_arn is None:
            fanout = self._driver.fanout
            name = opts.consumer_name
            assert fanout is not None and name is not None
            consumer = self._driver.run(lambda: fanout.ensure_consumer(opts.stream_name, name))
            log.info("reading %s through stream consumer %s", opts.stream_name, consumer.arn)
            self._consumer_arn = consumer.arn
        return self._consumer_arn

    # -- DataSourceStreamReader -----------------------------------------------------------

    @user_facing
    def initialOffset(self) -> dict[str, Any]:
        # Spark asks twice as a query starts: the same answer, without listing shards again.
        if self._initial is None:
            self._initial = self._initial_offset()
        return self._initial

    def _initial_offset(self) -> dict[str, Any]:
        start = self.options.starting_position
        when = start.timestamp
        if start.kind is InitialPositionKind.LATEST:
            # LATEST is pinned to when load() defined the DataFrame (see offsets.py); with a
            # schema given by the user load() does not ask, so to this first planning.
            when = self.latest_at or datetime.now(UTC)
        positions: dict[str, ShardPosition] = {}
        store = self._driver.leases
        if store is not None:
            positions = self._driver.run(lambda: read_positions(store))
            if positions:
                log.info(
                    "starting from %d positions in lease table %s",
                    len(positions),
                    self.options.lease_table,
                )
        if not positions:
            listed = self._listing(force=True)
            assert listed is not None
            positions = initial_positions(listed, start)
        offset = SourceOffset(
            run=uuid.uuid4().hex,
            batch=-1,
            shards=positions,
            timestamp=when.isoformat() if when is not None else None,
        )
        return offset.to_json()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_records_per_batch is not None:
            return ReadMaxRows(self.options.max_records_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        # Nothing that arrives after this instant is read in this run.
        self._until = datetime.now(UTC)
        self._drained = set()

    @user_facing
    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        offset = SourceOffset.from_json(start)
        progress = self._progress()
        read_ids = [sid for sid, pos in offset.shards.items() if pos.quota > 0]
        stream = self.options.stream_name
        relist = self._listing_due()

        async def look() -> tuple[dict[str, ShardProgress], list[Shard] | None]:
            # The batch's progress, the pruning of older batches and (when due) the shard
            # listing do not depend on each other: one round trip's time for all three.
            recorded, _, listed = await asyncio.gather(
                progress.get_batch(offset.run, offset.batch, read_ids),
                progress.prune(offset.run, offset.batch),
                self._kinesis().list_shards(stream) if relist else _none(),
            )
            return recorded, listed

        recorded, listed = self._driver.run(look)
        if listed is not None:
            self._set_listing(listed)
        done, read = state_after(offset, recorded)
        state = add_new_shards(
            done,
            self.options.starting_position,
            listed=self._listed,
            reported_children=[child for rec in read.values() for child in rec.children],
        )
        timestamp = parse_time(offset.timestamp)
        until = self._until
        polling = self.options.consumer_type is ConsumerType.POLLING
        if polling and until is not None and offset.until == until.isoformat():
            # Only GetRecords reads: one that ends caught up saw what a probe would see (an
            # empty page at the tip); a fan-out read also ends "caught up" when no event came
            # in time (``fanout_pages``), which proves nothing.
            self._drained |= drained_shards(offset, read)
        candidates = readable_shards(state)
        # A shard whose read stopped at its quota may hold more, except in an AvailableNow run,
        # where "more" may all have arrived after the cutoff: probing it (one GetRecords) costs
        # less than planning a batch that then reads nothing.
        known = [sid for sid in candidates if sid in read and read[sid].more and until is None]
        unknown = [
            sid
            for sid in candidates
            if sid not in known
            and (until is None or (sid, state[sid].position) not in self._drained)
        ]

        iterators: dict[str, str] = {}
        per_batch = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        # A query's first planning stops asking once a shard has records (``probing``): not
        # with a row limit (a shard planned unasked would take a share of it) nor with fan-out
        # (an empty shard's read would wait for its subscription's events).
        early = offset.batch < 0 and polling and per_batch is None

        def ask(sid: str) -> Awaitable[bool]:
            return has_new_records(
                self._kinesis(),
                stream,
                sid,
                state[sid].position,
                timestamp=timestamp,
                until=until,
                iterators=iterators,
            )

        async def probe() -> dict[str, bool | None]:
            found, _ = await asyncio.gather(
                probe_shards(unknown, ask, early_stop=early),
                self._sync_lease_table(offset.run, done),
            )
            return found

        found = self._driver.run(probe)
        self._iterators = {(sid, state[sid].position): it for sid, it in iterators.items()}
        unasked = [sid for sid in unknown if found[sid] is None]

        def take(sid: str) -> Awaitable[str | None]:
            pos = state[sid].position
            return shard_iterator(self._kinesis(), stream, sid, pos, timestamp=timestamp)

        async def take_unasked() -> dict[tuple[str, str], str]:
            got = await take_iterators(unasked, take)
            return {(sid, state[sid].position): it for sid, it in got.items()}

        self._early.start(self._driver.spawn(take_unasked) if unasked else None)
        if until is not None:
            self._drained |= {(sid, state[sid].position) for sid in unknown if found[sid] is False}
        work = known + [sid for sid in unknown if found[sid] is not False]
        if not work:
            return start
        quotas = allocate_quotas(
            work,
            per_shard=self.options.max_records_per_shard,
            per_batch=per_batch,
            batch=offset.batch + 1,
        )
        nxt = SourceOffset(
            run=offset.run,
            batch=offset.batch + 1,
            shards={sid: attrs.evolve(pos, quota=quotas.get(sid, 0)) for sid, pos in state.items()},
            timestamp=offset.timestamp,
            until=until.isoformat() if until is not None else None,
        )
        return nxt.to_json()

    async def _sync_lease_table(self, run: str, state: dict[str, ShardPosition]) -> None:
        # ``latestOffset(start)`` is only called once ``start``'s batch is committed to the sink
        # (a batch left uncommitted is replayed first), so ``state`` is safe to publish. It also
        # covers the last batch of an AvailableNow run, which Spark never ``commit()``s.
        store = self._driver.leases
        if store is None or state == self._lease_state:
            return
        owner = f"{SPARK_OWNER_PREFIX}:{run}"
        await write_positions(store, state, owner)
        self._lease_state = dict(state)

    def partitions(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> list[ShardPartition] | list[ShardGroupPartition]:
        offset = SourceOffset.from_json(end)
        consumer_arn = self._fanout_consumer()
        iterators = {**self._iterators, **self._early.result()}
        parts = [
            ShardPartition(
                options=self.options,
                run=offset.run,
                batch=offset.batch,
                shard_id=sid,
                start=pos.position,
                quota=pos.quota,
                timestamp=offset.timestamp,
                until=offset.until,
                consumer_arn=consumer_arn,
                iterator=None if consumer_arn else iterators.get((sid, pos.position)),
            )
            for sid, pos in sorted(offset.shards.items())
            if pos.quota > 0
        ]
        return group_partitions(parts, self.options.shards_per_task)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, (ShardPartition, ShardGroupPartition))
        return user_facing_rows(arrow_batches(partition))

    @user_facing
    def commit(self, end: dict[str, Any]) -> None:
        offset = SourceOffset.from_json(end)
        progress = self._progress()
        self._driver.run(lambda: progress.prune(offset.run, offset.batch))

    def stop(self) -> None:
        self._early.start(None)
        self._clients.close()
