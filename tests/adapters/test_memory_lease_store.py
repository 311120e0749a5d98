"""The in-memory lease store: reads, conditional writes, handoff, test helpers and counters."""

from __future__ import annotations

import attrs
import pytest

from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable
from kclasync._adapters.memory.lease_table import apply_update
from kclasync._core.leases import lease_rules as rules
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.leases.position import SHARD_END, TRIM_HORIZON, Checkpoint
from tests.adapters.memory_helpers import KEY, owned

# ---------------------------------------------------------------------------------------------
# Lease store: reads and create


async def test_create_only_when_absent(store: MemoryLeaseStore) -> None:
    assert await store.is_empty()
    assert await store.create_lease(Lease(KEY, checkpoint=TRIM_HORIZON))
    assert not await store.create_lease(Lease(KEY, counter=7, owner="x"))
    stored = await store.get_lease(KEY)
    assert stored == Lease(KEY, checkpoint=TRIM_HORIZON)
    assert not await store.is_empty()


async def test_get_missing_and_list_sorted(store: MemoryLeaseStore) -> None:
    assert await store.get_lease("nope") is None
    for key in ("b", "a", "c"):
        await store.create_lease(Lease(key))
    scan = await store.list_leases()
    assert [lease.key for lease in scan.leases] == ["a", "b", "c"]
    assert scan.corrupt == ()


async def test_corrupt_items(store: MemoryLeaseStore, table: MemoryLeaseTable) -> None:
    await store.create_lease(Lease("good"))
    store.put_corrupt("bad", "leaseCounter", "is missing")
    assert not await store.is_empty()
    scan = await store.list_leases()
    assert [lease.key for lease in scan.leases] == ["good"]
    assert [(e.lease_key, e.attribute) for e in scan.corrupt] == [("bad", "leaseCounter")]
    with pytest.raises(CorruptLeaseError):
        await store.get_lease("bad")
    assert not await store.create_lease(Lease("bad"))
    with pytest.raises(CorruptLeaseError):
        await store.take_lease(Lease("bad"), "w1")
    store.put_raw("bad", Lease("bad"))
    assert await store.get_lease("bad") == Lease("bad")
    assert table.items_scanned == 2  # one scan of two items


async def test_ensure_table(store: MemoryLeaseStore, table: MemoryLeaseTable) -> None:
    await store.ensure_table()
    await store.ensure_table()
    assert table.exists


# ---------------------------------------------------------------------------------------------
# renew


