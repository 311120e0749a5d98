"""Buffered checkpoints (``checkpoint(persist=False)``, ``buffered_handler_checkpoints``) on
moto: positions stay in memory until the background writer's interval, a stop writes them."""

from __future__ import annotations

import asyncio

import pytest

from kclasync._core.leases.position import TRIM_HORIZON
from kclasync.testing.emulators import LocalAws
from tests.support import Tally, aws_for, wait_until

pytestmark = pytest.mark.asyncio


async def _checkpoints(aws_store) -> dict[str, str]:  # type: ignore[no-untyped-def]
    return {lease.key: lease.checkpoint.value for lease in (await aws_store.list_leases()).leases}


async def test_buffered_handler_writes_on_stop_not_per_batch(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        ids = await aws.produce(300)
        tally = Tally()
        consumer = aws.consumer(
            tally.handler("w"), buffered_handler_checkpoints=True, checkpoint_interval=3600.0
        )
        task = asyncio.create_task(consumer.run())
        await wait_until(lambda: tally.seen(ids), 30, "all records")
        # Every batch recorded its checkpoint in memory only: nothing written yet.
        assert set((await _checkpoints(aws.store)).values()) == {TRIM_HORIZON.value}
        await consumer.stop()
        await task
        # The stop wrote the newest position of every shard.
        assert await _checkpoints(aws.store) == tally.last_seq


async def test_background_writer_writes_the_newest_position(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        ids = await aws.produce(300)
        tally = Tally()
        consumer = aws.consumer(
            tally.handler("w"), buffered_handler_checkpoints=True, checkpoint_interval=0.3
        )
        task = asyncio.create_task(consumer.run())
        try:
            await wait_until(lambda: tally.seen(ids), 30, "all records")

            async def written() -> bool:
                return await _checkpoints(aws.store) == tally.last_seq

            # Written while running, by the interval writer alone.
            await wait_until(written, 10, "the buffered checkpoints written")
        finally:
            task.cancel()  # a crash: no flush on the way out
            await asyncio.gather(task, return_exceptions=True)
        assert await _checkpoints(aws.store) == tally.last_seq
