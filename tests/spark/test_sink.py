"""The Spark processor for kclasync workers (moto): every batch lands in parquet once, a crash
between the Spark write and the checkpoint duplicates nothing, and a pipeline moves between the
Spark source and kclasync workers through the lease table without reading anything twice."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import pathlib
import threading
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from pyspark.sql import functions as F

from kclasync.spark import BatchInfo, ParquetSink, SparkProcessor
from kclasync.testing.emulators import LocalAws
from tests.spark.support import source_options
from tests.support import Tally, aws_for, wait_until

pytestmark = pytest.mark.asyncio


def parquet_ids(spark: Any, path: pathlib.Path) -> list[int]:
    rows = spark.read.parquet(str(path)).select(
        F.get_json_object(F.col("data").cast("string"), "$.id").cast("long")
    )
    return [r[0] for r in rows.collect()]


def written_ids(path: pathlib.Path) -> list[int]:
    """The ids in the published batch files (read with pyarrow: cheap enough to poll)."""
    ids: list[int] = []
    for name in glob.glob(str(path / "stream=*" / "shardId=*" / "*.parquet")):
        ids += [orjson.loads(d)["id"] for d in pq.read_table(name).column("data").to_pylist()]
    return ids


class CountingSink:
    """A ``ParquetSink`` that counts the rows it wrote; ``block_after`` makes one write hang
    after the file is published, standing for a worker that dies before its checkpoint."""

    def __init__(self, path: pathlib.Path, block_after: int | None = None) -> None:
        self.sink = ParquetSink(str(path))
        self.rows = 0
        self.writes = 0
        self.lock = threading.Lock()
        self.block_after = block_after
        self.blocked = threading.Event()
        self.release = threading.Event()

    def __call__(self, df: Any, info: BatchInfo) -> None:
        self.sink(df, info)
        with self.lock:
            self.rows += info.records
            self.writes += 1
            hang = self.writes == self.block_after
        if hang:
            self.blocked.set()
            self.release.wait(60)

    def last_written(self, stream: str, shard_id: str) -> str | None:
        return self.sink.last_written(stream, shard_id)


async def test_every_batch_lands_in_parquet_once(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    out = tmp_path / "out"
    sink = CountingSink(out)
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        ids = await aws.produce(800)
        consumer = aws.consumer(SparkProcessor.factory(spark, sink), max_records=100)
        async with consumer:
            await wait_until(lambda: sink.rows >= len(ids), 90, "every record written")
        assert sink.writes >= 8  # at most 100 records per GetRecords page
        scan = await aws.store.list_leases()
        assert all(lease.checkpoint.is_sequence for lease in scan.leases)
    got = parquet_ids(spark, out)
    assert sorted(got) == sorted(ids)


async def test_crash_between_write_and_checkpoint_writes_nothing_twice(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    out = tmp_path / "out"
    crashing = CountingSink(out, block_after=3)
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        ids = await aws.produce(600)
        first = aws.consumer(SparkProcessor.factory(spark, crashing), max_records=100)
        run = asyncio.create_task(first.run())
        await wait_until(crashing.blocked.is_set, 90, "the third write to hang")
        # The worker dies: its leases stay held until they expire; the hanging batch's file
        # exists but its checkpoint was never written.
        run.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        crashing.release.set()
        more = await aws.produce(200)

        second = CountingSink(out)
        consumer = aws.consumer(SparkProcessor.factory(spark, second), max_records=100)
        async with consumer:
            await wait_until(
                lambda: len(written_ids(out)) >= len(ids) + len(more),
                60,
                "every record written after the restart",
            )
        # The replayed batch was trimmed to what the crashed worker had not written.
        assert second.rows < len(ids) + len(more) - 100
    assert sorted(written_ids(out)) == sorted(ids + more)
    got = parquet_ids(spark, out)
    assert len(got) == len(ids) + len(more)
    assert set(got) == set(ids) | set(more)


async def test_pipeline_moves_between_spark_source_and_workers(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    table = unique_name

    def spark_run(name: str) -> list[int]:
        opts = source_options(moto, unique_name, tmp_path, leaseTable=table)
        out = tmp_path / f"out-{name}"
        query = (
            spark.readStream.format("kinesis")
            .options(**opts)
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(tmp_path / f"ck-{name}"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(120)
        assert query.exception() is None
        return parquet_ids(spark, out)

    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        first = await aws.produce(300)
        # 1. The Spark source reads the backlog and leaves its positions in the lease table.
        assert sorted(await asyncio.to_thread(spark_run, "a")) == first
        scan = await aws.store.list_leases()
        assert len(scan.leases) == 2
        assert all(lease.checkpoint.is_sequence and lease.owner is None for lease in scan.leases)

        # 2. kclasync workers continue from there: only the new records.
        second = await aws.produce(200)
        tally = Tally()
        async with aws.consumer(tally.handler("w1")):
            await wait_until(lambda: tally.seen(second), 60, "the workers to read the new records")
        assert set(tally.deliveries) == set(second)
        assert tally.duplicates == 0

        # 3. And a new Spark query (a new checkpoint) continues after the workers.
        third = await aws.produce(100)
        assert sorted(await asyncio.to_thread(spark_run, "b")) == third
