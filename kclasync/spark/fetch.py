"""Reading one shard for one batch of the Spark source, through kclasync's ``StreamClient``.

Owns: turning an offset position into a shard iterator, the GetRecords loop that stops at a
quota, a time limit, an arrival-time cutoff or when caught up, replaying a recorded range exactly,
retries on throttling and expired iterators, KPL de-aggregation (``_core.records.kpl``, as the
workers do: user records share their aggregate's sequence number and are told apart by their
sub-sequence number), noticing records trimmed away before they were read (data loss), and the
cheap driver-side probe for new records.

A sequence position ``<seq>`` or ``<seq>/<sub>`` means "after user record (seq, sub)", exactly
like a lease checkpoint: the read starts AT_SEQUENCE_NUMBER ``seq`` and skips what is not after
it, so a batch may end inside an aggregate and the next one resumes at the following user record.
Must not: import pyspark, or decide which shards to read (``kclasync.spark.offsets``).
Executors call this on their worker's private event loop (``kclasync.spark.worker_io``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from datetime import datetime
from typing import Protocol

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
from kclasync._core.records.kpl import KplFormatError, deaggregate, is_aggregated
from kclasync._records import Record
from kclasync._runtime.shard_cursor import ShardCursor
from kclasync.errors import KclAsyncError
from kclasync.spark.offsets import (
    AT_TIMESTAMP,
    SHARD_END,
    TRIM_HORIZON,
    ShardProgress,
    format_position,
    parse_position,
)

__all__ = [
    "AwsOptions",
    "DataLossError",
    "PageSource",
    "Pages",
    "ShardRead",
    "expand",
    "has_new_records",
    "read_shard",
    "shard_iterator",
]

log = logging.getLogger("kclasync.spark")


class DataLossError(KclAsyncError):
    """Records between a batch's start and the first readable record are gone (trimmed by the
    stream's retention) and ``failOnDataLoss`` is true."""


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
    seq, _ = parse_position(position)
    return StartingPosition(IteratorType.AT_SEQUENCE_NUMBER, seq)


def expand(records: Sequence[Record]) -> tuple[list[Record], int]:
    """KPL aggregates unpacked into their user records, and how many aggregates were malformed
    (delivered whole, as the workers do)."""
    out: list[Record] = []
    malformed = 0
    for record in records:
        if not is_aggregated(record.data):
            out.append(record)
            continue
        try:
            users = deaggregate(record.data)
        except KplFormatError as exc:
            malformed += 1
            log.warning(
                "record %s on shard %s has the KPL magic bytes but is malformed (%s); "
                "delivering it as one ordinary record",
                record.sequence_number,
                record.shard_id,
                exc,
            )
            out.append(record)
            continue
        out.extend(
            attrs.evolve(record, data=u.data, partition_key=u.partition_key, sub_sequence_number=i)
            for i, u in enumerate(users)
        )
    return out, malformed


class _After:
    """Drops user records at or before a sequence position, and checks that the position's
    own record was still there (else the records up to the first one seen were trimmed)."""

    def __init__(self, position: str) -> None:
        self.after: tuple[int, int] | None = None
        if position not in (TRIM_HORIZON, AT_TIMESTAMP, SHARD_END):
            seq, sub = parse_position(position)
            self.after = (int(seq), sub)
        self.checked = self.after is None
        self.lost: str | None = None

    def __call__(self, fetched: Sequence[Record]) -> list[Record]:
        users, _ = expand(fetched)
        if self.after is None or not fetched:
            return users
        if not self.checked:
            self.checked = True
            first = fetched[0].sequence_number
            if int(first) != self.after[0]:
                self.lost = first
        after = self.after
        self.after = None  # AT_SEQUENCE_NUMBER repeats only the start's own record
        return [r for r in users if r.position > after]


def _cursor(
    client: StreamClient,
    stream: str,
    shard_id: str,
    start: StartingPosition,
    iterator: str | None = None,
) -> ShardCursor:
    """The workers' shard reader, with a bounded number of retries (a Spark task should fail
    and be retried by Spark rather than hang). ``iterator``: one already taken at ``start``
    (used first; once it expires the cursor takes a new one at ``start``)."""
    cursor = ShardCursor(client, stream, shard_id, start, backoff=0.1, max_backoff=5.0, attempts=8)
    cursor.iterator = iterator
    return cursor


class Pages(Protocol):
    """Pages of one shard in order: GetRecords results (``next_iterator`` None at SHARD_END)."""

    async def next(self, limit: int) -> GetRecordsResult: ...


