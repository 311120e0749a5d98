"""KPL aggregated records: the wire format, and malformed input."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kclasync._core.records.kpl import (
    MAGIC,
    KplFormatError,
    UserRecord,
    aggregate,
    deaggregate,
    is_aggregated,
)

users = st.lists(
    st.builds(
        UserRecord,
        partition_key=st.text(min_size=1, max_size=20),
        data=st.binary(max_size=200),
        explicit_hash_key=st.one_of(st.none(), st.integers(0, 2**128 - 1).map(str)),
    ),
    min_size=1,
    max_size=30,
)


@given(users)
def test_round_trip(records: list[UserRecord]) -> None:
    blob = aggregate(records)
    assert is_aggregated(blob)
    assert deaggregate(blob) == records


def test_plain_data_is_not_aggregated() -> None:
    assert not is_aggregated(b'{"id": 1}')
    assert not is_aggregated(MAGIC)  # too short to hold a digest


def test_digest_mismatch_is_rejected() -> None:
    blob = bytearray(aggregate([UserRecord("k", b"v")]))
    blob[-1] ^= 0xFF
    with pytest.raises(KplFormatError, match="MD5"):
        deaggregate(bytes(blob))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"\x1a\x05\x08", "truncated"),  # a record field longer than the message
        (b"\x1a\x02\x08\x03", "partition key index 3 out of range"),
        (b"\x0b", "unsupported wire type"),
    ],
)
def test_malformed_bodies_are_rejected(body: bytes, message: str) -> None:
    blob = MAGIC + body + hashlib.md5(body).digest()
    with pytest.raises(KplFormatError, match=message):
        deaggregate(blob)
