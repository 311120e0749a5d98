"""Tests for kclasync._core.shard_lineage and kclasync._core.shard_end.

Part 1 is the conformance table of kcl-protocol.md section 7 on graph A. Part 2 covers the
child/gate/auditor functions directly. Part 3 drives everything with random split/merge histories.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kclasync._adapters.protocols import ChildShard
from kclasync._core.lease import Lease
from kclasync._core.position import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    Checkpoint,
    InitialPosition,
    InitialPositionKind,
)
from kclasync._core.shard import MAX_HASH_KEY, HashRange, Shard
from kclasync._core.shard_end import ChildLeasePlan, child_leases_at_shard_end, parents_finished
from kclasync._core.shard_lineage import hash_range_holes, plan_new_leases


def sid(number: int) -> str:
    return f"shardId-{number:012d}"


POSITIONS: Mapping[InitialPositionKind, InitialPosition] = {
    InitialPositionKind.LATEST: InitialPosition.latest(),
    InitialPositionKind.TRIM_HORIZON: InitialPosition.trim_horizon(),
    InitialPositionKind.AT_TIMESTAMP: InitialPosition.at_timestamp(
        datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    ),
}

# Every lease the non-empty-table sync creates starts at the initial position. Under LATEST that
# includes the closed ancestors it creates (6 for leases 4,5,7; 2 and 6 for leases 3,4,5), as the
# KCL's own HierarchicalShardSyncerTest expects; see the rule table in shard_lineage.
EXPECTED_START: Mapping[InitialPositionKind, Checkpoint] = {
    InitialPositionKind.LATEST: LATEST,
    InitialPositionKind.TRIM_HORIZON: TRIM_HORIZON,
    InitialPositionKind.AT_TIMESTAMP: AT_TIMESTAMP,
}


# ---------------------------------------------------------------------------------------------
# Part 1: conformance graph A
#
#   0 1 2 3 4   5      0-3: seq 11..102 (closed); 4: open from 11; 5: 11..205 (closed)
#   \ / \ / |   |
#    6   7  4   5      6=merge(0,1) 0-199, 7=merge(2,3) 200-399: seq 103..205 (closed)
#     \ /   |  / \
#      8    4 9  10    8=merge(6,7) 0-399; 9 and 10 split from 5: 206..open

# number, parent, adjacent parent, first hash key, last hash key, first seq, last seq (None: open)
_GRAPH_A_ROWS: list[tuple[int, int | None, int | None, int, int, str, str | None]] = [
    (0, None, None, 0, 99, "11", "102"),
    (1, None, None, 100, 199, "11", "102"),
    (2, None, None, 200, 299, "11", "102"),
    (3, None, None, 300, 399, "11", "102"),
    (4, None, None, 400, 499, "11", None),
    (5, None, None, 500, MAX_HASH_KEY, "11", "205"),
    (6, 0, 1, 0, 199, "103", "205"),
    (7, 2, 3, 200, 399, "103", "205"),
    (8, 6, 7, 0, 399, "206", None),
    (9, 5, None, 500, 799, "206", None),
    (10, 5, None, 800, MAX_HASH_KEY, "206", None),
]

GRAPH_A: list[Shard] = [
    Shard(
        shard_id=sid(number),
        parent_shard_id=None if parent is None else sid(parent),
        adjacent_parent_shard_id=None if adjacent is None else sid(adjacent),
        hash_range=HashRange(first_key, last_key),
        starting_sequence=first_seq,
        ending_sequence=last_seq,
    )
    for number, parent, adjacent, first_key, last_key, first_seq, last_seq in _GRAPH_A_ROWS
]
GRAPH_A_BY_ID = {shard.shard_id: shard for shard in GRAPH_A}

# existing leases -> created under LATEST, TRIM_HORIZON, AT_TIMESTAMP (None: empty cell, no claim)
CONFORMANCE: list[
    tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], tuple[int, ...] | None]
] = [
    ((4, 5, 7), (6,), (0, 1), (0, 1)),
    ((3, 4, 5), (2, 6), (0, 1, 2), None),
    ((2, 6), (3, 4, 9, 10), (3, 4, 5), None),
    ((4, 9, 10), (8,), (0, 1, 2, 3), None),
    ((4, 5, 6, 7), (), (), ()),
    ((0, 1, 2, 3, 4, 5, 6, 7), (), (), ()),
    ((0, 1, 4, 7, 9, 10), (), (), ()),
    ((), (4, 8, 9, 10), (0, 1, 2, 3, 4, 5), (0, 1, 2, 3, 4, 5)),
]

ExistingState = Literal["processing", "finished-if-closed"]


def lease_for(shard: Shard, checkpoint: Checkpoint, key: str | None = None) -> Lease:
    return Lease(
        key=shard.shard_id if key is None else key,
        owner="worker-1",
        counter=7,
        checkpoint=checkpoint,
        parent_shard_ids=frozenset(shard.parent_ids),
        hash_range=shard.hash_range,
    )


def existing_leases(numbers: Iterable[int], state: ExistingState) -> list[Lease]:
    leases = []
    for number in numbers:
        shard = GRAPH_A_BY_ID[sid(number)]
        finished = state == "finished-if-closed" and not shard.is_open
        leases.append(lease_for(shard, SHARD_END if finished else Checkpoint("150")))
    return leases


def _conformance_cases() -> list[object]:
    kinds = (
        InitialPositionKind.LATEST,
        InitialPositionKind.TRIM_HORIZON,
        InitialPositionKind.AT_TIMESTAMP,
    )
    cases: list[object] = []
    for existing, *expectations in CONFORMANCE:
        for kind, expected in zip(kinds, expectations, strict=True):
            if expected is None:
                continue
            label = ",".join(map(str, existing)) or "empty"
            cases.append(pytest.param(existing, kind, expected, id=f"{label}-{kind.value}"))
    return cases


@pytest.mark.parametrize("state", ["processing", "finished-if-closed"])
@pytest.mark.parametrize(("existing", "kind", "expected"), _conformance_cases())
def test_graph_a_conformance(
    existing: tuple[int, ...],
    kind: InitialPositionKind,
    expected: tuple[int, ...],
    state: ExistingState,
) -> None:
    created = plan_new_leases(GRAPH_A, existing_leases(existing, state), POSITIONS[kind])

    assert [lease.key for lease in created] == [sid(n) for n in sorted(expected)]
    for lease in created:
        shard = GRAPH_A_BY_ID[lease.shard_id]
        assert lease.checkpoint == EXPECTED_START[kind]
        assert lease.parent_shard_ids == frozenset(shard.parent_ids)
        assert lease.hash_range == shard.hash_range
        assert lease.owner is None
        assert lease.counter == 0


@pytest.mark.parametrize("existing", [row[0] for row in CONFORMANCE])
def test_graph_a_at_timestamp_matches_trim_horizon(existing: tuple[int, ...]) -> None:
    """Beyond the table's filled cells: from the graph alone, AT_TIMESTAMP picks the same shards
    as TRIM_HORIZON (the KCL's tests expect this for the rows the table leaves empty)."""
    leases = existing_leases(existing, "processing")
    at_timestamp = plan_new_leases(GRAPH_A, leases, POSITIONS[InitialPositionKind.AT_TIMESTAMP])
    horizon = plan_new_leases(GRAPH_A, leases, POSITIONS[InitialPositionKind.TRIM_HORIZON])
    assert [lease.key for lease in at_timestamp] == [lease.key for lease in horizon]
    assert all(lease.checkpoint == AT_TIMESTAMP for lease in at_timestamp)


def test_graph_a_trimmed_parents_make_roots() -> None:
    """Shards 0-3 aged out of the stream: 6 and 7 are now the oldest shards."""
    trimmed = [shard for shard in GRAPH_A if shard.shard_id not in {sid(n) for n in range(4)}]
    created = plan_new_leases(trimmed, [], InitialPosition.trim_horizon())
    assert [lease.key for lease in created] == [sid(n) for n in (4, 5, 6, 7)]
    # The lease still names its parents: they are gone, so they do not block it.
    assert created[2].parent_shard_ids == {sid(0), sid(1)}
    assert parents_finished(created[2], {lease.key: lease for lease in created})

    created = plan_new_leases(
        trimmed, existing_leases([9, 10], "processing"), POSITIONS[InitialPositionKind.TRIM_HORIZON]
    )
    assert [lease.key for lease in created] == [sid(n) for n in (4, 6, 7)]


def test_multi_stream_lease_keys() -> None:
    prefix = "123456789012:orders:1700000000:"
    existing = [
        lease_for(GRAPH_A_BY_ID[sid(n)], Checkpoint("150"), key=prefix + sid(n)) for n in (4, 5, 7)
    ]
    # Another stream's lease for the same shard id does not count as a lease for this stream.
    existing.append(lease_for(GRAPH_A_BY_ID[sid(6)], Checkpoint("150"), key="x:y:1:" + sid(6)))
    created = plan_new_leases(
        GRAPH_A, existing, InitialPosition.trim_horizon(), lease_key=lambda s: prefix + s
    )
    assert [lease.key for lease in created] == [prefix + sid(0), prefix + sid(1)]
    assert [lease.shard_id for lease in created] == [sid(0), sid(1)]


def test_graph_a_lifecycle_from_leases_4_5_7() -> None:
    """The seed's story: LATEST with leases 4,5,7 creates 6; when 6 ends, 8 follows (7 has a
    lease), but 8 is not read before 7 ends too."""
    table = {lease.key: lease for lease in existing_leases((4, 5, 7), "processing")}
    (six,) = plan_new_leases(GRAPH_A, list(table.values()), InitialPosition.latest())
    table[six.key] = six
    assert parents_finished(six, table)  # 0 and 1 never had leases

    # 6 has been read to its end; its worker creates 8 before 6's SHARD_END checkpoint, while 7
    # is still processing: 7 has a lease, which is what the gate waits on.
    plan = child_leases_at_shard_end(six, GRAPH_A, table.values())
    assert plan.complete
    (eight,) = plan.create
    assert eight.key == sid(8)
    assert eight.checkpoint == TRIM_HORIZON
    assert eight.parent_shard_ids == {sid(6), sid(7)}
    assert eight.hash_range == HashRange(0, 399)
    table[eight.key] = eight
    table[six.key] = attrs.evolve(six, checkpoint=SHARD_END)
    assert not parents_finished(eight, table)  # 7 is still processing

    # 7 ends: nothing left to create, and now 8 may start.
    seven = table[sid(7)]
    assert child_leases_at_shard_end(seven, GRAPH_A, table.values()) == ChildLeasePlan(create=())
    table[seven.key] = attrs.evolve(seven, checkpoint=SHARD_END)
    assert parents_finished(eight, table)
    assert plan_new_leases(GRAPH_A, list(table.values()), InitialPosition.latest()) == []


# ---------------------------------------------------------------------------------------------
# Part 2: children, the gate, the auditor


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


MID_SHARD = Checkpoint("5")


def _bare(start: int, end: int, checkpoint: Checkpoint = MID_SHARD) -> Lease:
    return Lease(key=f"k{start}-{end}", checkpoint=checkpoint, hash_range=HashRange(start, end))


@pytest.mark.parametrize(
    ("leases", "holes"),
    [
        pytest.param([], [HashRange(0, MAX_HASH_KEY)], id="no-leases"),
        pytest.param([_bare(0, MAX_HASH_KEY)], [], id="one-covers-all"),
        pytest.param([_bare(10, 20)], [HashRange(0, 9), HashRange(21, MAX_HASH_KEY)], id="middle"),
        pytest.param(
            [_bare(30, MAX_HASH_KEY), _bare(0, 15), _bare(10, 20)],
            [HashRange(21, 29)],
            id="overlap",
        ),
        pytest.param([_bare(0, 50), _bare(10, 20), _bare(51, MAX_HASH_KEY)], [], id="nested"),
        pytest.param([_bare(0, 99), _bare(100, MAX_HASH_KEY)], [], id="adjacent"),
        pytest.param(
            [_bare(0, 99), _bare(100, 199, SHARD_END), _bare(200, MAX_HASH_KEY)],
            [HashRange(100, 199)],
            id="finished-lease-is-a-hole",
        ),
        pytest.param(
            [_bare(0, 99), Lease(key="no-range"), _bare(100, MAX_HASH_KEY - 1)],
            [HashRange(MAX_HASH_KEY, MAX_HASH_KEY)],
            id="lease-without-range-ignored",
        ),
    ],
)
def test_hash_range_holes_examples(leases: list[Lease], holes: list[HashRange]) -> None:
    assert hash_range_holes(leases) == holes


def test_graph_a_holes() -> None:
    leases = existing_leases((4, 5, 7), "processing")
    assert hash_range_holes(leases) == [HashRange(0, 199)]
    assert hash_range_holes(existing_leases((4, 8, 9, 10), "processing")) == []


# ---------------------------------------------------------------------------------------------
# Part 3: random split/merge histories


@attrs.define
class Stream:
    """A resharding stream, as far as lineage is concerned."""

    shards: dict[str, Shard]
    next_number: int
    clock: int = 1

    @classmethod
    def fresh(cls, count: int) -> Stream:
        width = (MAX_HASH_KEY + 1) // count
        shards = {}
        for i in range(count):
            end = MAX_HASH_KEY if i == count - 1 else (i + 1) * width - 1
            shards[sid(i)] = Shard(sid(i), hash_range=HashRange(i * width, end))
        return cls(shards, count)

    def open_shards(self) -> list[Shard]:
        return sorted(
            (shard for shard in self.shards.values() if shard.is_open),
            key=lambda shard: shard.hash_range.start,
        )

    def apply(self, kind: str, pick: int, key_fraction: int) -> None:
        """Split an open shard at a hash key, or merge two adjacent open shards."""
        open_shards = self.open_shards()
        if kind == "split":
            shard = open_shards[pick % len(open_shards)]
            low, high = shard.hash_range.start, shard.hash_range.end
            if low == high:
                return
            split_at = low + 1 + ((key_fraction * (high - low)) >> 64)  # in (low, high]
            self._close(shard)
            self._add(shard.shard_id, None, HashRange(low, split_at - 1))
            self._add(shard.shard_id, None, HashRange(split_at, high))
        else:
            if len(open_shards) < 2:
                return
            index = pick % (len(open_shards) - 1)
            left, right = open_shards[index], open_shards[index + 1]
            self._close(left)
            self._close(right)
            self._add(
                left.shard_id,
                right.shard_id,
                HashRange(left.hash_range.start, right.hash_range.end),
            )
        self.clock += 1

    def _close(self, shard: Shard) -> None:
        self.shards[shard.shard_id] = attrs.evolve(shard, ending_sequence=str(self.clock * 100))

    def _add(self, parent: str, adjacent: str | None, hash_range: HashRange) -> None:
        shard_id = sid(self.next_number)
        self.next_number += 1
        self.shards[shard_id] = Shard(
            shard_id, parent, adjacent, hash_range, starting_sequence=str(self.clock * 100 + 1)
        )

    def ancestors(self, shard_id: str) -> set[str]:
        found: set[str] = set()
        stack = [shard_id]
        while stack:
            for parent in self.shards[stack.pop()].parent_ids:
                if parent in self.shards and parent not in found:
                    found.add(parent)
                    stack.append(parent)
        return found


@attrs.define
class Consumer:
    """A whole consumer fleet seen as one: shard sync, processing, child creation, cleanup.

    With ``check_lineage`` it asserts property (b) at every creation and every processed shard:
    each ancestor is settled, i.e. has a lease at SHARD_END, or was finished and deleted, or (under
    LATEST) was already closed when the consumer first synced, so LATEST skips it by design.
    """

    initial: InitialPosition
    check_lineage: bool = True
    table: dict[str, Lease] = attrs.Factory(dict)
    deleted: set[str] = attrs.Factory(set)
    skipped: set[str] = attrs.Factory(set)
    synced: bool = False

    def sync(self, stream: Stream) -> bool:
        shards = list(stream.shards.values())
        plan = plan_new_leases(shards, list(self.table.values()), self.initial)
        if not self.synced and self.initial.kind is InitialPositionKind.LATEST:
            self.skipped = {shard.shard_id for shard in shards if not shard.is_open}
        self.synced = True
        for lease in plan:
            assert lease.key not in self.table
            self._assert_settled_ancestors(stream, lease.shard_id, "created")
            self.table[lease.key] = lease
        # (c) applying the plan and planning again creates nothing.
        assert plan_new_leases(shards, list(self.table.values()), self.initial) == []
        return bool(plan)

    def process(self, stream: Stream) -> bool:
        changed = False
        shards = list(stream.shards.values())
        # Every lease whose shard is closed and whose parents are done reads to its end.
        # Newest first, so a child is always looked at before its parents in the same pass.
        for key in sorted(self.table, reverse=True):
            lease = self.table[key]
            if lease.is_finished or stream.shards[lease.shard_id].is_open:
                continue
            if parents_finished(lease, self.table):
                # The gate, checked against the table directly.
                for parent in stream.shards[lease.shard_id].parent_ids:
                    assert parent not in self.table or self.table[parent].is_finished
                self._assert_settled_ancestors(stream, lease.shard_id, "processed")
                # The SHARD_END task: children first, the checkpoint only once none waits.
                plan = child_leases_at_shard_end(lease, shards, list(self.table.values()))
                changed |= self._create_children(stream, plan.create)
                if plan.complete:
                    self.table[key] = attrs.evolve(lease, checkpoint=SHARD_END)
                    changed = True
        # Shard sync's repair: children of finished leases. From an empty table there is never
        # anything to repair, because every SHARD_END checkpoint came after its children.
        for key in sorted(self.table):
            lease = self.table[key]
            if not lease.is_finished:
                continue
            plan = child_leases_at_shard_end(lease, shards, list(self.table.values()))
            if self.check_lineage:
                assert plan == ChildLeasePlan(create=()), f"{key} finished without children"
            changed |= self._create_children(stream, plan.create)
        # Cleanup: a finished lease goes once all its children have leases that may start.
        doomed = []
        for key, lease in self.table.items():
            children = [s.shard_id for s in stream.shards.values() if key in s.parent_ids]
            if (
                lease.is_finished
                and children
                and all(
                    child in self.table and parents_finished(self.table[child], self.table)
                    for child in children
                )
            ):
                doomed.append(key)
        for key in doomed:
            del self.table[key]
            self.deleted.add(key)
        return changed or bool(doomed)

    def _create_children(self, stream: Stream, children: Iterable[Lease]) -> bool:
        created = False
        for child in children:
            assert child.key not in self.table
            assert child.checkpoint == TRIM_HORIZON
            # A child lease may exist before its parents finished (the gate keeps it unread),
            # but never before a parent's lease: the gate counts a missing lease as finished.
            if self.check_lineage:
                for parent in stream.shards[child.shard_id].parent_ids:
                    assert parent in self.table or self.settled(parent), (
                        f"created {child.shard_id} before a lease of its parent {parent}"
                    )
            self.table[child.key] = child
            created = True
        return created

    def round(self, stream: Stream) -> bool:
        created = self.sync(stream)
        return self.process(stream) or created

    def run_to_completion(self, stream: Stream) -> None:
        for _ in range(10 * len(stream.shards) + 10):
            if not self.round(stream):
                return
        raise AssertionError("the consumer never settled")

    def settled(self, shard_id: str) -> bool:
        lease = self.table.get(shard_id)
        if lease is not None:
            return lease.is_finished
        return shard_id in self.deleted or shard_id in self.skipped

    def _assert_settled_ancestors(self, stream: Stream, shard_id: str, event: str) -> None:
        if not self.check_lineage:
            return
        unsettled = sorted(a for a in stream.ancestors(shard_id) if not self.settled(a))
        assert not unsettled, f"{event} {shard_id} while ancestors {unsettled} are not done"


def assert_open_shards_exactly_covered(consumer: Consumer, stream: Stream) -> None:
    """(a) the unfinished leases are the open shards', tiling the hash space once."""
    unfinished = [lease for lease in consumer.table.values() if not lease.is_finished]
    assert sorted(lease.shard_id for lease in unfinished) == sorted(
        shard.shard_id for shard in stream.open_shards()
    )
    assert hash_range_holes(unfinished) == []
    ranges = [lease.hash_range for lease in unfinished]
    assert all(r is not None for r in ranges)
    assert sum(r.end - r.start + 1 for r in ranges if r is not None) == MAX_HASH_KEY + 1
    # ... and every one of them may start.
    assert all(parents_finished(lease, consumer.table) for lease in unfinished)


initial_shard_counts = st.integers(min_value=1, max_value=4)
reshard_ops = st.tuples(
    st.sampled_from(("split", "merge")),
    st.integers(min_value=0, max_value=63),
    st.integers(min_value=0, max_value=(1 << 64) - 1),
    st.integers(min_value=0, max_value=2),  # consumer rounds after the op (lag)
)
histories = st.lists(reshard_ops, max_size=12)
positions = st.sampled_from(list(POSITIONS.values()))
PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)


