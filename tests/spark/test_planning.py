"""The driver's planning of Trigger.AvailableNow runs, driven as Spark drives the reader (moto's
server, no Spark session): the run's last planning asks no shard that its last batch read to the
cutoff, and the next run still reads what arrived since, each record once."""

from __future__ import annotations

import pathlib
from typing import Any

import orjson
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

import kclasync.spark.source as source_module
import kclasync.spark.worker_io as worker_module
from kclasync.spark.offsets import (
    TRIM_HORIZON,
    ShardPosition,
    ShardProgress,
    SourceOffset,
    drained_shards,
)
from kclasync.spark.options import SourceOptions
from kclasync.spark.shard_task import arrow_batches
from kclasync.spark.source import KinesisStreamReader
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, produce, source_options


def test_drained_shards_are_those_read_short_of_their_limits() -> None:
    shards = {sid: ShardPosition(TRIM_HORIZON, (), 10) for sid in ("cut", "full", "ended")}
    offset = SourceOffset("r", 0, shards, until="2026-01-01T00:00:00+00:00")
    read = {
        "cut": ShardProgress(3, "33"),
        "full": ShardProgress(10, "90", more=True),
        "ended": ShardProgress(2, "20", ended=True),
    }
    assert drained_shards(offset, read) == {("cut", "33")}
    # Without AvailableNow's cutoff nothing is drained: records keep arriving.
    unbounded = SourceOffset("r", 0, shards)
    assert drained_shards(unbounded, read) == set()


def _ids(parts: list[Any]) -> list[int]:
    out: list[int] = []
    for part in parts:
        for batch in arrow_batches(part):
            out.extend(orjson.loads(d)["id"] for d in batch.column("data").to_pylist())
    return out


def test_available_now_ends_without_asking_drained_shards(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_ids = create_and_produce(moto, unique_name, 2, 40)
    opts = SourceOptions.parse(
        source_options(moto, unique_name, tmp_path, metadataPath=str(tmp_path / "meta"))
    )
    probes: list[str] = []
    real_probe = source_module.has_new_records

    async def counted(client: Any, stream: str, shard_id: str, start: str, **kw: Any) -> bool:
        probes.append(shard_id)
        return await real_probe(client, stream, shard_id, start, **kw)

    monkeypatch.setattr(source_module, "has_new_records", counted)
    io = WorkerIO()
    monkeypatch.setattr(worker_module, "_current", io)
    reader = KinesisStreamReader(opts)
    everything = ReadAllAvailable()
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        end = reader.latestOffset(start, everything)
        assert end != start and len(probes) == 2  # the first planning asks both shards
        assert sorted(_ids(reader.partitions(start, end))) == first_ids

        probes.clear()
        assert reader.latestOffset(end, everything) == end  # the run is over...
        assert probes == []  # ...and no shard was asked: both were read to the cutoff

        # The next run finds what arrived since (in a new reader, as Spark makes one per
        # query; the progress store is the same) and reads each new record once.
        later_ids = produce(moto, unique_name, 1000, 25)
        reader.stop()
        reader = KinesisStreamReader(opts)
        reader.prepareForTriggerAvailableNow()
        nxt = reader.latestOffset(end, everything)
        assert nxt != end and len(probes) == 2
        assert sorted(_ids(reader.partitions(end, nxt))) == later_ids
        probes.clear()
        assert reader.latestOffset(nxt, everything) == nxt and probes == []
    finally:
        reader.stop()
        io.close()