async def test_renew_increments_counter_and_writes_throughput(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    renewed = await store.renew_lease(lease, throughput_kbps=12.5)
    assert renewed is not None
    assert renewed.counter == lease.counter + 1
    assert renewed.throughput_kbps == 12.5
    again = await store.renew_lease(renewed)
    assert again is not None
    assert again.counter == lease.counter + 2
    assert again.throughput_kbps == 12.5  # not given: left as it was
    assert await store.get_lease(KEY) == again


async def test_renew_fails_on_stale_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    assert await store.renew_lease(lease) is not None
    assert await store.renew_lease(lease) is None  # local counter is now stale


async def test_renew_fails_for_other_owner(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    assert await store.renew_lease(attrs.evolve(lease, owner="w2")) is None
    stored = await store.get_lease(KEY)
    assert stored == lease  # nothing written


async def test_renew_fails_when_unowned_or_missing(store: MemoryLeaseStore) -> None:
    await store.create_lease(Lease(KEY))
    assert await store.renew_lease(Lease(KEY)) is None
    assert await store.renew_lease(Lease("missing", owner="w1")) is None


# ---------------------------------------------------------------------------------------------
# take


async def test_take_sets_owner_and_clears_checkpoint_owner(store: MemoryLeaseStore) -> None:
    store.put_raw(
        KEY,
        Lease(KEY, counter=4, owner="old", owner_switches_since_checkpoint=2, checkpoint_owner="x"),
    )
    local = await store.get_lease(KEY)
    assert local is not None
    taken = await store.take_lease(local, "me")
    assert taken == attrs.evolve(
        local, counter=5, owner="me", owner_switches_since_checkpoint=3, checkpoint_owner=None
    )


async def test_take_fails_on_stale_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    assert await store.renew_lease(lease) is not None
    assert await store.take_lease(lease, "w2") is None
    stored = await store.get_lease(KEY)
    assert stored is not None and stored.owner == "w1"
    assert await store.take_lease(Lease("missing"), "w2") is None


async def test_steal_fences_the_old_owner(table: MemoryLeaseTable) -> None:
    a, b = MemoryLeaseStore(table), MemoryLeaseStore(table)
    mine = await owned(a, "a")
    seen_by_b = await b.get_lease(KEY)
    assert seen_by_b is not None
    assert await b.take_lease(seen_by_b, "b") is not None
    assert await a.renew_lease(mine) is None
    assert await a.checkpoint(mine, Checkpoint("5")) is None
    assert await a.release_lease(mine) is None


# ---------------------------------------------------------------------------------------------
# release


async def test_release_removes_owner_regardless_of_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    renewed = await store.renew_lease(lease)
    assert renewed is not None
    released = await store.release_lease(lease)  # stale counter: release only checks the owner
    assert released is not None
    assert released.owner is None
    assert released.counter == renewed.counter + 1


async def test_release_fails_for_other_owner_or_unowned(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    assert await store.release_lease(attrs.evolve(lease, owner="w2")) is None
    assert await store.release_lease(attrs.evolve(lease, owner=None)) is None
    assert await store.release_lease(Lease("missing", owner="w1")) is None
    assert await store.get_lease(KEY) == lease


# ---------------------------------------------------------------------------------------------
# checkpoint


async def test_checkpoint_writes_and_resets(store: MemoryLeaseStore) -> None:
    store.put_raw(
        KEY,
        Lease(
            KEY,
            counter=3,
            owner="w1",
            pending_checkpoint=Checkpoint("9"),
            owner_switches_since_checkpoint=2,
        ),
    )
    local = await store.get_lease(KEY)
    assert local is not None
    done = await store.checkpoint(local, Checkpoint("10", 2))
    assert done is not None
    assert done.checkpoint == Checkpoint("10", 2)
    assert done.pending_checkpoint is None
    assert done.owner_switches_since_checkpoint == 0
    assert done.counter == 4
    assert done.owner == "w1"


async def test_checkpoint_fails_on_stale_counter_or_other_owner(
    store: MemoryLeaseStore,
) -> None:
    lease = await owned(store, "w1")
    assert await store.checkpoint(attrs.evolve(lease, owner="w2"), Checkpoint("1")) is None
    assert await store.checkpoint(attrs.evolve(lease, counter=0), Checkpoint("1")) is None
    assert await store.checkpoint(attrs.evolve(lease, owner=None), Checkpoint("1")) is None
    assert await store.get_lease(KEY) == lease


async def test_prepare_checkpoint_writes_only_pending(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    prepared = await store.checkpoint(lease, Checkpoint("77"), pending=Checkpoint("42", 1))
    assert prepared == attrs.evolve(
        lease, counter=lease.counter + 1, pending_checkpoint=Checkpoint("42", 1)
    )
    assert prepared.owner_switches_since_checkpoint == 1  # not reset by a prepare
    assert await store.checkpoint(lease, TRIM_HORIZON, pending=Checkpoint("43")) is None


# ---------------------------------------------------------------------------------------------
# delete


async def test_delete_conditional_on_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    renewed = await store.renew_lease(lease)
    assert renewed is not None
    assert not await store.delete_lease(lease)
    assert await store.get_lease(KEY) is not None
    assert await store.delete_lease(renewed)
    assert await store.get_lease(KEY) is None
    assert not await store.delete_lease(renewed)


# ---------------------------------------------------------------------------------------------
# graceful handoff


async def test_handoff_round_trip(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "old")
    started = await store.start_handoff(lease, "new")
    assert started == attrs.evolve(lease, owner="new", checkpoint_owner="old")  # counter unchanged
    # The new owner may not checkpoint yet (a normal-mode write during a handoff is refused).
    assert (
        await store.checkpoint(attrs.evolve(started, checkpoint_owner=None), Checkpoint("5"))
        is None
    )
    # The old owner checkpoints in handoff mode, fenced by checkpointOwner; counter untouched.
    old_cp = await store.checkpoint(started, Checkpoint("5"))
    assert old_cp is not None
    assert old_cp.checkpoint == Checkpoint("5")
    assert old_cp.counter == started.counter
    assert old_cp.owner == "new" and old_cp.checkpoint_owner == "old"
    # Another worker cannot pose as the checkpoint owner.
    assert (
        await store.checkpoint(attrs.evolve(started, checkpoint_owner="x"), Checkpoint("5")) is None
    )
    # The old owner can no longer renew or release.
    assert await store.renew_lease(attrs.evolve(old_cp, owner="old")) is None
    assert await store.release_lease(lease) is None
    finished = await store.finish_handoff(started)  # stale counter is fine: not conditioned on it
    assert finished is not None
    assert finished.counter == old_cp.counter + 1
    assert finished.owner == "new" and finished.checkpoint_owner is None
    assert await store.checkpoint(started, Checkpoint("6")) is None  # the handoff is over
    assert await store.checkpoint(finished, Checkpoint("6")) is not None


async def test_start_handoff_conditions(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "old")
    assert await store.start_handoff(attrs.evolve(lease, owner="other"), "new") is None
    started = await store.start_handoff(lease, "new")
    assert started is not None
    assert await store.start_handoff(started, "third") is None  # a handoff is under way
    assert await store.start_handoff(Lease("missing", owner="old"), "new") is None


async def test_finish_handoff_conditions(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "old")
    assert await store.finish_handoff(lease) is None  # no handoff under way
    started = await store.start_handoff(lease, "new")
    assert started is not None
    assert await store.finish_handoff(attrs.evolve(started, checkpoint_owner="x")) is None
    assert await store.finish_handoff(attrs.evolve(started, owner="x")) is None
    assert await store.get_lease(KEY) == started


async def test_take_during_handoff_cancels_it(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "old")
    started = await store.start_handoff(lease, "new")
    assert started is not None
    taken = await store.take_lease(started, "thief")
    assert taken is not None and taken.checkpoint_owner is None
    assert await store.finish_handoff(started) is None


# ---------------------------------------------------------------------------------------------
# helpers and counters


async def test_set_sticky_does_not_touch_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    store.set_sticky(KEY, 10)
    stored = await store.get_lease(KEY)
    assert stored == attrs.evolve(lease, sticky=10)
    assert await store.renew_lease(lease) is not None  # still renewable with the same counter
    store.set_sticky(KEY, None)
    assert (await store.get_lease(KEY)) is not None
    with pytest.raises(KeyError):
        store.set_sticky("missing", 20)


async def test_put_raw_uses_the_given_key(store: MemoryLeaseStore) -> None:
    store.put_raw("k2", Lease("k1", counter=3))
    assert await store.get_lease("k2") == Lease("k2", counter=3)
    assert await store.get_lease("k1") is None


async def test_counters(table: MemoryLeaseTable) -> None:
    a, b = MemoryLeaseStore(table), MemoryLeaseStore(table)
    lease = await owned(a)
    await a.renew_lease(lease)
    await b.renew_lease(lease)  # fails
    await b.list_leases()
    await b.get_lease(KEY)
    assert table.writes == {"create_lease": 1, "take_lease": 1, "renew_lease": 2}
    assert table.reads == {"list_leases": 1, "get_lease": 1}
    assert table.condition_failures == {"renew_lease": 1}
    assert a.calls == {"create_lease": 1, "take_lease": 1, "renew_lease": 1}
    assert b.calls == {"renew_lease": 1, "list_leases": 1, "get_lease": 1}


async def test_shard_end_checkpoint_round_trip(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    done = await store.checkpoint(lease, SHARD_END)
    assert done is not None and done.is_finished


def test_updates_apply_to_the_item_as_it_was_before_the_write() -> None:
    stored = Lease(KEY, counter=4, owner="a", checkpoint_owner="b", sticky_worker="w")
    update = (
        rules.Set(rules.Attr.COUNTER, 9),
        rules.Add(rules.Attr.OWNER_SWITCHES, 1),
        rules.Remove(rules.Attr.CHECKPOINT_OWNER),
        rules.Remove(rules.Attr.STICKY_WORKER),
        rules.Set(rules.Attr.CHILD_SHARD_IDS, frozenset({"x"})),
    )
    assert apply_update(update, stored) == attrs.evolve(
        stored,
        counter=9,
        owner_switches_since_checkpoint=1,
        checkpoint_owner=None,
        sticky_worker=None,
        child_shard_ids=frozenset({"x"}),
    )
    assert apply_update((), stored) == stored
    with pytest.raises(ValueError, match="cannot be removed"):
        apply_update((rules.Remove(rules.Attr.CHECKPOINT),), stored)
