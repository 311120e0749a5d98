"""The fan-out cursor (resubscribing, renewing from the continuation, registering again,
giving up, backpressure) against the local event-stream server with injected faults."""

from __future__ import annotations

import asyncio
import logging
import random
import re
from typing import Any

import attrs
import pytest

from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.fanout_errors import (
    ConsumerNotFoundError,
    SubscriptionInUseError,
)
from kclasync._adapters.fanout_subscription import SubscriptionEvent
from kclasync._adapters.protocols import (
    ShardNotFoundError,
)
from kclasync._core.records.fanout_session import ResubscribePolicy
from kclasync._runtime.fanout_cursor import FanOutCursor
from kclasync._runtime.fanout_streams import FanOutConsumers
from kclasync.testing.eventstream import FanOutServer, Fault
from tests.fanout.server_support import FAST, SHARD, TRIM, consumer_arn, put, wait_for


async def read_all(cursor: FanOutCursor) -> list[str]:
    seqs = []
    async for event in cursor.events():
        seqs.extend(r.sequence_number for r in event.records)
        if event.shard_ended:
            break
    return seqs


def cursor(fanout: FanOutClient, arn: str, **kwargs: Any) -> FanOutCursor:
    return FanOutCursor(
        fanout, arn, "fanout-stream", SHARD, TRIM, policy=FAST, rng=random.Random(3), **kwargs
    )


