"""The shards a query's first planning leaves unasked (``kclasync.spark.probing``) get their shard
iterators on the driver's loop while Spark launches the batch, not in the tasks: once the planning
has returned, those GetShardIterator calls go out without another call of the reader, and the
tasks make none; if they could not be taken the tasks take their own. Either way each record is
read once. Driven as Spark drives the reader, on moto's server."""

from __future__ import annotations

import asyncio
import pathlib
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import kclasync.spark.source as source_module
import kclasync.spark.worker_io as worker_module
from kclasync.spark.checks import check_source
from kclasync.spark.options import SourceOptions
from kclasync.spark.probing import FIRST_WAVE
from kclasync.spark.shard_task import arrow_batches
from kclasync.spark.source import KinesisStreamReader
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, source_options

UNASKED = 6
SHARDS = FIRST_WAVE + UNASKED


def _read(
    local: LocalAws,
    stream: str,
    tmp: pathlib.Path,
    io: WorkerIO,
    taken: Callable[[Counter[str]], bool],
) -> tuple[list[int], Counter[str], Counter[str], int]:
    """One batch: its rows, the driver's and the tasks' Kinesis calls, and the driver's
    GetShardIterator calls seen after the planning returned, once ``taken`` (given the
    driver's calls) says the early iterators were taken, before ``partitions``."""
    opts = SourceOptions.parse(
        source_options(
            local,
            stream,
            tmp,
            progressTable=f"{stream}-progress",
            shardsPerTask=SHARDS // 2,
            shardListIntervalSec=3600,
        )
    )
    check_source(opts)
    reader = KinesisStreamReader(opts)
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        end = reader.latestOffset(start, ReadAllAvailable())
        driver = reader._driver.kinesis
        assert driver is not None
        calls: Counter[str] = driver.calls  # type: ignore[attr-defined]
        deadline = time.monotonic() + 30
        while not taken(calls) and time.monotonic() < deadline:
            time.sleep(0.01)  # a poll with a deadline: the loop's thread takes them meanwhile
        before_partitions = calls["get_shard_iterator"]
        tasks = reader.partitions(start, end)
        rows = [
            orjson.loads(d)["id"]
            for task in tasks
            for batch in arrow_batches(task)
            for d in batch.column("data").to_pylist()
        ]
        [kinesis] = io._kinesis.values()
        return rows, Counter(calls), Counter(kinesis.calls), before_partitions  # type: ignore[attr-defined]
    finally:
        reader.stop()


def test_the_unasked_shards_iterators_are_taken_between_planning_and_tasks(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = create_and_produce(moto, unique_name, SHARDS, 300)
    io = WorkerIO()
    monkeypatch.setattr(worker_module, "_current", io)
    try:
        rows, driver, tasks, before = _read(
            moto, unique_name, tmp_path, io, lambda calls: calls["get_shard_iterator"] >= SHARDS
        )
    finally:
        io.close()
    assert sorted(rows) == ids
    # The driver: a probe (iterator and small page) per shard of the first wave, and an
    # iterator per unasked shard, taken with no call of the reader in between.
    assert driver["get_records"] == FIRST_WAVE
    assert driver["get_shard_iterator"] == SHARDS and before == SHARDS
    assert tasks["get_shard_iterator"] == 0


def test_without_the_early_iterators_the_tasks_take_their_own(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = create_and_produce(moto, unique_name, SHARDS, 300)

    tried: list[str] = []

    async def failed(*args: Any, **kw: Any) -> str | None:
        await asyncio.sleep(0)
        tried.append("shard_iterator")
        return None  # what ``shard_iterator`` gives when its one call failed

    monkeypatch.setattr(source_module, "shard_iterator", failed)
    io = WorkerIO()
    monkeypatch.setattr(worker_module, "_current", io)
    try:
        rows, driver, tasks, _ = _read(
            moto, unique_name, tmp_path, io, lambda calls: len(tried) >= UNASKED
        )
    finally:
        io.close()
    assert sorted(rows) == ids
    assert driver["get_shard_iterator"] == FIRST_WAVE
    assert tasks["get_shard_iterator"] == UNASKED
