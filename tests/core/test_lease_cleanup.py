"""Deleting finished leases only after their children started; the hole auditor's patience."""

from __future__ import annotations

from kclasync._core.leases.lease import Lease
from kclasync._core.leases.lease_cleanup import (
    CleanupTracker,
    HoleAuditor,
    child_started,
    ready_for_deletion,
)
from kclasync._core.leases.position import SHARD_END, TRIM_HORIZON, Checkpoint
from kclasync._core.lineage.shard import HashRange


def lease(key: str, checkpoint: Checkpoint = TRIM_HORIZON, **kw: object) -> Lease:
    return Lease(key=key, checkpoint=checkpoint, **kw)  # type: ignore[arg-type]


PARENT = lease("p", SHARD_END, child_shard_ids=frozenset({"c1", "c2"}))


def by_key(*leases: Lease) -> dict[str, Lease]:
    return {x.key: x for x in leases}


def test_child_started_means_checkpointed_or_owned_with_parents_finished() -> None:
    parents = frozenset({"p"})
    idle = lease("c1", parent_shard_ids=parents)
    assert not child_started(idle, by_key(PARENT, idle))
    assert child_started(lease("c1", Checkpoint("42"), parent_shard_ids=parents), {})
    assert child_started(lease("c1", SHARD_END, parent_shard_ids=parents), {})
    owned = lease("c1", owner="w", parent_shard_ids=parents)
    assert child_started(owned, by_key(PARENT, owned))
    # Owned but a (merge) parent still processing: its worker waits, so it has not started.
    merge = lease("c1", owner="w", parent_shard_ids=frozenset({"p", "q"}))
    assert not child_started(merge, by_key(PARENT, lease("q", Checkpoint("7")), merge))


def test_ready_needs_every_child_lease_present_and_started() -> None:
    c1 = lease("c1", Checkpoint("1"), parent_shard_ids=frozenset({"p"}))
    c2_idle = lease("c2", parent_shard_ids=frozenset({"p"}))
    assert not ready_for_deletion(PARENT, by_key(PARENT, c1))  # c2 missing
    assert not ready_for_deletion(PARENT, by_key(PARENT, c1, c2_idle))
    c2 = lease("c2", owner="w", parent_shard_ids=frozenset({"p"}))
    assert ready_for_deletion(PARENT, by_key(PARENT, c1, c2))
    # Unfinished, or no known children: never.
    assert not ready_for_deletion(lease("p", Checkpoint("5")), by_key(c1, c2))
    bare = lease("p", SHARD_END)
    assert not ready_for_deletion(bare, by_key(bare, c1, c2))
    assert ready_for_deletion(bare, by_key(bare, c1, c2), children=["c1", "c2"])


def test_multi_stream_children_are_looked_up_under_the_parents_prefix() -> None:
    prefix = "123:orders:1700000000:"
    parent = lease(prefix + "p", SHARD_END, child_shard_ids=frozenset({"c"}))
    child = lease(prefix + "c", Checkpoint("9"), parent_shard_ids=frozenset({"p"}))
    other = lease("c", Checkpoint("9"))
    assert ready_for_deletion(parent, by_key(parent, child))
    assert not ready_for_deletion(parent, by_key(parent, other))


def test_tracker_waits_the_delay_and_restarts_it_when_readiness_lapses() -> None:
    c1 = lease("c1", Checkpoint("1"), parent_shard_ids=frozenset({"p"}))
    c2 = lease("c2", Checkpoint("1"), parent_shard_ids=frozenset({"p"}))
    tracker = CleanupTracker(delay=5.0)
    assert tracker.plan([PARENT, c1, c2], now=0.0) == []
    assert tracker.plan([PARENT, c1, c2], now=4.9) == []
    assert tracker.plan([PARENT, c1], now=5.0) == []  # c2 vanished: not ready, forgotten
    assert tracker.plan([PARENT, c1, c2], now=6.0) == []  # the delay starts again
    assert tracker.plan([PARENT, c1, c2], now=11.0) == [PARENT]
    tracker.deleted("p")
    assert tracker.plan([c1, c2], now=12.0) == []


def test_auditor_syncs_after_threshold_consecutive_holes_only() -> None:
    hole = [HashRange(0, 10)]
    auditor = HoleAuditor(threshold=3)
    assert [auditor.record("s", hole) for _ in range(2)] == [False, False]
    assert auditor.record("s", []) is False  # a clean audit resets the count
    assert [auditor.record("s", hole) for _ in range(3)] == [False, False, True]
    assert auditor.consecutive("s") == 0  # counting starts again after a sync
    assert auditor.record("other", hole) is False  # streams are counted apart
