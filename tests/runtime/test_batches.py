"""``Consumer.batches()`` on the in-memory adapters in virtual time: resharding (children after
their parent, SHARD_END written), backpressure towards the fetcher, a queued batch of a lost
lease that is never yielded, and a cancelled loop that still stops gracefully."""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable, MemoryStreamClient
from kclasync._core.leases.position import SHARD_END, TRIM_HORIZON
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

STREAM = "s"


def consumer(table: MemoryLeaseTable, client: MemoryStreamClient, **config: object) -> Consumer:
    settings: dict[str, object] = {
        "failover_time": 3.0,
        "initial_position": "TRIM_HORIZON",
        "idle_time_between_reads": 0.05,
        "min_time_between_reads": 0.0,
        "parent_shard_poll_interval": 0.1,
        "shard_sync_interval": 0.5,
        "worker_id": "w",
        **config,
    }
    return Consumer(
        stream_name=STREAM,
        application_name="app",
        config=ConsumerConfig(**settings),  # type: ignore[arg-type]
        backend=AdapterBackend(MemoryLeaseStore(table), client),
        registry=CollectorRegistry(),
        rng=random.Random(0),
    )


def put(client: MemoryStreamClient, first: int, count: int) -> list[bytes]:
    payloads = [str(i).encode() for i in range(first, first + count)]
    for data in payloads:
        client.put_record(STREAM, f"k{int(data) % 37}", data)
    return payloads


@in_virtual_time
async def test_children_come_after_their_parent_and_shard_end_is_checkpointed() -> None:
    table, client = MemoryLeaseTable(), MemoryStreamClient()
    client.create_stream(STREAM, 1)
    parent_records = put(client, 0, 30)
    c = consumer(table, client, max_records=10)
    order: list[tuple[str, bytes]] = []
    split = False
    async with c.batches() as batches:
        async for batch in batches:
            order.extend((r.shard_id, r.data) for r in batch)
            await batch.commit()
            if not split:
                (parent,) = [s.shard_id for s in client.stream(STREAM).shards]
                client.split_shard(STREAM, parent, 2**127)
                child_records = put(client, 30, 30)
                split = True
            if len(order) == 60:
                break
    assert sorted(d for _, d in order) == sorted(parent_records + child_records)
    shards = [shard for shard, _ in order]
    last_parent = max(i for i, s in enumerate(shards) if s == parent)
    assert last_parent == len(parent_records) - 1  # every parent record before any child's
    assert (
        set(shards[last_parent + 1 :]) == {s for s in shards if s != parent}
        and len(set(shards)) == 3
    )
    # The shard-end checkpoint happened as it does for a processor.
    assert table.leases[parent].checkpoint == SHARD_END


@in_virtual_time
async def test_shards_interleave_each_in_its_own_order() -> None:
    table, client = MemoryLeaseTable(), MemoryStreamClient()
    client.create_stream(STREAM, 3)
    written = put(client, 0, 150)
    c = consumer(table, client, max_records=5)
    order: list[str] = []
    per_shard: dict[str, list[tuple[int, int]]] = {}
    async with c.batches() as batches:
        async for batch in batches:
            order.append(batch.shard_id)
            per_shard.setdefault(batch.shard_id, []).extend(r.position for r in batch)
            await batch.commit()
            if sum(map(len, per_shard.values())) == len(written):
                break
    for positions in per_shard.values():
        assert positions == sorted(positions)
    # No shard waits for another to be drained: every shard is in the first three batches.
    assert len(per_shard) == 3 and set(order[:3]) == set(per_shard), order


@in_virtual_time
async def test_a_slow_loop_holds_the_fetcher_back() -> None:
    table, client = MemoryLeaseTable(), MemoryStreamClient()
    client.create_stream(STREAM, 1)
    written = put(client, 0, 300)
    c = consumer(table, client, max_records=10, max_queued_batches=2)
    got: list[bytes] = []
    async with c.batches() as batches:
        async for batch in batches:
            if not got:
                # The batch in the loop, two queued for the shard, one waiting to be queued.
                await wait_until(lambda: client.records_returned >= 40, 10, "a full pipeline")
                await asyncio.sleep(30.0)  # virtual seconds: a bound, nothing more is read
                assert client.records_returned == 40
            got.extend(r.data for r in batch)
            if len(got) == len(written):
                break
    assert got == written


@in_virtual_time
async def test_a_queued_batch_of_a_lost_lease_is_never_yielded() -> None:
    table, client = MemoryLeaseTable(), MemoryStreamClient()
    client.create_stream(STREAM, 2)
    put(client, 0, 100)
    c = consumer(table, client, max_records=10)
    store = MemoryLeaseStore(table)
    async with c.batches() as batches:
        stream = aiter(batches)
        held = await anext(stream)
        # The loop holds one shard's batch; the other shard's first batch waits in the queue.
        feed = c._feed
        assert feed is not None
        await wait_until(lambda: feed.queue.qsize() == 1, 5, "the other shard's batch")
        (queued,) = list(feed.queue._queue)  # type: ignore[attr-defined]
        other = queued.shard.lease_key
        assert other != held.shard.lease_key
        assert await store.take_lease(table.leases[other], "intruder") is not None
        await wait_until(lambda: other not in c.held_leases, 5, "the loss to be noticed")
        await held.commit()  # the shard still held is unaffected
        while True:
            batch = await asyncio.wait_for(anext(stream), 60)
            # A batch is yielded only while its lease is held, never the stale one queued.
            assert batch is not queued
            assert batch.shard.lease_key in c.held_leases and not batch.stale
            await batch.commit()
            if batch.shard.lease_key == other:
                break
        # The stolen lease came back once the intruder's expired; its new pipeline reads from
        # the lease's checkpoint again (nothing was committed: the queued batch's records).
        assert batch.records[0].position == queued.records[0].position
    assert table.leases[other].checkpoint.value == batch.records[-1].sequence_number
    assert table.leases[other].owner is None  # released on the way out


@in_virtual_time
async def test_cancelling_the_loop_stops_gracefully_and_writes_buffered_commits() -> None:
    table, client = MemoryLeaseTable(), MemoryStreamClient()
    client.create_stream(STREAM, 2)
    put(client, 0, 100)
    c = consumer(table, client, max_records=10, checkpoint_interval=3600.0)
    committed: dict[str, str] = {}
    both = asyncio.Event()

    async def loop() -> None:
        async for batch in c.batches():
            await batch.commit(persist=False)
            committed[batch.shard.lease_key] = batch.records[-1].sequence_number
            if len(committed) == 2:
                both.set()
                await asyncio.Event().wait()  # cancelled in here

    task = asyncio.create_task(loop())
    await asyncio.wait_for(both.wait(), 30)
    assert {lease.checkpoint for lease in table.leases.values()} == {TRIM_HORIZON}
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task

    def stopped() -> bool:
        return all(lease.owner is None for lease in table.leases.values())

    await wait_until(stopped, 30, "the graceful stop after the cancellation")
    # The buffered commits were written on the way out, as on a processor's stop.
    assert {key: lease.checkpoint.value for key, lease in table.leases.items()} == committed
    await c.stop()
