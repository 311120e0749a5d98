"""The Java KCL's Migration3.0 item: read tolerantly, never written."""

from __future__ import annotations

from kclasync._core.leases.client_version import (
    ClientVersion,
    decode_migration_item,
    java_fleet_follows_leader,
    lease_mode,
)


def test_each_client_version_says_whether_java_workers_follow_a_leader() -> None:
    def state(cv: str) -> bool | None:
        item = {"key": {"S": "Migration3.0"}, "cv": {"S": cv}, "mb": {"S": "java-1"}}
        return java_fleet_follows_leader(decode_migration_item(item))

    assert state("CLIENT_VERSION_3X") is True
    assert state("CLIENT_VERSION_3X_WITH_ROLLBACK") is True
    assert state("CLIENT_VERSION_2X") is False
    assert state("CLIENT_VERSION_UPGRADE_FROM_2X") is False
    assert state("CLIENT_VERSION_INIT") is None
    assert state("CLIENT_VERSION_4X") is None  # unknown: no claim
    assert java_fleet_follows_leader(None) is None


def test_the_item_is_decoded_tolerantly() -> None:
    decoded = decode_migration_item({"cv": {"S": "CLIENT_VERSION_3X"}, "mb": {"S": "w"}})
    assert decoded is not None and decoded.version is ClientVersion.V3X
    assert decoded.modified_by == "w"
    odd = decode_migration_item({"cv": {"N": "3"}})
    assert odd is not None and odd.version is None and "N" in odd.raw
    assert decode_migration_item(None) is None


def test_a_worker_side_taker_follows_a_leader_while_the_java_workers_do() -> None:
    def mode(cv: str | None, *, leader_based: bool = False) -> bool:
        item = None if cv is None else {"cv": {"S": cv}, "mb": {"S": "java-1"}}
        state = decode_migration_item(item)
        return lease_mode(state, configured_leader_based=leader_based).leader_assigns

    # balanced / kcl2: the leader assigns only where Java workers wait for a leader.
    assert mode("CLIENT_VERSION_3X") is True
    assert mode("CLIENT_VERSION_3X_WITH_ROLLBACK") is True
    assert mode(None) is False
    assert mode("CLIENT_VERSION_INIT") is False
    assert mode("CLIENT_VERSION_2X") is False  # a rollback: Java workers take leases again
    assert mode("CLIENT_VERSION_UPGRADE_FROM_2X") is False
    assert mode("CLIENT_VERSION_4X") is False  # unknown: no claim, the configured taker
    # kcl3 / load: always leader-assigned, whatever the table says.
    for cv in (None, "CLIENT_VERSION_2X", "CLIENT_VERSION_3X"):
        assert mode(cv, leader_based=True) is True


def test_the_lease_mode_says_why() -> None:
    state = decode_migration_item({"cv": {"S": "CLIENT_VERSION_3X"}})
    why = lease_mode(state, configured_leader_based=False).reason
    assert "CLIENT_VERSION_3X" in why and "assign" in why
    assert "no Java" in lease_mode(None, configured_leader_based=False).reason
