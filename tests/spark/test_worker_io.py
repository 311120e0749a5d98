"""An executor task's clients are the Python worker's: the second task in the same process makes
no new client, reads the right records and replays a recorded batch exactly (moto's server)."""

from __future__ import annotations

import asyncio
import pathlib

import kclasync.spark.worker_io as module
from kclasync.spark.options import SourceOptions
from kclasync.spark.source import ShardPartition
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws
from tests.spark.support import (
    create_and_produce,
    kinesis_endpoint,
    partition,
    read_replay_rest,
    source_options,
)
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
            return partition(opts, shard, batch=batch, start=start, quota=quota)

        first, replay, rest = read_replay_rest(part)
    finally:
        module._current = previous
        io.close()
    assert [r.sequence_number for r in replay] == [r.sequence_number for r in first]
    assert len(first) == 20 and len(rest) == len(ids) - 20
    assert {r.sequence_number for r in first}.isdisjoint(r.sequence_number for r in rest)
    assert io.created == {"kinesis": 1, "progress": 1}


EXITING = """
import atexit, os, sys
from kclasync.spark.fetch import AwsOptions
from kclasync.spark.worker_io import worker_io

aws = AwsOptions(region_name="us-east-1", endpoint_url=sys.argv[1],
                 aws_access_key_id="testing", aws_secret_access_key="testing")
io = worker_io()

async def shards():
    return await (await io.kinesis(aws)).list_shards(sys.argv[2])

assert len(io.run(shards)) == 1
child = os.fork()
if child == 0:
    # As pyspark's forked workers end (os._exit), after running the exit hooks it inherited:
    # the parent's must leave the parent's clients alone (this process has no loop thread).
    atexit._run_exitfuncs()
    print("child closed them:", io._closed, flush=True)
    os._exit(0)
os.waitpid(child, 0)
print("parent exits", flush=True)
"""


def test_a_worker_closes_its_clients_when_it_exits(moto: LocalAws, unique_name: str) -> None:
    import subprocess
    import sys

    create_and_produce(moto, unique_name, 1, 1)
    done = subprocess.run(
        [sys.executable, "-c", EXITING, kinesis_endpoint(moto), unique_name],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["child closed them: False", "parent exits"]
    assert "Unclosed" not in done.stderr, done.stderr
