"""A query's first planning stops asking shards once one has records (``kclasync.spark.probing``):
the batch runs anyway, so the shards not asked are planned and read like the others. Without
records anywhere every shard is still asked and no batch is planned. The probes run at most
``limit`` at a time. Driven as Spark drives the reader, on moto's server."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import orjson
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

import kclasync.spark.source as source_module
import kclasync.spark.worker_io as worker_module
from kclasync.spark.options import SourceOptions
from kclasync.spark.probing import FIRST_WAVE, probe_shards
from kclasync.spark.shard_task import arrow_batches
from kclasync.spark.source import KinesisStreamReader
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, source_options
from tests.support import aws_for

SHARDS = FIRST_WAVE + 4


def _answers(has: set[str], asked: list[str], peak: list[int]) -> Any:
    running = 0

    async def probe(sid: str) -> bool:
        nonlocal running
        asked.append(sid)
        running += 1
        peak[0] = max(peak[0], running)
        await asyncio.sleep(0)
        running -= 1
        return sid in has

    return probe


@pytest.mark.parametrize(
    ("has", "early", "asked_count"),
    [
        ({"s1"}, True, FIRST_WAVE),  # found in the first wave: the rest are not asked
        ({"s11"}, True, SHARDS),  # found only later: every shard is asked
        (set(), True, SHARDS),  # nothing anywhere: every shard is asked
        ({"s1"}, False, SHARDS),  # a later planning asks every shard
    ],
)
def test_probe_shards_stops_only_after_a_first_wave_with_records(
    has: set[str], early: bool, asked_count: int
) -> None:
    ids = [f"s{i}" for i in range(SHARDS)]
    asked: list[str] = []
    peak = [0]
    found = asyncio.run(probe_shards(ids, _answers(has, asked, peak), early_stop=early, limit=3))
    assert len(asked) == asked_count and len(set(asked)) == asked_count
    assert peak[0] <= 3
    assert {sid for sid, f in found.items() if f} == has & set(asked)
    assert {sid for sid, f in found.items() if f is None} == set(ids) - set(asked)
    # What is planned: every shard not known to be empty.
    planned = {sid for sid, f in found.items() if f is not False}
    assert planned >= has


def _reader(
    local: LocalAws, stream: str, tmp: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[KinesisStreamReader, list[str]]:
    opts = SourceOptions.parse(
        source_options(local, stream, tmp, metadataPath=str(tmp / "meta"), shardsPerTask=6)
    )
    asked: list[str] = []
    real = source_module.has_new_records

    async def counted(client: Any, stream: str, shard_id: str, start: str, **kw: Any) -> bool:
        asked.append(shard_id)
        return await real(client, stream, shard_id, start, **kw)

    monkeypatch.setattr(source_module, "has_new_records", counted)
    return KinesisStreamReader(opts), asked


def _planned(parts: list[Any]) -> list[str]:
    return [p.shard_id for task in parts for p in getattr(task, "parts", [task])]


def _ids(parts: list[Any]) -> list[int]:
    return sorted(
        orjson.loads(d)["id"]
        for part in parts
        for batch in arrow_batches(part)
        for d in batch.column("data").to_pylist()
    )


def test_a_first_planning_with_records_asks_one_wave_and_reads_every_shard(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = create_and_produce(moto, unique_name, SHARDS, 600)
    io = WorkerIO()
    monkeypatch.setattr(worker_module, "_current", io)
    reader, asked = _reader(moto, unique_name, tmp_path, monkeypatch)
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert len(asked) == FIRST_WAVE
        parts = reader.partitions(start, end)
        assert len(_planned(parts)) == SHARDS
        assert _ids(parts) == ids  # each record once, the unasked shards' too
        asked.clear()
        # The run is over: every shard was read to the cutoff, none is asked again.
        assert reader.latestOffset(end, ReadAllAvailable()) == end and asked == []
    finally:
        reader.stop()
        io.close()


def test_a_first_planning_with_a_row_limit_asks_every_shard(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_and_produce(moto, unique_name, SHARDS, 600)
    reader, asked = _reader(moto, unique_name, tmp_path, monkeypatch)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadMaxRows(100))
        assert end != start and len(asked) == SHARDS
    finally:
        reader.stop()


def test_a_first_planning_asks_every_shard_until_one_has_records(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_and_produce(moto, unique_name, SHARDS, 0)
    io = WorkerIO()
    monkeypatch.setattr(worker_module, "_current", io)
    reader, asked = _reader(moto, unique_name, tmp_path, monkeypatch)
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        # An empty stream: every shard asked, no batch.
        assert reader.latestOffset(start, ReadAllAvailable()) == start
        assert sorted(asked) == sorted(start["shards"])

        # Records in the last shard only (beyond the first wave): every shard asked, that
        # shard alone planned.
        async def put_last() -> str:
            async with aws_for(moto, unique_name) as aws:
                shards = sorted(await aws.stream.list_shards(unique_name), key=lambda s: s.shard_id)
                last = shards[-1]
                await aws.stream._client.put_record(
                    StreamName=unique_name,
                    PartitionKey="k",
                    ExplicitHashKey=str(last.hash_range.start),
                    Data=orjson.dumps({"id": 7}),
                )
                return last.shard_id

        last = asyncio.run(put_last())
        reader.stop()
        reader, asked = _reader(moto, unique_name, tmp_path, monkeypatch)
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        end = reader.latestOffset(start, ReadAllAvailable())
        assert len(asked) == SHARDS
        parts = reader.partitions(start, end)
        assert _planned(parts) == [last]
        assert _ids(parts) == [7]
    finally:
        reader.stop()
        io.close()
