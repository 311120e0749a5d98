"""The fast parse of DynamoDB item outputs gives exactly what botocore's parser gives.

On moto: the same items read and written through two clients, one with kclasync's parser and one
with botocore's, with every kind of attribute value (strings, numbers, binary, sets, nested maps
and lists, null, booleans) and the members moto adds (``ConsumedCapacity``). Then bodies moto
never sends (unknown members, nulls, bad base64, wrong types, not JSON) parse the same both ways.
"""

from __future__ import annotations

from typing import Any

import pytest

from kclasync._adapters import fast_parse
from kclasync.testing.emulators import LocalAws
from tests.adapters.test_fast_parse import two_clients

pytestmark = pytest.mark.asyncio

ITEM: dict[str, Any] = {
    "k": {"S": "a"},
    "n": {"N": "12.5"},
    "b": {"B": b"\x00\xffbinary"},
    "ss": {"SS": ["x", "y"]},
    "ns": {"NS": ["1", "2"]},
    "bs": {"BS": [b"\x01", b"\x02\x03"]},
    "m": {"M": {"inner": {"L": [{"S": "z"}, {"N": "3"}, {"M": {"b": {"B": b"\x07"}}}]}}},
    "null": {"NULL": True},
    "yes": {"BOOL": True},
    "no": {"BOOL": False},
}


def _strip(resp: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resp.items() if k != "ResponseMetadata"}


def _same_types(a: Any, b: Any, where: str = "") -> None:
    assert type(a) is type(b), where
    if isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            _same_types(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same_types(x, y, f"{where}[{i}]")


def _assert_same(fast: dict[str, Any], slow: dict[str, Any]) -> None:
    assert _strip(fast) == _strip(slow)
    _same_types(_strip(fast), _strip(slow))


async def test_item_outputs_parse_as_botocore_parses_them_on_moto(
    moto: LocalAws, unique_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    direct: list[str] = []  # the outputs the fast client parsed without botocore's walk
    parse = fast_parse._item_output

    def counted(doc: Any, members: dict[str, str], other: Any) -> dict[str, Any]:
        parsed = parse(doc, members, other)
        direct.append(",".join(sorted(parsed)))
        return parsed

    monkeypatch.setattr(fast_parse, "_item_output", counted)
    async with two_clients(moto, "dynamodb") as (fast, slow):
        await slow.create_table(
            TableName=unique_name,
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for key in ("a", "b", "c"):
            await slow.put_item(TableName=unique_name, Item={**ITEM, "k": {"S": key}})
        table = {"TableName": unique_name}
        touch = {
            **table,
            "Key": {"k": {"S": "a"}},
            "UpdateExpression": "SET touched = :t",
            "ExpressionAttributeValues": {":t": {"L": [{"B": b"\x09"}, {"NULL": True}]}},
            "ReturnValues": "ALL_NEW",
        }
        updated = await fast.update_item(**touch)
        assert updated["Attributes"]["b"] == {"B": b"\x00\xffbinary"}
        _assert_same(updated, await slow.update_item(**touch))
        get = {**table, "Key": {"k": {"S": "a"}}, "ConsistentRead": True}
        _assert_same(await fast.get_item(**get), await slow.get_item(**get))
        missing = {**table, "Key": {"k": {"S": "none"}}}
        _assert_same(await fast.get_item(**missing), await slow.get_item(**missing))
        for page in ({**table, "Limit": 2}, table):
            scanned = await fast.scan(**page)
            assert scanned["Items"] and ("LastEvaluatedKey" in scanned) == ("Limit" in page)
            _assert_same(scanned, await slow.scan(**page))
        query = {
            **table,
            "KeyConditionExpression": "k = :k",
            "ExpressionAttributeValues": {":k": {"S": "b"}},
        }
        _assert_same(await fast.query(**query), await slow.query(**query))
        gone_fast = await fast.delete_item(**table, Key={"k": {"S": "b"}}, ReturnValues="ALL_OLD")
        gone_slow = await slow.delete_item(**table, Key={"k": {"S": "c"}}, ReturnValues="ALL_OLD")
        gone_slow["Attributes"]["k"] = {"S": "b"}
        _assert_same(gone_fast, gone_slow)
    # update (with moto's ConsumedCapacity), 2 gets, 2 scans, a query, a delete
    assert len(direct) == 7, direct
    assert "Attributes,ConsumedCapacity" in direct


async def test_odd_item_bodies_parse_the_same() -> None:
    import botocore.session
    from aiobotocore.parsers import AioResponseParserFactory
    from orjson import dumps

    model = botocore.session.get_session().get_service_model("dynamodb")
    update = model.operation_model("UpdateItem").output_shape
    scan = model.operation_model("Scan").output_shape
    capacity = {"TableName": "t", "CapacityUnits": 1.0, "Table": {"CapacityUnits": 1.0}}
    bodies: list[tuple[Any, bytes]] = [
        (update, dumps({"Attributes": {"k": {"S": "a"}}, "ConsumedCapacity": capacity})),
        (
            update,
            dumps(
                {
                    "Attributes": {"k": {"S": "a"}},
                    "ItemCollectionMetrics": {
                        "ItemCollectionKey": {"k": {"S": "a"}},
                        "SizeEstimateRangeGB": [0.0, 1.0],
                    },
                }
            ),
        ),
        (update, dumps({"Attributes": {"k": {"X": "unknown member"}}})),
        (update, dumps({"Attributes": {"k": {"S": None}}})),
        (update, dumps({"Attributes": {"k": {"S": "a", "N": "1"}}})),
        (update, dumps({"Attributes": {"k": {"B": "not base64!"}}})),
        (update, dumps({"Attributes": {"k": {"SS": ["a", 1]}}})),
        (update, dumps({"Attributes": None, "Unknown": 1})),
        (update, b"{}"),
        (update, b""),
        (scan, dumps({"Items": [], "Count": 0, "ScannedCount": 0})),
        (scan, dumps({"Items": [{"k": {"N": "1"}}], "Count": 1.0, "ScannedCount": 1})),
        (scan, dumps({"Items": {"not": "a list"}, "Count": 1})),
    ]
    fast = fast_parse.FastParserFactory().create_parser("json")
    slow = AioResponseParserFactory().create_parser("json")
    for shape, body in bodies:
        raw = {"status_code": 200, "headers": {}, "body": body}
        outcomes = []
        for parser in (fast, slow):
            try:
                outcomes.append(await parser.parse(dict(raw), shape))
            except Exception as exc:  # botocore's own failure, raised the same way by both
                outcomes.append(type(exc))
        if isinstance(outcomes[0], dict) and isinstance(outcomes[1], dict):
            _assert_same(outcomes[0], outcomes[1])
        else:
            assert outcomes[0] == outcomes[1], body
    not_json = {"status_code": 200, "headers": {}, "body": b"<html>oops</html>"}
    assert await fast.parse(dict(not_json), update) == await slow.parse(dict(not_json), update)
