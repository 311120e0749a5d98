"""A shard that stayed idle long enough for its read pause to grow to the maximum gets a new
record processed within that maximum (plus a call on moto), on moto with a real worker.

Unbounded growth would fail this: after the reads counted below, a pause that kept doubling
would be tens of seconds. The slack covers one GetRecords round trip to moto on a loaded machine;
benchmarks/idle_shards.py prints the real wake-up figures.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from kclasync import Record
from kclasync.testing.emulators import LocalAws
from tests.support import aws_for, wait_until

pytestmark = pytest.mark.asyncio

IDLE, MAX_IDLE = 0.1, 0.8
SLACK = 2.0  # seconds: a moto round trip and the processor's turn on a busy machine


async def test_an_idle_shard_wakes_up_within_the_maximum_idle_time(
    moto: LocalAws, unique_name: str
) -> None:
    loop = asyncio.get_running_loop()
    processed: dict[bytes, float] = {}

    async def handle(records: Sequence[Record]) -> None:
        for record in records:
            processed.setdefault(record.data, loop.time())

    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        consumer = aws.consumer(
            handle,
            initial_position="LATEST",
            idle_time_between_reads=IDLE,
            max_idle_time_between_reads=MAX_IDLE,
        )
        async with consumer:
            await wait_until(lambda: len(consumer.held_leases) == 1, 30, "the lease")
            kinesis = consumer._stream_client
            assert kinesis is not None

            def reads() -> int:
                return int(kinesis.calls.get("get_records", 0))  # type: ignore[attr-defined]

            for wake in range(2):
                # Nine empty reads in a row: the pause is at its maximum (0.1, 0.2, 0.4, 0.8 ...);
                # doubling without a bound would have reached 0.1 x 2^8 = 25.6 s.
                target = reads() + 9
                await wait_until(lambda t=target: reads() >= t, 60, "idle reads")
                data = f"wake-{wake}".encode()
                written = loop.time()
                await aws.stream.put_records(unique_name, [("k", data)])
                await wait_until(lambda d=data: d in processed, 60, "the record")
                took = processed[data] - written
                assert took <= MAX_IDLE + SLACK, f"woke up after {took:.2f}s"