def build_stream(initial_count: int, ops: Sequence[tuple[str, int, int, int]]) -> Stream:
    stream = Stream.fresh(initial_count)
    for kind, pick, key_fraction, _lag in ops:
        stream.apply(kind, pick, key_fraction)
    return stream


@PROPERTY_SETTINGS
@given(
    initial_count=initial_shard_counts,
    ops=histories,
    first_sync_after=st.integers(min_value=0, max_value=12),
    initial=positions,
)
def test_lifecycle_reads_parents_before_children(
    initial_count: int,
    ops: list[tuple[str, int, int, int]],
    first_sync_after: int,
    initial: InitialPosition,
) -> None:
    """(a) and (b): a consumer that starts on an empty table while the stream reshards, lagging
    behind it, never creates or processes a shard before its ancestors, ends up with the open
    shards exactly covered, and (except what LATEST skips) reads every closed shard."""
    stream = Stream.fresh(initial_count)
    consumer = Consumer(initial)
    for index, (kind, pick, key_fraction, lag) in enumerate(ops):
        if index == first_sync_after:
            consumer.sync(stream)
        stream.apply(kind, pick, key_fraction)
        if consumer.synced:
            for _ in range(lag):
                consumer.round(stream)
    consumer.run_to_completion(stream)

    assert_open_shards_exactly_covered(consumer, stream)
    for shard in stream.shards.values():
        if not shard.is_open:
            assert consumer.settled(shard.shard_id), f"{shard.shard_id} was never read"
    if initial.kind is not InitialPositionKind.LATEST:
        assert not consumer.skipped
        assert set(consumer.deleted) | {
            key for key, lease in consumer.table.items() if lease.is_finished
        } == {shard.shard_id for shard in stream.shards.values() if not shard.is_open}


