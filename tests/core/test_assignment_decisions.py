"""The pure decisions of leader-based assignment: snapshot, writes, follower steps, streak."""

from __future__ import annotations

from kclasync._core.assignment.assignment_decisions import (
    FailureStreak,
    FollowerStep,
    WriteKind,
    fleet_snapshot,
    follower_step,
    leader_writes,
    renewing_owners,
    worker_loads,
)
from kclasync._core.assignment.load_assignment import Move, Plan
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._core.workers.worker_metrics import WorkerMetrics


def test_follower_steps() -> None:
    mine = Lease(key="k", owner="me", counter=3)
    assert follower_step("me", mine, held=False) is FollowerStep.TAKE
    assert follower_step("me", mine, held=True) is FollowerStep.SKIP
    assert follower_step("me", None, held=False) is FollowerStep.SKIP
    assert follower_step("me", Lease(key="k", owner="x"), held=False) is FollowerStep.SKIP
    handed = Lease(key="k", owner="me", checkpoint_owner="old")
    assert follower_step("me", handed, held=False) is FollowerStep.INCOMING
    done = Lease(key="k", owner="me", checkpoint=Checkpoint("SHARD_END"))
    assert follower_step("me", done, held=False) is FollowerStep.SKIP


def test_writes_for_a_plan() -> None:
    scanned = {
        "u": Lease(key="u"),
        "m": Lease(key="m", owner="a", counter=4),
        "h": Lease(key="h", owner="b", checkpoint_owner="a"),
    }
    plan = Plan(
        assignments=(Move("u", None, "b"),),
        moves=(Move("m", "a", "b"), Move("h", "b", "c"), Move("gone", "a", "b")),
    )
    writes = leader_writes(plan, scanned)
    assert [(w.kind, w.lease.key, w.to_worker) for w in writes] == [
        (WriteKind.ASSIGN, "u", "b"),
        (WriteKind.HANDOFF, "m", "b"),
    ]


def test_snapshot_expiry_and_finished_leases() -> None:
    expiry = ExpiryTracker(10.0)
    leases = [
        Lease(key="a", owner="w1", counter=1),
        Lease(key="b", owner="w2", counter=1, throughput_kbps=5.0),
        Lease(key="c", owner="w1", checkpoint=Checkpoint("SHARD_END")),
    ]
    expiry.observe(leases, 0.0)
    moved = [leases[0], Lease(key="b", owner="w2", counter=2, throughput_kbps=5.0), leases[2]]
    expiry.observe(moved, 15.0)
    snap = fleet_snapshot(moved, worker_loads({"w1", "w2"}, {}), expiry, 15.0)
    by_key = {lease.key: lease for lease in snap.leases}
    assert set(by_key) == {"a", "b"}
    assert by_key["a"].expired and not by_key["b"].expired
    assert by_key["b"].throughput_kbps == 5.0
    # w1 still owns "c" (finished, counter unchanged) and "a": both stood still; w2 renews
    assert renewing_owners(moved, expiry, 15.0) == {"w2"}


def test_worker_loads_from_metrics() -> None:
    m = WorkerMetrics(
        worker_id="w1",
        last_update=1,
        metric_stats={"C": (10.0, 42.0)},
        operating_range={"C": (80,)},
    )
    failing = WorkerMetrics(
        worker_id="w2",
        last_update=1,
        metric_stats={"C": (10.0, -1.0)},
        operating_range={"C": (90,)},
    )
    loads = worker_loads({"w2", "w1", "w3"}, {"w1": m, "w2": failing}, capacities={"w3": 500.0})
    assert [(w.worker_id, w.cpu_percent, w.max_cpu_percent, w.capacity_kbps) for w in loads] == [
        ("w1", 42.0, 80.0, None),
        ("w2", None, 90.0, None),
        ("w3", None, 100.0, 500.0),
    ]


def test_failure_streak() -> None:
    streak = FailureStreak()
    assert not streak.failed() and not streak.failed()
    streak.succeeded()
    assert not streak.failed() and not streak.failed()
    assert streak.failed() and streak.count == 0


def test_no_rebalance_while_a_handoff_runs_or_right_after_moves() -> None:
    from kclasync._core.assignment.assignment_decisions import may_rebalance
    from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, WorkerLoad

    calm = FleetSnapshot(leases=(LeaseLoad("a", "w1"),), workers=(WorkerLoad("w1"),))
    busy = FleetSnapshot(
        leases=(LeaseLoad("a", "w2", checkpoint_owner="w1"),),
        workers=(WorkerLoad("w1"), WorkerLoad("w2")),
    )
    assert may_rebalance(calm, moved_last_run=False)
    assert not may_rebalance(calm, moved_last_run=True)
    assert not may_rebalance(busy, moved_last_run=False)
