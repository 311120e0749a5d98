"""Batch planning of the Spark source without Spark: offsets, lineage gating, read limits
(the progress stores are tested in test_progress.py)."""

from __future__ import annotations

import pytest

from kclasync._adapters.protocols import ChildShard
from kclasync._core.leases.position import InitialPosition
from kclasync._core.lineage.shard import HashRange, Shard
from kclasync.spark.offsets import (
    ShardPosition,
    ShardProgress,
    SourceOffset,
    add_new_shards,
    allocate_quotas,
    initial_positions,
    readable_shards,
    state_after,
)
from tests.spark.support import partition

HALF = 1 << 127
P = Shard("p", hash_range=HashRange(0, HALF - 1), ending_sequence="9")
Q = Shard("q", hash_range=HashRange(HALF, (1 << 128) - 1))
C1 = Shard("c1", parent_shard_id="p", hash_range=HashRange(0, HALF // 2))
C2 = Shard("c2", parent_shard_id="p", hash_range=HashRange(HALF // 2 + 1, HALF - 1))
SHARDS = [P, Q, C1, C2]


def test_offset_json_round_trip() -> None:
    offset = SourceOffset(
        "r", 3, {"a": ShardPosition("17", ("z",), 5)}, timestamp="2026-01-01T00:00:00+00:00"
    )
    assert SourceOffset.from_json(offset.to_json()) == offset
    with pytest.raises(ValueError, match="version"):
        SourceOffset.from_json({**offset.to_json(), "v": 99})


def test_trim_horizon_starts_at_the_oldest_shards_and_latest_is_pinned() -> None:
    assert initial_positions(SHARDS, InitialPosition.trim_horizon()) == {
        "p": ShardPosition("TRIM_HORIZON"),
        "q": ShardPosition("TRIM_HORIZON"),
    }
    latest = initial_positions(SHARDS, InitialPosition.latest())
    assert set(latest) == {"q", "c1", "c2"}
    assert {pos.position for pos in latest.values()} == {"AT_TIMESTAMP"}


def test_children_start_only_after_their_parent_ended() -> None:
    state = initial_positions(SHARDS, InitialPosition.trim_horizon())
    offset = SourceOffset("r", 0, {sid: ShardPosition("TRIM_HORIZON", quota=10) for sid in state})
    # Batch 0 read part of p: its children are neither added nor readable yet.
    after, _ = state_after(
        offset, {"p": ShardProgress(10, "5", more=True), "q": ShardProgress(0, "TRIM_HORIZON")}
    )
    grown = add_new_shards(after, InitialPosition.trim_horizon(), listed=SHARDS)
    assert set(grown) == {"p", "q"}
    assert readable_shards(grown) == ["p", "q"]
    # p reached SHARD_END: both children start at TRIM_HORIZON, behind p.
    ended = SourceOffset(
        "r", 1, {"p": ShardPosition("5", quota=10), "q": ShardPosition("TRIM_HORIZON")}
    )
    after, _ = state_after(ended, {"p": ShardProgress(4, "9", ended=True)})
    assert after["p"].ended
    grown = add_new_shards(
        after,
        InitialPosition.trim_horizon(),
        reported_children=[ChildShard("c1", ("p",)), ChildShard("c2", ("p",))],
    )
    assert grown["c1"] == ShardPosition("TRIM_HORIZON", ("p",))
    assert readable_shards(grown) == ["c1", "c2", "q"]


def test_a_child_waits_while_its_parent_is_unfinished() -> None:
    state = {"p": ShardPosition("3"), "c1": ShardPosition("TRIM_HORIZON", ("p",))}
    assert readable_shards(state) == ["p"]


def test_missing_progress_for_a_read_shard_is_an_error() -> None:
    offset = SourceOffset("r", 2, {"p": ShardPosition("3", quota=5)})
    with pytest.raises(LookupError, match="batch 2"):
        state_after(offset, {})


def test_quotas_respect_both_limits_and_rotate() -> None:
    assert allocate_quotas(["a", "b"], per_shard=100, per_batch=None, batch=0) == {
        "a": 100,
        "b": 100,
    }
    assert allocate_quotas(["a", "b", "c"], per_shard=100, per_batch=200, batch=0) == {
        "a": 67,
        "b": 67,
        "c": 66,
    }
    picked = [
        set(allocate_quotas(["a", "b", "c"], per_shard=9, per_batch=1, batch=b)) for b in range(3)
    ]
    assert picked == [{"a"}, {"b"}, {"c"}]


def test_shards_per_task_groups_evenly() -> None:
    from kclasync.spark.options import SourceOptions
    from kclasync.spark.shard_task import ShardGroupPartition, ShardPartition, group_partitions

    opts = SourceOptions.parse({"streamName": "s"})

    def part(sid: str) -> ShardPartition:
        return partition(opts, sid)

    parts = [part(f"s{i}") for i in range(5)]
    assert group_partitions(parts, 1) == parts
    groups = group_partitions(parts, 2)
    assert all(isinstance(g, ShardGroupPartition) for g in groups)
    assert [[p.shard_id for p in g.parts] for g in groups] == [  # type: ignore[union-attr]
        ["s0", "s3"],
        ["s1", "s4"],
        ["s2"],
    ]
    (one,) = group_partitions(parts, 10)
    assert sorted(p.shard_id for p in one.parts) == [f"s{i}" for i in range(5)]  # type: ignore[union-attr]