@PROPERTY_SETTINGS
@given(initial_count=initial_shard_counts, ops=histories, initial=positions, data=st.data())
def test_recovery_from_any_lease_table_covers_the_open_shards(
    initial_count: int,
    ops: list[tuple[str, int, int, int]],
    initial: InitialPosition,
    data: st.DataObject,
) -> None:
    """(a) and (c) from any starting table (the conformance rows are such tables): repeatedly
    plan, finish closed shards parent-first and create children; the open shards end up covered
    with no gap and no overlap, and each plan is idempotent."""
    stream = build_stream(initial_count, ops)
    shard_ids = sorted(stream.shards)
    leased = data.draw(st.sets(st.sampled_from(shard_ids)), label="leased")
    closed_leased = sorted(s for s in leased if not stream.shards[s].is_open)
    finished = (
        data.draw(st.sets(st.sampled_from(closed_leased)), label="finished")
        if closed_leased
        else set()
    )
    consumer = Consumer(initial, check_lineage=False)
    for shard_id in leased:
        checkpoint = SHARD_END if shard_id in finished else Checkpoint("42")
        consumer.table[shard_id] = lease_for(stream.shards[shard_id], checkpoint)
    consumer.synced = True

    consumer.run_to_completion(stream)
    assert_open_shards_exactly_covered(consumer, stream)


