"""Fuzzing KPL de-aggregation: any bytes give user records or ``KplFormatError``, nothing else.

The runtime delivers data whose de-aggregation raises ``KplFormatError`` as one ordinary record
and counts it (``kclasync_malformed_aggregates_total``); any other exception would stop the
shard's pipeline, and an empty result would drop the record silently.
"""

from __future__ import annotations

import hashlib

from hypothesis import assume, given
from hypothesis import strategies as st

from kclasync._core.records.kpl import (
    MAGIC,
    KplFormatError,
    UserRecord,
    _encode_varint,
    aggregate,
    deaggregate,
    is_aggregated,
)
from tests.fuzz.profile import FUZZ

users = st.lists(
    st.builds(
        UserRecord,
        partition_key=st.text(min_size=1, max_size=12),
        data=st.binary(max_size=64),
        explicit_hash_key=st.one_of(st.none(), st.integers(0, 2**128 - 1).map(str)),
    ),
    min_size=1,
    max_size=8,
)


def signed(body: bytes) -> bytes:
    """``body`` framed as an aggregated record with a correct digest."""
    return MAGIC + body + hashlib.md5(body).digest()


def outcome(data: bytes) -> list[UserRecord] | KplFormatError:
    """De-aggregate; the only exception allowed out is ``KplFormatError``, with a message."""
    try:
        records = deaggregate(data)
    except KplFormatError as exc:
        assert str(exc), "a KplFormatError must say what is wrong"
        return exc
    assert records, "an aggregated record with no user records must be an error, not dropped"
    for r in records:
        assert isinstance(r.partition_key, str)
        assert isinstance(r.data, bytes)
        assert r.explicit_hash_key is None or isinstance(r.explicit_hash_key, str)
    return records


def field(number: int, wire: int, payload: bytes | int) -> bytes:
    key = _encode_varint(number << 3 | wire)
    if isinstance(payload, int):
        return key + _encode_varint(payload)
    return key + _encode_varint(len(payload)) + payload


# A protobuf-ish message: a few fields of any number and wire type, some of them lying about
# their length, nested one level so that user records are fuzzed too.
scalar_field = st.builds(
    field,
    st.integers(0, 6),
    st.sampled_from([0, 2]),
    st.one_of(st.integers(0, 2**70), st.binary(max_size=20)),
).filter(lambda b: True)
raw_field = st.one_of(
    scalar_field,
    st.builds(
        lambda k, n: _encode_varint(k) + _encode_varint(n),
        st.integers(0, 2**12),
        st.integers(0, 2**64),
    ),
    st.binary(max_size=12),
)
record_body = st.lists(raw_field, max_size=5).map(b"".join)
message = st.lists(
    st.one_of(raw_field, st.builds(lambda b: field(3, 2, b), record_body)), max_size=8
).map(b"".join)


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes(data: bytes) -> None:
    outcome(data)
    outcome(MAGIC + data)


@FUZZ
@given(message)
def test_random_protobuf_with_good_digest(body: bytes) -> None:
    outcome(signed(body))


@FUZZ
@given(users, st.data())
def test_truncated(records: list[UserRecord], data: st.DataObject) -> None:
    blob = aggregate(records)
    cut = data.draw(st.integers(0, len(blob) - 1))
    result = outcome(blob[:cut])
    assert isinstance(result, KplFormatError)


@FUZZ
@given(users, st.binary(min_size=4, max_size=4))
def test_wrong_magic(records: list[UserRecord], magic: bytes) -> None:
    assume(magic != MAGIC)
    blob = magic + aggregate(records)[len(MAGIC) :]
    assert not is_aggregated(blob)
    assert isinstance(outcome(blob), KplFormatError)


@FUZZ
@given(users, st.data())
def test_bad_checksum_or_flipped_bit(records: list[UserRecord], data: st.DataObject) -> None:
    blob = bytearray(aggregate(records))
    at = data.draw(st.integers(len(MAGIC), len(blob) - 1))
    blob[at] ^= 1 << data.draw(st.integers(0, 7))
    result = outcome(bytes(blob))
    assert isinstance(result, KplFormatError)  # the digest no longer matches
    assert "MD5" in str(result)


@FUZZ
@given(st.integers(2**31, 2**63), st.integers(0, 3))
def test_huge_counts_and_lengths(huge: int, where: int) -> None:
    """Lengths and indexes far beyond the data fail fast instead of allocating."""
    record = field(1, 0, 0) + field(3, 2, b"x")
    bodies = [
        _encode_varint(1 << 3 | 2) + _encode_varint(huge) + b"k",  # key of absurd length
        field(1, 2, b"k") + field(3, 2, field(1, 0, huge) + field(3, 2, b"x")),  # key index
        field(1, 2, b"k") + field(3, 2, record + field(2, 0, huge)),  # hash key index
        field(1, 2, b"k") + field(3, 2, _encode_varint(3 << 3 | 2) + _encode_varint(huge)),
    ]
    assert isinstance(outcome(signed(bodies[where])), KplFormatError)


@FUZZ
@given(st.integers(1, 500))
def test_many_records(count: int) -> None:
    records = [UserRecord("k", b"%d" % i) for i in range(count)]
    assert outcome(aggregate(records)) == records


@FUZZ
@given(st.binary(min_size=1, max_size=8).filter(lambda b: not _valid_utf8(b)))
def test_partition_key_not_utf8(key: bytes) -> None:
    body = field(1, 2, key) + field(3, 2, field(1, 0, 0) + field(3, 2, b"x"))
    result = outcome(signed(body))
    assert isinstance(result, KplFormatError)
    assert "partition key" in str(result)


def _valid_utf8(b: bytes) -> bool:
    try:
        b.decode()
    except UnicodeDecodeError:
        return False
    return True


@FUZZ
@given(st.sampled_from([1, 3]), st.integers(0, 2**20))
def test_known_field_with_wrong_wire_type(number: int, value: int) -> None:
    """A user record whose data (3) or aggregate whose key table (1) is a varint is malformed,
    not a record with empty data."""
    if number == 3:
        body = field(1, 2, b"k") + field(3, 2, field(1, 0, 0) + field(3, 0, value))
    else:
        body = field(1, 0, value) + field(3, 2, field(1, 0, 0) + field(3, 2, b"x"))
    assert isinstance(outcome(signed(body)), KplFormatError)


def test_no_user_records_is_an_error() -> None:
    assert isinstance(outcome(signed(b"")), KplFormatError)
    assert isinstance(outcome(signed(field(1, 2, b"k"))), KplFormatError)


def test_missing_data_is_an_error() -> None:
    body = field(1, 2, b"k") + field(3, 2, field(1, 0, 0))
    assert isinstance(outcome(signed(body)), KplFormatError)


@FUZZ
@given(users)
def test_round_trip(records: list[UserRecord]) -> None:
    assert outcome(aggregate(records)) == records
