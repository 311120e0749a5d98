"""Tests for _core.lineage.shard_end on graph A (``tests/core/graph_a.py``): the child leases a
shard read to its end needs, created before its SHARD_END checkpoint, and the gate that lets a
child start only after its parents finished.
"""

from __future__ import annotations

import attrs
import pytest

from kclasync._adapters.protocols import ChildShard
from kclasync._core.leases.position import (
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    Checkpoint,
    InitialPosition,
)
from kclasync._core.lineage.shard import MAX_HASH_KEY, HashRange, Shard
from kclasync._core.lineage.shard_end import (
    ChildLeasePlan,
    child_leases_at_shard_end,
    parents_finished,
)
from kclasync._core.lineage.shard_lineage import plan_new_leases
from tests.core.graph_a import (
    GRAPH_A,
    GRAPH_A_BY_ID,
    lease_for,
    sid,
)


def test_split_children_are_created_at_once() -> None:
    five = lease_for(GRAPH_A_BY_ID[sid(5)], SHARD_END)
    plan = child_leases_at_shard_end(five, GRAPH_A, [five])
    children = plan.create
    assert plan.complete
    assert [child.key for child in children] == [sid(9), sid(10)]
    assert all(child.checkpoint == TRIM_HORIZON for child in children)
    assert [child.hash_range for child in children] == [
        HashRange(500, 799),
        HashRange(800, MAX_HASH_KEY),
    ]
    assert all(child.parent_shard_ids == {sid(5)} for child in children)


def test_children_are_planned_before_the_shard_end_checkpoint() -> None:
    """The runtime asks before writing SHARD_END: the parent's own checkpoint does not matter,
    so a worker that dies right after its SHARD_END checkpoint leaves the children behind."""
    five = lease_for(GRAPH_A_BY_ID[sid(5)], Checkpoint("204"))
    plan = child_leases_at_shard_end(five, GRAPH_A, [five])
    assert [child.key for child in plan.create] == [sid(9), sid(10)]


def test_existing_children_are_left_alone() -> None:
    five = lease_for(GRAPH_A_BY_ID[sid(5)], SHARD_END)
    nine = lease_for(GRAPH_A_BY_ID[sid(9)], Checkpoint("300"))
    plan = child_leases_at_shard_end(five, GRAPH_A, [five, nine])
    assert [child.key for child in plan.create] == [sid(10)]
    assert plan.complete


@pytest.mark.parametrize(
    ("other", "created"),
    [
        pytest.param(Checkpoint("150"), True, id="other-parent-processing"),
        pytest.param(TRIM_HORIZON, True, id="other-parent-not-started"),
        pytest.param(SHARD_END, True, id="other-parent-finished"),
        pytest.param(None, False, id="other-parent-has-no-lease"),
    ],
)
def test_merge_child_needs_the_other_parents_lease(other: Checkpoint | None, created: bool) -> None:
    """Created once both parent leases exist, whatever the other's checkpoint (the gate keeps
    it unread); deferred while the other parent has no lease."""
    six = lease_for(GRAPH_A_BY_ID[sid(6)], Checkpoint("170"))
    table = [six]
    if other is not None:
        table.append(lease_for(GRAPH_A_BY_ID[sid(7)], other))
    plan = child_leases_at_shard_end(six, GRAPH_A, table)
    assert [child.key for child in plan.create] == ([sid(8)] if created else [])
    assert plan.deferred == (() if created else (sid(8),))
    assert plan.complete is created
    if created:
        (eight,) = plan.create
        table_by_key = {lease.key: lease for lease in [*table, eight]}
        table_by_key[six.key] = attrs.evolve(six, checkpoint=SHARD_END)
        assert parents_finished(eight, table_by_key) is (other == SHARD_END)


def test_merge_child_of_a_trimmed_parent_is_not_deferred() -> None:
    """A missing other parent that the shard list no longer has was trimmed: no records left."""
    six = lease_for(GRAPH_A_BY_ID[sid(6)], SHARD_END)
    listed = {s.shard_id for s in GRAPH_A if s.shard_id != sid(7)}
    (eight,) = child_leases_at_shard_end(six, GRAPH_A, [six], listed=listed).create
    assert eight.parent_shard_ids == {sid(6), sid(7)}
    # Still listed: deferred.
    listed.add(sid(7))
    assert child_leases_at_shard_end(six, GRAPH_A, [six], listed=listed).deferred == (sid(8),)


def test_merge_child_already_read_is_neither_created_nor_awaited() -> None:
    """A table that lost its lineage: 0 and 1 merged into 2, 2 split into 3 and 4; 2 was read
    and deleted, 3 has a lease, and a lease for 0 exists again. Waiting for 1's lease (deleted
    long ago) would never end; 3's lease shows that 2 was read."""
    whole = HashRange(0, MAX_HASH_KEY)
    shards = [
        Shard(sid(0), hash_range=HashRange(0, 9), ending_sequence="100"),
        Shard(sid(1), hash_range=HashRange(10, MAX_HASH_KEY), ending_sequence="100"),
        Shard(sid(2), sid(0), sid(1), hash_range=whole, ending_sequence="200"),
        Shard(sid(3), sid(2), hash_range=HashRange(0, 99)),
        Shard(sid(4), sid(2), hash_range=HashRange(100, MAX_HASH_KEY)),
    ]
    zero = lease_for(shards[0], Checkpoint("90"))
    three = lease_for(shards[3], Checkpoint("250"))
    assert child_leases_at_shard_end(zero, shards, [zero, three]) == ChildLeasePlan(create=())
    # Without a leased descendant, or with only GetRecords' ChildShards to go by: deferred.
    assert child_leases_at_shard_end(zero, shards, [zero]).deferred == (sid(2),)
    reported = [ChildShard(sid(2), (sid(0), sid(1)), whole)]
    assert child_leases_at_shard_end(zero, reported, [zero, three]).deferred == (sid(2),)


