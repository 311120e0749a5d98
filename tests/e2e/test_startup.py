"""A lone worker reads its first record soon after ``run()``: no fixed wait before the first
taking round, on an empty table, after a graceful stop and after a crash with the same id.
The bound is generous (the machine may be loaded); benchmarks/data_path.py --startup prints the
real figure."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from kclasync import Consumer, Record
from kclasync.testing.emulators import LocalAws
from tests.support import Aws, aws_for

pytestmark = pytest.mark.asyncio

BOUND = 5.0  # seconds; the target on an idle machine is 1.5 s


async def _first_record(aws: Aws, *, crash: bool) -> tuple[float, Consumer]:
    got = asyncio.Event()

    async def handle(batch: Sequence[Record]) -> None:
        got.set()

    consumer = aws.consumer(handle, worker_id="same", idle_time_between_reads=1.0)
    start = time.perf_counter()
    task = asyncio.create_task(consumer.run())
    await asyncio.wait_for(got.wait(), 30)
    elapsed = time.perf_counter() - start
    if crash:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    else:
        await consumer.stop()
        await task
    return elapsed, consumer


async def test_lone_worker_first_record_quickly(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        await aws.dynamodb.list_tables()  # moto loads its DynamoDB code on the first call
        await aws.produce(20)
        empty, _ = await _first_record(aws, crash=False)
        await aws.produce(20)
        released, _ = await _first_record(aws, crash=True)
        # The crashed worker's leases still name it; the restarted one takes them back at once.
        scan = await aws.store.list_leases()
        assert {lease.owner for lease in scan.leases} == {"same"}
        await aws.produce(20)
        crashed, _ = await _first_record(aws, crash=False)
    assert empty < BOUND, f"empty table: {empty:.2f}s"
    assert released < BOUND, f"released leases: {released:.2f}s"
    assert crashed < BOUND, f"after a crash: {crashed:.2f}s"
