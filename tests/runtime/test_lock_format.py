"""The leader lock item on moto's DynamoDB, in the exact layout of the lock client inside the KCL
3.x: what kclasync writes, what it reads (the Java leader's item, earlier kclasync items), and
that a release deletes the item as the Java leader does."""

from __future__ import annotations

from typing import Any

import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState
from kclasync._core.leases.leader_lock import LeaderLockState, LockAction
from kclasync.testing.emulators import LocalAws

pytestmark = pytest.mark.asyncio

#: The leader item a Java KCL 3.1.3 worker wrote (read back from its table in the interop run).
JAVA_LEADER_ITEM = {
    "key": {"S": "Leader"},
    "ownerName": {"S": "java-1"},
    "recordVersionNumber": {"S": "e6ecf3b5-7cf6-4908-97b3-50a7d30cebc0"},
    "leaseDuration": {"S": "120000"},
}


async def _store(ddb: Any, name: str) -> DynamoCoordinatorState:
    store = DynamoCoordinatorState(ddb, f"{name}-CoordinatorState")
    await store.ensure_table()
    return store


async def _raw(store: DynamoCoordinatorState, ddb: Any) -> dict[str, Any] | None:
    resp = await ddb.get_item(
        TableName=store.table_name, Key={"key": {"S": "Leader"}}, ConsistentRead=True
    )
    item: dict[str, Any] | None = resp.get("Item")
    return item


async def test_written_item_has_the_lock_clients_attributes_and_types(
    moto: LocalAws, unique_name: str
) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        store = await _store(ddb, unique_name)
        assert await store.create_lock("Leader", "w1", 12.5, "rvn-1") is not None
        assert await _raw(store, ddb) == {
            "key": {"S": "Leader"},
            "ownerName": {"S": "w1"},
            "leaseDuration": {"S": "12500"},
            "recordVersionNumber": {"S": "rvn-1"},
        }  # no isReleased while held: the lock client would read any value as "released"
        assert await store.replace_lock("Leader", "rvn-1", "w1", 12.5, "rvn-2") is not None
        assert (await _raw(store, ddb) or {})["recordVersionNumber"] == {"S": "rvn-2"}
        # Release: only the holder with the current RVN may; it deletes the item.
        assert not await store.release_lock("Leader", "rvn-1", "w1", "unused")
        assert not await store.release_lock("Leader", "rvn-2", "w2", "unused")
        assert await store.release_lock("Leader", "rvn-2", "w1", "unused")
        assert await _raw(store, ddb) is None
        assert await store.get_lock("Leader") is None
        assert not await store.release_lock("Leader", "rvn-2", "w1", "unused")


async def test_reads_the_java_leaders_item_and_waits_its_full_duration(
    moto: LocalAws, unique_name: str
) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        store = await _store(ddb, unique_name)
        await ddb.put_item(TableName=store.table_name, Item=JAVA_LEADER_ITEM)
        lock = await store.get_lock("Leader")
        assert lock is not None
        assert (lock.owner, lock.lease_duration, lock.released) == ("java-1", 120.0, False)
        state = LeaderLockState("py-1")
        state.observe(lock, 0.0)
        assert state.decide(lock, 119.0).action is LockAction.WAIT
        state.observe(lock, 120.5)
        decision = state.decide(lock, 120.5)
        assert decision.action is LockAction.TAKE
        # The takeover is conditional on the RVN read; a second taker loses.
        assert decision.expected_version is not None
        taken = await store.replace_lock("Leader", decision.expected_version, "py-1", 10.0, "r2")
        assert taken is not None and taken.owner == "py-1"
        late = await store.replace_lock("Leader", decision.expected_version, "py-2", 10, "r3")
        assert late is None


@pytest.mark.parametrize(
    ("marker", "released"),
    [
        ({"S": "1"}, True),  # the lock client's release without delete
        ({"BOOL": True}, True),  # an earlier kclasync release
        ({"BOOL": False}, False),  # an earlier kclasync holder
    ],
)
async def test_released_markers(
    moto: LocalAws, unique_name: str, marker: dict[str, Any], released: bool
) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        store = await _store(ddb, unique_name)
        await ddb.put_item(
            TableName=store.table_name, Item={**JAVA_LEADER_ITEM, "isReleased": marker}
        )
        lock = await store.get_lock("Leader")
        assert lock is not None and lock.released is released
        if released:  # taken at once, and the new item carries no marker
            state = LeaderLockState("py-1")
            state.observe(lock, 0.0)
            decision = state.decide(lock, 0.0)
            assert decision.action is LockAction.TAKE and decision.expected_version
            assert await store.replace_lock("Leader", decision.expected_version, "py-1", 10.0, "r2")
            assert "isReleased" not in (await _raw(store, ddb) or {})


async def test_leaves_the_migration_item_alone(moto: LocalAws, unique_name: str) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        store = await _store(ddb, unique_name)
        migration = {"key": {"S": "Migration3.0"}, "cv": {"S": "CLIENT_VERSION_3X"}}
        await ddb.put_item(TableName=store.table_name, Item=migration)
        assert await store.create_lock("Leader", "w1", 10.0, "r1") is not None
        assert await store.release_lock("Leader", "r1", "w1", "unused")
        resp = await ddb.scan(TableName=store.table_name)
        assert resp["Items"] == [migration]


async def test_successors_are_one_extra_list_attribute_and_a_java_write_drops_them(
    moto: LocalAws, unique_name: str
) -> None:
    async with moto.client_options().create_client("dynamodb") as ddb:
        store = await _store(ddb, unique_name)
        written = await store.create_lock("Leader", "w1", 10.0, "rvn-1", ("w2", "w3"))
        assert written is not None and written.successors == ("w2", "w3")
        raw = await _raw(store, ddb) or {}
        # The lock client's attributes unchanged, and one more it does not read.
        assert {k: v for k, v in raw.items() if k != "kclasyncSuccessors"} == {
            "key": {"S": "Leader"},
            "ownerName": {"S": "w1"},
            "leaseDuration": {"S": "10000"},
            "recordVersionNumber": {"S": "rvn-1"},
        }
        assert raw["kclasyncSuccessors"] == {"L": [{"S": "w2"}, {"S": "w3"}]}
        read = await store.get_lock("Leader")
        assert read is not None and read.successors == ("w2", "w3")
        # A Java KCL leader's write (a put of its own attributes) leaves no successors.
        await ddb.put_item(TableName=store.table_name, Item=JAVA_LEADER_ITEM)
        java = await store.get_lock("Leader")
        assert java is not None and java.successors is None
        # A holder that has not read the registry yet names an empty list (everyone fast).
        empty = await store.replace_lock(
            "Leader", "e6ecf3b5-7cf6-4908-97b3-50a7d30cebc0", "w1", 10.0, "rvn-2", ()
        )
        assert empty is not None and empty.successors == ()
        assert (await store.get_lock("Leader")) == empty
        # A value that is not a list of strings names nobody.
        await ddb.put_item(
            TableName=store.table_name,
            Item={**JAVA_LEADER_ITEM, "kclasyncSuccessors": {"L": [{"N": "1"}]}},
        )
        odd = await store.get_lock("Leader")
        assert odd is not None and odd.successors is None
