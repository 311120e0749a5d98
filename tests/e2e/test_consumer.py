"""The foundation, end to end against moto's server over HTTP on 127.0.0.1 (bad input:
``test_consumer_errors.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from kclasync import (
    LeaseLostError,
    ShardInfo,
)
from kclasync._core.leases.position import TRIM_HORIZON, Checkpoint
from kclasync._processor import Checkpointer
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.support import RecordingProcessor, Tally, aws_for, wait_until

pytestmark = pytest.mark.asyncio


async def test_consumes_everything_from_trim_horizon(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(4)
        ids = await aws.produce(600)
        tally = Tally()
        async with aws.consumer(tally.handler("w")) as consumer:
            await wait_until(lambda: tally.seen(ids), 30, "all records")
            assert len(consumer.held_leases) == 4
        assert tally.duplicates == 0
        assert set(tally.deliveries) == set(ids)
        scan = await aws.store.list_leases()
        # Every shard's checkpoint is its last record; the graceful stop released every lease.
        assert {lease.key: lease.checkpoint.value for lease in scan.leases} == tally.last_seq
        assert all(lease.owner is None for lease in scan.leases)


async def test_three_workers_split_six_shards_two_each(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(6)
        tally = Tally()
        consumers = [aws.consumer(tally.handler(f"w{i}"), worker_id=f"w{i}") for i in range(3)]
        tasks = [asyncio.create_task(c.run()) for c in consumers]
        try:
            await wait_until(
                lambda: sorted(len(c.held_leases) for c in consumers) == [2, 2, 2],
                60,
                "a 2/2/2 split",
            )
            held = [set(c.held_leases) for c in consumers]
            scan = await aws.store.list_leases()
            # Every lease of the table is held by exactly one worker, the one the table names.
            assert set.union(*held) == {lease.key for lease in scan.leases}
            assert sum(len(h) for h in held) == 6
            owners = {lease.key: lease.owner for lease in scan.leases}
            for consumer, keys in zip(consumers, held, strict=True):
                assert {owners[key] for key in keys} == {consumer.worker_id}
        finally:
            for c in consumers:
                await c.stop()
            await asyncio.gather(*tasks)


async def test_crashed_worker_fails_over_within_three_failover_times(
    moto: LocalAws, unique_name: str
) -> None:
    failover = 2.0
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(4)
        first = await aws.produce(400)
        tally = Tally()
        a = aws.consumer(tally.handler("a"), worker_id="a", failover_time=failover)
        b = aws.consumer(tally.handler("b"), worker_id="b", failover_time=failover)
        task_a = asyncio.create_task(a.run())
        await wait_until(lambda: len(a.held_leases) == 4, 30, "a to take every lease")
        task_b = asyncio.create_task(b.run())
        await wait_until(lambda: tally.seen(first), 30, "the first records")
        # b steals at most one lease per round; crash a while it still holds some.
        orphaned = set(a.held_leases)
        assert orphaned
        task_a.cancel()  # abrupt: nothing is released
        await asyncio.gather(task_a, return_exceptions=True)
        assert a._coordinator is not None
        # Loop time each orphaned lease was last written by a (its renewal or checkpoint).
        last_write = max(a._coordinator.held[key].renewed_at for key in orphaned)
        loop = asyncio.get_running_loop()
        second = await aws.produce(400)
        await wait_until(
            lambda: orphaned <= set(b.held_leases), 3 * failover, "b to take over a's leases"
        )
        # Not before the leases expired: b waits a failover time from the last change it saw.
        assert loop.time() >= last_write + failover
        await wait_until(lambda: tally.seen(second), 30, "records written after the crash")
        await b.stop()
        await task_b
        assert set(first) | set(second) <= set(tally.deliveries)


async def test_graceful_stop_releases_leases_for_immediate_takeover(
    moto: LocalAws, unique_name: str
) -> None:
    failover = 6.0
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(3)
        first = await aws.produce(300)
        tally = Tally()
        events: list[tuple[str, str]] = []
        async with aws.consumer(
            lambda: RecordingProcessor(tally, "a", events), worker_id="a", failover_time=failover
        ):
            await wait_until(lambda: tally.seen(first), 30, "a to process the first records")
        # stop(): every shard got shutdown_requested, and the leases are released, not expiring.
        assert sorted(e for e in events if e[0] == "shutdown_requested") == sorted(
            ("shutdown_requested", s) for s in tally.last_seq
        )
        scan = await aws.store.list_leases()
        assert [lease.owner for lease in scan.leases] == [None] * 3
        second = await aws.produce(300)
        b = aws.consumer(tally.handler("b"), worker_id="b", failover_time=failover)
        task = asyncio.create_task(b.run())
        # Counted from b's start, not from run() (clients and tables are plain I/O, slow on a
        # loaded machine): had a kept its leases, b could not take them before a full failover.
        await wait_until(lambda: b.health["running"], 30, "b to start")
        took = await wait_until(lambda: len(b.held_leases) == 3, failover * 0.5, "b's takeover")
        assert took < failover
        await wait_until(lambda: tally.seen(second), 30, "b to process the rest")
        await b.stop()
        await task
        assert tally.duplicates == 0
        assert set(tally.by_worker["b"]) == set(second)


async def test_restart_resumes_from_checkpoints(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        first = await aws.produce(250)
        tally = Tally()
        async with aws.consumer(tally.handler("first"), worker_id="first"):
            await wait_until(lambda: tally.seen(first), 30, "first run")
        second = await aws.produce(250)
        async with aws.consumer(tally.handler("second"), worker_id="second"):
            await wait_until(lambda: tally.seen(second), 30, "second run")
        assert sorted(tally.by_worker["second"]) == second
        assert tally.duplicates == 0


async def test_stale_owner_checkpoint_is_rejected(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        await aws.produce(20)
        got_batch = asyncio.Event()
        may_checkpoint = asyncio.Event()
        outcome: list[BaseException] = []
        lost: list[str] = []

        class Slow:
            async def initialize(self, shard: ShardInfo) -> None:
                self.shard = shard

            async def process_records(
                self, records: Sequence[Record], checkpointer: Checkpointer, behind: int | None
            ) -> None:
                got_batch.set()
                await may_checkpoint.wait()
                try:
                    await checkpointer.checkpoint()
                except LeaseLostError as exc:
                    outcome.append(exc)
                    raise

            async def lease_lost(self) -> None:
                lost.append(self.shard.shard_id)

            async def shard_ended(self, checkpointer: Checkpointer) -> None:
                await checkpointer.checkpoint_shard_end()

            async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
                return None

        # A long failover keeps the renewer (every failover/3) from noticing first.
        consumer = aws.consumer(Slow, worker_id="stale", failover_time=60.0)
        task = asyncio.create_task(consumer.run())
        await asyncio.wait_for(got_batch.wait(), 30)
        (key,) = consumer.held_leases
        lease = await aws.store.get_lease(key)
        assert lease is not None
        stolen = await aws.store.take_lease(lease, "intruder")
        assert stolen is not None
        may_checkpoint.set()
        await wait_until(lambda: bool(outcome) and bool(lost), 10, "the fenced checkpoint")
        assert isinstance(outcome[0], LeaseLostError)
        after = await aws.store.get_lease(key)
        assert after is not None
        assert after.owner == "intruder"
        assert after.checkpoint == TRIM_HORIZON
        assert consumer.held_leases == []
        await consumer.stop()
        await task


async def test_store_rejects_checkpoint_with_stale_counter(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.store.ensure_table()
        from kclasync._core.leases.lease import Lease

        assert await aws.store.create_lease(Lease(key="shard-a"))
        assert not await aws.store.create_lease(Lease(key="shard-a"))
        base = await aws.store.get_lease("shard-a")
        assert base is not None
        mine = await aws.store.take_lease(base, "w1")
        assert mine is not None and mine.counter == base.counter + 1
        theirs = await aws.store.take_lease(mine, "w2")
        assert theirs is not None and theirs.owner == "w2"
        assert await aws.store.checkpoint(mine, Checkpoint("123")) is None
        assert await aws.store.renew_lease(mine) is None
        assert await aws.store.release_lease(mine) is None
        written = await aws.store.checkpoint(theirs, Checkpoint("123", 4))
        assert written is not None and written.checkpoint == Checkpoint("123", 4)
        assert written.owner_switches_since_checkpoint == 0
