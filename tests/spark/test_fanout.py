"""The source with enhanced fan-out (``consumerType=EFO``) in a Spark query on kinesis-local,
through the test relay that adds the service's initial-response and ChildShards: an
availableNow query over a backlog with a split in the middle gives every record once, children
after their parent (the shards of a batch read two per task, concurrently). The executor
tasks' reads without Spark are in test_fanout_tasks.py."""

from __future__ import annotations

import pathlib
from collections import Counter
from typing import Any

from pyspark.sql import functions as F

from kclasync.testing.emulators import LocalAws
from tests.spark.support import RelayThread, create_and_produce, produce, source_options
from tests.spark.test_lineage import split_first_shard


def test_available_now_over_a_backlog_split_in_the_middle(
    spark: Any, kinesis: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    before = create_and_produce(kinesis, unique_name, 2, 300)
    shards = split_first_shard(kinesis, unique_name)
    after = produce(kinesis, unique_name, 300, 300)
    parent = shards[0].shard_id
    children = {s.shard_id for s in shards if parent in s.parent_ids}
    out = tmp_path / "out"

    def keep(df: Any, batch_id: int) -> None:
        df.withColumn("batch", F.lit(batch_id)).write.mode("append").parquet(str(out))

    with RelayThread(kinesis) as relay:
        opts = source_options(
            kinesis,
            unique_name,
            tmp_path,
            endpointUrl=relay.url,
            maxRecordsPerShard=200,
            shardsPerTask=2,  # the shards of a batch read concurrently in one task
            consumerType="EFO",
            consumerName="lake",
        )
        query = (
            spark.readStream.format("kinesis")
            .options(**opts)
            .load()
            .writeStream.foreachBatch(keep)
            .option("checkpointLocation", str(tmp_path / "ck"))
            .trigger(availableNow=True)
            .start()
        )
        try:
            assert query.awaitTermination(150), [p["sources"] for p in query.recentProgress[-3:]]
        finally:
            query.stop()
        assert query.exception() is None
        operations = Counter(relay.relay.operations)
        shard_ends = relay.relay.shard_ends_sent

    rows = spark.read.parquet(str(out))
    ids = [
        int(r[0])
        for r in rows.select(F.get_json_object(F.col("data").cast("string"), "$.id")).collect()
    ]
    assert len(ids) == len(before) + len(after)  # no duplicate
    assert sorted(ids) == sorted(before + after)  # nothing lost
    batches = {
        (r["shardId"], r["batch"]) for r in rows.select("shardId", "batch").distinct().collect()
    }
    last_parent_batch = max(b for s, b in batches if s == parent)
    child_batches = [b for s, b in batches if s in children]
    assert child_batches and min(child_batches) > last_parent_batch
    # The parent's end came from its subscription (the relay's ChildShards event), and the
    # consumer was registered once for the query.
    assert shard_ends >= 1
    assert operations["RegisterStreamConsumer"] == 1
    assert operations["SubscribeToShard"] >= len(batches)
