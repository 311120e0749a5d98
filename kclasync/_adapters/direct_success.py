"""The direct path's parse of a successful hot call: the dict botocore's parser returns, built
with orjson for the body shapes the workers' calls get back.

A renewal or a heartbeat (``UpdateItem`` without ``ReturnValues``) answers ``{}`` or just its
consumed capacity, a registry
read (``Scan``) answers items of DynamoDB attribute values, and a poll (``GetRecords``) answers
records; botocore walks the output shape for each of them. Here the body is read with orjson
and turned into the same dict (the same keys, values and types, and the same
``ResponseMetadata``: ``RequestId``, ``HTTPStatusCode``, ``HTTPHeaders`` lowercased and
``RetryAttempts`` 0); small members (``ConsumedCapacity``) go through the parser's own walk of
their shape. A body with anything this module does not know (an attribute type tag, a renamed
member, an odd value), and every error, return None: the client's own parser does it.

Owns: ``parse`` and ``enabled_for``. Must not: send anything, or parse an error.
"""

from __future__ import annotations

import binascii
import contextlib
from collections.abc import Callable
from typing import Any

import orjson
from aiobotocore.parsers import AioJSONParser
from botocore.utils import lowercase_dict

from kclasync._adapters import fast_parse


class _Unknown(Exception):
    """A body this module does not turn into botocore's result: the parser's job."""


_SCALARS = frozenset({"S", "N"})
_STRING_SETS = frozenset({"SS", "NS"})


def _value(raw: Any) -> dict[str, Any]:
    """One DynamoDB attribute value, as botocore parses it (binaries decoded to bytes)."""
    if type(raw) is not dict or len(raw) != 1:
        raise _Unknown
    ((tag, inner),) = raw.items()
    if tag in _SCALARS:
        if type(inner) is not str:
            raise _Unknown
    elif tag == "BOOL" or tag == "NULL":
        if type(inner) is not bool:
            raise _Unknown
    elif tag == "M":
        inner = _item(inner)
    elif tag == "L":
        if type(inner) is not list:
            raise _Unknown
        inner = [_value(v) for v in inner]
    elif tag == "B":
        if type(inner) is not str:
            raise _Unknown
        inner = binascii.a2b_base64(inner)
    elif tag in _STRING_SETS:
        if type(inner) is not list or any(type(v) is not str for v in inner):
            raise _Unknown
    elif tag == "BS":
        if type(inner) is not list or any(type(v) is not str for v in inner):
            raise _Unknown
        inner = [binascii.a2b_base64(v) for v in inner]
    else:
        raise _Unknown
    return {tag: inner}


def _item(raw: Any) -> dict[str, Any]:
    if type(raw) is not dict:
        raise _Unknown
    return {name: _value(value) for name, value in raw.items()}


def _items(raw: Any) -> list[dict[str, Any]]:
    if type(raw) is not list:
        raise _Unknown
    return [_item(item) for item in raw]


def _count(raw: Any) -> int:
    if type(raw) is not int:
        raise _Unknown
    return raw


_CAPACITY_UNITS = frozenset({"CapacityUnits", "ReadCapacityUnits", "WriteCapacityUnits"})


def _capacity(raw: Any) -> dict[str, Any]:
    """A table's ``ConsumedCapacity`` (its name and units; per-index figures: the parser's)."""
    if type(raw) is not dict:
        raise _Unknown
    for name, value in raw.items():
        if name == "TableName":
            if type(value) is not str:
                raise _Unknown
        elif name not in _CAPACITY_UNITS or type(value) not in (int, float):
            raise _Unknown
    return dict(raw)


#: The DynamoDB output members built here; the others, and values these builders do not know
#: (a capacity with per-index figures), are parsed by the parser's own walk of their shape.
_MEMBERS: dict[str, Callable[[Any], Any]] = {
    "Attributes": _item,
    "Items": _items,
    "LastEvaluatedKey": _item,
    "Count": _count,
    "ScannedCount": _count,
    "ConsumedCapacity": _capacity,
}


def _dynamodb(doc: dict[str, Any], parser: Any, shape: Any) -> dict[str, Any]:
    members = shape.members
    out: dict[str, Any] = {}
    for name, value in doc.items():
        if value is None or name not in members:  # as botocore: skipped
            continue
        if members[name].serialization.get("name", name) != name:
            raise _Unknown
        build = _MEMBERS.get(name)
        if build is not None:
            with contextlib.suppress(_Unknown):
                out[name] = build(value)
                continue
        out[name] = parser._parse_shape(members[name], value)
    return out


def _get_records(doc: dict[str, Any], parser: Any, shape: Any) -> dict[str, Any]:
    parsed = fast_parse.records(doc, parser, shape)
    if parsed is None:
        raise _Unknown
    return parsed


_BODIES: dict[str, Callable[[dict[str, Any], Any, Any], dict[str, Any]]] = {
    "UpdateItem": _dynamodb,
    "Scan": _dynamodb,
    "GetRecords": _get_records,
}


def enabled_for(parser: Any) -> frozenset[str]:
    """The operations whose successes this module parses for ``parser``: the ones whose result
    would be the same as the parser's (its blob parser botocore's own; GetRecords only on
    kclasync's fast parser, whose timestamps are UTC)."""
    if not isinstance(parser, AioJSONParser):
        return frozenset()
    if getattr(parser, "_blob_parser", None) != getattr(parser, "_default_blob_parser", 0):
        return frozenset()
    names = {"UpdateItem", "Scan"}
    if fast_parse.is_fast(parser):
        names.add("GetRecords")
    return frozenset(names)


def parse(op: Any, parser: Any, status: int, headers: Any, body: bytes) -> dict[str, Any] | None:
    """botocore's parse of a 200 answer to operation ``op`` (its model), or None: use the
    parser."""
    build = _BODIES.get(op.name)
    if status != 200 or build is None:
        return None
    try:
        doc = orjson.loads(body) if body else {}
        if type(doc) is not dict:
            return None
        parsed = build(doc, parser, op.output_shape)
    except (_Unknown, orjson.JSONDecodeError, binascii.Error, ValueError, TypeError):
        return None
    metadata: dict[str, Any] = {}
    if "x-amzn-requestid" in headers:
        metadata["RequestId"] = headers["x-amzn-requestid"]
    metadata["HTTPStatusCode"] = status
    metadata["HTTPHeaders"] = lowercase_dict(headers)
    metadata["RetryAttempts"] = 0
    parsed["ResponseMetadata"] = metadata
    return parsed
