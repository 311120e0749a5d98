"""Fuzzing the GetRecords response mapping (``records_result``): a response with missing, extra
or mistyped fields gives a ``GetRecordsResult`` holding every record, or a
``MalformedResponseError`` (a ``TransientError``, so the shard's reader retries the same
iterator with backoff) naming the field. Never another exception, never a record left out."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from kclasync._adapters.kinesis import MalformedResponseError, records_result
from kclasync._adapters.protocols import GetRecordsResult, TransientError
from kclasync._records import Record
from tests.fuzz.profile import FUZZ

RECORD_FIELDS = ["SequenceNumber", "Data", "PartitionKey", "ApproximateArrivalTimestamp"]
RESPONSE_FIELDS = ["Records", "NextShardIterator", "MillisBehindLatest", "ChildShards"]

anything = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=10),
    st.binary(max_size=10),
    st.just(datetime(2024, 1, 1, tzinfo=UTC)),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)
good_record = st.fixed_dictionaries(
    {
        "SequenceNumber": st.integers(0, 2**128).map(str),
        "Data": st.binary(max_size=20),
        "PartitionKey": st.text(min_size=1, max_size=10),
    },
    optional={
        "ApproximateArrivalTimestamp": st.just(datetime(2024, 1, 1, tzinfo=UTC)),
        "EncryptionType": st.sampled_from(["NONE", "KMS"]),
    },
)
good_child = st.fixed_dictionaries(
    {
        "ShardId": st.text(min_size=1, max_size=10),
        "ParentShards": st.lists(st.text(min_size=1, max_size=10), max_size=2),
        "HashKeyRange": st.just({"StartingHashKey": "0", "EndingHashKey": "100"}),
    }
)
good_response = st.fixed_dictionaries(
    {"Records": st.lists(good_record, max_size=4)},
    optional={
        "NextShardIterator": st.text(min_size=1, max_size=10),
        "MillisBehindLatest": st.integers(0, 10**9),
        "ChildShards": st.lists(good_child, max_size=2),
    },
)


def check(resp: Any) -> GetRecordsResult | MalformedResponseError:
    try:
        result = records_result(resp, "stream", "shardId-000000000000")
    except MalformedResponseError as exc:
        assert isinstance(exc, TransientError)  # retried by the shard reader
        assert "stream/shardId-000000000000" in str(exc)
        return exc
    raw = resp.get("Records") or []
    assert len(result.records) == len(raw), "a record was left out"
    for record, source in zip(result.records, raw, strict=True):
        assert isinstance(record, Record)
        assert record.data == bytes(source["Data"])
        assert record.position[0] == int(source["SequenceNumber"])
        assert isinstance(record.partition_key, str)
        assert record.approximate_arrival is None or isinstance(
            record.approximate_arrival, datetime
        )
    assert result.next_iterator is None or isinstance(result.next_iterator, str)
    assert result.millis_behind_latest is None or isinstance(result.millis_behind_latest, int)
    for child in result.child_shards:
        assert isinstance(child.shard_id, str)
        assert all(isinstance(p, str) for p in child.parent_shard_ids)
    return result


@FUZZ
@given(good_response)
def test_well_formed_responses_keep_every_record(resp: dict[str, Any]) -> None:
    assert isinstance(check(resp), GetRecordsResult)


@FUZZ
@example({"Records": [{"Data": b"x", "PartitionKey": "k"}]}, 0, "SequenceNumber", None)
@example({"Records": [{"Data": b"x", "PartitionKey": "k", "SequenceNumber": "1"}]}, 0, "Data", 5)
@example({"Records": [{"Data": b"x", "PartitionKey": "k", "SequenceNumber": "1"}]}, 0, "Data", "x")
@given(
    good_response.filter(lambda r: r["Records"]),
    st.integers(0, 3),
    st.sampled_from(RECORD_FIELDS),
    st.one_of(st.just(None), anything),
)
def test_record_fields_missing_or_odd(
    resp: dict[str, Any], index: int, name: str, value: Any
) -> None:
    record = resp["Records"][index % len(resp["Records"])]
    if value is None:
        record.pop(name, None)
    else:
        record[name] = value
    result = check(resp)
    if isinstance(result, MalformedResponseError) and value is not None:
        assert name in str(result)


@FUZZ
@given(good_response, st.sampled_from(RESPONSE_FIELDS), anything)
def test_response_fields_odd(resp: dict[str, Any], name: str, value: Any) -> None:
    resp[name] = value
    result = check(resp)
    if isinstance(result, MalformedResponseError):
        assert name in str(result) or "record" in str(result) or "child" in str(result)


@FUZZ
@given(
    good_response,
    st.lists(
        st.one_of(
            anything,
            st.dictionaries(st.sampled_from(["ShardId", "ParentShards", "HashKeyRange"]), anything),
        ),
        min_size=1,
        max_size=2,
    ),
)
def test_child_shards_odd(resp: dict[str, Any], children: list[Any]) -> None:
    resp["ChildShards"] = children
    check(resp)


@FUZZ
@given(st.one_of(anything, st.dictionaries(st.sampled_from(RESPONSE_FIELDS), anything)))
def test_any_response(resp: Any) -> None:
    check(resp)
