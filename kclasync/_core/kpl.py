"""De-aggregation of KPL (Kinesis Producer Library) aggregated records.

An aggregated record's data is: the 4 magic bytes F3 89 9A C2, a protobuf ``AggregatedRecord``,
and the MD5 digest of that protobuf. ``AggregatedRecord`` holds a table of partition keys
(field 1), a table of explicit hash keys (field 2) and the user records (field 3); each user
record holds a partition-key index (1), an optional explicit-hash-key index (2), its data (3)
and tags (4, ignored). All user records of one aggregated record share its sequence number and
are told apart by their sub-sequence number, their index.

Data without the magic bytes is an ordinary record. Data with the magic bytes whose digest does
not match, or whose protobuf does not parse, is delivered as one ordinary record too (as the
Java KCL does), and counted, so that nothing is dropped silently.

Owns: the wire format. Must not: do I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import attrs

MAGIC = b"\xf3\x89\x9a\xc2"
_DIGEST = 16


class KplFormatError(ValueError):
    """The data carries the KPL magic bytes but is not a valid aggregated record."""


@attrs.frozen
class UserRecord:
    partition_key: str
    data: bytes
    explicit_hash_key: str | None = None


def is_aggregated(data: bytes) -> bool:
    return data.startswith(MAGIC) and len(data) >= len(MAGIC) + _DIGEST


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise KplFormatError("truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise KplFormatError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) pairs of a protobuf message: ints for varints, bytes otherwise."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, value
        elif wire == 2:
            length, pos = _varint(buf, pos)
            if pos + length > len(buf):
                raise KplFormatError("truncated field")
            yield number, buf[pos : pos + length]
            pos += length
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        else:
            raise KplFormatError(f"unsupported wire type {wire}")
        if pos > len(buf):
            raise KplFormatError("truncated field")


def deaggregate(data: bytes) -> list[UserRecord]:
    """The user records inside an aggregated record. Raises KplFormatError when malformed."""
    if not is_aggregated(data):
        raise KplFormatError("no KPL magic bytes")
    body, digest = data[len(MAGIC) : -_DIGEST], data[-_DIGEST:]
    if hashlib.md5(body).digest() != digest:
        raise KplFormatError("MD5 digest mismatch")
    keys: list[str] = []
    hash_keys: list[str] = []
    raw_records: list[bytes] = []
    for number, value in _fields(body):
        if not isinstance(value, bytes):
            continue
        if number == 1:
            keys.append(value.decode())
        elif number == 2:
            hash_keys.append(value.decode())
        elif number == 3:
            raw_records.append(value)
    out: list[UserRecord] = []
    for raw in raw_records:
        key_index: int | None = None
        hash_index: int | None = None
        payload = b""
        for number, value in _fields(raw):
            if number == 1 and isinstance(value, int):
                key_index = value
            elif number == 2 and isinstance(value, int):
                hash_index = value
            elif number == 3 and isinstance(value, bytes):
                payload = value
        if key_index is None or key_index >= len(keys):
            raise KplFormatError(f"partition key index {key_index} out of range")
        if hash_index is not None and hash_index >= len(hash_keys):
            raise KplFormatError(f"explicit hash key index {hash_index} out of range")
        out.append(
            UserRecord(
                partition_key=keys[key_index],
                data=payload,
                explicit_hash_key=hash_keys[hash_index] if hash_index is not None else None,
            )
        )
    return out


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _encode_varint(number << 3 | 2) + _encode_varint(len(payload)) + payload


def aggregate(records: list[UserRecord]) -> bytes:
    """Build an aggregated record (for producers in tests and tools)."""
    keys: list[str] = []
    hash_keys: list[str] = []
    body = b""
    for record in records:
        if record.partition_key not in keys:
            keys.append(record.partition_key)
        inner = _encode_varint(1 << 3 | 0) + _encode_varint(keys.index(record.partition_key))
        if record.explicit_hash_key is not None:
            if record.explicit_hash_key not in hash_keys:
                hash_keys.append(record.explicit_hash_key)
            inner += _encode_varint(2 << 3 | 0) + _encode_varint(
                hash_keys.index(record.explicit_hash_key)
            )
        inner += _field(3, record.data)
        body += _field(3, inner)
    head = b"".join(_field(1, k.encode()) for k in keys)
    head += b"".join(_field(2, k.encode()) for k in hash_keys)
    message = head + body
    return MAGIC + message + hashlib.md5(message).digest()
