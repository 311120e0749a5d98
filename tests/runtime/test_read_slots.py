"""A worker's GetRecords calls in flight are bounded over all its shards
(``max_reads_in_flight``): a loop that cannot keep up reads less often instead of queueing a
read per shard ahead of its lease renewals."""

from __future__ import annotations

import asyncio

from kclasync._adapters.memory import MemoryStreamClient
from kclasync._adapters.protocols import GetRecordsResult
from kclasync._runtime.read_slots import ReadSlots
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


async def _busy_worker(*, renewals_first: bool) -> tuple[list[float], int]:
    """One worker on 60 shards whose every read takes a 10 ms round trip and then 20 ms of its
    event loop (the virtual clock moves while the response is read, as CPU time would): 120
    reads a second wanted, 50 a second possible. The renewals' lateness over 10 failover times
    once warm, and the lowest limit of reads in flight."""
    loop = asyncio.get_running_loop()
    read = MemoryStreamClient.get_records

    async def costly(self: MemoryStreamClient, *args: object, **kw: object) -> GetRecordsResult:
        await asyncio.sleep(0.01)  # the round trip
        loop.clock.advance(0.02)  # type: ignore[attr-defined]  # the response's parsing
        return await read(self, *args, **kw)  # type: ignore[arg-type]

    fleet = Fleet(shards=60, renewals_first=renewals_first)
    worker = fleet.start("a")
    MemoryStreamClient.get_records = costly  # type: ignore[method-assign]
    try:
        await wait_until(lambda: len(worker.held_leases) == 60, 20 * FAILOVER, "60 leases")
        await asyncio.sleep(3 * FAILOVER)
        parts = worker._worker
        assert parts is not None
        renewals = parts.coordinator.renewals
        samples: list[float] = []
        report = renewals.on_lateness

        def record(lateness: float) -> None:
            samples.append(lateness)
            if report is not None:
                report(lateness)

        renewals.on_lateness = record
        await asyncio.sleep(10 * FAILOVER)
        assert len(worker.held_leases) == 60
        slots = parts.supervisor.read_slots
        assert slots is not None
        return sorted(samples), slots.lowest
    finally:
        MemoryStreamClient.get_records = read  # type: ignore[method-assign]
        await fleet.close()


def _p99(samples: list[float]) -> float:
    return samples[int(0.99 * (len(samples) - 1))]


@in_virtual_time
async def test_a_busy_data_path_gives_way_to_renewals() -> None:
    late, lowest_off = await _busy_worker(renewals_first=False)
    first, lowest = await _busy_worker(renewals_first=True)
    assert lowest_off == 32 and lowest < 32  # the limit moved only when asked to
    assert len(first) > 100 and len(late) > 100
    # Without: a renewal waits behind up to 32 reads of 20 ms.
    assert _p99(late) > 0.04 * FAILOVER, _p99(late)
    # With: the reads in flight shrink until renewals go out within 2 % of the failover time.
    assert _p99(first) <= 0.025 * FAILOVER, (_p99(first), lowest)


def _slots(ceiling: int, now: list[float]) -> ReadSlots:
    return ReadSlots(ceiling, failover_time=FAILOVER, clock=lambda: now[0])


async def _hold(slots: ReadSlots, order: list[int], n: int, release: asyncio.Event) -> None:
    async with slots:
        order.append(n)
        await release.wait()


async def test_a_cut_applies_as_reads_end_and_growth_lets_waiters_in_in_order() -> None:
    now = [0.0]
    slots = _slots(4, now)
    order: list[int] = []
    release = [asyncio.Event() for _ in range(8)]
    tasks = [asyncio.create_task(_hold(slots, order, n, release[n])) for n in range(8)]
    await wait_until(lambda: len(order) == 4, 1.0, "four reads in flight")
    now[0] = FAILOVER  # a step later, a renewal 1 s late: the limit halves
    slots.observe(1.0)
    assert slots.limit == 2 and slots.in_use == 4
    release[0].set()
    release[1].set()
    await wait_until(lambda: slots.in_use == 2, 1.0, "two reads ended")
    assert order == [0, 1, 2, 3]  # nobody let in while above the new limit
    release[2].set()
    await wait_until(lambda: order == [0, 1, 2, 3, 4], 1.0, "the first waiter in")
    now[0] = 2 * FAILOVER  # on time again: one more slot, the next waiter in
    slots.observe(0.0)
    assert slots.limit == 3
    await wait_until(lambda: order == [0, 1, 2, 3, 4, 5], 1.0, "the next waiter in")
    for event in release:
        event.set()
    await asyncio.gather(*tasks)
    assert slots.in_use == 0 and order == list(range(8))


async def test_a_cancelled_waiter_gives_its_slot_on() -> None:
    slots = _slots(1, [0.0])
    order: list[int] = []
    release = [asyncio.Event() for _ in range(3)]
    first = asyncio.create_task(_hold(slots, order, 0, release[0]))
    await wait_until(lambda: order == [0], 1.0, "the first read in flight")
    waiting = asyncio.create_task(_hold(slots, order, 1, release[1]))
    last = asyncio.create_task(_hold(slots, order, 2, release[2]))
    await asyncio.sleep(0)
    release[0].set()
    await asyncio.sleep(0)  # the slot is granted to the second ...
    waiting.cancel()  # ... which is cancelled before it runs
    await asyncio.gather(first, waiting, return_exceptions=True)
    await wait_until(lambda: order == [0, 2], 1.0, "the slot passed to the third")
    release[2].set()
    await last
    assert slots.in_use == 0
    # A waiter cancelled while it waits leaves the queue: a later read does not wait for it.
    done = asyncio.Event()
    holder = asyncio.create_task(_hold(slots, order, 3, done))
    await wait_until(lambda: slots.in_use == 1, 1.0, "a read in flight")
    gone = asyncio.create_task(_hold(slots, order, 4, asyncio.Event()))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    done.set()
    await holder
    async with slots:
        assert slots.in_use == 1
