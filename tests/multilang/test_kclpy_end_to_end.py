"""``kclasync multilang`` with amazon_kclpy's own record processors, unchanged (v3 and v2), on
moto + kinesis-local: every record processed, the children's checkpoints in the lease table, a
split handled through ``shardEnded`` (v2: ``shutdown`` TERMINATE), a SIGKILLed worker's shards
resumed by another at the checkpoints, and ``shutdownRequested`` then ``leaseLost`` on a
graceful stop (v2: ``shutdown`` ZOMBIE)."""

from __future__ import annotations

import pathlib
import sys

import pytest

from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import (
    Delivery,
    _active,
    beyond_checkpoints,
    checkpoints,
    delivered,
    produce,
)
from tests.multilang.worker import (
    V2_PROCESSOR,
    MultiLangWorker,
    daemon_properties,
    write_properties,
)
from tests.support import Aws, aws_for, wait_until

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]


async def split_first_shard(aws: Aws) -> tuple[str, list[str]]:
    """Split the stream's first shard in the middle: (parent, children)."""
    client = aws.stream._client
    shards = {s.shard_id: s for s in await aws.stream.list_shards(aws.name)}
    parent = sorted(shards)[0]
    rng = shards[parent].hash_range
    await client.split_shard(
        StreamName=aws.name,
        ShardToSplit=parent,
        NewStartingHashKey=str((rng.start + rng.end) // 2 + 1),
    )
    await _active(aws)
    children = [
        s.shard_id
        for s in await aws.stream.list_shards(aws.name)
        if s.parent_shard_id == parent and s.shard_id not in shards
    ]
    return parent, children


def last_per_shard(deliveries: list[Delivery]) -> dict[str, str]:
    out: dict[str, int] = {}
    for d in deliveries:
        out[d.shard] = max(out.get(d.shard, 0), d.seq)
    return {shard: str(seq) for shard, seq in out.items()}


def worker(
    kinesis: LocalAws, tmp: pathlib.Path, name: str, worker_id: str, **props: str
) -> MultiLangWorker:
    path = write_properties(
        tmp / f"{worker_id}.properties",
        daemon_properties(kinesis, stream=name, application=name, worker_id=worker_id, **props),
    )
    return MultiLangWorker(path, worker_id=worker_id, workdir=tmp)


async def test_kclpy_v3_processor_end_to_end(
    kinesis: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(2)
        sent = await produce(aws, 0, 300)
        a = worker(kinesis, tmp_path, unique_name, "ml-a").start()
        b = worker(kinesis, tmp_path, unique_name, "ml-b")
        try:

            async def a_has_all() -> bool:
                assert a.running, a.log()[-3000:]
                return sent <= delivered(a.deliveries())

            await wait_until(a_has_all, 60, "worker a to process the first records")

            async def checkpointed() -> bool:
                ours = await checkpoints(aws)
                return all(ours.get(s) == seq for s, seq in last_per_shard(a.deliveries()).items())

            await wait_until(checkpointed, 20, "the children's checkpoints in the lease table")

            parent, children = await split_first_shard(aws)
            sent |= await produce(aws, 300, 300)

            async def split_done() -> bool:
                assert a.running, a.log()[-3000:]
                cps = await checkpoints(aws)
                return (
                    sent <= delivered(a.deliveries())
                    and cps.get(parent) == "SHARD_END"
                    and all(c in last_per_shard(a.deliveries()) for c in children)
                )

            await wait_until(split_done, 60, "the split to be handled through shardEnded")
            assert (parent, "shardEnded") in a.events()

            a.stop(kill=True)
            at_kill = await checkpoints(aws)
            redo_allowed = beyond_checkpoints(a.deliveries(), at_kill)
            sent |= await produce(aws, 600, 200)
            b.start()

            async def b_resumed() -> bool:
                assert b.running, b.log()[-3000:]
                return sent <= delivered(a.deliveries()) | delivered(b.deliveries())

            await wait_until(b_resumed, 60, "worker b to resume a's shards")
            twice = delivered(a.deliveries()) & delivered(b.deliveries())
            assert twice <= redo_allowed, sorted(twice - redo_allowed)[:10]
            # b started each shard at a's checkpoint.
            started = {s: w.split(" ", 1)[1] for s, w in b.events() if w.startswith("initialize")}
            for shard, seq in started.items():
                assert seq == at_kill.get(shard, "TRIM_HORIZON"), (shard, seq, at_kill)
            held = set(started)

            assert b.stop(grace=30) == 0, b.log()[-3000:]
            events = b.events()
            for shard in held - {parent}:
                calls = [w for s, w in events if s == shard]
                assert calls[-2:] == ["shutdownRequested", "leaseLost"], (shard, calls)
            final = await checkpoints(aws)
            for shard, seq in last_per_shard(b.deliveries()).items():
                assert final[shard] in (seq, "SHARD_END"), (shard, final[shard], seq)
            assert "Traceback" not in a.log() + b.log()
        finally:
            a.stop(kill=True)
            b.stop(kill=True)


async def test_kclpy_v2_processor_end_to_end(
    kinesis: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(1)
        sent = await produce(aws, 0, 100)
        w = worker(
            kinesis,
            tmp_path,
            unique_name,
            "ml-v2",
            executableName=f"{sys.executable} {V2_PROCESSOR}",
        )
        w.start()
        try:

            async def has_all() -> bool:
                assert w.running, w.log()[-3000:]
                return sent <= delivered(w.deliveries())

            await wait_until(has_all, 60, "the v2 processor to process the records")
            parent, children = await split_first_shard(aws)
            sent |= await produce(aws, 100, 100)

            async def split_done() -> bool:
                cps = await checkpoints(aws)
                return sent <= delivered(w.deliveries()) and cps.get(parent) == "SHARD_END"

            await wait_until(split_done, 60, "the v2 processor to end the parent shard")
            assert (parent, "shutdown TERMINATE") in w.events()
            assert w.stop(grace=30) == 0, w.log()[-3000:]
            events = w.events()
            final = await checkpoints(aws)
            for child in children:
                calls = [c for s, c in events if s == child]
                assert calls[-2:] == ["shutdownRequested", "shutdown ZOMBIE"], (child, calls)
            for shard, seq in last_per_shard(w.deliveries()).items():
                assert final[shard] in (seq, "SHARD_END"), (shard, final[shard], seq)
        finally:
            w.stop(kill=True)