@PROPERTY_SETTINGS
@given(initial_count=initial_shard_counts, ops=histories, initial=positions, data=st.data())
def test_plan_is_idempotent_and_creates_no_descendants(
    initial_count: int,
    ops: list[tuple[str, int, int, int]],
    initial: InitialPosition,
    data: st.DataObject,
) -> None:
    """(c), and (b) for a single plan on any table: no planned shard descends from a leased
    shard or from another planned shard (descendants wait for their parents' SHARD_END)."""
    stream = build_stream(initial_count, ops)
    shards = list(stream.shards.values())
    leased = data.draw(st.sets(st.sampled_from(sorted(stream.shards))), label="leased")
    leases = [lease_for(stream.shards[s], Checkpoint("42")) for s in sorted(leased)]

    plan = plan_new_leases(shards, leases, initial)

    planned = {lease.shard_id for lease in plan}
    assert [lease.shard_id for lease in plan] == sorted(planned)
    assert not planned & leased
    for shard_id in planned:
        assert not stream.ancestors(shard_id) & (leased | planned)
    assert plan_new_leases(shards, leases + plan, initial) == []
    # Shuffled inputs give the same plan.
    shuffled_shards = data.draw(st.permutations(shards), label="shard order")
    shuffled_leases = data.draw(st.permutations(leases), label="lease order")
    assert plan_new_leases(shuffled_shards, shuffled_leases, initial) == plan


