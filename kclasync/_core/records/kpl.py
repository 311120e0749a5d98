"""De-aggregation of KPL (Kinesis Producer Library) aggregated records.

An aggregated record's data is: the 4 magic bytes F3 89 9A C2, a protobuf ``AggregatedRecord``,
and the MD5 digest of that protobuf. ``AggregatedRecord`` holds a table of partition keys
(field 1), a table of explicit hash keys (field 2) and the user records (field 3); each user
record holds a partition-key index (1), an optional explicit-hash-key index (2), its data (3)
and tags (4, ignored). All user records of one aggregated record share its sequence number and
are told apart by their sub-sequence number, their index.

Data without the magic bytes is an ordinary record. Data with the magic bytes whose digest does
not match, or whose protobuf does not parse (truncated, a known field with the wrong wire type, a
key that is not UTF-8, an index out of range, a user record without data, no user record at
all), raises ``KplFormatError``: the runtime delivers it as one ordinary record (as the Java KCL
does) and counts it, so that nothing is dropped silently.

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


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of a protobuf message's fields: ints for varints, bytes
    for length-delimited fields, and the raw bytes of fixed 64- and 32-bit fields."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 2, 5):
            if wire == 2:
                length, pos = _varint(buf, pos)
            else:
                length = 8 if wire == 1 else 4
            if pos + length > len(buf):
                raise KplFormatError(f"field {number} is truncated")
            value = buf[pos : pos + length]
            pos += length
        else:
            raise KplFormatError(f"unsupported wire type {wire}")
        yield number, wire, value


def _text(value: bytes, what: str) -> str:
    try:
        return value.decode()
    except UnicodeDecodeError:
        raise KplFormatError(f"{what} is not UTF-8: {value[:32]!r}") from None


def _bytes(number: int, wire: int, value: int | bytes, what: str) -> bytes:
    """A length-delimited field's value; any other wire type means the record is malformed."""
    if wire != 2 or not isinstance(value, bytes):
        raise KplFormatError(f"{what} (field {number}) has wire type {wire}, expected 2")
    return value


def _uint(number: int, wire: int, value: int | bytes, what: str) -> int:
    """A varint field's value; any other wire type means the record is malformed."""
    if wire != 0 or not isinstance(value, int):
        raise KplFormatError(f"{what} (field {number}) has wire type {wire}, expected 0")
    return value


def deaggregate(data: bytes) -> list[UserRecord]:
    """The user records inside an aggregated record. Raises KplFormatError when malformed,
    including when it holds no user record (which would otherwise vanish without a trace)."""
    if not is_aggregated(data):
        raise KplFormatError("no KPL magic bytes")
    body, digest = data[len(MAGIC) : -_DIGEST], data[-_DIGEST:]
    if hashlib.md5(body).digest() != digest:
        raise KplFormatError("MD5 digest mismatch")
    keys: list[str] = []
    hash_keys: list[str] = []
    raw_records: list[bytes] = []
    for number, wire, value in _fields(body):
        if number == 1:
            raw = _bytes(number, wire, value, "partition key")
            keys.append(_text(raw, f"partition key {len(keys)}"))
        elif number == 2:
            raw = _bytes(number, wire, value, "explicit hash key")
            hash_keys.append(_text(raw, f"explicit hash key {len(hash_keys)}"))
        elif number == 3:
            raw_records.append(_bytes(number, wire, value, "user record"))
    if not raw_records:
        raise KplFormatError("no user records")
    out: list[UserRecord] = []
    for position, record in enumerate(raw_records):
        key_index: int | None = None
        hash_index: int | None = None
        payload: bytes | None = None
        for number, wire, value in _fields(record):
            what = f"user record {position}"
            if number == 1:
                key_index = _uint(number, wire, value, f"{what} partition key index")
            elif number == 2:
                hash_index = _uint(number, wire, value, f"{what} explicit hash key index")
            elif number == 3:
                payload = _bytes(number, wire, value, f"{what} data")
        if key_index is None or key_index >= len(keys):
            raise KplFormatError(f"partition key index {key_index} out of range")
        if hash_index is not None and hash_index >= len(hash_keys):
            raise KplFormatError(f"explicit hash key index {hash_index} out of range")
        if payload is None:
            raise KplFormatError(f"user record {position} has no data")
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
