"""The direct path's orjson parse of a success is botocore's parse of the same bytes.

A client on botocore's path (``fast_requests=False``, kclasync's GetRecords parser installed)
makes each call; a ``before-parse`` hook keeps the answer's status, headers and body, and
``direct_success.parse`` of those bytes must equal the dict the call returned, metadata and
all: UpdateItem without and with ``ReturnValues``, Scan with items of every attribute type and
with a ``LastEvaluatedKey`` (moto), GetRecords with records, empty, and with ChildShards after a
split (moto, kinesis-local). Errors give None
(left to the parser).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest

from kclasync._adapters import direct_requests, direct_success
from kclasync.testing.emulators import LocalAws

pytestmark = pytest.mark.asyncio


class _Seen:
    """The raw answers a client's calls got, and the check against its parsed results."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.parser = client._endpoint._response_parser_factory.create_parser("json")
        self.raw: list[tuple[Any, dict[str, Any]]] = []
        client.meta.events.register("before-parse", self._keep)

    def _keep(self, operation_model: Any, response_dict: dict[str, Any], **_: Any) -> None:
        self.raw.append((operation_model, dict(response_dict)))

    async def same(self, method: str, **params: Any) -> dict[str, Any]:
        self.raw.clear()
        result: dict[str, Any] = await getattr(self.client, method)(**params)
        ((op, raw),) = self.raw
        assert op.name in direct_success.enabled_for(self.parser)
        mine = direct_success.parse(
            op, self.parser, raw["status_code"], raw["headers"], raw["body"]
        )
        assert mine == result
        assert _types(mine) == _types(result)
        return result

    async def left_to_parser(self, method: str, **params: Any) -> None:
        self.raw.clear()
        with contextlib.suppress(Exception):
            await getattr(self.client, method)(**params)
        assert self.raw
        op, raw = self.raw[-1]
        assert (
            direct_success.parse(op, self.parser, raw["status_code"], raw["headers"], raw["body"])
            is None
        )


def _types(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _types(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_types(v) for v in value]
    return type(value)


@contextlib.asynccontextmanager
async def _client(aws: LocalAws, service: str) -> AsyncIterator[_Seen]:
    async with aws.client_options(fast_requests=False).create_client(service) as client:
        yield _Seen(client)


async def test_dynamodb_successes_parse_the_same(moto: LocalAws, unique_name: str) -> None:
    async with _client(moto, "dynamodb") as seen:
        d = seen.client
        await d.create_table(
            TableName=unique_name,
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for i in range(3):
            await d.put_item(
                TableName=unique_name,
                Item={
                    "k": {"S": f"key-{i}"},
                    "n": {"N": "12.50"},
                    "b": {"B": b"\x00\xffbin"},
                    "ss": {"SS": ["a", "b"]},
                    "ns": {"NS": ["1", "2.5"]},
                    "bs": {"BS": [b"x", b"\x01"]},
                    "m": {"M": {"inner": {"L": [{"S": "v"}, {"NULL": True}, {"BOOL": False}]}}},
                    "t": {"BOOL": True},
                },
            )
        update = {
            "TableName": unique_name,
            "Key": {"k": {"S": "key-0"}},
            "UpdateExpression": "SET c = :c",
            "ExpressionAttributeValues": {":c": {"N": "1"}},
        }
        plain = await seen.same("update_item", **update)
        assert "Attributes" not in plain
        new = await seen.same("update_item", ReturnValues="ALL_NEW", **update)
        assert new["Attributes"]["b"] == {"B": b"\x00\xffbin"}
        scanned = await seen.same("scan", TableName=unique_name)
        assert scanned["Count"] == 3 and len(scanned["Items"]) == 3
        page = await seen.same("scan", TableName=unique_name, Limit=1)
        assert "LastEvaluatedKey" in page
        empty = await seen.same(
            "scan",
            TableName=unique_name,
            ScanFilter={"k": {"AttributeValueList": [{"S": "none"}], "ComparisonOperator": "EQ"}},
        )
        assert empty["Items"] == []
        # Capacity per table and per index (the latter through the parser's walk).
        for mode in ("TOTAL", "INDEXES"):
            counted = await seen.same("scan", TableName=unique_name, ReturnConsumedCapacity=mode)
            assert counted["ConsumedCapacity"]["TableName"] == unique_name
        # Left to the client's parser: a failed condition.
        await seen.left_to_parser(
            "update_item", ConditionExpression="attribute_not_exists(k)", **update
        )


async def _get_records(aws: LocalAws, name: str, split: bool) -> None:
    async with _client(aws, "kinesis") as seen:
        k = seen.client
        await k.create_stream(StreamName=name, ShardCount=1)
        for _ in range(200):
            desc = await k.describe_stream_summary(StreamName=name)
            if desc["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                break
        for i in range(4):
            await k.put_record(StreamName=name, Data=bytes([i]) * (i + 1), PartitionKey=f"p{i}")
        shard = (await k.list_shards(StreamName=name))["Shards"][0]
        it = (
            await k.get_shard_iterator(
                StreamName=name, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )
        )["ShardIterator"]
        full = await seen.same("get_records", ShardIterator=it, Limit=100)
        assert len(full["Records"]) == 4
        tip = await seen.same("get_records", ShardIterator=full["NextShardIterator"])
        assert tip["Records"] == []
        if not split:
            return
        start = int(shard["HashKeyRange"]["StartingHashKey"])
        end = int(shard["HashKeyRange"]["EndingHashKey"])
        await k.split_shard(
            StreamName=name,
            ShardToSplit=shard["ShardId"],
            NewStartingHashKey=str((start + end) // 2),
        )
        it = tip["NextShardIterator"]
        for _ in range(200):
            last = await seen.same("get_records", ShardIterator=it)
            if last.get("NextShardIterator") is None:
                break
            it = last["NextShardIterator"]
        assert last.get("NextShardIterator") is None and last.get("ChildShards")


async def test_get_records_parse_the_same_on_moto(moto: LocalAws, unique_name: str) -> None:
    await _get_records(moto, unique_name, split=False)


async def test_get_records_parse_the_same_on_kinesis_local(
    kinesis: LocalAws, unique_name: str
) -> None:
    await _get_records(kinesis, unique_name, split=True)


async def test_direct_callers_use_it_where_results_match(moto: LocalAws) -> None:
    """kclasync's clients parse these successes here; GetRecords only with kclasync's
    GetRecords parser (botocore's gives local-time timestamps)."""
    everything = {"UpdateItem", "Scan", "GetRecords"}
    async with (
        moto.client_options().create_client("kinesis") as fast,
        moto.client_options(fast_parsing=False).create_client("kinesis") as plain,
    ):
        fast_caller = direct_requests.caller_for(fast)
        plain_caller = direct_requests.caller_for(plain)
        assert fast_caller is not None and plain_caller is not None
        assert direct_success.enabled_for(fast_caller._parser) == everything
        assert direct_success.enabled_for(plain_caller._parser) == everything - {"GetRecords"}
