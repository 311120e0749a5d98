"""The leader lock's pure rules: expiry from observed record versions, first writer wins."""

from __future__ import annotations

from kclasync._core.leases.leader_lock import LeaderLockState, LockAction, LockItem


def item(owner: str | None, version: str, duration: float = 10.0, released: bool = False):
    return LockItem(owner, version, duration, released)


def test_missing_item_is_created() -> None:
    state = LeaderLockState("a")
    state.observe(None, 0.0)
    assert state.decide(None, 0.0).action is LockAction.CREATE


def test_someone_elses_lock_expires_only_after_a_full_duration_on_our_clock() -> None:
    state = LeaderLockState("a")
    lock = item("b", "v1")
    state.observe(lock, 100.0)  # first sighting: a full duration starts now
    assert state.decide(lock, 100.0).action is LockAction.WAIT
    state.observe(lock, 110.0)
    assert state.decide(lock, 110.0).action is LockAction.WAIT  # exactly the duration: not yet
    state.observe(lock, 110.5)
    decision = state.decide(lock, 110.5)
    assert decision.action is LockAction.TAKE and decision.expected_version == "v1"


def test_a_heartbeat_restarts_the_wait() -> None:
    state = LeaderLockState("a")
    state.observe(item("b", "v1"), 0.0)
    state.observe(item("b", "v2"), 9.0)  # the holder renewed
    state.observe(item("b", "v2"), 15.0)
    assert state.decide(item("b", "v2"), 15.0).action is LockAction.WAIT
    state.observe(item("b", "v2"), 19.5)
    assert state.decide(item("b", "v2"), 19.5).action is LockAction.TAKE


def test_released_lock_is_taken_at_once_and_own_lock_after_restart_too() -> None:
    state = LeaderLockState("a")
    released = item("b", "v3", released=True)
    state.observe(released, 0.0)
    assert state.decide(released, 0.0).action is LockAction.TAKE
    mine_from_before = item("a", "v4")
    state.observe(mine_from_before, 1.0)
    assert state.decide(mine_from_before, 1.0).action is LockAction.TAKE


def test_holder_heartbeats_and_leads_only_within_its_duration() -> None:
    state = LeaderLockState("a")
    written = item("a", "v1", duration=10.0)
    state.written(written, sent_at=50.0)
    assert state.is_leader(55.0)
    assert not state.is_leader(60.0)  # the others may take it from now on
    state.observe(written, 52.0)
    decision = state.decide(written, 52.0)
    assert decision.action is LockAction.HEARTBEAT and decision.expected_version == "v1"
    # Someone replaced our version: we are not the leader any more.
    state.observe(item("c", "v9"), 53.0)
    assert not state.is_leader(53.0)
    assert state.decide(item("c", "v9"), 53.0).action is LockAction.WAIT


def test_holder_stops_leading_before_any_observer_may_take_over() -> None:
    holder, other = LeaderLockState("a"), LeaderLockState("b")
    lock = item("a", "v1", duration=10.0)
    holder.written(lock, sent_at=0.0)
    other.observe(lock, 0.2)  # seen after it was sent
    for now in (1.0, 5.0, 9.9, 10.1, 10.3):
        other.observe(lock, now)
        takes = other.decide(lock, now).action is LockAction.TAKE
        assert not (takes and holder.is_leader(now)), now


def test_released_marker_follows_the_lock_client_and_reads_older_kclasync_items() -> None:
    from kclasync._core.leases.leader_lock import RELEASED_MARKER, is_released_marker

    assert not is_released_marker(None)  # the lock client writes no marker while held
    assert is_released_marker(RELEASED_MARKER)  # the lock client's release without delete
    assert is_released_marker("anything")  # the lock client only tests for presence
    assert is_released_marker(True)  # earlier kclasync release
    assert not is_released_marker(False)  # earlier kclasync wrote false on every held lock


def test_a_lock_deleted_by_its_holder_is_created_by_the_next_reader() -> None:
    # The KCL 3.x leader deletes the item on a graceful release.
    state = LeaderLockState("a")
    held_by_java = item("java-1", "uuid-1", duration=120.0)
    state.observe(held_by_java, 0.0)
    assert state.decide(held_by_java, 100.0).action is LockAction.WAIT  # 120 s is honoured
    state.observe(None, 101.0)
    assert state.decide(None, 101.0).action is LockAction.CREATE
