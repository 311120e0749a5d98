"""Helpers for the Spark tests: streams with JSON ids on the emulators, source options."""

from __future__ import annotations

import asyncio
import pathlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kclasync.testing.emulators import LocalAws
from tests.support import aws_for

if TYPE_CHECKING:
    from kclasync.spark.shard_task import ShardPartition


def partition(
    opts: Any,
    shard_id: str,
    *,
    batch: int = 0,
    start: str = "0",
    quota: int = 1,
    consumer_arn: str | None = None,
) -> ShardPartition:
    """One shard's planned range of a batch (run "r", no timestamp or end), as the driver
    would send it to a task."""
    from kclasync.spark.shard_task import ShardPartition  # imports pyspark

    extra = {} if consumer_arn is None else {"consumer_arn": consumer_arn}
    return ShardPartition(
        options=opts,
        run="r",
        batch=batch,
        shard_id=shard_id,
        start=start,
        quota=quota,
        timestamp=None,
        until=None,
        **extra,
    )


def read_replay_rest(
    part: Callable[[int, str, int], ShardPartition],
) -> tuple[list[Any], list[Any], list[Any]]:
    """A task's three reads of one shard, each ``part(batch, start, quota)``: batch 0 (20
    records from the trim horizon), batch 0 again with a larger quota (a retried task: it must
    read what was recorded, the same 20), and batch 1 from the record after the first's last."""
    from kclasync.spark.offsets import TRIM_HORIZON, format_position
    from kclasync.spark.shard_task import read_partition

    first = list(read_partition(part(0, TRIM_HORIZON, 20)))
    replay = list(read_partition(part(0, TRIM_HORIZON, 25)))
    rest = list(read_partition(part(1, format_position(first[-1]), 100)))
    return first, replay, rest


def kinesis_endpoint(local: LocalAws) -> str:
    return local.kinesis_endpoint_url or local.endpoint_url


def create_and_produce(local: LocalAws, stream: str, shards: int, count: int) -> list[int]:
    async def go() -> list[int]:
        async with aws_for(local, stream) as aws:
            await aws.create_stream(shards)
            return await aws.produce(count)

    return asyncio.run(go())


def produce(local: LocalAws, stream: str, first_id: int, count: int) -> list[int]:
    async def go() -> list[int]:
        async with aws_for(local, stream) as aws:
            aws.next_id = first_id
            return await aws.produce(count)

    return asyncio.run(go())


def source_options(local: LocalAws, stream: str, tmp: pathlib.Path, **extra: Any) -> dict[str, str]:
    opts = {
        "streamName": stream,
        "endpointUrl": kinesis_endpoint(local),
        "region": "us-east-1",
        "awsAccessKeyId": "testing",
        "awsSecretKey": "testing",
        "startingPosition": "TRIM_HORIZON",
        "dynamodbEndpointUrl": local.endpoint_url,
        "shardListIntervalSec": "0",
        "maxFetchTimePerShardSec": "5",
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return opts


class RelayThread:
    """``KinesisLocalFanOutRelay`` on its own event loop in a thread, for the Spark tests (the
    executors, in other processes, reach it over HTTP while the test waits synchronously)."""

    def __init__(self, local: LocalAws) -> None:
        from kclasync.testing.fanout_proxy import KinesisLocalFanOutRelay

        self.relay = KinesisLocalFanOutRelay(kinesis_endpoint(local))
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> RelayThread:
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self.relay.__aenter__(), self._loop).result(30)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.relay.__aexit__(None, None, None), self._loop).result(
            30
        )
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
