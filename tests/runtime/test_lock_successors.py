"""The successor watch on the in-memory adapters and the virtual-time loop: in a kclasync-only
fleet of a leader-based taker, the leader names two successors in the lock item; they read the
lock at the short term's pace, the others at the configured one; when the leader and its
first successor crash together, the lock and both workers' leases still move within about
two failover times; and when every fast reader crashes at once, within the configured pace."""

from __future__ import annotations

import asyncio

from kclasync import Consumer
from kclasync._core.leases.leader_lock import LEADER_LOCK_KEY, LockItem
from kclasync._core.leases.lock_term import SUCCESSORS
from kclasync._runtime.leader import LeaderElector
from tests.runtime.test_early_failover import FAILOVER, Fleet, owners
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

SHARDS = 24
NAMES = ("a", "b", "c", "d", "e", "f")
#: The configured (Java) pace: 30 s, the KCL's default.
CONFIGURED = 30.0


def elector(consumer: Consumer) -> LeaderElector:
    worker = consumer._worker
    assert worker is not None
    return worker.elector


def lock_item(fleet: Fleet) -> LockItem | None:
    assert fleet.locks is not None
    return fleet.locks.items.get(LEADER_LOCK_KEY)


async def started() -> tuple[Fleet, dict[str, Consumer]]:
    fleet = Fleet(one_leader=True, shards=SHARDS, lease_taker="load")
    workers = {name: fleet.start(name) for name in NAMES}

    def ready() -> bool:
        item = lock_item(fleet)
        return (
            len(fleet.table.leases) == SHARDS
            and set(owners(fleet.table).values()) == set(NAMES)
            and item is not None
            and item.lease_duration == FAILOVER  # the short term
            and item.successors is not None
            and len(item.successors) == SUCCESSORS
        )

    await wait_until(ready, 60 * FAILOVER, "leases on every worker, two successors named")
    # Every worker has read the item naming the successors at least once.
    await asyncio.sleep(CONFIGURED + FAILOVER)
    return fleet, workers


@in_virtual_time
async def test_only_the_named_successors_read_the_lock_fast() -> None:
    fleet, workers = await started()
    item = lock_item(fleet)
    assert item is not None and item.successors is not None and item.owner is not None
    leader, named = item.owner, item.successors
    assert leader not in named
    for name in NAMES:
        if name == leader:
            continue
        expected = FAILOVER / 4 if name in named else CONFIGURED
        assert elector(workers[name]).interval() == expected, name
    # Lock reads over one minute: the holder and its successors every F / 4, the rest twice.
    assert fleet.locks is not None
    before = fleet.locks.totals["get_lock"]
    await asyncio.sleep(60.0)
    reads = fleet.locks.totals["get_lock"] - before
    fast = (1 + SUCCESSORS) * 60.0 / (FAILOVER / 4)
    slow = (len(NAMES) - 1 - SUCCESSORS) * (60.0 / CONFIGURED + 1)
    assert fast <= reads <= fast + slow + 3, reads
    await fleet.close()


@in_virtual_time
async def test_the_leader_and_its_first_successor_crash_together() -> None:
    loop = asyncio.get_running_loop()
    fleet, workers = await started()
    item = lock_item(fleet)
    assert item is not None and item.successors is not None and item.owner is not None
    leader, first, second = item.owner, item.successors[0], item.successors[1]
    killed = loop.time()
    await fleet.kill(leader)
    await fleet.kill(first)
    dead = {leader, first}
    await wait_until(
        lambda: any(workers[n].is_leader for n in NAMES if n not in dead),
        10 * FAILOVER,
        "a new leader",
    )
    took_lock = loop.time() - killed
    new_leader = next(n for n in NAMES if n not in dead and workers[n].is_leader)
    # The second successor had been reading fast all along; it (or a worker that turned fast
    # when the leader's heartbeat stopped) holds the lock a little over one term later.
    assert took_lock < 1.5 * FAILOVER, (took_lock, new_leader, second)
    await wait_until(
        lambda: not dead & set(owners(fleet.table).values()),
        10 * FAILOVER,
        "the dead workers' leases assigned",
    )
    took_leases = loop.time() - killed
    assert took_leases < 2.5 * FAILOVER, (took_lock, took_leases)
    # The new holder names two live successors, neither of the dead.
    await wait_until(
        lambda: (
            (now := lock_item(fleet)) is not None
            and now.owner == new_leader
            and now.successors is not None
            and len(now.successors) == SUCCESSORS
            and not dead & set(now.successors)
        ),
        10 * FAILOVER,
        "two live successors named",
    )
    await fleet.close()


@in_virtual_time
async def test_the_leader_and_both_successors_crash_together() -> None:
    """A correlated failure takes every fast reader: the others still take the lock over, at
    their own pace, within the configured interval, the term and a read (no two leaders: the
    pace decides when a reader notices, never whether it may take over)."""
    loop = asyncio.get_running_loop()
    fleet, workers = await started()
    item = lock_item(fleet)
    assert item is not None and item.successors is not None and item.owner is not None
    dead = {item.owner, *item.successors}
    killed = loop.time()
    for name in sorted(dead):
        await fleet.kill(name)
    await wait_until(
        lambda: any(workers[n].is_leader for n in NAMES if n not in dead),
        10 * CONFIGURED,
        "a new leader",
    )
    took_lock = loop.time() - killed
    assert took_lock <= CONFIGURED + FAILOVER + FAILOVER / 4 + 1.0, took_lock
    assert sum(workers[n].is_leader for n in NAMES if n not in dead) == 1
    await wait_until(
        lambda: not dead & set(owners(fleet.table).values()),
        10 * CONFIGURED,
        "the dead workers' leases assigned",
    )
    await fleet.close()
