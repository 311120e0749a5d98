"""Every lease-table write rule, run against the in-memory store and DynamoDB on moto's server.

Each case is a sequence of writes on one lease. Both adapters run the same sequence from the same
starting item; every step must succeed or fail as written here, and both adapters must return the
same lease and leave the same item after every step. The conditions themselves come from
``_core.leases.lease_rules`` (each write's condition and update), so this checks that its two
compilations (DynamoDB expressions, the memory store's evaluation) agree with each other and with
the protocol. The leader lock's writes are run the same way on both coordinator-state stores.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable
from kclasync._adapters.memory.coordinator_state import MemoryCoordinatorState
from kclasync._core.leases.leader_lock import LockItem
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync.testing.emulators import LocalAws

KEY = "shardId-000000000007"
CP1 = Checkpoint("49590338271490256608559692538361571095921575989136588898")
CP2 = Checkpoint("49590338271490256608559692538361571095921575989136588999", 3)

Store = MemoryLeaseStore | DynamoLeaseStore
Write = Callable[[Store], Awaitable[object]]


def held(counter: int = 5, owner: str | None = "a", **more: Any) -> Lease:
    return Lease(KEY, counter=counter, owner=owner, **more)


@attrs.frozen
class Step:
    name: str
    write: Write
    applied: bool


async def _sticky(store: Store, value: int | None, worker: str | None = None) -> bool:
    try:
        if isinstance(store, MemoryLeaseStore):
            store.set_sticky(KEY, value, worker)
        else:
            await store.set_sticky(KEY, value, worker)
    except KeyError:
        return False
    return True


#: name -> (the item before the first step, or None for no item; the steps)
CASES: dict[str, tuple[Lease | None, list[Step]]] = {
    "create": (
        None,
        [
            Step("create", lambda s: s.create_lease(held(counter=1)), True),
            Step("create again", lambda s: s.create_lease(held(counter=9, owner="b")), False),
        ],
    ),
    "renew": (
        held(),
        [
            Step("stale counter", lambda s: s.renew_lease(held(counter=4)), False),
            Step("other owner", lambda s: s.renew_lease(held(owner="b")), False),
            Step("no owner", lambda s: s.renew_lease(held(owner=None)), False),
            Step("renew", lambda s: s.renew_lease(held()), True),
            Step("with throughput", lambda s: s.renew_lease(held(counter=6), 12.5), True),
            Step("old view", lambda s: s.renew_lease(held()), False),
        ],
    ),
    "renew unowned": (
        held(owner=None),
        [Step("no owner on either side", lambda s: s.renew_lease(held(owner=None)), False)],
    ),
    "take and steal": (
        held(checkpoint_owner="c", owner_switches_since_checkpoint=2),
        [
            Step("stale counter", lambda s: s.take_lease(held(counter=4), "b"), False),
            Step("steal a held lease", lambda s: s.take_lease(held(), "b"), True),
            Step("old view", lambda s: s.take_lease(held(), "c"), False),
            Step("take again", lambda s: s.take_lease(held(counter=6, owner="b"), "a"), True),
        ],
    ),
    "release": (
        held(),
        [
            Step("not the owner", lambda s: s.release_lease(held(owner="b")), False),
            Step("release", lambda s: s.release_lease(held(counter=1)), True),
            Step("already released", lambda s: s.release_lease(held(counter=6)), False),
            Step("take the free lease", lambda s: s.take_lease(held(counter=6), "b"), True),
        ],
    ),
    "checkpoint normal": (
        held(owner_switches_since_checkpoint=3, pending_checkpoint=CP2),
        [
            Step("stale counter", lambda s: s.checkpoint(held(counter=4), CP1), False),
            Step("other owner", lambda s: s.checkpoint(held(owner="b"), CP1), False),
            Step("no owner", lambda s: s.checkpoint(held(owner=None), CP1), False),
            Step("checkpoint", lambda s: s.checkpoint(held(), CP1), True),
            Step("pending", lambda s: s.checkpoint(held(counter=6), CP1, pending=CP2), True),
            Step("old view", lambda s: s.checkpoint(held(counter=6), CP2), False),
        ],
    ),
    "checkpoint during handoff": (
        held(owner="b", checkpoint_owner="a"),
        [
            Step("normal mode is fenced out", lambda s: s.checkpoint(held(owner="b"), CP1), False),
            Step(
                "handoff mode, stale counter",
                lambda s: s.checkpoint(held(counter=1, owner="b", checkpoint_owner="a"), CP1),
                True,
            ),
            Step(
                "handoff mode, pending",
                lambda s: s.checkpoint(held(owner="b", checkpoint_owner="a"), CP1, CP2),
                True,
            ),
            Step(
                "another checkpoint owner",
                lambda s: s.checkpoint(held(owner="b", checkpoint_owner="c"), CP2),
                False,
            ),
            Step("accept", lambda s: s.finish_handoff(held(owner="b", checkpoint_owner="a")), True),
            Step(
                "handoff mode after accept",
                lambda s: s.checkpoint(held(counter=6, owner="b", checkpoint_owner="a"), CP2),
                False,
            ),
        ],
    ),
    "handoff": (
        held(),
        [
            Step("not the owner", lambda s: s.start_handoff(held(owner="b"), "c"), False),
            Step("no owner", lambda s: s.start_handoff(held(owner=None), "c"), False),
            Step("start", lambda s: s.start_handoff(held(counter=1), "b"), True),
            Step("start again", lambda s: s.start_handoff(held(owner="b"), "c"), False),
            Step(
                "accept as another worker",
                lambda s: s.finish_handoff(held(owner="c", checkpoint_owner="a")),
                False,
            ),
            Step(
                "accept naming another old owner",
                lambda s: s.finish_handoff(held(owner="b", checkpoint_owner="c")),
                False,
            ),
            Step("accept without old owner", lambda s: s.finish_handoff(held(owner="b")), False),
            Step("accept", lambda s: s.finish_handoff(held(owner="b", checkpoint_owner="a")), True),
            Step(
                "accept again",
                lambda s: s.finish_handoff(held(counter=6, owner="b", checkpoint_owner="a")),
                False,
            ),
            Step("renew by the new owner", lambda s: s.renew_lease(held(6, "b")), True),
        ],
    ),
    "take during handoff": (
        held(owner="b", checkpoint_owner="a"),
        [Step("take clears the handoff", lambda s: s.take_lease(held(), "c"), True)],
    ),
    "delete": (
        held(),
        [
            Step("stale counter", lambda s: s.delete_lease(held(counter=4)), False),
            Step("delete", lambda s: s.delete_lease(held(owner="b")), True),
            Step("gone", lambda s: s.delete_lease(held()), False),
        ],
    ),
    "childShardIds owned": (
        held(),
        [
            Step(
                "stale counter",
                lambda s: s.update_child_shard_ids(held(counter=4), frozenset({"x"})),
                False,
            ),
            Step(
                "other owner",
                lambda s: s.update_child_shard_ids(held(owner="b"), frozenset({"x"})),
                False,
            ),
            Step(
                "as unowned",
                lambda s: s.update_child_shard_ids(held(owner=None), frozenset({"x"})),
                False,
            ),
            Step("write", lambda s: s.update_child_shard_ids(held(), frozenset({"x", "y"})), True),
        ],
    ),
    "childShardIds unowned": (
        held(owner=None, checkpoint=Checkpoint("SHARD_END")),
        [
            Step(
                "naming an owner",
                lambda s: s.update_child_shard_ids(held(), frozenset({"x"})),
                False,
            ),
            Step(
                "backfill",
                lambda s: s.update_child_shard_ids(held(owner=None), frozenset({"x"})),
                True,
            ),
        ],
    ),
    "no item": (
        None,
        [
            Step("renew", lambda s: s.renew_lease(held()), False),
            Step("take", lambda s: s.take_lease(held(), "b"), False),
            Step("release", lambda s: s.release_lease(held()), False),
            Step("checkpoint", lambda s: s.checkpoint(held(), CP1), False),
            Step(
                "handoff checkpoint",
                lambda s: s.checkpoint(held(checkpoint_owner="a"), CP1),
                False,
            ),
            Step("start handoff", lambda s: s.start_handoff(held(), "b"), False),
            Step(
                "accept handoff",
                lambda s: s.finish_handoff(held(owner="b", checkpoint_owner="a")),
                False,
            ),
            Step("delete", lambda s: s.delete_lease(held()), False),
            Step(
                "childShardIds",
                lambda s: s.update_child_shard_ids(held(owner=None), frozenset({"x"})),
                False,
            ),
            Step("set Sticky", lambda s: _sticky(s, 10), False),
        ],
    ),
    "set Sticky": (
        held(),
        [
            Step("set Sticky", lambda s: _sticky(s, 10), True),
            Step("pin to a worker", lambda s: _sticky(s, 10, "b"), True),
            Step("release mode drops the worker", lambda s: _sticky(s, 20), True),
            Step("pin again", lambda s: _sticky(s, 10, "c"), True),
            Step("remove both", lambda s: _sticky(s, None), True),
        ],
    ),
    "owner switches added and reset": (
        held(owner_switches_since_checkpoint=0),
        [
            Step("take", lambda s: s.take_lease(held(), "b"), True),
            Step("take back", lambda s: s.take_lease(held(6, "b"), "a"), True),
            Step("checkpoint resets", lambda s: s.checkpoint(held(7), CP1), True),
        ],
    ),
}


def _view(result: object) -> object:
    """What a write returned, with every lease field the rules and updates touch."""
    if not isinstance(result, Lease):
        return result
    return (
        result.key,
        result.counter,
        result.owner,
        result.checkpoint_owner,
        result.owner_switches_since_checkpoint,
        result.checkpoint,
        result.pending_checkpoint,
        result.child_shard_ids,
        result.throughput_kbps,
        result.sticky,
        result.sticky_worker,
    )


def _applied(result: object) -> bool:
    return result is True or isinstance(result, Lease)


async def _run(store: Store, start: Lease | None, steps: list[Step]) -> list[tuple[object, ...]]:
    if start is not None:
        assert await store.create_lease(start)
    trace: list[tuple[object, ...]] = []
    for step in steps:
        result = await step.write(store)
        assert _applied(result) == step.applied, f"{type(store).__name__}: {step.name}: {result}"
        trace.append((step.name, _view(result), _view(await store.get_lease(KEY))))
    return trace


@pytest.mark.parametrize("case", sorted(CASES))
async def test_both_adapters_apply_the_rule_alike(
    case: str, moto: LocalAws, unique_name: str
) -> None:
    start, steps = CASES[case]
    memory = await _run(MemoryLeaseStore(MemoryLeaseTable()), start, steps)
    async with moto.client_options().create_client("dynamodb") as ddb:
        dynamo_store = DynamoLeaseStore(ddb, unique_name)
        await dynamo_store.ensure_table()
        dynamo = await _run(dynamo_store, start, steps)
    assert memory == dynamo


def test_every_conditional_write_is_covered() -> None:
    names = {step.write.__code__.co_names for _, steps in CASES.values() for step in steps}
    called = set().union(*names)
    writes = {
        "create_lease",
        "renew_lease",
        "take_lease",
        "release_lease",
        "checkpoint",
        "start_handoff",
        "finish_handoff",
        "delete_lease",
        "update_child_shard_ids",
        "_sticky",
    }
    assert writes <= called, writes - called
    lock_called = set().union(*(write.__code__.co_names for _, write, _ in LOCK_STEPS))
    assert {"create_lock", "replace_lock", "release_lock"} <= lock_called


# -- the leader lock ---------------------------------------------------------------------------

LockStore = MemoryCoordinatorState | DynamoCoordinatorState
LockWrite = Callable[[LockStore], Awaitable[object]]

LOCK_STEPS: list[tuple[str, LockWrite, bool]] = [
    ("replace a missing lock", lambda s: s.replace_lock("Leader", "v0", "a", 10.0, "v1"), False),
    ("release a missing lock", lambda s: s.release_lock("Leader", "v0", "a", "v9"), False),
    ("create", lambda s: s.create_lock("Leader", "a", 10.0, "v1"), True),
    ("create again", lambda s: s.create_lock("Leader", "b", 10.0, "v2"), False),
    (
        "replace on a stale version",
        lambda s: s.replace_lock("Leader", "v0", "b", 10.0, "v2"),
        False,
    ),
    ("heartbeat", lambda s: s.replace_lock("Leader", "v1", "a", 10.0, "v2"), True),
    ("take over", lambda s: s.replace_lock("Leader", "v2", "b", 20.0, "v3"), True),
    ("release as the old holder", lambda s: s.release_lock("Leader", "v3", "a", "v9"), False),
    ("release on a stale version", lambda s: s.release_lock("Leader", "v2", "b", "v9"), False),
    ("release", lambda s: s.release_lock("Leader", "v3", "b", "v9"), True),
    ("create after release", lambda s: s.create_lock("Leader", "c", 10.0, "v4"), True),
]


async def _run_lock(store: LockStore) -> list[tuple[object, ...]]:
    trace: list[tuple[object, ...]] = []
    for name, write, applied in LOCK_STEPS:
        result = await write(store)
        assert (result is True or isinstance(result, LockItem)) == applied, (
            f"{type(store).__name__}: {name}: {result}"
        )
        trace.append((name, result, await store.get_lock("Leader")))
    return trace


async def test_both_lock_stores_apply_the_lock_conditions_alike(
    moto: LocalAws, unique_name: str
) -> None:
    memory = await _run_lock(MemoryCoordinatorState())
    async with moto.client_options().create_client("dynamodb") as ddb:
        dynamo_store = DynamoCoordinatorState(ddb, f"{unique_name}-CoordinatorState")
        await dynamo_store.ensure_table()
        dynamo = await _run_lock(dynamo_store)
    assert memory == dynamo
