"""Multi-stream lease keys: ``<account>:<stream>:<creationEpoch>:<shardId>``."""

from __future__ import annotations

from kclasync._core.leases.lease import Lease
from kclasync._core.lineage.streams import StreamIdentity, parse_multi_stream_key


def test_key_round_trip_and_shard_id() -> None:
    ident = StreamIdentity("123456789012", "orders", 1700000000)
    key = ident.lease_key("shardId-000000000007")
    assert key == "123456789012:orders:1700000000:shardId-000000000007"
    assert parse_multi_stream_key(key) == (ident, "shardId-000000000007")
    assert Lease(key=key).shard_id == "shardId-000000000007"
    assert ident.owns(key)
    assert not StreamIdentity("123456789012", "orders", 1700000001).owns(key)


def test_single_stream_and_malformed_keys_are_not_multi_stream() -> None:
    for key in ("shardId-000000000001", "a:b:c:d", "1:orders::shard", "1:2:3:4:5"):
        assert parse_multi_stream_key(key) is None
