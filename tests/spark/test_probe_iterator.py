"""The shard iterator the driver's probe takes is handed to the batch's read of that shard: the
read makes no GetShardIterator of its own while the iterator is fresh, reads exactly what it
would have read without it (from the stream's start and from inside the shard), and once the
iterator has expired takes a new one at the same start (moto's server and kinesis-local)."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

import pytest
from pyspark import cloudpickle
from pyspark.sql.streaming.datasource import ReadAllAvailable

import kclasync.spark.worker_io as worker_module
from kclasync._adapters.protocols import ExpiredIteratorError, GetRecordsResult
from kclasync.spark.fetch import has_new_records, read_shard
from kclasync.spark.offsets import TRIM_HORIZON, format_position
from kclasync.spark.options import SourceOptions
from kclasync.spark.shard_task import ShardGroupPartition, ShardPartition
from kclasync.spark.source import KinesisStreamReader
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, source_options
from tests.support import aws_for


class Iterators:
    """A stream client that counts GetShardIterator calls and, with ``expired`` set, refuses
    that iterator once, as a service refuses one older than five minutes."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.taken = 0
        self.expired: str | None = None

    async def get_shard_iterator(self, *args: Any, **kwargs: Any) -> str:
        self.taken += 1
        iterator: str = await self.client.get_shard_iterator(*args, **kwargs)
        return iterator

    async def get_records(self, stream: str, shard: str, iterator: str, limit: int) -> Any:
        if iterator == self.expired:
            self.expired = None  # moto hands out the same string again for the same start
            raise ExpiredIteratorError("iterator expired")
        result: GetRecordsResult = await self.client.get_records(stream, shard, iterator, limit)
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@pytest.mark.parametrize("backend", ["moto", "kinesis"])
@pytest.mark.parametrize("inside", [False, True], ids=["trim-horizon", "after-a-record"])
def test_a_read_uses_the_probes_iterator_until_it_expires(
    request: pytest.FixtureRequest, backend: str, unique_name: str, inside: bool
) -> None:
    local: LocalAws = request.getfixturevalue(backend)

    async def go() -> None:
        async with aws_for(local, unique_name) as aws:
            await aws.create_stream(1)
            await aws.produce(30)
            [shard] = await aws.stream.list_shards(unique_name)
            sid = shard.shard_id
            client = Iterators(aws.stream)
            start = TRIM_HORIZON
            if inside:
                first = await read_shard(client, unique_name, sid, TRIM_HORIZON, quota=10)
                start = format_position(first.records[-1])
            plain = await read_shard(client, unique_name, sid, start, quota=100)
            assert len(plain.records) == (20 if inside else 30)

            iterators: dict[str, str] = {}
            assert await has_new_records(client, unique_name, sid, start, iterators=iterators)
            client.taken = 0
            handed = await read_shard(
                client, unique_name, sid, start, quota=100, iterator=iterators[sid]
            )
            assert client.taken == 0  # no GetShardIterator of its own
            assert handed == plain

            client.expired = iterators[sid]
            late = await read_shard(
                client, unique_name, sid, start, quota=100, iterator=iterators[sid]
            )
            assert client.taken == 1  # a new one at the same start
            assert late == plain

    asyncio.run(go())


def test_the_planned_reads_carry_the_probes_iterators(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    create_and_produce(moto, unique_name, 2, 40)
    opts = SourceOptions.parse(
        source_options(moto, unique_name, tmp_path, metadataPath=str(tmp_path / "meta"))
    )
    io = WorkerIO()
    monkeypatch.setattr(worker_module, "_current", io)
    reader = KinesisStreamReader(opts)
    try:
        start = reader.initialOffset()
        end = reader.latestOffset(start, ReadAllAvailable())
        parts = reader.partitions(start, end)
        assert len(parts) == 2
        assert all(isinstance(p, ShardPartition) and p.iterator for p in parts)
        # Spark pickles the partitions to the executors: the iterator goes with them.
        shipped = cloudpickle.loads(cloudpickle.dumps(parts))
        assert [p.iterator for p in shipped] == [p.iterator for p in parts]
        # A reader that did not plan the batch (a restarted driver replaying it) hands none.
        other = KinesisStreamReader(opts)
        try:
            replayed = other.partitions(start, end)
        finally:
            other.stop()
        assert not any(isinstance(p, ShardGroupPartition) for p in replayed)
        assert all(isinstance(p, ShardPartition) and p.iterator is None for p in replayed)
    finally:
        reader.stop()
        io.close()
