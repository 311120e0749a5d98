"""KPL aggregates in the source (moto): user records come out one row each with their
sub-sequence numbers, a batch may end inside an aggregate and the next resumes at the following
user record, a worker's checkpoint inside an aggregate is resumed exactly, and records trimmed
away before they were read fail the query (or, with failOnDataLoss=false, are stepped over)."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
from collections import Counter
from typing import Any

import orjson
from pyspark.errors import StreamingQueryException
from pyspark.sql import functions as F

from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._core.records.kpl import UserRecord, aggregate
from kclasync.testing.emulators import LocalAws
from tests.spark.support import source_options
from tests.support import aws_for

PER_AGGREGATE = 7


def put_aggregates(local: LocalAws, stream: str, aggregates: int, shards: int = 1) -> list[str]:
    """``aggregates`` KPL records of 7 user records each, ids 0.. in order; returns their
    sequence numbers."""

    async def go() -> list[str]:
        async with aws_for(local, stream) as aws:
            await aws.create_stream(shards)
            seqs = []
            for a in range(aggregates):
                users = [
                    UserRecord(f"k{a}-{i}", orjson.dumps({"id": a * PER_AGGREGATE + i}))
                    for i in range(PER_AGGREGATE)
                ]
                [(_, seq)] = [
                    r
                    for r in await aws.stream.put_records(stream, [(f"a{a}", aggregate(users))])
                    if r
                ]
                seqs.append(seq)
            return seqs

    return asyncio.run(go())


def run(spark: Any, opts: dict[str, str], tmp: pathlib.Path, name: str) -> tuple[Any, list[Any]]:
    out = tmp / f"out-{name}"

    def keep(df: Any, batch_id: int) -> None:
        df.withColumn("batch", F.lit(batch_id)).write.mode("append").parquet(str(out))

    query = (
        spark.readStream.format("kinesis")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(tmp / f"ck-{name}"))
        .trigger(availableNow=True)
        .start()
    )
    with contextlib.suppress(StreamingQueryException):
        assert query.awaitTermination(150)
    if not list(out.glob("*.parquet")):
        return query, []
    rows = (
        spark.read.parquet(str(out))
        .select(
            F.get_json_object(F.col("data").cast("string"), "$.id").cast("long").alias("id"),
            "sequenceNumber",
            "subSequenceNumber",
            "partitionKey",
            "batch",
        )
        .collect()
    )
    return query, rows


def test_aggregates_split_across_batches_resume_exactly(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    seqs = put_aggregates(moto, unique_name, 6)
    opts = source_options(moto, unique_name, tmp_path, maxRecordsPerShard=5)
    query, rows = run(spark, opts, tmp_path, "split")
    assert query.exception() is None
    ids = Counter(r["id"] for r in rows)
    assert set(ids) == set(range(6 * PER_AGGREGATE)) and max(ids.values()) == 1
    for r in rows:
        a, i = divmod(r["id"], PER_AGGREGATE)
        assert (r["sequenceNumber"], r["subSequenceNumber"], r["partitionKey"]) == (
            seqs[a],
            i,
            f"k{a}-{i}",
        )
    # 42 user records, 5 per batch: batches end inside aggregates, and each batch is in order.
    by_batch: dict[int, list[int]] = {}
    for r in rows:
        by_batch.setdefault(r["batch"], []).append(r["id"])
    assert [len(v) for _, v in sorted(by_batch.items())] == [5] * 8 + [2]
    assert [i for _, v in sorted(by_batch.items()) for i in sorted(v)] == list(range(42))


def test_a_worker_checkpoint_inside_an_aggregate_is_resumed_exactly(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    seqs = put_aggregates(moto, unique_name, 3)

    async def lease() -> None:
        async with aws_for(moto, unique_name) as aws:
            await aws.store.ensure_table()
            shard = (await aws.stream.list_shards(unique_name))[0].shard_id
            created = await aws.store.create_lease(
                Lease(key=shard, checkpoint=Checkpoint(seqs[1], 3))
            )
            assert created

    asyncio.run(lease())
    opts = source_options(moto, unique_name, tmp_path, leaseTable=unique_name)
    query, rows = run(spark, opts, tmp_path, "lease")
    assert query.exception() is None
    # After user record 3 of aggregate 1: records 4..6 of it, then all of aggregate 2.
    assert sorted(r["id"] for r in rows) == list(range(PER_AGGREGATE + 4, 3 * PER_AGGREGATE))


def test_records_trimmed_before_they_were_read(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    """A checkpoint whose record is gone stands for records trimmed by retention."""
    seqs = put_aggregates(moto, unique_name, 2)
    gone = str(int(seqs[0]) - 1)

    async def lease(table: str) -> None:
        async with aws_for(moto, table) as aws:
            await aws.store.ensure_table()
            shard = (await aws.stream.list_shards(unique_name))[0].shard_id
            assert await aws.store.create_lease(Lease(key=shard, checkpoint=Checkpoint(gone)))

    asyncio.run(lease(f"{unique_name}-a"))
    opts = source_options(moto, unique_name, tmp_path, leaseTable=f"{unique_name}-a")
    query, rows = run(spark, opts, tmp_path, "fail")
    assert rows == []
    error = str(query.exception())
    assert "DataLossError" in error and f"after {gone} are gone" in error
    assert "failOnDataLoss=false" in error

    asyncio.run(lease(f"{unique_name}-b"))
    opts = source_options(
        moto, unique_name, tmp_path, leaseTable=f"{unique_name}-b", failOnDataLoss="false"
    )
    query, rows = run(spark, opts, tmp_path, "skip")
    assert query.exception() is None
    assert sorted(r["id"] for r in rows) == list(range(2 * PER_AGGREGATE))
