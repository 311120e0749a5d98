"""Enhanced fan-out for the Spark source's executor reads: SubscribeToShard events as pages.

Owns: handing the events of the workers' fan-out cursor (``kclasync._runtime.fanout_cursor``,
which subscribes from the exact starting position, renews a subscription before the service's
five-minute limit and resubscribes after errors from the continuation sequence number) to the
one read loop of the source (``kclasync.spark.fetch.read_shard``) as GetRecords-like pages, so
polling and fan-out share the quota, replay, cutoff, KPL and SHARD_END rules; bounding the wait
for an event by the read's time limit; closing the subscription when the read stops.
Must not: decide what a batch reads (``fetch``), resubscribe by itself (the cursor and
``kclasync._core.records.fanout_session`` do), or register the stream consumer (the driver does).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable

from kclasync._adapters.fanout import FanOutClient, SubscriptionEvent
from kclasync._adapters.protocols import GetRecordsResult, IteratorType, StartingPosition
from kclasync._core.records.fanout_session import ResubscribePolicy
from kclasync._runtime.fanout_cursor import FanOutCursor
from kclasync.spark.fetch import Pages, PageSource

__all__ = ["TASK_POLICY", "FanOutPages", "fanout_pages"]

#: Resubscription inside one Spark task. The service refuses a new subscription to a shard
#: within 5 s of the consumer's last successful one (ResourceInUse; the previous batch's task
#: made it) and allows one SubscribeToShard call per second per consumer and shard: retry every
#: 1-2 s. A subscription that keeps failing fails the task (Spark retries it) instead of hanging.
TASK_POLICY = ResubscribePolicy(
    base_backoff=0.5, max_backoff=2.0, in_use_backoff=2.0, max_failures=15
)

#: Stands for "the shard goes on" in a page (a fan-out read has no shard iterator).
_OPEN = "subscription"

#: The shortest wait for an event once the read's time limit has passed (a replay reads on
#: until it has its recorded records).
_MIN_WAIT = 1.0


class FanOutPages:
    """The pages of one shard from one fan-out cursor.

    An event's records form one page. An event with ``MillisBehindLatest`` 0 that brought a
    record other than the starting position's own (a subscription AT_SEQUENCE_NUMBER repeats
    it) means nothing more is there at the moment: the next page is an empty, caught-up one,
    without waiting for the next event. (Otherwise the next event is awaited: at a closed
    shard's end it is the one that carries the ChildShards.) The read's time limit
    (``max_seconds``) counts from the first event, so the
    wait for a subscription (bounded by ``TASK_POLICY``) does not use it up; no event within
    the time left (at least ``_MIN_WAIT``) then also reads as caught up.
    """

    def __init__(
        self,
        events: AsyncGenerator[SubscriptionEvent, None],
        max_seconds: float,
        start: StartingPosition,
    ) -> None:
        self._events = events
        self._start = (
            start.sequence_number if start.type is IteratorType.AT_SEQUENCE_NUMBER else None
        )
        self._max_seconds = max_seconds
        self._deadline: float | None = None
        self._pending: asyncio.Future[SubscriptionEvent] | None = None
        self._caught_up = False

    async def next(self, limit: int) -> GetRecordsResult:
        if self._caught_up:
            self._caught_up = False
            return GetRecordsResult([], _OPEN, millis_behind_latest=0)
        if self._pending is None:
            self._pending = asyncio.ensure_future(anext(self._events))
        loop = asyncio.get_running_loop()
        wait = None if self._deadline is None else max(self._deadline - loop.time(), _MIN_WAIT)
        done, _ = await asyncio.wait({self._pending}, timeout=wait)
        if not done:
            return GetRecordsResult([], _OPEN, millis_behind_latest=0)
        pending, self._pending = self._pending, None
        event = pending.result()  # the cursor's errors surface here
        if self._deadline is None:
            self._deadline = loop.time() + self._max_seconds
        fresh = any(r.sequence_number != self._start for r in event.records)
        self._caught_up = fresh and event.millis_behind_latest == 0
        return GetRecordsResult(
            event.records,
            None if event.shard_ended else _OPEN,
            millis_behind_latest=event.millis_behind_latest,
            child_shards=event.child_shards,
        )

    async def aclose(self) -> None:
        """Stop waiting and close the subscription."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
            await asyncio.wait({pending})  # the subscription's cleanup ran
            if not pending.cancelled():
                pending.exception()  # retrieved: the read is over either way
        await self._events.aclose()


def fanout_pages(
    fanout: FanOutClient,
    consumer_arn: str,
    stream: str,
    shard_id: str,
    *,
    max_seconds: float,
    reregister: Callable[[], Awaitable[str]] | None = None,
    rng: random.Random | None = None,
    on_subscribe: Callable[[], None] | None = None,
) -> PageSource:
    """The ``pages`` argument of ``read_shard`` for a fan-out read of ``shard_id``."""

    @contextlib.asynccontextmanager
    async def open_pages(position: StartingPosition) -> AsyncIterator[Pages]:
        cursor = FanOutCursor(
            fanout,
            consumer_arn,
            stream,
            shard_id,
            position,
            policy=TASK_POLICY,
            rng=rng,
            reregister=reregister,
            on_subscribe=on_subscribe,
        )
        pages = FanOutPages(cursor.events(), max_seconds, position)
        try:
            yield pages
        finally:
            await pages.aclose()

    return open_pages