def test_merge_child_waits_for_a_parent_lease_not_created_yet() -> None:
    """Found by the lifecycle property: 0 splits into 1 and 2, 2 splits into 3 and 4, then 1 and
    3 merge into 5. When 1 ends, 3 has no lease yet because 2 is still being read. Treating the
    missing lease as "gone" would create 5, and the gate would let 5 start before 3 and 2."""
    whole = HashRange(0, MAX_HASH_KEY)
    shards = [
        Shard(sid(0), hash_range=whole, ending_sequence="100"),
        Shard(sid(1), sid(0), hash_range=HashRange(0, 9), ending_sequence="300"),
        Shard(sid(2), sid(0), hash_range=HashRange(10, MAX_HASH_KEY), ending_sequence="200"),
        Shard(sid(3), sid(2), hash_range=HashRange(10, 19), ending_sequence="300"),
        Shard(sid(4), sid(2), hash_range=HashRange(20, MAX_HASH_KEY)),
        Shard(sid(5), sid(1), sid(3), hash_range=HashRange(0, 19)),
    ]
    one = lease_for(shards[1], Checkpoint("290"))
    two = lease_for(shards[2], Checkpoint("150"))
    # 1 is read to its end: 5 is deferred, so 1 is not checkpointed at SHARD_END yet.
    assert child_leases_at_shard_end(one, shards, [one, two]) == ChildLeasePlan(
        create=(), deferred=(sid(5),)
    )
    # Shard sync leaves 5 alone too: it is covered through 1 (and 3 will come from 2).
    assert plan_new_leases(shards, [one, two], InitialPosition.latest()) == []

    # 2 ends and creates 3 and 4 first; now 1 can create 5 (3 still processing) and finish.
    three, four = child_leases_at_shard_end(two, shards, [one, two]).create
    assert (three.key, four.key) == (sid(3), sid(4))
    two = attrs.evolve(two, checkpoint=SHARD_END)
    (five,) = child_leases_at_shard_end(one, shards, [one, two, three, four]).create
    assert five.key == sid(5)
    assert five.parent_shard_ids == {sid(1), sid(3)}
    one = attrs.evolve(one, checkpoint=SHARD_END)
    table = {lease.key: lease for lease in (one, two, three, four, five)}
    assert not parents_finished(five, table)  # 3 is still processing
    assert child_leases_at_shard_end(three, shards, table.values()).create == ()


def test_child_shards_from_get_records() -> None:
    """GetRecords' ChildShards work as the children list, hash range or not."""
    prefix = "123456789012:orders:1700000000:"
    five = lease_for(GRAPH_A_BY_ID[sid(5)], SHARD_END, key=prefix + sid(5))
    child_shards = [
        ChildShard(sid(9), (sid(5),), HashRange(500, 799)),
        ChildShard(sid(10), (sid(5),), None),
    ]
    children = child_leases_at_shard_end(five, child_shards, [five]).create
    assert [child.key for child in children] == [prefix + sid(9), prefix + sid(10)]
    assert [child.hash_range for child in children] == [HashRange(500, 799), None]

    seven = lease_for(GRAPH_A_BY_ID[sid(7)], SHARD_END, key=prefix + sid(7))
    six = lease_for(GRAPH_A_BY_ID[sid(6)], Checkpoint("170"), key=prefix + sid(6))
    merged = [ChildShard(sid(8), (sid(6), sid(7)), HashRange(0, 399))]
    (eight,) = child_leases_at_shard_end(seven, merged, [six, seven]).create
    assert eight.key == prefix + sid(8)
    assert eight.parent_shard_ids == {sid(6), sid(7)}
    # Another stream's lease for shard 6 is not this stream's parent.
    other_six = attrs.evolve(six, key="x:y:1:" + sid(6))
    assert child_leases_at_shard_end(seven, merged, [other_six, seven]).deferred == (sid(8),)


@pytest.mark.parametrize(
    ("parents", "expected"),
    [
        pytest.param({}, True, id="no-parent-leases"),
        pytest.param({6: SHARD_END, 7: SHARD_END}, True, id="both-finished"),
        pytest.param({6: SHARD_END}, True, id="one-finished-one-deleted"),
        pytest.param({6: SHARD_END, 7: Checkpoint("180")}, False, id="one-processing"),
        pytest.param({7: TRIM_HORIZON}, False, id="one-not-started"),
    ],
)
def test_parents_finished(parents: dict[int, Checkpoint], expected: bool) -> None:
    prefix = "123456789012:orders:1700000000:"
    eight = lease_for(GRAPH_A_BY_ID[sid(8)], TRIM_HORIZON, key=prefix + sid(8))
    table = {prefix + sid(8): eight}
    for number, checkpoint in parents.items():
        key = prefix + sid(number)
        table[key] = lease_for(GRAPH_A_BY_ID[sid(number)], checkpoint, key)
    # The same shard ids under another stream's prefix must not be mistaken for the parents.
    table["x:y:1:" + sid(7)] = lease_for(GRAPH_A_BY_ID[sid(7)], Checkpoint("1"), "x:y:1:" + sid(7))
    table[sid(6)] = lease_for(GRAPH_A_BY_ID[sid(6)], Checkpoint("1"))
    assert parents_finished(eight, table) is expected


def test_root_lease_may_always_start() -> None:
    four = lease_for(GRAPH_A_BY_ID[sid(4)], LATEST)
    assert parents_finished(four, {four.key: four})
