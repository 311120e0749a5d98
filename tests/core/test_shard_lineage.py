"""Tests for _core.lineage.shard_lineage: the conformance table of kcl-protocol.md section 7 on
graph A (``tests/core/graph_a.py``), and the hash-range auditor's holes.

The child leases at SHARD_END and the parent gate are in test_shard_end.py; random split/merge
histories in test_lineage_histories.py.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import pytest

from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import (
    AT_TIMESTAMP,
    LATEST,
    SHARD_END,
    TRIM_HORIZON,
    Checkpoint,
    InitialPosition,
    InitialPositionKind,
)
from kclasync._core.lineage.shard import MAX_HASH_KEY, HashRange
from kclasync._core.lineage.shard_end import (
    ChildLeasePlan,
    child_leases_at_shard_end,
    parents_finished,
)
from kclasync._core.lineage.shard_lineage import hash_range_holes, plan_new_leases
from tests.core.graph_a import (
    GRAPH_A,
    GRAPH_A_BY_ID,
    POSITIONS,
    ExistingState,
    existing_leases,
    lease_for,
    sid,
)

# Every lease the non-empty-table sync creates starts at the initial position. Under LATEST that
# includes the closed ancestors it creates (6 for leases 4,5,7; 2 and 6 for leases 3,4,5), as the
# KCL's own HierarchicalShardSyncerTest expects; see the rule table in shard_lineage.
EXPECTED_START: Mapping[InitialPositionKind, Checkpoint] = {
    InitialPositionKind.LATEST: LATEST,
    InitialPositionKind.TRIM_HORIZON: TRIM_HORIZON,
    InitialPositionKind.AT_TIMESTAMP: AT_TIMESTAMP,
}

# ---------------------------------------------------------------------------------------------
# Conformance on graph A (drawn in tests/core/graph_a.py)

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
