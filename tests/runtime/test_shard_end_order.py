"""The SHARD_END order on the in-memory adapters in virtual time: child leases are created
before the parent's SHARD_END checkpoint, so a worker that stops dead right after that
checkpoint leaves no child without a lease, with no shard sync to repair it."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from kclasync import Checkpointer, Consumer, ConsumerConfig, ShardInfo
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import (
    FaultPlan,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStreamClient,
    OpFaults,
)
from kclasync._records import Record
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

STREAM = "s"


class StopsDeadAtShardEnd:
    """Processes records; at SHARD_END it checkpoints, notes which leases exist at that moment,
    and then never returns, as a worker killed right after the checkpoint."""

    seen: list[bytes]
    at_shard_end: dict[str, frozenset[str]]
    table: MemoryLeaseTable

    def __init__(self) -> None:
        self.shard = ""

    async def initialize(self, shard: ShardInfo) -> None:
        self.shard = shard.shard_id

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        self.seen.extend(r.data for r in records)
        await checkpointer.checkpoint()

    async def lease_lost(self) -> None:
        return None

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await checkpointer.checkpoint_shard_end()
        self.at_shard_end[self.shard] = frozenset(self.table.leases)
        await asyncio.Event().wait()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        return None


@in_virtual_time
async def test_merge_child_exists_when_a_parent_checkpoints_shard_end() -> None:
    client = MemoryStreamClient()
    client.create_stream(STREAM, 2)
    left, right = (s.shard_id for s in client.stream(STREAM).shards)
    table = MemoryLeaseTable()
    StopsDeadAtShardEnd.seen = []
    StopsDeadAtShardEnd.at_shard_end = {}
    StopsDeadAtShardEnd.table = table
    consumer = Consumer(
        stream_name=STREAM,
        application_name="app",
        processor=StopsDeadAtShardEnd,
        config=ConsumerConfig(
            worker_id="w",
            failover_time=3.0,
            initial_position="TRIM_HORIZON",
            idle_time_between_reads=0.05,
            min_time_between_reads=0.0,
            parent_shard_poll_interval=0.1,
            # No repair by the leader's shard sync within the test: only the SHARD_END path
            # can create the merge child.
            shard_sync_interval=3600.0,
            shutdown_timeout=1.0,
        ),
        backend=AdapterBackend(MemoryLeaseStore(table), client),
        registry=CollectorRegistry(),
        rng=random.Random(0),
    )
    before = [b"before-%d" % i for i in range(20)]
    for i, data in enumerate(before):
        client.put_record(STREAM, f"k{i}", data)
    async with consumer:
        await wait_until(lambda: len(StopsDeadAtShardEnd.seen) == len(before), 20, "parents")
        child = client.merge_shards(STREAM, left, right)
        after = [b"after-%d" % i for i in range(10)]
        for i, data in enumerate(after):
            client.put_record(STREAM, f"k{i}", data)
        # Both parents' workers stop dead after their SHARD_END checkpoint; the child is read
        # all the same, because its lease was created before either checkpoint.
        await wait_until(
            lambda: len(StopsDeadAtShardEnd.seen) == len(before) + len(after), 30, "the child"
        )
    assert sorted(StopsDeadAtShardEnd.seen) == sorted(before + after)
    assert set(StopsDeadAtShardEnd.at_shard_end) == {left, right}
    for parent, leases in StopsDeadAtShardEnd.at_shard_end.items():
        assert child in leases, f"{parent} checkpointed SHARD_END before {child} had a lease"
    # Parent gating still held: no child record before every parent record.
    first_child = min(StopsDeadAtShardEnd.seen.index(d) for d in after)
    assert first_child >= len(before)


@in_virtual_time
async def test_shard_end_waits_while_the_child_leases_cannot_be_written() -> None:
    """Creating the children fails past the retry budget (an unreachable table for
    ``create_lease``): the parent is not checkpointed at SHARD_END meanwhile, and once the
    table answers again the children are created, then SHARD_END is written."""
    client = MemoryStreamClient()
    client.create_stream(STREAM, 1)
    (parent,) = (s.shard_id for s in client.stream(STREAM).shards)
    table = MemoryLeaseTable()
    faults = FaultPlan(random.Random(1))
    seen: list[bytes] = []

    async def handle(records: Sequence[Record]) -> None:
        seen.extend(r.data for r in records)

    consumer = Consumer(
        stream_name=STREAM,
        application_name="app",
        processor=handle,
        config=ConsumerConfig(
            worker_id="w",
            failover_time=3.0,
            initial_position="TRIM_HORIZON",
            idle_time_between_reads=0.05,
            min_time_between_reads=0.0,
            parent_shard_poll_interval=0.1,
            shard_sync_interval=3600.0,
        ),
        backend=AdapterBackend(MemoryLeaseStore(table, faults=faults), client),
        registry=CollectorRegistry(),
        rng=random.Random(0),
    )
    before = [b"before-%d" % i for i in range(10)]
    for i, data in enumerate(before):
        client.put_record(STREAM, f"k{i}", data)
    async with consumer:
        await wait_until(lambda: len(seen) == len(before), 20, "the parent")
        faults.operations["create_lease"] = OpFaults(transient=1.0)
        low, high = client.split_shard(STREAM, parent, 2**127)
        after = [b"after-%d" % i for i in range(10)]
        for i, data in enumerate(after):
            client.put_record(STREAM, f"k{i}", data)
        refused = faults.injected
        await wait_until(lambda: refused["create_lease:transient_before"] >= 30, 120, "refusals")
        assert not table.leases[parent].checkpoint.is_shard_end
        assert low not in table.leases and high not in table.leases
        faults.operations.clear()
        await wait_until(lambda: len(seen) == len(before) + len(after), 60, "the children")
    assert table.leases[parent].checkpoint.is_shard_end
    assert {low, high} <= set(table.leases)
    assert sorted(seen) == sorted(before + after)


@in_virtual_time
async def test_a_merge_child_waits_for_its_other_parents_lease() -> None:
    """0 and 1 are the roots; 1 splits into 2 and 3, then 0 and 2 merge into 4. While 1 is still
    being processed, 2 has no lease: 0, read to its end, defers 4 and is not checkpointed at
    SHARD_END. Once 1 ends and creates 2, 0 creates 4 and finishes; 4 is read last."""
    messages: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    supervisor_log = logging.getLogger("kclasync._consumer")
    supervisor_log.addHandler(handler)
    supervisor_log.setLevel(logging.INFO)
    client = MemoryStreamClient()
    client.create_stream(STREAM, 2)
    zero, one = (s.shard_id for s in client.stream(STREAM).shards)
    seen: list[tuple[str, bytes]] = []
    one_may_go = asyncio.Event()

    async def handle(records: Sequence[Record]) -> None:
        if records[0].shard_id == one:
            await one_may_go.wait()
        seen.extend((r.shard_id, r.data) for r in records)

    for i in range(40):
        client.put_record(STREAM, f"k{i}", b"old-%d" % i)
    half = 2**127
    two, _ = client.split_shard(STREAM, one, half + 2**125)
    four = client.merge_shards(STREAM, zero, two)
    for i in range(40):
        client.put_record(STREAM, f"k{i}", b"new-%d" % i)
    table = MemoryLeaseTable()
    consumer = Consumer(
        stream_name=STREAM,
        application_name="app",
        processor=handle,
        config=ConsumerConfig(
            worker_id="w",
            failover_time=3.0,
            initial_position="TRIM_HORIZON",
            idle_time_between_reads=0.05,
            min_time_between_reads=0.0,
            parent_shard_poll_interval=0.1,
            shard_sync_interval=1.0,
        ),
        backend=AdapterBackend(MemoryLeaseStore(table), client),
        registry=CollectorRegistry(),
        rng=random.Random(0),
    )
    deferred = f"merge child {four} waits for its other parent's lease"
    try:
        async with consumer:
            await wait_until(lambda: any(deferred in m for m in messages), 20, "a deferral")
            # Several retries and shard syncs later, nothing has been created early.
            await asyncio.sleep(5.0)
            assert not table.leases[zero].checkpoint.is_shard_end
            assert four not in table.leases and two not in table.leases
            one_may_go.set()
            await wait_until(lambda: len(seen) == 80, 60, "every record")
            await wait_until(lambda: table.leases[zero].checkpoint.is_shard_end, 10, "0 ended")
    finally:
        supervisor_log.removeHandler(handler)
        supervisor_log.setLevel(logging.NOTSET)
    order = [shard for shard, _ in seen]
    assert four in order
    first_four = order.index(four)
    # Parent gating held: 4 is read after every record of 0, 1 and 2.
    assert not {zero, one, two} & set(order[first_four:])
    assert {zero, one} <= set(order[:first_four])
