"""An executor task's clients are the Python worker's: the second task in the same process makes
no new client, reads the right records and replays a recorded batch exactly (moto's server)."""

from __future__ import annotations

import asyncio
import pathlib

import kclasync.spark.worker_io as module
from kclasync.spark.offsets import TRIM_HORIZON, format_position
from kclasync.spark.options import SourceOptions
from kclasync.spark.source import ShardPartition, read_partition
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, source_options
from tests.support import aws_for


def test_tasks_in_one_worker_share_its_clients(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    ids = create_and_produce(moto, unique_name, 1, 30)

    async def shard_id() -> str:
        async with aws_for(moto, unique_name) as aws:
            return (await aws.stream.list_shards(unique_name))[0].shard_id

    shard = asyncio.run(shard_id())
    opts = SourceOptions.parse(
        source_options(moto, unique_name, tmp_path, metadataPath=str(tmp_path / "meta"))
    )
    io = WorkerIO()
    previous = module._current
    module._current = io
    try:

        def part(batch: int, start: str, quota: int) -> ShardPartition:
            return ShardPartition(
                options=opts,
                run="r",
                batch=batch,
                shard_id=shard,
                start=start,
                quota=quota,
                timestamp=None,
                until=None,
            )

        first = read_partition(part(0, TRIM_HORIZON, 20))
        replay = read_partition(part(0, TRIM_HORIZON, 25))  # recorded: the same 20 again
        rest = read_partition(part(1, format_position(first[-1]), 100))
    finally:
        module._current = previous
        io.close()
    assert [r.sequence_number for r in replay] == [r.sequence_number for r in first]
    assert len(first) == 20 and len(rest) == len(ids) - 20
    assert {r.sequence_number for r in first}.isdisjoint(r.sequence_number for r in rest)
    assert io.created == {"kinesis": 1, "progress": 1}
