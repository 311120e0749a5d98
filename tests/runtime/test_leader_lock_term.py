"""The leader lock's short term in a kclasync-only fleet, on the in-memory adapters and the
virtual-time loop, with the default lock (120 s, read every 30 s): a killed leader's lock is
taken over and its leases assigned within 3 x failover; with a Java-like entry in the registry
the lock keeps the Java term and nobody takes it early."""

from __future__ import annotations

import asyncio

from kclasync import Consumer
from kclasync._core.leases.leader_lock import LEADER_LOCK_KEY
from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers.worker_metrics_item import encode_item
from tests.runtime.test_early_failover import FAILOVER, Fleet, owners
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

SHARDS = 20
NAMES = ("a", "b", "c", "d", "e")


async def started(fleet: Fleet) -> tuple[dict[str, Consumer], str]:
    workers = await fleet.start_all(NAMES, SHARDS)
    leader = next(n for n in NAMES if workers[n].is_leader)
    return workers, leader


async def lock_duration(fleet: Fleet) -> float | None:
    assert fleet.locks is not None
    item = await fleet.locks.get_lock(LEADER_LOCK_KEY)
    return None if item is None else item.lease_duration


@in_virtual_time
async def test_a_killed_leaders_leases_are_assigned_within_3x_failover() -> None:
    loop = asyncio.get_running_loop()
    fleet = Fleet(one_leader=True, shards=SHARDS, lease_taker="load")
    workers, leader = await started(fleet)

    async def short_term() -> bool:  # no Java worker: the short term
        return await lock_duration(fleet) == FAILOVER

    await wait_until(short_term, 2 * FAILOVER, "the short term")
    killed = loop.time()
    await fleet.kill(leader)
    await wait_until(
        lambda: any(workers[n].is_leader for n in NAMES if n != leader), 3 * FAILOVER, "a leader"
    )
    took_lock = loop.time() - killed
    await wait_until(
        lambda: leader not in owners(fleet.table).values(), 3 * FAILOVER, "leases assigned"
    )
    took_leases = loop.time() - killed
    # The lock: the last write up to a quarter term before the kill, a term and a read or two
    # (~1.5 x); the leases: a failover time from the new leader's first read of them.
    assert took_lock < 1.6 * FAILOVER, took_lock
    assert took_leases < 3 * FAILOVER, (took_lock, took_leases)
    assert await lock_duration(fleet) == FAILOVER
    await fleet.close()


@in_virtual_time
async def test_with_a_java_entry_in_the_registry_the_lock_keeps_the_java_term() -> None:
    loop = asyncio.get_running_loop()
    fleet = Fleet(one_leader=True, shards=SHARDS, lease_taker="load")
    java = wm.WorkerMetrics(worker_id="java-worker-1", last_update=int(loop.time()))
    fleet.table.worker_metrics.items[java.worker_id] = encode_item(java)  # no ``impl`` marker
    workers, leader = await started(fleet)
    assert await lock_duration(fleet) == 120.0
    await fleet.kill(leader)
    # Past the time a kclasync-only fleet needs: nobody took the lock over, nothing moved.
    held = sorted(k for k, owner in owners(fleet.table).items() if owner == leader)
    await asyncio.sleep(3 * FAILOVER)
    assert not any(workers[n].is_leader for n in NAMES if n != leader)
    assert sorted(k for k, owner in owners(fleet.table).items() if owner == leader) == held
    # The Java term ends it: a new leader after the 120 s, then the leases.
    await wait_until(
        lambda: leader not in owners(fleet.table).values(), 160.0 + 3 * FAILOVER, "leases moved"
    )
    await fleet.close()
