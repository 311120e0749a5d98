"""The dashboard's view model, without I/O: ownership changes, ages, lag, rates, leader."""

from __future__ import annotations

from kclasync._core.leases.leader_lock import LockItem
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync.dashboard._source import parse_worker_metrics
from kclasync.dashboard._view import (
    FleetRead,
    FleetView,
    WorkerEntry,
    WorkerMetrics,
    ownership_changes,
)


def test_ownership_changes_name_new_moved_and_deleted_leases() -> None:
    before = {"a": "w1", "b": "w1", "c": None}
    after = {"a": "w1", "b": "w2", "c": "w3", "d": None}
    assert ownership_changes(before, after) == [
        ("b", "w1", "w2"),
        ("c", None, "w3"),
        ("d", "(new)", None),
    ]
    assert ownership_changes(after, {}) == [
        (k, after[k], "(deleted)") for k in ("a", "b", "c", "d")
    ]


def test_view_tracks_changes_ages_lag_and_rates() -> None:
    view = FleetView("app", "app")
    metrics = [WorkerMetrics("w1", 2, records={"s0": 100}, millis_behind={"s0": 1500})]
    first = FleetRead(
        leases=[Lease("s0", counter=1, owner="w1"), Lease("s1", counter=5, owner="w2")],
        workers=[WorkerEntry("w1", "7")],
        leader=LockItem("w1", "v1", 10.0),
        metrics=metrics,
    )
    doc = view.update(first, now=100.0, wall=1000.0)
    assert doc["changes"] == []  # the first read is the baseline
    s0, s1 = doc["leases"]
    assert s0["millis_behind_latest"] == 1500 and s1["millis_behind_latest"] is None
    assert s0["checkpoint_age"] is None and s0["renewal_age"] is None  # not seen moving yet
    assert doc["leader"]["state"] == "held"
    assert [(w["id"], w["leases"], w["registered"], w["leader"]) for w in doc["workers"]] == [
        ("w1", 1, True, True),
        ("w2", 1, False, False),
    ]

    second = FleetRead(
        leases=[
            Lease("s0", counter=2, owner="w1", checkpoint=Checkpoint("49590", 0)),
            Lease("s1", counter=6, owner="w1"),
        ],
        workers=[WorkerEntry("w1", "8")],
        leader=LockItem("w1", "v1", 10.0),  # same version: the leader did not heartbeat
        metrics=[WorkerMetrics("w1", 2, records={"s0": 160}, millis_behind={"s0": 0})],
    )
    doc = view.update(second, now=102.0, wall=1002.0)
    assert doc["changes"] == [{"at": 1002.0, "lease": "s1", "from": "w2", "to": "w1"}]
    s0, s1 = doc["leases"]
    assert s0["checkpoint_age"] == 0.0 and s0["renewal_age"] == 0.0
    assert s0["records_per_second"] == 30.0  # 60 records in 2 s, by the lease's owner
    assert doc["workers"][0]["metrics"]["records_per_second"] == 30.0
    assert [w["id"] for w in doc["workers"]] == ["w1"]

    doc = view.update(second, now=113.0, wall=1013.0)
    assert doc["leases"][0]["checkpoint_age"] == 11.0
    assert doc["workers"][0]["heartbeat_age"] == 11.0
    assert doc["leader"]["state"] == "expired"  # same version for longer than 10 s
    assert len(doc["changes"]) == 1


def test_released_and_missing_leader() -> None:
    view = FleetView("app", "app")
    assert view.update(FleetRead(leases=[]), 0.0, 0.0)["leader"] == {"owner": None, "state": "none"}
    read = FleetRead(leases=[], leader=LockItem("w1", "v2", 10.0, released=True))
    assert view.update(read, 1.0, 1.0)["leader"]["state"] == "released"


def test_parse_worker_metrics_keeps_only_the_application() -> None:
    text = """# TYPE kclasync_leases_held gauge
kclasync_leases_held{application="app",worker="w1"} 2.0
kclasync_leases_held{application="other",worker="w9"} 5.0
# TYPE kclasync_records_processed_total counter
kclasync_records_processed_total{application="app",shard="s0",stream="x",worker="w1"} 42.0
# TYPE kclasync_millis_behind_latest gauge
kclasync_millis_behind_latest{application="app",shard="s0",stream="x",worker="w1"} 250.0
# TYPE kclasync_lease_renewal_failures_total counter
kclasync_lease_renewal_failures_total{application="app",reason="lost",worker="w1"} 1.0
kclasync_lease_renewal_failures_total{application="app",reason="error",worker="w1"} 2.0
"""
    (w1,) = parse_worker_metrics(text, "app")
    assert w1 == WorkerMetrics(
        "w1", 2.0, records={"s0": 42.0}, millis_behind={"s0": 250.0}, renewal_failures=3.0
    )
