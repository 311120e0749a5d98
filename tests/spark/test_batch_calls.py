"""The AWS calls of one batch of the source, driven as Spark drives it (the reader on the driver,
the tasks on a Python worker's clients), counted by the adapters on both sides: the tasks take
no shard iterator of their own (they start from the ones the driver's probes took) and a task
of several shards reads their progress records in one Query (moto's server: Kinesis and the
DynamoDB progress table)."""

from __future__ import annotations

import pathlib
from collections import Counter

import orjson
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import kclasync.spark.worker_io as worker_module
from kclasync.spark.checks import check_source
from kclasync.spark.options import SourceOptions
from kclasync.spark.shard_task import ShardGroupPartition, arrow_batches
from kclasync.spark.source import KinesisStreamReader
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, source_options

SHARDS = 8
PER_TASK = 4


def test_a_batchs_calls_per_shard_and_per_task(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = create_and_produce(moto, unique_name, SHARDS, 200)
    opts = SourceOptions.parse(
        source_options(
            moto,
            unique_name,
            tmp_path,
            progressTable=f"{unique_name}-progress",
            shardsPerTask=PER_TASK,
            shardListIntervalSec=3600,
        )
    )
    check_source(opts)  # as load() does: creates the progress table
    io = WorkerIO()
    monkeypatch.setattr(worker_module, "_current", io)
    reader = KinesisStreamReader(opts)
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        end = reader.latestOffset(start, ReadAllAvailable())
        tasks = reader.partitions(start, end)
        assert len(tasks) == SHARDS // PER_TASK
        assert all(isinstance(t, ShardGroupPartition) for t in tasks)
        rows = [
            orjson.loads(d)["id"]
            for task in tasks
            for batch in arrow_batches(task)
            for d in batch.column("data").to_pylist()
        ]
        assert sorted(rows) == ids
        driver = reader._driver
        assert driver.kinesis is not None and driver.progress is not None
        planned = Counter(driver.kinesis.calls) + Counter(driver.progress.calls)  # type: ignore[attr-defined]
        [kinesis] = io._kinesis.values()
        [store] = io._stores.values()
        read = Counter(kinesis.calls) + Counter(store.calls)  # type: ignore[attr-defined]
    finally:
        reader.stop()
        io.close()
    # The driver: one probe (an iterator and a small page) per shard.
    assert planned["get_shard_iterator"] == SHARDS and planned["get_records"] == SHARDS
    # The tasks: no iterator of their own, one page per shard (each holds under 10,000 records
    # and moto reports 0 ms behind), one progress read per task, one progress write per shard.
    assert read["get_shard_iterator"] == 0
    assert read["get_records"] >= SHARDS
    assert read["query"] == len(tasks) and read["get_item"] == 0
    assert read["put_item"] == SHARDS
