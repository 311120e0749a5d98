"""Reading one shard for one batch of the Spark source, through kclasync's ``StreamClient``.

Owns: turning an offset position into a shard iterator, the GetRecords loop that stops at a
quota, a time limit, an arrival-time cutoff or when caught up, replaying a recorded range exactly,
retries on throttling and expired iterators, and the cheap driver-side probe for new records.
Must not: import pyspark, or decide which shards to read (``kclasync.spark.offsets``).
Executors call this with ``asyncio.run`` (Spark's Python workers are synchronous).
"""

from __future__ import annotations

import asyncio
from datetime import datetime

import attrs

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.protocols import (
    ChildShard,
    GetRecordsResult,
    IteratorType,
    ShardNotFoundError,
    StartingPosition,
    StreamClient,
)
from kclasync._records import Record
from kclasync._runtime.shard_cursor import ShardCursor
from kclasync.spark.offsets import AT_TIMESTAMP, SHARD_END, TRIM_HORIZON, ShardProgress

__all__ = ["AwsOptions", "ShardRead", "has_new_records", "read_shard"]


#: GetRecords' largest page.
MAX_PAGE = 10_000


@attrs.frozen
class AwsOptions:
    """Picklable connection settings (executors build their clients from these)."""

    region_name: str | None = None
    endpoint_url: str | None = None
    dynamodb_endpoint_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: str | None = None
    aws_session_token: str | None = None

    def client_options(self) -> ClientOptions:
        return ClientOptions(
            region_name=self.region_name,
            endpoint_url=self.endpoint_url,
            dynamodb_endpoint_url=self.dynamodb_endpoint_url,
            aws_access_key_id=self.aws_access_key_id,
            aws_secret_access_key=self.aws_secret_access_key,
            aws_session_token=self.aws_session_token,
        )


@attrs.frozen
class ShardRead:
    """A batch's read of one shard: the records and the progress that describes them."""

    records: list[Record]
    progress: ShardProgress


def starting_position(position: str, timestamp: datetime | None) -> StartingPosition | None:
    """The iterator for an offset position (None at SHARD_END)."""
    if position == SHARD_END:
        return None
    if position == TRIM_HORIZON:
        return StartingPosition(IteratorType.TRIM_HORIZON)
    if position == AT_TIMESTAMP:
        if timestamp is None:
            raise ValueError("an AT_TIMESTAMP position needs the offset's timestamp")
        return StartingPosition(IteratorType.AT_TIMESTAMP, timestamp=timestamp)
    if not position.isdigit():
        raise ValueError(f"not a shard position: {position!r}")
    return StartingPosition(IteratorType.AFTER_SEQUENCE_NUMBER, position)


def _cursor(
    client: StreamClient, stream: str, shard_id: str, start: StartingPosition
) -> ShardCursor:
    """The workers' shard reader, with a bounded number of retries (a Spark task should fail
    and be retried by Spark rather than hang)."""
    return ShardCursor(client, stream, shard_id, start, backoff=0.1, max_backoff=5.0, attempts=8)


def _arrived_after(record: Record, until: datetime | None) -> bool:
    return (
        until is not None
        and record.approximate_arrival is not None
        and record.approximate_arrival > until
    )


async def read_shard(
    client: StreamClient,
    stream: str,
    shard_id: str,
    start: str,
    *,
    quota: int,
    timestamp: datetime | None = None,
    until: datetime | None = None,
    max_seconds: float = 10.0,
    idle_interval: float = 0.2,
    replay: ShardProgress | None = None,
) -> ShardRead:
    """Read ``shard_id`` from ``start`` for one batch.

    A first read stops at ``quota`` records, after ``max_seconds``, at the first record that
    arrived after ``until``, at SHARD_END, or when caught up (an empty page with nothing
    behind). With ``replay`` (the progress an earlier attempt recorded), it reads exactly that
    many records again and returns ``replay`` as the progress.
    """
    position = starting_position(start, timestamp)
    if position is None:
        return ShardRead([], replay or ShardProgress(0, SHARD_END, ended=True))
    cursor = _cursor(client, stream, shard_id, position)
    records: list[Record] = []
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max_seconds
    want = replay.records if replay is not None else quota
    ended = more = False
    children: tuple[ChildShard, ...] = ()
    while len(records) < want:
        try:
            result = await cursor.next(min(MAX_PAGE, want - len(records)))
        except ShardNotFoundError:
            result = GetRecordsResult([], None)
        page = list(result.records)
        if replay is None:
            for i, record in enumerate(page):
                if _arrived_after(record, until):
                    page = page[:i]
                    break
        records.extend(page[: want - len(records)])
        if replay is None and len(page) < len(result.records):
            break  # the cutoff: the rest of the shard is for a later run
        if result.shard_ended:
            ended, children = True, result.child_shards
            break
        if replay is not None:
            continue
        caught_up = not result.records and not result.millis_behind_latest
        if caught_up:
            break
        if loop.time() >= deadline:
            more = True
            break
        if not result.records:
            await asyncio.sleep(idle_interval)
    else:
        more = replay is None
    if replay is not None:
        last = records[-1].sequence_number if records else start
        if len(records) != replay.records or (records and last != replay.end):
            raise RuntimeError(
                f"cannot replay batch of {stream}/{shard_id} from {start}: recorded "
                f"{replay.records} records up to {replay.end}, found {len(records)} up to "
                f"{last} (records trimmed by the stream's retention?)"
            )
        return ShardRead(records, replay)
    end = records[-1].sequence_number if records else start
    return ShardRead(
        records, ShardProgress(len(records), end, ended=ended, more=more, children=children)
    )


async def has_new_records(
    client: StreamClient,
    stream: str,
    shard_id: str,
    start: str,
    *,
    timestamp: datetime | None = None,
    until: datetime | None = None,
) -> bool:
    """Whether a batch would read anything from ``start``: a record (that arrived by
    ``until``) or the shard's end. One GetShardIterator and one GetRecords of one record."""
    position = starting_position(start, timestamp)
    if position is None:
        return False
    cursor = _cursor(client, stream, shard_id, position)
    try:
        result = await cursor.next(1)
    except ShardNotFoundError:
        return True  # the shard is gone: a batch records its end
    if result.shard_ended:
        return True
    if not result.records:
        return bool(result.millis_behind_latest)  # a gap in the shard: let a batch step over it
    return bool(result.records) and not _arrived_after(result.records[0], until)
