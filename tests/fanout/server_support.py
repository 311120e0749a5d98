"""What the fan-out tests against the local event-stream server share besides its fixtures
(``conftest.py``): the shard, a resubscribe policy without the service's waits, and small
helpers."""

from __future__ import annotations

import asyncio
from typing import Any

from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.protocols import IteratorType, StartingPosition
from kclasync._core.records.fanout_session import ResubscribePolicy
from kclasync.testing.eventstream import FanOutServer

SHARD = "shardId-000000000000"
TRIM = StartingPosition(IteratorType.TRIM_HORIZON)
# No waits for the service's limits (the test server has none; tests/faults checks them).
FAST = ResubscribePolicy(
    base_backoff=0.01,
    max_backoff=0.05,
    in_use_backoff=0.02,
    success_interval=0.0,
    call_interval=0.0,
)


async def put(server: FanOutServer, n: int, shard: str = SHARD) -> list[str]:
    return [await server.put(shard, f"r{i}".encode()) for i in range(n)]


async def consumer_arn(fanout: FanOutClient, server: FanOutServer) -> str:
    return (await fanout.ensure_consumer(server.stream, "app", poll_interval=0.01)).arn


async def wait_for(predicate: Any, timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.02)
