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


class _FastJSONParser(_JSONParser):  # type: ignore[misc]
    """botocore's JSON-protocol parser, with a direct path for GetRecords bodies."""

    def _handle_json_body(self, raw_body: bytes, shape: Any) -> Any:
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
    """Creates the fast parser for the JSON protocol (Kinesis), botocore's for the others."""

    def create_parser(self, protocol_name: str) -> Any:
        if protocol_name == "json":
            return _FastJSONParser(**self._defaults)
        return super().create_parser(protocol_name)


def install(session: Any) -> None:
    """Make clients created from ``session`` from now on parse GetRecords the fast way."""
    session.register_component("response_parser_factory", FastParserFactory())
