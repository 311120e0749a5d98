"""The fan-out adapter and cursor against kinesis-local.

kinesis-local sends no ``initial-response`` event and no ChildShards at a shard's end; the tests
reach it through ``KinesisLocalFanOutRelay`` (test support), which adds both as the service sends
them. The library's own path is the same as against the service.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.fanout_errors import SubscriptionDroppedError
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._adapters.protocols import IteratorType, StartingPosition
from kclasync._core.records.fanout_session import ResubscribePolicy
from kclasync._runtime.fanout_cursor import FanOutCursor
from kclasync.testing.emulators import LocalAws
from kclasync.testing.fanout_proxy import KinesisLocalFanOutRelay

TRIM = StartingPosition(IteratorType.TRIM_HORIZON)


@pytest.fixture
async def relayed(kinesis: LocalAws) -> AsyncIterator[Any]:
    assert kinesis.kinesis_endpoint_url is not None
    async with KinesisLocalFanOutRelay(kinesis.kinesis_endpoint_url) as url:
        options = kinesis.client_options(kinesis_endpoint_url=url, max_attempts=1)
        async with options.create_client("kinesis") as client:
            yield client


async def test_without_the_relay_aiobotocore_refuses_the_stream(
    kinesis: LocalAws, unique_name: str
) -> None:
    """The quirk itself: no initial-response, so the adapter sees an unreadable stream."""
    async with kinesis.client_options(max_attempts=1).create_client("kinesis") as client:
        stream = KinesisStreamClient(client)
        await stream.create_stream(unique_name, 1)
        fanout = FanOutClient(client)
        consumer = await fanout.ensure_consumer(unique_name, "app", poll_interval=0.1)
        await stream.put_records(unique_name, [("k", b"x")])
        shard = (await stream.list_shards(unique_name))[0].shard_id
        with pytest.raises(SubscriptionDroppedError, match="unreadable event stream"):
            async with fanout.subscribe(consumer.arn, unique_name, shard, TRIM):
                pass


async def test_reads_renews_and_ends_at_the_split(relayed: Any, unique_name: str) -> None:
    stream = KinesisStreamClient(relayed)
    await stream.create_stream(unique_name, 1)
    fanout = FanOutClient(relayed)
    consumer = await fanout.ensure_consumer(unique_name, "app", poll_interval=0.1)
    again = await fanout.ensure_consumer(unique_name, "app", poll_interval=0.1)
    assert again.arn == consumer.arn
    shard = (await stream.list_shards(unique_name))[0].shard_id
    first = await stream.put_records(unique_name, [("k", b"a%d" % i) for i in range(20)])
    expected = [r[1] for r in first if r is not None]
    assert len(expected) == 20

    reasons: list[str] = []
    policy = ResubscribePolicy(
        base_backoff=0.05,
        max_backoff=0.5,
        in_use_backoff=0.3,
        refresh_after=2.5,
        success_interval=0.0,  # kinesis-local has no such limit; tests/faults checks it
        call_interval=0.0,
    )
    cursor = FanOutCursor(
        fanout,
        consumer.arn,
        unique_name,
        shard,
        TRIM,
        policy=policy,
        rng=random.Random(5),
        on_resubscribe=reasons.append,
    )
    got: list[str] = []
    ended = None
    split = False
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 45
    async for event in cursor.events():
        got.extend(r.sequence_number for r in event.records)
        if event.shard_ended:
            ended = event
            break
        if not split and "refreshed" in reasons and len(got) == 20:
            more = await stream.put_records(unique_name, [("k", b"b%d" % i) for i in range(5)])
            expected += [r[1] for r in more if r is not None]
            await relayed.split_shard(
                StreamName=unique_name, ShardToSplit=shard, NewStartingHashKey=str(2**127)
            )
            split = True
        assert loop.time() < deadline, f"stuck: {reasons}"
    assert got == expected  # every record once, in order, across renewals
    assert "refreshed" in reasons
    assert ended is not None
    children = {c.shard_id for c in ended.child_shards}
    listed = {s.shard_id for s in await stream.list_shards(unique_name) if s.shard_id != shard}
    assert children == listed and len(children) == 2
    assert all(c.parent_shard_ids == (shard,) for c in ended.child_shards)
