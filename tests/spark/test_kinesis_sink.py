"""The Kinesis sink: request packing within PutRecords' limits, per-record retries, a clear error
for an oversized record (no Spark), and a Spark query that reads one stream and writes another
on kinesis-local with exact counts, plus a batch write with explicit hash keys."""

from __future__ import annotations

import asyncio
import pathlib
from collections import Counter
from typing import Any

import orjson
import pytest

from kclasync._adapters.protocols import IteratorType, StartingPosition
from kclasync.spark.put import (
    MAX_RECORD_BYTES,
    MAX_REQUEST_BYTES,
    Entry,
    RecordTooLargeError,
    pack,
    put_all,
)
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, kinesis_endpoint, source_options
from tests.support import aws_for


def test_requests_stay_within_500_records_and_5_mib() -> None:
    small = [Entry("k", b"x" * 10) for _ in range(1201)]
    assert [len(c) for c in pack(small)] == [500, 500, 201]
    big = [Entry("k", b"x" * (MAX_RECORD_BYTES - 1)) for _ in range(11)]
    chunks = list(pack(big))
    assert [len(c) for c in chunks] == [5, 5, 1]
    assert all(sum(e.size for e in c) <= MAX_REQUEST_BYTES for c in chunks)
    assert [e for c in chunks for e in c] == big


def test_an_oversized_record_is_refused_by_row_and_size() -> None:
    with pytest.raises(RecordTooLargeError, match=r"row 2 \(partition key 'k'\) is 1,048,577"):
        Entry("k", b"x" * MAX_RECORD_BYTES).check(2)
    with pytest.raises(RecordTooLargeError, match="partition key must have 1 to 256"):
        Entry("", b"x").check(0)


class FlakyKinesis:
    """A PutRecords stand-in that throttles the first call and fails every third entry once."""

    def __init__(self) -> None:
        self.calls = 0
        self.failed_once: set[bytes] = set()
        self.written: list[bytes] = []

    async def put_records(self, StreamName: str, Records: list[dict[str, Any]]) -> Any:
        from botocore.exceptions import ClientError

        self.calls += 1
        if self.calls == 1:
            raise ClientError(
                {"Error": {"Code": "ProvisionedThroughputExceededException"}}, "PutRecords"
            )
        out = []
        for i, r in enumerate(Records):
            if i % 3 == 0 and r["Data"] not in self.failed_once:
                self.failed_once.add(r["Data"])
                out.append({"ErrorCode": "ProvisionedThroughputExceededException"})
            else:
                self.written.append(r["Data"])
                out.append({"SequenceNumber": "1", "ShardId": "s"})
        failed = sum(1 for o in out if "ErrorCode" in o)
        return {"FailedRecordCount": failed, "Records": out}


def test_failed_entries_are_retried_until_written() -> None:
    client = FlakyKinesis()
    entries = [Entry("k", str(i).encode()) for i in range(1000)]
    stats = asyncio.run(put_all(client, "s", entries, backoff=0.001))
    assert sorted(client.written, key=int) == [e.data for e in entries]
    assert stats.records == 1000 and stats.throttled_requests == 1
    assert stats.retried_records == len(client.failed_once) > 300


def read_stream(local: LocalAws, stream: str) -> list[tuple[str, bytes, str]]:
    """Every record of every shard: (shard id, data, partition key)."""

    async def go() -> list[tuple[str, bytes, str]]:
        out = []
        async with aws_for(local, stream) as aws:
            for shard in await aws.stream.list_shards(stream):
                it = await aws.stream.get_shard_iterator(
                    stream, shard.shard_id, StartingPosition(IteratorType.TRIM_HORIZON)
                )
                while it:
                    page = await aws.stream.get_records(stream, shard.shard_id, it, 10_000)
                    out += [(shard.shard_id, r.data, r.partition_key) for r in page.records]
                    if not page.records and not page.millis_behind_latest:
                        break
                    it = page.next_iterator
        return out

    return asyncio.run(go())


def sink_options(local: LocalAws, stream: str) -> dict[str, str]:
    return {
        "streamName": stream,
        "endpointUrl": kinesis_endpoint(local),
        "region": "us-east-1",
        "awsAccessKeyId": "testing",
        "awsSecretKey": "testing",
    }


def test_a_query_copies_one_stream_into_another(
    spark: Any, kinesis: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    ids = create_and_produce(kinesis, unique_name, 2, 1200)
    target = f"{unique_name}-out"
    create_and_produce(kinesis, target, 3, 0)
    query = (
        spark.readStream.format("kinesis")
        .options(**source_options(kinesis, unique_name, tmp_path, maxRecordsPerShard=400))
        .load()
        .writeStream.format("kinesis")
        .options(**sink_options(kinesis, target))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(200)
    assert query.exception() is None
    copied = read_stream(kinesis, target)
    counts = Counter(orjson.loads(data)["id"] for _, data, _ in copied)
    assert set(counts) == set(ids) and sum(counts.values()) == len(ids)
    # The source's partition keys were kept, so records spread over the target's shards.
    assert {key for _, _, key in copied} == {f"key-{i % 101}" for i in ids}
    assert len({shard for shard, _, _ in copied}) == 3
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    assert rows == len(ids)


def test_a_batch_write_with_explicit_hash_keys(
    spark: Any, kinesis: LocalAws, unique_name: str
) -> None:
    create_and_produce(kinesis, unique_name, 2, 0)
    top = (1 << 128) - 1
    df = spark.createDataFrame(
        [(f"row-{i}", str(0 if i % 2 else top), orjson.dumps({"id": i})) for i in range(1500)],
        "pk STRING, hashKey STRING, payload BINARY",
    )
    (
        df.write.format("kinesis")
        .options(**sink_options(kinesis, unique_name))
        .option("partitionKeyColumn", "pk")
        .option("explicitHashKeyColumn", "hashKey")
        .option("dataColumn", "payload")
        .mode("append")
        .save()
    )
    got = read_stream(kinesis, unique_name)
    assert sorted(orjson.loads(d)["id"] for _, d, _ in got) == list(range(1500))
    by_shard = Counter((shard, orjson.loads(d)["id"] % 2) for shard, d, _ in got)
    assert len(by_shard) == 2  # odd ids all on the low shard, even ids on the high one
    assert sorted(by_shard.values()) == [750, 750]


def test_a_missing_column_fails_before_writing(
    spark: Any, kinesis: LocalAws, unique_name: str
) -> None:
    from pyspark.errors import PySparkException

    create_and_produce(kinesis, unique_name, 1, 0)
    df = spark.createDataFrame([("a", b"x")], "key STRING, data BINARY")
    with pytest.raises(PySparkException) as caught:
        df.write.format("kinesis").options(**sink_options(kinesis, unique_name)).mode(
            "append"
        ).save()
    text = str(caught.value)
    assert "partitionKeyColumn: column 'partitionKey' is not in the DataFrame" in text
    assert read_stream(kinesis, unique_name) == []
