"""The start-up sync repairs finished parents without children: a table left by a worker that
died between its SHARD_END checkpoint and its children (a Java worker that got no ChildShards,
killed with its 120 s leader lock still held) gets its child leases from the first worker that
starts, not only from a leader's shard sync."""

from __future__ import annotations

import asyncio

from kclasync import ConsumerConfig
from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable, MemoryStreamClient
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import SHARD_END, TRIM_HORIZON
from kclasync._runtime.shard_sync import ShardSync
from tests.runtime.virtual import in_virtual_time

STREAM = "s"


def sync_for(store: MemoryLeaseStore, client: MemoryStreamClient) -> ShardSync:
    config = ConsumerConfig(worker_id="py-a", initial_position="TRIM_HORIZON")
    return ShardSync(
        config=config,
        streams=[STREAM],
        multi_stream=False,
        store=store,
        stream_client=client,
        clock=asyncio.get_running_loop().time,
        expiry=ExpiryTracker(config.failover_time),
        on_created=lambda: None,
    )


@in_virtual_time
async def test_start_up_sync_creates_the_children_of_finished_parents() -> None:
    client = MemoryStreamClient()
    stream = client.create_stream(STREAM, 3)
    first, second, third = (s.shard_id for s in stream.shards)
    rng = stream.shards[0].hash_range
    low, high = stream.split_shard(first, (rng.start + rng.end) // 2 + 1)
    merged = stream.merge_shards(second, third)
    store = MemoryLeaseStore(MemoryLeaseTable())
    for parent in (first, second, third):  # all finished by a dead worker, no child leases
        assert await store.create_lease(Lease(key=parent, owner="java-1", checkpoint=SHARD_END))

    await sync_for(store, client).initial_sync()

    leases = {lease.key: lease for lease in (await store.list_leases()).leases}
    assert set(leases) == {first, second, third, low, high, merged}
    assert leases[merged].parent_shard_ids == {second, third}
    assert leases[low].parent_shard_ids == {first}
    assert all(leases[k].checkpoint == TRIM_HORIZON for k in (low, high, merged))
    assert all(leases[k].owner is None for k in (low, high, merged))


@in_virtual_time
async def test_start_up_sync_leaves_open_shards_to_the_leader() -> None:
    """Only the repair runs at start: a lease missing for an open shard (the leader's full
    plan) is not created there."""
    client = MemoryStreamClient()
    stream = client.create_stream(STREAM, 2)
    first, second = (s.shard_id for s in stream.shards)
    store = MemoryLeaseStore(MemoryLeaseTable())
    assert await store.create_lease(Lease(key=first, owner="java-1"))

    await sync_for(store, client).initial_sync()

    assert {lease.key for lease in (await store.list_leases()).leases} == {first}
    assert second  # planned by the leader's full sync, not here