@PROPERTY_SETTINGS
@given(initial_count=initial_shard_counts, ops=histories, data=st.data())
def test_holes_are_exactly_the_removed_ranges(
    initial_count: int, ops: list[tuple[str, int, int, int]], data: st.DataObject
) -> None:
    """(d) start from leases tiling the open shards, delete or finish some: the holes are exactly
    the removed ranges, adjacent ones merged. Finished leases of closed shards change nothing."""
    stream = build_stream(initial_count, ops)
    open_shards = stream.open_shards()
    fates = data.draw(
        st.lists(
            st.sampled_from(("keep", "delete", "finish")),
            min_size=len(open_shards),
            max_size=len(open_shards),
        ),
        label="fates",
    )
    leases = [lease_for(shard, SHARD_END) for shard in stream.shards.values() if not shard.is_open]
    expected: list[HashRange] = []
    for shard, fate in zip(open_shards, fates, strict=True):
        if fate == "keep":
            leases.append(lease_for(shard, Checkpoint("42")))
            # A second lease over part of a kept range (overlap) changes nothing.
            low, high = shard.hash_range.start, shard.hash_range.end
            leases.append(Lease(key=f"extra-{low}", hash_range=HashRange(low, (low + high) // 2)))
            continue
        if fate == "finish":
            leases.append(lease_for(shard, SHARD_END))
        if expected and expected[-1].end + 1 == shard.hash_range.start:
            expected[-1] = HashRange(expected[-1].start, shard.hash_range.end)
        else:
            expected.append(shard.hash_range)

    shuffled = data.draw(st.permutations(leases), label="lease order")
    assert hash_range_holes(shuffled) == expected
