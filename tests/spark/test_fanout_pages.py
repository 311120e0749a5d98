"""Fan-out events as the source's pages, over a scripted event flow (the cursor and the servers
are tested in tests/fanout and test_fanout.py): when a read counts as caught up, the time limit,
and closing a subscription that is still waiting for an event."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator

from kclasync._adapters.fanout import SubscriptionEvent
from kclasync._adapters.protocols import ChildShard, IteratorType, StartingPosition
from kclasync._records import Record
from kclasync.spark.fanout_pages import FanOutPages
from kclasync.spark.fetch import read_shard

AT_5 = StartingPosition(IteratorType.AT_SEQUENCE_NUMBER, "5")


def rec(seq: int) -> Record:
    return Record(data=b"x", partition_key="k", sequence_number=str(seq), shard_id="s")


def event(seqs: list[int], behind: int | None, *, end: bool = False) -> SubscriptionEvent:
    return SubscriptionEvent(
        records=[rec(s) for s in seqs],
        continuation_sequence=None if end else str(max(seqs, default=0)),
        millis_behind_latest=behind,
        child_shards=(ChildShard("c", ("s",), None),) if end else (),
    )


class Script:
    """An event flow: the events given, then (optionally) nothing for ever."""

    def __init__(self, events: list[SubscriptionEvent], hang: bool = False) -> None:
        self.events = events
        self.hang = hang
        self.closed = False

    async def flow(self) -> AsyncGenerator[SubscriptionEvent, None]:
        try:
            for e in self.events:
                yield e
            if self.hang:
                await asyncio.Event().wait()
        finally:
            self.closed = True


async def test_caught_up_after_new_records_but_not_after_the_start_record_alone() -> None:
    script = Script([event([5], 0), event([], 0, end=True)])
    pages = FanOutPages(script.flow(), 10.0, AT_5)
    first = await pages.next(100)
    assert [r.sequence_number for r in first.records] == ["5"] and not first.shard_ended
    # Only the start's own record: the next page is the next event (here the shard's end).
    second = await pages.next(100)
    assert second.shard_ended and second.child_shards[0].shard_id == "c"
    await pages.aclose()
    assert script.closed

    script = Script([event([5, 6, 7], 0)], hang=True)
    pages = FanOutPages(script.flow(), 10.0, AT_5)
    assert len((await pages.next(100)).records) == 3
    caught_up = await asyncio.wait_for(pages.next(100), 1)  # no wait for another event
    assert not caught_up.records and caught_up.millis_behind_latest == 0
    assert not caught_up.shard_ended
    await pages.aclose()


async def test_time_limit_counts_from_the_first_event_and_close_stops_the_wait() -> None:
    script = Script([event([6], 500)], hang=True)
    pages = FanOutPages(script.flow(), 0.0, AT_5)
    behind = await pages.next(100)
    assert len(behind.records) == 1 and behind.millis_behind_latest == 500
    loop = asyncio.get_running_loop()
    began = loop.time()
    idle = await pages.next(100)  # the limit has passed: one short wait, then "caught up"
    assert not idle.records and idle.millis_behind_latest == 0
    assert 0.9 <= loop.time() - began < 5
    await pages.aclose()  # an event was still awaited: the flow is closed all the same
    assert script.closed


async def test_a_subscription_refused_for_a_while_does_not_use_up_the_read_time() -> None:
    """The service refuses a subscription to a shard within 5 s of the previous batch's: a read
    that waited that long for its first event still reads on to the shard's end (it used to stop
    at the first event, the start's own record, and every later batch planned the same read)."""

    class Late(Script):
        async def flow(self) -> AsyncGenerator[SubscriptionEvent, None]:
            await asyncio.sleep(0.3)  # the refused subscriptions, then the accepted one
            async for e in super().flow():
                yield e

    script = Late([event([5], 0), event([], 0, end=True)])

    @contextlib.asynccontextmanager
    async def source(position: StartingPosition) -> AsyncIterator[FanOutPages]:
        pages = FanOutPages(script.flow(), 0.1, position)
        try:
            yield pages
        finally:
            await pages.aclose()

    read = await read_shard(
        None,  # type: ignore[arg-type]  # no GetRecords: the pages are the events
        "stream",
        "s",
        "5",
        quota=100,
        max_seconds=0.1,
        pages=source,
    )
    assert read.records == [] and read.progress.ended and not read.progress.more
    assert [c.shard_id for c in read.progress.children] == ["c"]
