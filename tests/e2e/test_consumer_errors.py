"""Bad input end to end against moto's server over HTTP on 127.0.0.1: corrupt lease items, a
processor that raises (retried, then the consumer stops, or the shard is released while the
others go on) and checkpoints the consumer refuses."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kclasync import (
    Consumer,
    InvalidCheckpointError,
    ProcessorFailedError,
    ShardInfo,
)
from kclasync._adapters import lease_codec
from kclasync._adapters.backends import AdapterBackend
from kclasync._core.leases.position import TRIM_HORIZON
from kclasync._processor import Checkpointer
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.support import Tally, aws_for, fast_config, wait_until

pytestmark = pytest.mark.asyncio


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
