"""ShardCursor: the shard reader shared by workers and the Spark source."""

from __future__ import annotations

import random

import pytest

from kclasync._adapters.memory import FaultPlan, MemoryStreamClient, OpFaults
from kclasync._adapters.protocols import IteratorType, StartingPosition
from kclasync._runtime.shard_cursor import ShardCursor
from kclasync.errors import ThrottledError

pytestmark = pytest.mark.asyncio


async def test_bounded_attempts_raise_the_last_error_and_count_throttles() -> None:
    faults = FaultPlan(random.Random(0), operations={"get_records": OpFaults(throttle=1.0)})
    client = MemoryStreamClient(faults=faults)
    client.create_stream("s", 1)
    (shard,) = [s.shard_id for s in await client.list_shards("s")]
    throttles: list[int] = []
    cursor = ShardCursor(
        client,
        "s",
        shard,
        StartingPosition(IteratorType.TRIM_HORIZON),
        backoff=0.001,
        attempts=3,
        on_throttle=lambda: throttles.append(1),
    )
    with pytest.raises(ThrottledError):
        await cursor.next(10)
    assert len(throttles) == 3


async def test_reads_in_order_and_resumes_after_an_expired_iterator() -> None:
    from kclasync._adapters.protocols import ExpiredIteratorError, GetRecordsResult

    class ExpiresEveryOther(MemoryStreamClient):
        calls = 0

        async def get_records(
            self, stream: str, shard_id: str, iterator: str, limit: int
        ) -> GetRecordsResult:
            self.calls += 1
            if self.calls % 2 == 0:
                raise ExpiredIteratorError("injected: iterator expired")
            return await super().get_records(stream, shard_id, iterator, limit)

    client = ExpiresEveryOther()
    client.create_stream("s", 1)
    for i in range(25):
        client.put_record("s", "k", str(i).encode())
    (shard,) = [s.shard_id for s in await client.list_shards("s")]
    cursor = ShardCursor(client, "s", shard, StartingPosition(IteratorType.TRIM_HORIZON))
    seen: list[bytes] = []
    for _ in range(3):
        seen += [r.data for r in (await cursor.next(10)).records]
    assert seen == [str(i).encode() for i in range(25)]  # nothing lost, nothing twice
    assert client.calls >= 5  # expiries happened and were recovered from
