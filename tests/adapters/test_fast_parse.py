"""The fast GetRecords parser gives exactly what botocore's parser gives, on real servers.

The same shard iterator is read through two clients, one with kclasync's parser and one with
botocore's, on moto and on kinesis-local: plain records, a KPL aggregate, binary data, an empty
batch and a closed shard's last batch. The parsed responses and the records the adapter builds
from them must be equal field by field, with the same types.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import pytest

from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._core.records.kpl import UserRecord, aggregate, deaggregate
from kclasync.testing.emulators import LocalAws

pytestmark = pytest.mark.asyncio


@contextlib.asynccontextmanager
async def two_clients(aws: LocalAws, service: str = "kinesis") -> AsyncIterator[tuple[Any, Any]]:
    """A client of ``service`` with kclasync's parser, and one with botocore's."""
    fast = aws.client_options(fast_parsing=True)
    slow = aws.client_options(fast_parsing=False)
    async with fast.create_client(service) as f, slow.create_client(service) as s:
        yield f, s


def _strip(resp: dict[str, Any]) -> dict[str, Any]:
    """The response without its metadata; an iterator only by presence (kinesis-local hands out a
    new encrypted iterator for every call)."""
    out = {k: v for k, v in resp.items() if k != "ResponseMetadata"}
    if "NextShardIterator" in out:
        out["NextShardIterator"] = out["NextShardIterator"] is not None
    return out


def _assert_same(fast: dict[str, Any], slow: dict[str, Any]) -> None:
    assert _strip(fast) == _strip(slow)
    for a, b in zip(fast["Records"], slow["Records"], strict=True):
        assert set(a) == set(b)
        for key in a:
            assert type(a[key]) is type(b[key]), key
        if "ApproximateArrivalTimestamp" in a:
            ts = a["ApproximateArrivalTimestamp"]
            assert isinstance(ts, datetime) and ts.tzinfo is not None


async def _fill(client: Any, stream: str) -> None:
    await client.create_stream(StreamName=stream, ShardCount=1)
    for _ in range(100):
        desc = await client.describe_stream_summary(StreamName=stream)
        if desc["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
            break
    users = [UserRecord(f"u{i}", f"user-{i}".encode()) for i in range(5)]
    entries = [
        {"PartitionKey": "plain", "Data": b"hello"},
        {"PartitionKey": "binary", "Data": bytes(range(256))},
        {"PartitionKey": "agg", "Data": aggregate(users)},
        {"PartitionKey": "unicode-\u00e9", "Data": "caf\u00e9".encode()},
    ]
    for entry in entries:  # one at a time: moto loses records under concurrent puts
        await client.put_record(StreamName=stream, **entry)


async def _compare_stream(aws: LocalAws, stream: str) -> None:
    async with two_clients(aws) as (fast, slow):
        await _fill(slow, stream)
        shard_id = (await slow.list_shards(StreamName=stream))["Shards"][0]["ShardId"]
        it = (
            await slow.get_shard_iterator(
                StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
            )
        )["ShardIterator"]
        f_resp = await fast.get_records(ShardIterator=it, Limit=100)
        s_resp = await slow.get_records(ShardIterator=it, Limit=100)
        assert len(s_resp["Records"]) == 4
        _assert_same(f_resp, s_resp)

        # The records the adapter hands on, and the KPL records inside them, are equal too.
        f_result = await KinesisStreamClient(fast).get_records(stream, shard_id, it, 100)
        s_result = await KinesisStreamClient(slow).get_records(stream, shard_id, it, 100)
        assert f_result.records == s_result.records
        assert f_result.child_shards == s_result.child_shards
        assert f_result.millis_behind_latest == s_result.millis_behind_latest
        agg = [r for r in f_result.records if r.partition_key == "agg"]
        assert [u.data for u in deaggregate(agg[0].data)] == [
            f"user-{i}".encode() for i in range(5)
        ]

        # An empty batch at the tip of the shard.
        tip = f_resp["NextShardIterator"]
        f_empty = await fast.get_records(ShardIterator=tip, Limit=100)
        s_empty = await slow.get_records(ShardIterator=tip, Limit=100)
        assert f_empty["Records"] == [] and s_empty["Records"] == []
        _assert_same(f_empty, s_empty)


async def test_same_parse_as_botocore_on_moto(moto: LocalAws, unique_name: str) -> None:
    await _compare_stream(moto, unique_name)


async def test_same_parse_as_botocore_on_kinesis_local(kinesis: LocalAws, unique_name: str) -> None:
    await _compare_stream(kinesis, unique_name)


async def test_closed_shard_children_parse_the_same(kinesis: LocalAws, unique_name: str) -> None:
    """The last batch of a split shard (no next iterator; ChildShards where the server sends
    them) parses the same both ways."""
    async with two_clients(kinesis) as (fast, slow):
        await _fill(slow, unique_name)
        shard = (await slow.list_shards(StreamName=unique_name))["Shards"][0]
        it = (
            await slow.get_shard_iterator(
                StreamName=unique_name,
                ShardId=shard["ShardId"],
                ShardIteratorType="TRIM_HORIZON",
            )
        )["ShardIterator"]
        start = int(shard["HashKeyRange"]["StartingHashKey"])
        end = int(shard["HashKeyRange"]["EndingHashKey"])
        await slow.split_shard(
            StreamName=unique_name,
            ShardToSplit=shard["ShardId"],
            NewStartingHashKey=str((start + end) // 2),
        )
        for _ in range(200):
            desc = await slow.describe_stream_summary(StreamName=unique_name)
            if desc["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                break
        closed = False
        for _ in range(200):
            f_resp = await fast.get_records(ShardIterator=it, Limit=2)
            s_resp = await slow.get_records(ShardIterator=it, Limit=2)
            _assert_same(f_resp, s_resp)
            if s_resp.get("NextShardIterator") is None:
                closed = True
                break
            it = s_resp["NextShardIterator"]
        assert closed, "the split parent never reported its end"


async def test_child_shards_and_odd_bodies_parse_the_same() -> None:
    """Bodies the emulators never send (ChildShards as AWS sends them at a shard's end, null
    members, a string timestamp, a body that is not JSON) parse the same both ways."""
    import botocore.session
    from aiobotocore.parsers import AioResponseParserFactory
    from orjson import dumps

    from kclasync._adapters.fast_parse import FastParserFactory

    model = botocore.session.get_session().get_service_model("kinesis")
    shape = model.operation_model("GetRecords").output_shape
    bodies = [
        {
            "Records": [
                {
                    "SequenceNumber": "1",
                    "Data": "aGk=",
                    "PartitionKey": "k",
                    "ApproximateArrivalTimestamp": 1.7e9,
                    "EncryptionType": "NONE",
                },
                {"SequenceNumber": "2", "Data": "", "ApproximateArrivalTimestamp": None},
                {"SequenceNumber": "3", "Data": "aGk=", "ApproximateArrivalTimestamp": 1700000000},
            ],
            "MillisBehindLatest": 0,
            "ChildShards": [
                {
                    "ShardId": "shardId-000000000001",
                    "ParentShards": ["shardId-000000000000"],
                    "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "99"},
                }
            ],
        },
        {"Records": [], "NextShardIterator": None, "MillisBehindLatest": None},
        {"Records": [{"SequenceNumber": "4", "Data": "aGk=", "Unknown": 1}]},
    ]
    fast = FastParserFactory().create_parser("json")
    slow = AioResponseParserFactory().create_parser("json")
    for body in bodies:
        raw = {"status_code": 200, "headers": {}, "body": dumps(body)}
        _assert_same(await fast.parse(dict(raw), shape), await slow.parse(dict(raw), shape))
    not_json = {"status_code": 200, "headers": {}, "body": b"<html>oops</html>"}
    assert await fast.parse(dict(not_json), shape) == await slow.parse(dict(not_json), shape)


async def test_a_session_passed_in_is_not_changed(moto: LocalAws, unique_name: str) -> None:
    """fast_parsing=True applies to the clients kclasync makes from your session, not to the
    session: a client you make from it afterwards keeps botocore's parser."""
    from aiobotocore.session import get_session

    from kclasync._adapters.fast_parse import FastParserFactory

    session = get_session()
    before = session.get_component("response_parser_factory")
    options = moto.client_options(session=session, fast_parsing=True)
    async with options.create_client("kinesis") as ours:
        assert isinstance(ours._endpoint._response_parser_factory, FastParserFactory)
        await ours.create_stream(StreamName=unique_name, ShardCount=1)
        async with session.create_client(
            "kinesis",
            region_name="us-east-1",
            endpoint_url=moto.endpoint_url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ) as yours:
            assert session.get_component("response_parser_factory") is before
            assert not isinstance(yours._endpoint._response_parser_factory, FastParserFactory)
            await yours.describe_stream_summary(StreamName=unique_name)
    default = moto.client_options(session=session)  # fast_parsing None: off on your session
    async with default.create_client("kinesis") as plain:
        assert not isinstance(plain._endpoint._response_parser_factory, FastParserFactory)
