"""One executor task of the Spark source: read one shard of one batch, exactly as planned.

Owns: the input partition Spark sends to an executor (``ShardPartition``), the task's read
(record the batch's end in the progress store before any row leaves, or replay what an earlier
attempt recorded), choosing polling or enhanced fan-out for it, and handing the records to Spark
as Arrow batches.
Must not: plan batches or register stream consumers (the driver does, in
``kclasync.spark.source``), or hold read rules of its own (``kclasync.spark.fetch``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED
from datetime import datetime
from typing import Any

from pyspark.sql.datasource import InputPartition

from kclasync._records import Record
from kclasync.spark.fanout_pages import fanout_pages
from kclasync.spark.fetch import PageSource, ShardRead, read_shard
from kclasync.spark.offsets import ShardProgress
from kclasync.spark.options import SourceOptions
from kclasync.spark.schema import in_layout, records_to_arrow
from kclasync.spark.worker_io import WorkerIO, worker_io

__all__ = [
    "ARROW_CHUNK",
    "ShardGroupPartition",
    "ShardPartition",
    "arrow_batches",
    "group_partitions",
    "parse_time",
    "read_partition",
]

#: Rows per Arrow batch handed to Spark.
ARROW_CHUNK = 4096


class ShardPartition(InputPartition):
    """One shard of one batch: read on an executor. ``consumer_arn``: the stream consumer the
    driver registered for this query (enhanced fan-out), else None (GetRecords). ``iterator``:
    the shard iterator at ``start`` the driver's probe took, if it probed the shard (the read
    uses it first, instead of a GetShardIterator of its own, until it expires)."""

    def __init__(
        self,
        *,
        options: SourceOptions,
        run: str,
        batch: int,
        shard_id: str,
        start: str,
        quota: int,
        timestamp: str | None,
        until: str | None,
        consumer_arn: str | None = None,
        iterator: str | None = None,
    ) -> None:
        super().__init__(shard_id)
        self.options = options
        self.run = run
        self.batch = batch
        self.shard_id = shard_id
        self.start = start
        self.quota = quota
        self.timestamp = timestamp
        self.until = until
        self.consumer_arn = consumer_arn
        self.iterator = iterator


class ShardGroupPartition(InputPartition):
    """Several shards of one batch read by one task, concurrently (``shardsPerTask``)."""

    def __init__(self, parts: list[ShardPartition]) -> None:
        super().__init__(tuple(p.shard_id for p in parts))
        self.parts = parts


def parse_time(text: str | None) -> datetime | None:
    return datetime.fromisoformat(text) if text else None


def read_partition(p: ShardPartition) -> list[Record]:
    """Read one shard of one batch on an executor; the same records on every replay. The
    clients are the Python worker's (``worker_io``), kept from task to task."""
    io = worker_io()
    return io.run(lambda: _read_partition(io, p))


def arrow_batches(p: ShardPartition | ShardGroupPartition) -> Iterator[Any]:
    """The partition's rows as Arrow record batches of at most ``ARROW_CHUNK`` rows. The shards
    of a group are read concurrently, and each shard's rows are handed over as soon as that
    shard is read and recorded in the progress store, while the others are still being read
    (a shard's rows never leave before its own record; a replay of the task reads every shard
    the same). The first failed read cancels the others, as does closing the iterator."""
    parts = p.parts if isinstance(p, ShardGroupPartition) else [p]
    io = worker_io()
    recorded: concurrent.futures.Future[dict[str, ShardProgress]] | None = None
    if len(parts) > 1:
        # One read of the batch's progress for every shard of the task, not one per shard.
        recorded = io.submit(functools.partial(_recorded, io, parts))
    reads = {
        io.submit(functools.partial(_read_partition, io, part, recorded)): i
        for i, part in enumerate(parts)
    }
    options = parts[0].options
    pending = set(reads)
    try:
        while pending:
            done, pending = concurrent.futures.wait(pending, return_when=FIRST_COMPLETED)
            # Shards whose reads ended together leave in the same batches: fewer, fuller
            # Arrow batches for Spark to take (each shard's rows are still complete and
            # recorded before they leave).
            records = [r for f in sorted(done, key=reads.__getitem__) for r in f.result()]
            for i in range(0, len(records), ARROW_CHUNK):
                batch = records_to_arrow(records[i : i + ARROW_CHUNK], options.stream_name)
                yield in_layout(batch, options.column_layout.value)
    finally:
        for read in reads:
            read.cancel()
        if recorded is not None:
            recorded.cancel()


def group_partitions(
    parts: list[ShardPartition], per_task: int
) -> list[ShardPartition] | list[ShardGroupPartition]:
    """``parts`` in tasks of at most ``per_task`` shards, as even as possible (shards in the
    order given, dealt round-robin)."""
    if per_task <= 1 or len(parts) <= 1:
        return parts
    tasks = -(-len(parts) // per_task)
    return [ShardGroupPartition(parts[i::tasks]) for i in range(tasks)]


async def _pages(io: WorkerIO, p: ShardPartition) -> PageSource | None:
    opts = p.options
    if p.consumer_arn is None:
        return None
    fanout = await io.fanout(opts.aws)
    name = opts.consumer_name
    assert name is not None

    async def reregister() -> str:
        # Deregistered while the query runs: register it again under the same name.
        return (await fanout.ensure_consumer(opts.stream_name, name)).arn

    return fanout_pages(
        fanout,
        p.consumer_arn,
        opts.stream_name,
        p.shard_id,
        max_seconds=opts.max_fetch_seconds,
        reregister=reregister,
    )


async def _recorded(io: WorkerIO, parts: list[ShardPartition]) -> dict[str, ShardProgress]:
    """What earlier attempts recorded for the shards of one task (all of one batch)."""
    first = parts[0]
    opts = first.options
    store = await io.progress(opts.aws, opts.metadata_path, opts.progress_table)
    return await store.get_batch(first.run, first.batch, [p.shard_id for p in parts])


async def _read_partition(
    io: WorkerIO,
    p: ShardPartition,
    recorded_all: concurrent.futures.Future[dict[str, ShardProgress]] | None = None,
) -> list[Record]:
    """Read ``p``; ``recorded_all``: the task's one read of its shards' progress (else this
    shard's own is read)."""
    opts = p.options
    kinesis = await io.kinesis(opts.aws)
    store = await io.progress(opts.aws, opts.metadata_path, opts.progress_table)
    pages = await _pages(io, p)

    async def fetch(replay: ShardProgress | None) -> ShardRead:
        return await read_shard(
            kinesis,
            opts.stream_name,
            p.shard_id,
            p.start,
            quota=p.quota,
            timestamp=parse_time(p.timestamp),
            until=parse_time(p.until),
            max_seconds=opts.max_fetch_seconds,
            replay=replay,
            fail_on_data_loss=opts.fail_on_data_loss,
            pages=pages,
            page_size=opts.max_records_per_fetch,
            iterator=p.iterator if pages is None else None,
        )

    if recorded_all is None:
        recorded = await store.get(p.run, p.batch, p.shard_id)
    else:
        # Shielded: the read shared by the task's shards is not cancelled with one of them.
        recorded = (await asyncio.shield(asyncio.wrap_future(recorded_all))).get(p.shard_id)
    result = await fetch(recorded)
    if recorded is None:
        # Record where this batch stops before Spark sees a row; a racing attempt may have won.
        claimed = await store.claim(p.run, p.batch, p.shard_id, result.progress)
        if claimed != result.progress:
            result = await fetch(claimed)
    return list(result.records)
