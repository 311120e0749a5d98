"""A faster parse of Kinesis GetRecords responses, for the sessions kclasync creates itself.

botocore parses every response by walking the operation's output shape, and turns each epoch
timestamp into a datetime through dateutil's ``tzlocal()``: for GetRecords that walk and the
timestamps are most of a consumer's CPU. This parser gives GetRecords the same result (the same
keys, values and types: ``Data`` as bytes, ``ApproximateArrivalTimestamp`` as an aware datetime
for the same instant, in UTC) with orjson and a direct loop; every other operation, every error
and anything unexpected in the body goes through botocore's parser unchanged.

Owns: the response parser factory installed on sessions kclasync creates (``install``).
Must not: touch a session the user passed in (``ClientOptions.fast_parsing`` says so), or decide
anything about records or leases.
"""

from __future__ import annotations

import binascii
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


def records(doc: Any, parser: Any, shape: Any) -> dict[str, Any] | None:
    """The parse of a GetRecords body ``doc`` (as orjson read it), or None when it holds
    something this module leaves to botocore's parser (``parser`` parses the child shards of
    the output ``shape``)."""
    try:
        if not isinstance(doc, dict) or not isinstance(doc.get("Records"), list):
            return None
        parsed: dict[str, Any] = {"Records": [_record(r) for r in doc["Records"]]}
    except (ValueError, TypeError, KeyError, AttributeError, binascii.Error):
        return None
    for key in ("NextShardIterator", "MillisBehindLatest"):
        if doc.get(key) is not None:
            parsed[key] = doc[key]
    if doc.get("ChildShards") is not None:
        children = shape.members["ChildShards"]
        parsed["ChildShards"] = parser._parse_shape(children, doc["ChildShards"])
    return parsed


class _FastJSONParser(_JSONParser):  # type: ignore[misc]
    """botocore's JSON-protocol parser, with a direct path for GetRecords bodies."""

    def _handle_json_body(self, raw_body: bytes, shape: Any) -> Any:
        if shape is None or shape.name != _RECORD_OUTPUT or not raw_body:
            return super()._handle_json_body(raw_body, shape)
        try:
            doc = orjson.loads(raw_body)
        except ValueError:
            doc = None
        parsed = records(doc, self, shape)
        if parsed is None:  # anything odd: botocore's own parse, which knows how to report it
            return super()._handle_json_body(raw_body, shape)
        return parsed


class FastParserFactory(_ParserFactory):  # type: ignore[misc]
    """Creates the fast parser for the JSON protocol (Kinesis), botocore's for the others."""

    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "json":
            return _FastJSONParser(**self._defaults)
        return super().create_parser(protocol_name)


def is_fast(parser: Any) -> bool:
    """Whether ``parser`` is this module's (GetRecords timestamps in UTC)."""
    return isinstance(parser, _FastJSONParser)


def install(session: Any) -> None:
    """Make clients created from ``session`` from now on parse GetRecords the fast way."""
    session.register_component("response_parser_factory", FastParserFactory())
