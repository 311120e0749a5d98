"""The source through a split on kinesis-local: children are read only after their parent
reached SHARD_END, and every row arrives exactly once."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

from pyspark.sql import functions as F

from kclasync._core.lineage.shard import Shard
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, produce, source_options
from tests.support import aws_for, wait_until


def split_first_shard(local: LocalAws, stream: str) -> list[Shard]:
    async def go() -> list[Shard]:
        async with aws_for(local, stream) as aws:
            shard = (await aws.stream.list_shards(stream))[0]
            middle = (shard.hash_range.start + shard.hash_range.end) // 2 + 1
            await aws.stream._client.split_shard(
                StreamName=stream, ShardToSplit=shard.shard_id, NewStartingHashKey=str(middle)
            )

            async def active() -> bool:
                resp = await aws.stream._client.describe_stream_summary(StreamName=stream)
                return bool(resp["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE")

            await wait_until(active, 10, "the stream to be ACTIVE after the split")
            return await aws.stream.list_shards(stream)

    return asyncio.run(go())


def test_children_are_read_in_later_batches_than_their_parent(
    spark: Any, kinesis: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    before = create_and_produce(kinesis, unique_name, 2, 300)
    shards = split_first_shard(kinesis, unique_name)
    after = produce(kinesis, unique_name, 300, 300)
    parent = shards[0].shard_id
    children = {s.shard_id for s in shards if parent in s.parent_ids}
    assert len(children) == 2

    out = tmp_path / "out"

    def keep(df: Any, batch_id: int) -> None:
        df.withColumn("batch", F.lit(batch_id)).write.mode("append").parquet(str(out))

    opts = source_options(kinesis, unique_name, tmp_path, maxRecordsPerShard=40)
    query = (
        spark.readStream.format("kinesis")
        .options(**opts)
        .load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(150)
    assert query.exception() is None

    rows = spark.read.parquet(str(out))
    ids = [
        r[0] for r in rows.select(F.get_json_object(F.col("data").cast("string"), "$.id")).collect()
    ]
    assert sorted(int(i) for i in ids) == sorted(before + after)
    batches = {
        (r["shardId"], r["batch"]) for r in rows.select("shardId", "batch").distinct().collect()
    }
    last_parent_batch = max(b for s, b in batches if s == parent)
    child_batches = [b for s, b in batches if s in children]
    assert child_batches, "no child rows were read"
    assert min(child_batches) > last_parent_batch
    # Records written after the split went to the children only.
    assert {s for s, _ in batches} == {parent, shards[1].shard_id, *children}
