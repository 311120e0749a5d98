"""A worker's GetRecords calls in flight are bounded over all its shards
(``max_reads_in_flight``): a loop that cannot keep up reads less often instead of queueing a
read per shard ahead of its lease renewals."""

from __future__ import annotations

import asyncio

from kclasync._adapters.memory import MemoryStreamClient
from kclasync._adapters.protocols import GetRecordsResult
from tests.runtime.test_early_failover import FAILOVER, Fleet
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until


async def _peak_reads(limit: int | None) -> tuple[int, set[object]]:
    """Run one worker on 40 shards whose reads each take 0.5 s; the most GetRecords calls in
    flight at once, and the shards read."""
    in_flight = peak = 0
    shards: set[object] = set()
    read = MemoryStreamClient.get_records

    async def slow(self: MemoryStreamClient, *args: object, **kw: object) -> GetRecordsResult:
        nonlocal in_flight, peak
        in_flight += 1
        shards.add(args[1])
        peak = max(peak, in_flight)
        try:
            await asyncio.sleep(0.5)
            return await read(self, *args, **kw)  # type: ignore[arg-type]
        finally:
            in_flight -= 1

    MemoryStreamClient.get_records = slow  # type: ignore[method-assign]
    fleet = Fleet(shards=40, max_reads_in_flight=limit)
    worker = fleet.start("a")
    try:
        await wait_until(lambda: len(worker.held_leases) == 40, 20 * FAILOVER, "40 leases")
        await asyncio.sleep(2 * FAILOVER)
        return peak, shards
    finally:
        MemoryStreamClient.get_records = read  # type: ignore[method-assign]
        await fleet.close()


@in_virtual_time
async def test_reads_in_flight_never_exceed_the_bound_and_every_shard_is_still_read() -> None:
    peak, shards = await _peak_reads(4)
    assert peak == 4
    assert len(shards) == 40  # every shard read, four at a time
    unbounded, _ = await _peak_reads(None)
    assert unbounded > 4  # without the bound, a read per shard at once
