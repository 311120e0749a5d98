"""The fan-out adapter against a local server speaking the service's event-stream framing
(initial-response, SubscribeToShardEvent, ChildShards at shard end, injected faults); the
cursor over it: ``test_cursor_server.py``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.fanout_errors import (
    ConsumerNotFoundError,
    SubscriptionDroppedError,
    SubscriptionInUseError,
)
from kclasync._adapters.fanout_subscription import SubscriptionEvent
from kclasync._adapters.protocols import (
    IteratorType,
    ShardNotFoundError,
    StartingPosition,
)
from kclasync.errors import ThrottledError, TransientError
from kclasync.testing.eventstream import FanOutServer, Fault
from tests.fanout.server_support import SHARD, TRIM, consumer_arn, put


async def first_events(
    fanout: FanOutClient, arn: str, position: StartingPosition, count: int
) -> list[SubscriptionEvent]:
    out = []
    async with fanout.subscribe(arn, "fanout-stream", SHARD, position) as sub:
        async for event in sub:
            out.append(event)
            if len(out) == count:
                break
    return out


async def test_register_waits_until_active_and_reuses_the_existing_consumer(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    first = await fanout.ensure_consumer(server.stream, "app", poll_interval=0.01)
    assert first.status == "ACTIVE"
    assert fanout.calls["register_stream_consumer"] == 1
    again = await fanout.ensure_consumer(server.stream, "app", poll_interval=0.01)
    assert again.arn == first.arn
    assert fanout.calls["register_stream_consumer"] == 1  # reused, not registered twice
    assert await fanout.deregister_consumer(first.arn)
    assert not await fanout.deregister_consumer(first.arn)
    assert "app" not in server.consumers


async def test_records_continuation_and_millis_behind(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    seqs = await put(server, 5)
    arn = await consumer_arn(fanout, server)
    (event,) = await first_events(fanout, arn, TRIM, 1)
    assert [r.sequence_number for r in event.records] == seqs
    assert [r.data for r in event.records] == [f"r{i}".encode() for i in range(5)]
    assert {(r.shard_id, r.stream, r.partition_key) for r in event.records} == {
        (SHARD, "fanout-stream", "pk")
    }
    arrival = event.records[0].approximate_arrival
    assert arrival is not None and arrival.tzinfo is UTC
    assert event.continuation_sequence == seqs[-1]
    assert event.millis_behind_latest == 0
    assert not event.shard_ended


@pytest.mark.parametrize(
    ("position", "expected"),
    [
        ("AT_SEQUENCE_NUMBER", slice(2, None)),
        ("AFTER_SEQUENCE_NUMBER", slice(3, None)),
        ("LATEST", slice(5, None)),
        ("AT_TIMESTAMP", slice(0, None)),
    ],
)
async def test_starting_positions(
    server: FanOutServer, fanout: FanOutClient, position: str, expected: slice
) -> None:
    seqs = await put(server, 5)
    arn = await consumer_arn(fanout, server)
    kind = IteratorType(position)
    if kind in (IteratorType.AT_SEQUENCE_NUMBER, IteratorType.AFTER_SEQUENCE_NUMBER):
        start = StartingPosition(kind, seqs[2])
    elif kind is IteratorType.AT_TIMESTAMP:
        start = StartingPosition(kind, timestamp=datetime(2020, 1, 1, tzinfo=UTC))
    else:
        start = StartingPosition(kind)
    (event,) = await first_events(fanout, arn, start, 1)
    assert [r.sequence_number for r in event.records] == seqs[expected]
    assert server.calls[-1].position["Type"] == position


async def test_shard_end_brings_child_shards(server: FanOutServer, fanout: FanOutClient) -> None:
    seqs = await put(server, 3)
    children = await server.split(SHARD)
    arn = await consumer_arn(fanout, server)
    events = []
    async with fanout.subscribe(arn, "fanout-stream", SHARD, TRIM) as sub:
        async for event in sub:
            events.append(event)
    assert [r.sequence_number for e in events for r in e.records] == seqs
    assert events[-1].shard_ended
    assert [c.shard_id for c in events[-1].child_shards] == list(children)
    assert all(c.parent_shard_ids == (SHARD,) for c in events[-1].child_shards)


async def test_a_subscription_ends_cleanly_after_its_lifetime(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    server.lifetime = 0.3
    arn = await consumer_arn(fanout, server)
    async with fanout.subscribe(arn, "fanout-stream", SHARD, TRIM) as sub:
        events = [e async for e in sub]
    assert sub.completed
    assert events and not events[-1].shard_ended


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        (Fault(error="ResourceInUseException"), SubscriptionInUseError),
        (Fault(error="LimitExceededException"), ThrottledError),
        (Fault(exception_after=1, exception_code="ResourceInUseException"), SubscriptionInUseError),
        (Fault(exception_after=1), TransientError),
        (Fault(drop_after=1), SubscriptionDroppedError),
        (Fault(corrupt_after=1), SubscriptionDroppedError),
    ],
)
async def test_errors_are_mapped(
    server: FanOutServer, fanout: FanOutClient, fault: Fault, error: type[Exception]
) -> None:
    await put(server, 2)
    arn = await consumer_arn(fanout, server)
    server.fault(fault)
    got: list[SubscriptionEvent] = []
    with pytest.raises(error):
        async with fanout.subscribe(arn, "fanout-stream", SHARD, TRIM) as sub:
            async for event in sub:
                got.append(event)
    # Mid-stream faults come after the first event, which arrived intact.
    assert len(got) == (1 if fault.error is None else 0)


async def test_not_found_tells_the_shard_from_the_consumer(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    arn = await consumer_arn(fanout, server)
    with pytest.raises(ShardNotFoundError):
        async with fanout.subscribe(arn, "fanout-stream", "shardId-000000000099", TRIM):
            pass
    await fanout.deregister_consumer(arn)
    with pytest.raises(ConsumerNotFoundError):
        async with fanout.subscribe(arn, "fanout-stream", SHARD, TRIM):
            pass