async def test_cursor_resubscribes_through_every_fault_without_loss_or_duplicates(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    server.batch = 4  # several events per subscription
    seqs = await put(server, 30)
    await server.split(SHARD)
    arn = await consumer_arn(fanout, server)
    for fault in (
        Fault(error="ResourceInUseException"),
        Fault(drop_after=2),
        Fault(exception_after=1, exception_code="InternalFailureException"),
        Fault(error="LimitExceededException"),
        Fault(corrupt_after=1),
        Fault(exception_after=2, exception_code="ResourceInUseException"),
    ):
        server.fault(fault)
    reasons: list[str] = []
    throttles: list[int] = []
    c = cursor(fanout, arn, on_resubscribe=reasons.append, on_throttle=lambda: throttles.append(1))
    assert await read_all(c) == seqs
    assert c.subscriptions == 7
    assert reasons == ["in_use", "dropped", "dropped", "throttled", "dropped", "in_use"]
    assert len(throttles) == 1
    # Each resubscription started right after what had been handed on.
    positions = [call.position for call in server.calls]
    assert positions[0] == {"Type": "TRIM_HORIZON"}
    assert positions[1] == {"Type": "TRIM_HORIZON"}  # nothing handed on yet
    assert positions[2]["Type"] == "AFTER_SEQUENCE_NUMBER"
    assert positions[2]["SequenceNumber"] == seqs[7]


async def test_a_refusal_inside_the_event_stream_is_not_counted_as_an_accepted_call(
    server: FanOutServer, fanout: FanOutClient, caplog: pytest.LogCaptureFixture
) -> None:
    # Some servers answer ResourceInUse as the first event of an established stream (kinesis-
    # local does). That call was refused: the next one waits the refusal's backoff, not the
    # ``success_interval`` that follows a call the service accepted.
    seqs = await put(server, 5)
    await server.split(SHARD)
    arn = await consumer_arn(fanout, server)
    server.fault(Fault(exception_after=0, exception_code="ResourceInUseException"))
    policy = attrs.evolve(FAST, success_interval=30.0, in_use_backoff=0.02, max_backoff=0.05)
    reasons: list[str] = []
    c = FanOutCursor(
        fanout,
        arn,
        "fanout-stream",
        SHARD,
        TRIM,
        policy=policy,
        rng=random.Random(3),
        on_resubscribe=reasons.append,
    )
    caplog.set_level(logging.INFO, logger="kclasync.fanout")
    assert await asyncio.wait_for(read_all(c), 10.0) == seqs
    assert reasons == ["in_use"] and c.subscriptions == 2
    delays = [float(m) for m in re.findall(r"subscribing again in ([0-9.]+)s", caplog.text)]
    assert len(delays) == 1 and delays[0] <= 0.05, caplog.text


@pytest.mark.parametrize(
    ("lifetime", "refresh_after", "reason"),
    [(5.0, 0.15, "refreshed"), (0.15, 280.0, "completed")],
)
async def test_cursor_renews_subscriptions_from_the_continuation(
    server: FanOutServer,
    fanout: FanOutClient,
    lifetime: float,
    refresh_after: float,
    reason: str,
) -> None:
    """Renewed by the reader before the lifetime ends, or after the service ended it."""
    server.lifetime = lifetime
    seqs = await put(server, 3)
    arn = await consumer_arn(fanout, server)
    reasons: list[str] = []
    policy = ResubscribePolicy(
        base_backoff=0.01,
        max_backoff=0.05,
        refresh_after=refresh_after,
        success_interval=0.0,
        call_interval=0.0,
    )
    c = FanOutCursor(
        fanout, arn, "fanout-stream", SHARD, TRIM, policy=policy, on_resubscribe=reasons.append
    )
    got: list[str] = []
    async for event in c.events():
        got.extend(r.sequence_number for r in event.records)
        if len(reasons) == 2 and len(seqs) == 3:
            seqs += await put(server, 3)  # written two renewals later
        if len(got) >= 6:
            break
    assert got == seqs
    # The old subscription may still count as active for a moment (ResourceInUse), as it does
    # on the service: the cursor then waits and subscribes again.
    assert reason in reasons
    assert set(reasons) <= {reason, "in_use"}
    assert all(call.position["Type"] == "AFTER_SEQUENCE_NUMBER" for call in server.calls[1:])
    assert server.calls[1].position["SequenceNumber"] == seqs[2]


async def test_cursor_registers_the_consumer_again_when_it_is_gone(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    seqs = await put(server, 3)
    await server.split(SHARD)
    arn = await consumer_arn(fanout, server)
    await fanout.deregister_consumer(arn)

    async def reregister() -> str:
        return await consumer_arn(fanout, server)

    assert await read_all(cursor(fanout, arn, reregister=reregister)) == seqs
    assert await fanout.deregister_consumer(arn)
    with pytest.raises(ConsumerNotFoundError):
        await read_all(cursor(fanout, arn))  # without a way to register again: raised


async def test_cursor_gives_up_when_the_shard_is_gone(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    arn = await consumer_arn(fanout, server)
    c = FanOutCursor(fanout, arn, "fanout-stream", "shardId-000000000099", TRIM, policy=FAST)
    with pytest.raises(ShardNotFoundError):
        await read_all(c)
    assert c.subscriptions == 1


async def test_cursor_gives_up_after_max_failures(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    arn = await consumer_arn(fanout, server)
    for _ in range(3):
        server.fault(Fault(error="ResourceInUseException"))
    policy = attrs.evolve(FAST, max_backoff=0.02, in_use_backoff=0.01, max_failures=3)
    c = FanOutCursor(fanout, arn, "fanout-stream", SHARD, TRIM, policy=policy)
    with pytest.raises(SubscriptionInUseError):
        await read_all(c)
    assert c.subscriptions == 3


async def test_one_registration_per_stream_and_deregistration_on_stop(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    consumers = FanOutConsumers(fanout, "app", poll_interval=0.01, deregister_on_stop=True)
    arns = await asyncio.gather(*(consumers.consumer_arn(server.stream) for _ in range(8)))
    assert len(set(arns)) == 1
    assert fanout.calls["register_stream_consumer"] == 1
    seqs = await put(server, 2)
    await server.split(SHARD)
    c = await consumers.cursor(server.stream, SHARD, TRIM)
    assert await read_all(c) == seqs
    await consumers.close()
    assert server.consumers == {}


async def test_consumers_are_kept_on_stop_by_default(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    consumers = FanOutConsumers(fanout, "app", poll_interval=0.01)
    await consumers.consumer_arn(server.stream)
    await consumers.close()
    assert server.consumers == {"app": "ACTIVE"}


async def test_the_stream_is_read_only_as_fast_as_the_queue_drains(
    server: FanOutServer, fanout: FanOutClient
) -> None:
    """40 events of ~1 MB: with the reader stalled behind a full queue of 3, the server can only
    send what the queue, the one event in hand and the socket buffers hold."""
    server.batch = 10
    server.lifetime = 120.0  # one subscription throughout, however slow the machine
    big = b"x" * 100_000
    for _ in range(400):
        await server.put(SHARD, big)
    arn = await consumer_arn(fanout, server)
    queue: asyncio.Queue[SubscriptionEvent] = asyncio.Queue(3)

    async def fetch() -> None:
        async for event in cursor(fanout, arn).events():
            await queue.put(event)

    task = asyncio.create_task(fetch())
    try:
        await wait_for(lambda: queue.full(), 10)
        sent = -1
        while sent != server.calls[-1].events:  # until the server is blocked
            sent = server.calls[-1].events
            await asyncio.sleep(0.3)
        assert 4 <= sent <= 20, sent  # far from all 40
        records = 0
        while records < 400:
            records += len((await asyncio.wait_for(queue.get(), 10)).records)
        assert records == 400
        assert len(server.calls) == 1
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
