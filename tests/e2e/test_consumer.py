"""The foundation, end to end against moto's server over HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kclasync import (
    Consumer,
    InvalidCheckpointError,
    LeaseLostError,
    ProcessorFailedError,
    ShardInfo,
)
from kclasync._adapters import lease_codec
from kclasync._adapters.backends import AdapterBackend
from kclasync._core.leases.position import TRIM_HORIZON, Checkpoint
from kclasync._processor import Checkpointer
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.support import RecordingProcessor, Tally, aws_for, fast_config, wait_until

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


async def test_corrupt_lease_items_are_named_and_skipped(
    moto: LocalAws, unique_name: str, caplog: pytest.LogCaptureFixture
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(3)
        await aws.produce(300)
        # Create the leases through a shard sync, then damage two of them behind the workers.
        tally = Tally()
        setup = Consumer(
            stream_name=aws.name,
            application_name=aws.name,
            processor=tally.handler("setup"),
            config=fast_config(),
            backend=AdapterBackend(aws.store, aws.stream),
            registry=CollectorRegistry(),
        )
        await aws.store.ensure_table()
        assert await setup._sync_shards() == 3
        keys = sorted(lease.key for lease in (await aws.store.list_leases()).leases)
        await aws.dynamodb.update_item(
            TableName=aws.name,
            Key={lease_codec.LEASE_KEY: {"S": keys[0]}},
            UpdateExpression="SET leaseCounter = :s",
            ExpressionAttributeValues={":s": {"S": "not-a-number"}},
        )
        await aws.dynamodb.update_item(
            TableName=aws.name,
            Key={lease_codec.LEASE_KEY: {"S": keys[1]}},
            UpdateExpression="REMOVE leaseCounter",
        )
        scan = await aws.store.list_leases()
        assert sorted(str(e) for e in scan.corrupt) == [
            f"lease {keys[0]!r} is corrupt: attribute 'leaseCounter' has type S, expected N",
            f"lease {keys[1]!r} is corrupt: attribute 'leaseCounter' is missing",
        ]
        registry = CollectorRegistry()
        caplog.set_level(logging.ERROR, logger="kclasync.leases")
        async with aws.consumer(tally.handler("w"), registry=registry) as consumer:
            await wait_until(lambda: consumer.held_leases == [keys[2]], 20, "the healthy lease")
            await wait_until(lambda: keys[2] in tally.last_seq, 20, "the healthy shard's records")
            assert (
                registry.get_sample_value(
                    "kclasync_corrupt_leases",
                    {"application": aws.name, "worker": consumer.worker_id},
                )
                == 2
            )
        # The healthy shard was consumed; the corrupt ones were left alone, and said so by name.
        assert set(tally.last_seq) == {keys[2]}
        logged = [r.getMessage() for r in caplog.records]
        assert any(keys[0] in m and "'leaseCounter' has type S" in m for m in logged)
        assert any(keys[1] in m and "'leaseCounter' is missing" in m for m in logged)


class _Flaky:
    """Raises on the first ``failures`` calls, then records."""

    failures = 2
    calls = 0

    def __init__(self, tally: Tally) -> None:
        self.tally = tally

    async def __call__(self, records: Sequence[Record]) -> None:
        type(self).calls += 1
        if type(self).calls <= self.failures:
            raise RuntimeError("downstream unavailable")
        self.tally.add("w", records)


async def test_processor_that_raises_is_retried_then_succeeds(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        ids = await aws.produce(50)
        tally = Tally()
        flaky = _Flaky(tally)
        registry = CollectorRegistry()

        async def handle(records: Sequence[Record]) -> None:
            await flaky(records)

        async with aws.consumer(handle, registry=registry, processor_retries=3) as consumer:
            await wait_until(lambda: tally.seen(ids), 30, "records after the retries")
        assert tally.duplicates == 0
        labels = {"application": aws.name, "worker": consumer.worker_id, "stream": aws.name}
        shard = next(iter(tally.last_seq))
        assert (
            registry.get_sample_value("kclasync_processor_errors_total", {**labels, "shard": shard})
            == 2
        )
        lease = await aws.store.get_lease(shard)
        assert lease is not None and lease.checkpoint.value == tally.last_seq[shard]


async def test_processor_that_keeps_raising_stops_the_consumer(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        await aws.produce(30)
        attempts: list[int] = []

        async def handle(records: Sequence[Record]) -> None:
            attempts.append(len(records))
            raise ValueError("poison")

        consumer = aws.consumer(handle, processor_retries=2)
        with pytest.raises(ProcessorFailedError) as info:
            await asyncio.wait_for(consumer.run(), 30)
        assert info.value.attempts == 3
        assert len(attempts) == 3
        assert "shard" in str(info.value) and info.value.first_sequence
        (lease,) = (await aws.store.list_leases()).leases
        assert lease.checkpoint == TRIM_HORIZON  # the failed batch was not checkpointed
        assert lease.owner is None  # released for another worker (or a restart) to retry


async def test_release_shard_policy_keeps_other_shards_going(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(3)
        await aws.produce(300)
        shards = sorted(s.shard_id for s in await aws.stream.list_shards(aws.name))
        poisoned = shards[0]
        tally = Tally()

        async def handle(records: Sequence[Record]) -> None:
            if records[0].shard_id == poisoned:
                raise ValueError("poison")
            tally.add("w", records)

        async with aws.consumer(
            handle,
            processor_retries=1,
            processor_error_policy="release_shard",
            failed_shard_backoff=600.0,
        ) as consumer:
            await wait_until(
                lambda: (
                    set(tally.last_seq) == set(shards[1:])
                    and poisoned not in consumer.held_leases
                    and consumer._coordinator is not None
                    and consumer._coordinator.taking.is_excluded(poisoned)
                ),
                30,
                "the healthy shards",
            )
            # The released lease is free, yet later taking rounds leave it alone (backoff).
            coordinator = consumer._coordinator
            assert coordinator is not None
            rounds = coordinator.rounds
            await wait_until(lambda: coordinator.rounds >= rounds + 2, 10, "two taking rounds")
            assert poisoned not in consumer.held_leases
            free = await aws.store.get_lease(poisoned)
            assert free is not None and free.owner is None
        lease = await aws.store.get_lease(poisoned)
        assert lease is not None and lease.checkpoint == TRIM_HORIZON and lease.owner is None


async def test_checkpoint_validation(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        await aws.produce(10)
        errors: list[str] = []
        done = asyncio.Event()

        class Checker:
            async def initialize(self, shard: ShardInfo) -> None:
                return None

            async def process_records(
                self, records: Sequence[Record], checkpointer: Checkpointer, behind: int | None
            ) -> None:
                beyond = str(int(records[-1].sequence_number) + 1)
                for bad in (beyond, "abc"):
                    try:
                        await checkpointer.checkpoint(bad)
                    except InvalidCheckpointError as exc:
                        errors.append(type(exc).__name__)
                await checkpointer.checkpoint(records[-1].sequence_number)
                try:
                    await checkpointer.checkpoint(records[0].sequence_number)
                except InvalidCheckpointError:
                    errors.append("backwards")
                done.set()

            async def lease_lost(self) -> None:
                return None

            async def shard_ended(self, checkpointer: Checkpointer) -> None:
                await checkpointer.checkpoint_shard_end()

            async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
                return None

        async with aws.consumer(Checker):
            await asyncio.wait_for(done.wait(), 30)
        assert errors == ["InvalidCheckpointError", "InvalidCheckpointError", "backwards"]
