"""The source's enhanced fan-out reads (``consumerType=EFO``) driven as Spark drives them, without
a Spark session, on kinesis-local through the test relay that adds the service's
initial-response and ChildShards: executor tasks read exactly their planned range through
SubscribeToShard (no GetRecords), a recorded batch replays exactly, and the driver reuses a
registered consumer."""

from __future__ import annotations

import asyncio
import pathlib
from collections import Counter

import kclasync.spark.worker_io as module
from kclasync._adapters.fanout import FanOutClient
from kclasync.spark.options import SourceOptions
from kclasync.spark.shard_task import ShardPartition
from kclasync.spark.source import KinesisStreamReader
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import (
    RelayThread,
    create_and_produce,
    partition,
    read_replay_rest,
    source_options,
)
from tests.support import aws_for


def register(local: LocalAws, url: str, stream: str, name: str) -> tuple[str, str]:
    """The consumer's ARN (registered here) and the stream's only shard."""

    async def go() -> tuple[str, str]:
        async with local.client_options(kinesis_endpoint_url=url).create_client("kinesis") as c:
            consumer = await FanOutClient(c).ensure_consumer(stream, name, poll_interval=0.1)
        async with aws_for(local, stream) as aws:
            shard = (await aws.stream.list_shards(stream))[0].shard_id
        return consumer.arn, shard

    return asyncio.run(go())


def test_fan_out_tasks_read_their_planned_range_and_replay_it(
    kinesis: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    ids = create_and_produce(kinesis, unique_name, 1, 50)
    io = WorkerIO()
    previous = module._current
    module._current = io
    with RelayThread(kinesis) as relay:
        arn, shard = register(kinesis, relay.url, unique_name, "tasks")
        opts = SourceOptions.parse(
            source_options(
                kinesis,
                unique_name,
                tmp_path,
                endpointUrl=relay.url,
                metadataPath=str(tmp_path / "meta"),
                consumerType="EFO",
                consumerName="tasks",
            )
        )

        def part(batch: int, start: str, quota: int) -> ShardPartition:
            return partition(opts, shard, batch=batch, start=start, quota=quota, consumer_arn=arn)

        # The driver's reader reuses the consumer registered above (once per query).
        reader = KinesisStreamReader(opts)
        try:
            assert reader._fanout_consumer() == arn
            assert reader._fanout_consumer() == arn
        finally:
            reader.stop()
        try:
            # A batch may end inside an event: the next one starts at the following record.
            first, replay, rest = read_replay_rest(part)
        finally:
            module._current = previous
            io.close()
        operations = Counter(relay.relay.operations)
    assert [r.sequence_number for r in replay] == [r.sequence_number for r in first]
    assert len(first) == 20 and len(rest) == len(ids) - 20
    assert [r.sequence_number for r in first + rest] == sorted(
        (r.sequence_number for r in first + rest), key=int
    )
    assert operations["SubscribeToShard"] >= 3 and operations["GetRecords"] == 0
    assert operations["RegisterStreamConsumer"] == 1
    assert io.created == {"kinesis": 1, "progress": 1}
