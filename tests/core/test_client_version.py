"""The Java KCL's Migration3.0 item: read tolerantly, never written."""

from __future__ import annotations

from kclasync._core.leases.client_version import (
    ClientVersion,
    decode_migration_item,
    java_fleet_follows_leader,
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
