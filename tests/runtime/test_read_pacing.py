"""A worker's fetchers pace their reads with ``_core/read_pacing`` (virtual time, in-memory
adapters): an idle shard is read less and less often, up to the maximum idle time, and a record
written to it at any moment is processed within that maximum."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from kclasync import Record
from kclasync._adapters.memory import MemoryLeaseTable, MemoryStreamClient
from tests.runtime.test_faults import STREAM, Seen, consumer
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

IDLE, MAX_IDLE = 1.0, 8.0


async def _idle_reads(client: MemoryStreamClient, seconds: float) -> int:
    before = client.reads["get_records"]
    await asyncio.sleep(seconds)
    return client.reads["get_records"] - before


@in_virtual_time
async def test_idle_shards_are_read_at_most_every_maximum_idle_time_and_wake_up_within_it() -> None:
    client = MemoryStreamClient()
    client.create_stream(STREAM, 2)
    seen = Seen()
    loop = asyncio.get_running_loop()
    processed_at: dict[bytes, float] = {}

    async def handle(records: Sequence[Record]) -> None:
        await seen(records)
        for record in records:
            processed_at.setdefault(record.data, loop.time())

    c = consumer(
        handle,
        MemoryLeaseTable(),
        client,
        CollectorRegistry(),
        idle_time_between_reads=IDLE,
        max_idle_time_between_reads=MAX_IDLE,
        min_time_between_reads=0.2,
        failover_time=10.0,
    )
    rng = random.Random(3)
    async with c:
        await wait_until(lambda: len(c.held_leases) == 2, 30, "both leases")
        await asyncio.sleep(30)  # the pauses grow to the maximum: 1 + 2 + 4 + 8
        # Two shards read every MAX_IDLE seconds: 2 x 240 / 8 = 60 calls (a fixed pause of IDLE
        # would make 480).
        reads = await _idle_reads(client, 240)
        assert 58 <= reads <= 62, reads
        for i in range(6):
            await asyncio.sleep(rng.uniform(0, MAX_IDLE))
            data = f"wake-{i}".encode()
            written = loop.time()
            client.put_record(STREAM, f"k{i}", data)
            await wait_until(lambda d=data: d in processed_at, 60, "the record")
            assert processed_at[data] - written <= MAX_IDLE + 0.01
            # The shard that had the record is busy again, then idle; let it grow again.
            await asyncio.sleep(20)
