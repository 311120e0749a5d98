"""Leader election over the coordinator-state store: in memory, and on moto's DynamoDB."""

from __future__ import annotations

import asyncio
import random

import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.memory import MemoryCoordinatorState, MemoryLeaseStore, MemoryLeaseTable
from kclasync._adapters.protocols import CoordinatorStateStore
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import SHARD_END
from kclasync._runtime.leader import LeaderElector
from kclasync.testing.emulators import LocalAws
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def elector(store: CoordinatorStateStore, name: str, clock: Clock) -> LeaderElector:
    return LeaderElector(
        store=store,
        worker_id=name,
        lock_duration=10.0,
        heartbeat_interval=2.0,
        rng=random.Random(name),
        clock=clock,
    )


async def election(store_a: CoordinatorStateStore, store_b: CoordinatorStateStore) -> None:
    clock = Clock()
    a, b = elector(store_a, "a", clock), elector(store_b, "b", clock)
    woke = a.subscribe()
    assert await a.step() is True  # first writer wins
    assert woke.is_set() and a.terms == 1
    assert await b.step() is False
    for _ in range(10):  # a heartbeats every 2 s; b never sees the lock stand still
        clock.now += 2.0
        assert await a.step() is True
        assert await b.step() is False
    # a dies: b takes over once it has seen the same version for more than the duration.
    died = clock.now
    while not await b.step():
        clock.now += 1.0
        assert clock.now - died <= 12.0
    assert not a.is_leader()  # a's last write is older than the duration by now
    assert await a.step() is False  # and a finds b's version: it waits
    # A graceful release hands over at once.
    await b.release()
    assert not b.is_leader()
    assert await a.step() is True


@pytest.mark.asyncio
async def test_election_in_memory() -> None:
    state = MemoryCoordinatorState()
    await election(state, state.shared())


@pytest.mark.asyncio
async def test_election_on_dynamodb(moto: LocalAws, unique_name: str) -> None:
    options = moto.client_options()
    async with options.create_client("dynamodb") as ddb:
        store = DynamoCoordinatorState(ddb, f"{unique_name}-CoordinatorState")
        await store.ensure_table()
        await store.ensure_table()  # idempotent
        await election(store, store)
        lock = await store.get_lock("Leader")
        assert lock is not None and lock.owner == "a" and lock.lease_duration == 10.0


@pytest.mark.asyncio
async def test_a_release_after_a_heartbeat_landed_unseen_still_deletes_the_lock(
    moto: LocalAws, unique_name: str
) -> None:
    # The graceful stop cancels the lock loop; a heartbeat cancelled after its write reached
    # the table leaves there a version the elector never saw, and its delete on the version it
    # knows is refused: the lock was left to expire (a Java worker then waits out its 30 s
    # between tries), seen in the kclasync-to-Java interop story under load.
    options = moto.client_options()
    async with options.create_client("dynamodb") as ddb:
        store = DynamoCoordinatorState(ddb, f"{unique_name}-CoordinatorState")
        await store.ensure_table()
        a = elector(store, "a", Clock())
        assert await a.step() is True
        held = await store.get_lock("Leader")
        assert held is not None
        landed = await store.replace_lock("Leader", held.record_version, "a", 10.0, "unseen", None)
        assert landed is not None
        await a.release()
        assert await store.get_lock("Leader") is None
        # A lock another worker took meanwhile is left alone.
        assert await a.step() is True
        taken = await store.get_lock("Leader")
        assert taken is not None
        assert await store.replace_lock("Leader", taken.record_version, "b", 10.0, "b1", None)
        await a.release()
        kept = await store.get_lock("Leader")
        assert kept is not None and kept.owner == "b"


@in_virtual_time
async def test_elector_loop_takes_over_from_a_dead_leader() -> None:
    state = MemoryCoordinatorState()
    make = lambda name: LeaderElector(  # noqa: E731
        store=state.shared(),
        worker_id=name,
        lock_duration=0.6,
        heartbeat_interval=0.1,
        rng=random.Random(name),
    )
    a, b = make("a"), make("b")
    task_a = asyncio.create_task(a.run())
    await wait_until(a.is_leader, 5, "a to lead")
    task_b = asyncio.create_task(b.run())
    await asyncio.sleep(0)
    task_a.cancel()
    loop = asyncio.get_running_loop()
    died = loop.time()
    await wait_until(b.is_leader, 5, "b to lead")
    assert loop.time() - died < 0.6 + 0.1 + 0.5
    task_b.cancel()
    await asyncio.gather(task_a, task_b, return_exceptions=True)


async def child_ids_fenced(store: MemoryLeaseStore | DynamoLeaseStore) -> None:
    await store.ensure_table()
    assert await store.create_lease(Lease(key="p"))
    base = await store.get_lease("p")
    assert base is not None
    mine = await store.take_lease(base, "w1")
    assert mine is not None
    ended = await store.checkpoint(mine, SHARD_END)
    assert ended is not None
    written = await store.update_child_shard_ids(ended, frozenset({"c1", "c2"}))
    assert written is not None
    assert written.child_shard_ids == {"c1", "c2"} and written.counter == ended.counter + 1
    assert await store.update_child_shard_ids(ended, frozenset({"c3"})) is None  # stale
    released = await store.release_lease(written)
    assert released is not None
    # The leader's backfill of an unowned lease: conditional on "no owner" and the counter.
    again = await store.update_child_shard_ids(released, frozenset({"c1", "c2", "c3"}))
    assert (
        again is not None
        and again.owner is None
        and again.child_shard_ids
        == {
            "c1",
            "c2",
            "c3",
        }
    )
    assert (
        await store.update_child_shard_ids(
            Lease(key="p", counter=again.counter, owner="w1"), frozenset({"c1"})
        )
        is None
    )


@pytest.mark.asyncio
async def test_child_shard_ids_in_memory() -> None:
    await child_ids_fenced(MemoryLeaseStore(MemoryLeaseTable()))


@pytest.mark.asyncio
async def test_child_shard_ids_on_dynamodb(moto: LocalAws, unique_name: str) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        await child_ids_fenced(DynamoLeaseStore(ddb, unique_name))
