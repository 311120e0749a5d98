"""A faster parse of Kinesis GetRecords responses and of DynamoDB item responses, on the
clients kclasync creates.

botocore parses every response by walking the operation's output shape, and turns each epoch
timestamp into a datetime through dateutil's ``tzlocal()``: for GetRecords that walk and the
timestamps are most of a consumer's CPU. This parser gives GetRecords the same result (the same
keys, values and types: ``Data`` as bytes, ``ApproximateArrivalTimestamp`` as an aware datetime
for the same instant, in UTC) with orjson and a direct loop. DynamoDB's item outputs (UpdateItem,
GetItem, PutItem, DeleteItem, Scan, Query: the renewals, checkpoints, takes and scans of the
lease table) are parsed the same way: an AttributeValue parses to itself but for its binary
members (``B``, ``BS``: base64 decoded to bytes), so each one is checked and copied. Every other
operation, every error and anything unexpected in a body (an unknown member, a null, a wrong
type, ``ConsumedCapacity``) goes through botocore's parser unchanged.

Owns: the response parser factory installed on one client kclasync created (``install``).
Must not: touch a session (the client's endpoint holds its own factory), or decide anything
about records or leases.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from aiobotocore.parsers import AioJSONParser, AioResponseParserFactory
from botocore.utils import parse_timestamp

# botocore's parser classes are untyped inside; they are extended through these names.
_JSONParser: Any = AioJSONParser
_ParserFactory: Any = AioResponseParserFactory

_RECORD_OUTPUT = "GetRecordsOutput"


def _timestamp(value: Any) -> datetime:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    parsed: datetime = parse_timestamp(value)
    return parsed


def _record(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if value is None:
            continue
        if key == "Data":
            out[key] = binascii.a2b_base64(value)
        elif key == "ApproximateArrivalTimestamp":
            out[key] = _timestamp(value)
        elif key in ("SequenceNumber", "PartitionKey", "EncryptionType"):
            out[key] = value
    return out


#: DynamoDB outputs parsed directly, and the kind of each member they may hold.
_ITEMS = {"Items": "items", "Count": "count", "ScannedCount": "count", "LastEvaluatedKey": "item"}
_ITEM_OUTPUTS: dict[str, dict[str, str]] = {
    "UpdateItemOutput": {"Attributes": "item"},
    "PutItemOutput": {"Attributes": "item"},
    "DeleteItemOutput": {"Attributes": "item"},
    "GetItemOutput": {"Item": "item"},
    "ScanOutput": _ITEMS,
    "QueryOutput": _ITEMS,
}
_STRINGS = ("S", "N")


class _Unexpected(ValueError):
    """Something botocore's parser should see (and report, or parse its own way)."""


def _strings(value: Any) -> list[str]:
    if type(value) is not list or any(type(v) is not str for v in value):
        raise _Unexpected
    return value


def _attribute(value: Any) -> dict[str, Any]:
    """One AttributeValue, as botocore parses it."""
    if type(value) is not dict or len(value) != 1:
        raise _Unexpected
    ((tag, inner),) = value.items()
    if tag in _STRINGS:
        if type(inner) is not str:
            raise _Unexpected
        return value  # a fresh dict from orjson, as botocore's would be
    if tag == "M":
        return {"M": _item(inner)}
    if tag == "L":
        if type(inner) is not list:
            raise _Unexpected
        return {"L": [_attribute(v) for v in inner]}
    if tag in ("BOOL", "NULL"):
        if type(inner) is not bool:
            raise _Unexpected
        return value
    if tag == "B":
        if type(inner) is not str:
            raise _Unexpected
        return {"B": binascii.a2b_base64(inner)}
    if tag in ("SS", "NS"):
        _strings(inner)
        return value
    if tag == "BS":
        return {"BS": [binascii.a2b_base64(v) for v in _strings(inner)]}
    raise _Unexpected  # botocore's tagged-union handling reports unknown members


def _item(value: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise _Unexpected
    return {name: _attribute(v) for name, v in value.items()}


def _item_output(
    doc: Any, members: dict[str, str], other: Callable[[str, Any], Any]
) -> dict[str, Any]:
    """The output's item members parsed here; ``other`` (botocore's walk of the member's shape)
    parses any other member the output has (``ConsumedCapacity``, ``ItemCollectionMetrics``)."""
    if type(doc) is not dict:
        raise _Unexpected
    parsed: dict[str, Any] = {}
    for key, value in doc.items():
        kind = members.get(key)
        if value is None:
            raise _Unexpected
        if kind == "item":
            parsed[key] = _item(value)
        elif kind == "items":
            if type(value) is not list:
                raise _Unexpected
            parsed[key] = [_item(v) for v in value]
        elif kind == "count":
            if type(value) is not int:
                raise _Unexpected
            parsed[key] = value
        else:
            parsed[key] = other(key, value)
    return parsed


def _holds_attribute_values(shape: Any, members: dict[str, str]) -> bool:
    """The output shape is DynamoDB's (its item members map names to ``AttributeValue``)."""
    for name, kind in members.items():
        member = shape.members.get(name)
        if member is None:
            return False
        if kind != "count":
            item = member.member if kind == "items" else member
            if getattr(getattr(item, "value", None), "name", None) != "AttributeValue":
                return False
    return True


class _FastJSONParser(_JSONParser):  # type: ignore[misc]
    """botocore's JSON-protocol parser, with a direct path for GetRecords bodies and for
    DynamoDB's item outputs."""

    def _handle_json_body(self, raw_body: bytes, shape: Any) -> Any:
        members = None if shape is None else _ITEM_OUTPUTS.get(shape.name)
        if members is not None and raw_body and _holds_attribute_values(shape, members):

            def other(key: str, value: Any) -> Any:
                member = shape.members.get(key)
                if member is None:
                    raise _Unexpected  # botocore's parse leaves it out; so does the fallback
                return self._parse_shape(member, value)

            try:
                return _item_output(orjson.loads(raw_body), members, other)
            except (ValueError, binascii.Error):  # _Unexpected, bad JSON, bad base64
                return super()._handle_json_body(raw_body, shape)
        if shape is None or shape.name != _RECORD_OUTPUT or not raw_body:
            return super()._handle_json_body(raw_body, shape)
        try:
            doc = orjson.loads(raw_body)
            if not isinstance(doc, dict) or not isinstance(doc.get("Records"), list):
                raise ValueError("not a GetRecords body")
            parsed: dict[str, Any] = {"Records": [_record(r) for r in doc["Records"]]}
        except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
            # Anything odd: botocore's own parse, which knows how to report it.
            return super()._handle_json_body(raw_body, shape)
        for key in ("NextShardIterator", "MillisBehindLatest"):
            if doc.get(key) is not None:
                parsed[key] = doc[key]
        if doc.get("ChildShards") is not None:
            parsed["ChildShards"] = self._parse_shape(
                shape.members["ChildShards"], doc["ChildShards"]
            )
        return parsed


class FastParserFactory(_ParserFactory):  # type: ignore[misc]
    """Creates the fast parser for the JSON protocol (Kinesis, DynamoDB), botocore's for the
    others."""

    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "json":
            return _FastJSONParser(**self._defaults)
        return super().create_parser(protocol_name)


def install(client: Any) -> None:
    """Make ``client`` parse GetRecords and DynamoDB's item outputs the fast way (its endpoint
    creates a parser per response from this factory)."""
    endpoint = getattr(client, "_endpoint", None)
    if endpoint is None or not hasattr(endpoint, "_response_parser_factory"):
        return  # another aiobotocore: botocore's parser
    endpoint._response_parser_factory = FastParserFactory()