#: Opens the pages of a shard from a starting position (closed when the read stops).
PageSource = Callable[[StartingPosition], AbstractAsyncContextManager[Pages]]


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
    fail_on_data_loss: bool = True,
    pages: PageSource | None = None,
    page_size: int = MAX_PAGE,
    iterator: str | None = None,
) -> ShardRead:
    """Read ``shard_id`` from ``start`` for one batch.

    A first read stops at ``quota`` user records, ``max_seconds`` after its first page (a
    fan-out subscription refused for a while does not shorten it), at the first record
    that arrived after ``until``, at SHARD_END, or when caught up (a page at the tip, see
    ``_caught_up``). With ``replay`` (the progress an earlier attempt recorded), it reads
    exactly that many records again and returns ``replay`` as the progress.

    ``pages``: where the records come from (default: GetRecords through the workers' shard
    cursor; ``kclasync.spark.fanout_pages`` gives SubscribeToShard events as pages).
    ``page_size``: the most records asked for per call (``maxRecordsPerFetch``).
    ``iterator``: a shard iterator the driver's probe took at ``start`` (GetRecords only; saves
    the read's GetShardIterator while it is fresh).
    """
    position = starting_position(start, timestamp)
    if position is None:
        return ShardRead([], replay or ShardProgress(0, SHARD_END, ended=True))
    stack = contextlib.AsyncExitStack()
    if pages is None:
        cursor: Pages = _cursor(client, stream, shard_id, position, iterator)
    else:
        cursor = await stack.enter_async_context(pages(position))
    after = _After(start)
    records: list[Record] = []
    loop = asyncio.get_running_loop()
    # The time limit counts from the first page: waiting for a fan-out subscription (the
    # service refuses one within 5 s of the previous batch's) must not use it up.
    deadline: float | None = None
    want = replay.records if replay is not None else quota
    ended = more = False
    children: tuple[ChildShard, ...] = ()
    async with stack:
        while len(records) < want:
            asked = min(page_size, want - len(records) + 1)
            try:
                result = await cursor.next(asked)
            except ShardNotFoundError:
                result = GetRecordsResult([], None)
            if deadline is None:
                deadline = loop.time() + max_seconds
            page = after(result.records)
            if after.lost is not None and (replay is None or replay.lost is None):
                _data_loss(stream, shard_id, start, after.lost, fail_on_data_loss)
            cut = False
            if replay is None:
                for i, record in enumerate(page):
                    if _arrived_after(record, until):
                        page, cut = page[:i], True
                        break
            records.extend(page[: want - len(records)])
            if len(records) >= want:
                break  # the quota (possibly inside an aggregate)
            if cut:
                break  # the cutoff: the rest of the shard is for a later run
            if result.shard_ended:
                ended, children = True, result.child_shards
                break
            if replay is not None:
                continue
            if _caught_up(result, asked, polling=pages is None):
                break
            if deadline is not None and loop.time() >= deadline:
                more = True
                break
            if not result.records:
                await asyncio.sleep(idle_interval)
    if replay is None and len(records) >= want and not ended:
        more = True
    end = format_position(records[-1]) if records else start
    if replay is not None:
        if len(records) != replay.records or (records and end != replay.end):
            raise RuntimeError(
                f"cannot replay batch of {stream}/{shard_id} from {start}: recorded "
                f"{replay.records} records up to {replay.end}, found {len(records)} up to "
                f"{end} (records trimmed by the stream's retention?)"
            )
        return ShardRead(records, replay)
    return ShardRead(
        records,
        ShardProgress(
            len(records), end, ended=ended, more=more, children=children, lost=after.lost
        ),
    )


def _caught_up(result: GetRecordsResult, asked: int, *, polling: bool) -> bool:
    """Whether a page shows the read reached the shard's tip: an empty page with nothing
    behind, or (GetRecords only) a page shorter than asked for that is 0 ms behind. The short
    page saves the empty GetRecords after it; both conditions are needed, since an emulator may
    report 0 ms behind with records left (moto counts only the milliseconds between arrivals)
    and a short page alone only says a GetRecords size limit was reached."""
    if result.millis_behind_latest:
        return False
    if not result.records:
        return True
    return polling and result.millis_behind_latest == 0 and len(result.records) < asked


def _data_loss(stream: str, shard_id: str, start: str, first: str, fail: bool) -> None:
    text = (
        f"records of {stream}/{shard_id} after {start} are gone (trimmed by the stream's "
        f"retention?): the first readable record is {first}"
    )
    if fail:
        raise DataLossError(f"{text}; set failOnDataLoss=false to carry on from there")
    log.warning("%s; carrying on from there (failOnDataLoss=false)", text)


async def shard_iterator(
    client: StreamClient,
    stream: str,
    shard_id: str,
    start: str,
    *,
    timestamp: datetime | None = None,
) -> str | None:
    """A shard iterator at ``start`` for the batch's read of the shard (``read_shard``'s
    ``iterator``), or None (at SHARD_END, or when the one call failed: the read takes its own,
    with its retries)."""
    position = starting_position(start, timestamp)
    if position is None:
        return None
    try:
        return await client.get_shard_iterator(stream, shard_id, position)
    except Exception as exc:
        log.debug("no early iterator for %s %s: %r", stream, shard_id, exc)
        return None


async def has_new_records(
    client: StreamClient,
    stream: str,
    shard_id: str,
    start: str,
    *,
    timestamp: datetime | None = None,
    until: datetime | None = None,
    iterators: dict[str, str] | None = None,
) -> bool:
    """Whether a batch would read anything from ``start``: a record (that arrived by
    ``until``), the shard's end, or a gap. One GetShardIterator and one small GetRecords.
    ``iterators``: where the iterator taken at ``start`` is kept, by shard, for the batch's
    read of the shard (``read_shard``'s ``iterator``)."""
    position = starting_position(start, timestamp)
    if position is None:
        return False
    cursor = _cursor(client, stream, shard_id, position)
    after = _After(start)
    try:
        cursor.iterator = await cursor.fresh_iterator()
        if iterators is not None:
            iterators[shard_id] = cursor.iterator
        result = await cursor.next(2)
    except ShardNotFoundError:
        return True  # the shard is gone: a batch records its end
    page = after(result.records)
    if page:
        return not _arrived_after(page[0], until)
    if result.shard_ended or after.lost is not None:
        return True
    if len(result.records) > 1 or (result.records and result.millis_behind_latest):
        return True  # more behind the start's own record
    return not result.records and bool(result.millis_behind_latest)  # a gap: step over it
