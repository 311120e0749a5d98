"""Fault injection on the in-memory adapters: throttling, transient errors, latency, seeds."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import attrs
import pytest

from kclasync._adapters.memory import (
    FaultPlan,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStream,
    MemoryStreamClient,
    OpFaults,
)
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync.errors import ThrottledError, TransientError
from tests.adapters.memory_helpers import KEY, TRIM, FakeClock, owned, plan

# ---------------------------------------------------------------------------------------------
# Fault injection on the lease store


async def test_throttle_is_not_applied(table: MemoryLeaseTable) -> None:
    setup = MemoryLeaseStore(table)
    lease = await owned(setup)
    faulty = MemoryLeaseStore(table, faults=plan(renew_lease=OpFaults(throttle=1.0)))
    with pytest.raises(ThrottledError):
        await faulty.renew_lease(lease)
    assert table.get(KEY) == lease
    assert faulty.faults is not None
    assert faulty.faults.injected == {"renew_lease:throttled": 1}
    assert await faulty.get_lease(KEY) == lease  # other operations unaffected


async def test_transient_before_write_is_not_applied(table: MemoryLeaseTable) -> None:
    lease = await owned(MemoryLeaseStore(table))
    faulty = MemoryLeaseStore(table, faults=plan(renew_lease=OpFaults(transient=1.0)))
    with pytest.raises(TransientError):
        await faulty.renew_lease(lease)
    assert table.get(KEY) == lease
    assert table.writes["renew_lease"] == 0


async def test_transient_after_write_leaves_the_write_applied(table: MemoryLeaseTable) -> None:
    lease = await owned(MemoryLeaseStore(table))
    faulty = MemoryLeaseStore(
        table, faults=plan(renew_lease=OpFaults(transient=1.0, transient_after_write=1.0))
    )
    with pytest.raises(TransientError):
        await faulty.renew_lease(lease, throughput_kbps=3.0)
    stored = await faulty.get_lease(KEY)
    assert stored == attrs.evolve(lease, counter=lease.counter + 1, throughput_kbps=3.0)
    # A retry of the same request now fails its condition; the re-read shows our increment.
    faulty.faults = None
    assert await faulty.renew_lease(lease) is None
    assert stored is not None and stored.counter == lease.counter + 1 and stored.owner == "w1"


@pytest.mark.parametrize(
    ("op", "call"),
    [
        ("take_lease", lambda s, lease: s.take_lease(lease, "w2")),
        ("checkpoint", lambda s, lease: s.checkpoint(lease, Checkpoint("9"))),
        ("release_lease", lambda s, lease: s.release_lease(lease)),
        ("delete_lease", lambda s, lease: s.delete_lease(lease)),
    ],
)
async def test_unknown_outcome_applies_every_write(
    table: MemoryLeaseTable, op: str, call: Callable[[MemoryLeaseStore, Lease], Awaitable[object]]
) -> None:
    lease = await owned(MemoryLeaseStore(table))
    writes_before = table.writes[op]
    faulty = MemoryLeaseStore(
        table,
        faults=FaultPlan(
            random.Random(1),
            operations={op: OpFaults(transient=1.0, transient_after_write=1.0)},
        ),
    )
    with pytest.raises(TransientError):
        await call(faulty, lease)
    assert table.get(KEY) != lease
    assert table.writes[op] == writes_before + 1
    assert table.condition_failures[op] == 0


async def test_fixed_and_callable_latency(table: MemoryLeaseTable, clock: FakeClock) -> None:
    drawn: list[float] = []

    def latency(rng: random.Random) -> float:
        value = rng.uniform(0.0, 1.0)
        drawn.append(value)
        return value

    faults = FaultPlan(
        random.Random(3),
        default=OpFaults(latency=0.5),
        operations={"get_lease": OpFaults(latency=latency)},
    )
    store = MemoryLeaseStore(table, faults=faults)
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        clock.advance(delay)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(asyncio, "sleep", fake_sleep)
        await store.create_lease(Lease(KEY))
        await store.get_lease(KEY)
    assert sleeps == [0.5, drawn[0]]


async def test_latency_delays_the_write() -> None:
    table = MemoryLeaseTable()
    store = MemoryLeaseStore(table, faults=FaultPlan(random.Random(0), OpFaults(latency=0.05)))
    task = asyncio.create_task(store.create_lease(Lease(KEY)))
    await asyncio.sleep(0)
    assert table.get(KEY) is None  # still "in flight"
    assert await task
    assert table.get(KEY) == Lease(KEY)


async def outcomes(seed: int) -> list[str]:
    table = MemoryLeaseTable()
    faults = FaultPlan(
        random.Random(seed),
        default=OpFaults(throttle=0.2, transient=0.3, transient_after_write=0.5),
    )
    store = MemoryLeaseStore(table, faults=faults)
    results: list[str] = []
    for i in range(60):
        try:
            created = await store.create_lease(Lease(f"k{i}"))
            results.append(f"ok:{created}")
        except ThrottledError:
            results.append("throttled")
        except TransientError:
            results.append("transient")
    results.append(f"stored:{sorted(table.leases)}")
    return results


async def test_faults_reproducible_from_seed() -> None:
    first = await outcomes(42)
    assert first == await outcomes(42)
    assert first != await outcomes(43)
    assert {"ok:True", "throttled", "transient"} <= set(first)


def test_fault_probabilities_validated() -> None:
    with pytest.raises(ValueError):
        OpFaults(throttle=1.5)
    with pytest.raises(ValueError):
        OpFaults(transient_after_write=-0.1)


# ---------------------------------------------------------------------------------------------
# Streams: faults and counters


async def test_stream_throttling_and_counters(clock: FakeClock) -> None:
    faults = plan(get_records=OpFaults(throttle=1.0))
    client = MemoryStreamClient(faults=faults)
    client.create_stream("s", 1)
    client.put_record("s", "k", b"")
    it = await client.get_shard_iterator("s", KEY, TRIM)
    with pytest.raises(ThrottledError):
        await client.get_records("s", KEY, it, 1)
    faults.operations["get_records"] = OpFaults(transient=1.0)
    with pytest.raises(TransientError):
        await client.get_records("s", KEY, it, 1)
    del faults.operations["get_records"]
    assert len((await client.get_records("s", KEY, it, 1)).records) == 1
    await client.list_shards("s")
    assert client.reads == {"get_shard_iterator": 1, "get_records": 3, "list_shards": 1}
    assert client.writes == {"create_stream": 1, "put_record": 1}
    assert faults.injected == {"get_records:throttled": 1, "get_records:transient_before": 1}


async def stream_outcomes(seed: int) -> list[str]:
    faults = FaultPlan(random.Random(seed), default=OpFaults(throttle=0.5))
    client = MemoryStreamClient([MemoryStream("s")], faults=faults)
    results: list[str] = []
    for _ in range(30):
        try:
            await client.list_shards("s")
            results.append("ok")
        except ThrottledError:
            results.append("throttled")
    return results


async def test_stream_faults_reproducible() -> None:
    assert await stream_outcomes(7) == await stream_outcomes(7)
    assert await stream_outcomes(7) != await stream_outcomes(8)
