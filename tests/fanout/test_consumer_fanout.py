"""A consumer in fan-out mode, end to end on kinesis-local (through the test relay that adds the
service's initial-response and ChildShards) and moto (DynamoDB): every record once, in order per
shard, across a split, children only after their parent ended; no GetRecords calls at all."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable, MemoryStreamClient
from kclasync._config import RetrievalMode
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync.errors import ConfigError
from kclasync.testing.emulators import LocalAws
from kclasync.testing.fanout_proxy import KinesisLocalFanOutRelay
from tests.support import Tally, aws_for, fast_config, wait_until


class OrderedProcessor:
    """Checkpoints every batch; notes the order of shard events and of sequence numbers."""

    def __init__(self, tally: Tally, events: list[tuple[str, str]]) -> None:
        self.tally = tally
        self.events = events
        self.shard = ""
        self.out_of_order = 0
        self.last = -1

    async def initialize(self, shard: ShardInfo) -> None:
        self.shard = shard.shard_id
        self.events.append(("initialize", shard.shard_id))

    async def process_records(
        self, records: Sequence[Record], checkpointer: Checkpointer, millis: int | None
    ) -> None:
        for r in records:
            if int(r.sequence_number) <= self.last:
                self.out_of_order += 1
            self.last = int(r.sequence_number)
        self.tally.add("w", records)
        await checkpointer.checkpoint()

    async def lease_lost(self) -> None:
        self.events.append(("lease_lost", self.shard))

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        self.events.append(("shard_ended", self.shard))
        await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        self.events.append(("shutdown_requested", self.shard))


def sample(registry: CollectorRegistry, name: str) -> float:
    return sum(s.value for metric in registry.collect() for s in metric.samples if s.name == name)


async def test_fan_out_consumer_reads_every_record_across_a_split(
    kinesis: LocalAws, unique_name: str
) -> None:
    assert kinesis.kinesis_endpoint_url is not None
    relay = KinesisLocalFanOutRelay(kinesis.kinesis_endpoint_url)
    async with aws_for(kinesis, unique_name) as aws, relay as relay_url:
        await aws.create_stream(1)
        written = await aws.produce(200)
        tally = Tally()
        events: list[tuple[str, str]] = []
        processors: list[OrderedProcessor] = []

        def factory() -> OrderedProcessor:
            processors.append(OrderedProcessor(tally, events))
            return processors[-1]

        registry = CollectorRegistry()
        consumer = Consumer(
            stream_name=unique_name,
            application_name=unique_name,
            processor=factory,
            config=fast_config(retrieval="fanout", fanout_consumer_name="fan"),
            client_options=kinesis.client_options(kinesis_endpoint_url=relay_url),
            registry=registry,
        )
        async with consumer:
            await wait_until(lambda: tally.seen(written), 30, "the first records")
            (parent,) = await aws.stream.list_shards(unique_name)
            await aws.stream._client.split_shard(
                StreamName=unique_name,
                ShardToSplit=parent.shard_id,
                NewStartingHashKey=str(2**127),
            )
            await asyncio.sleep(0.3)  # kinesis-local: the split takes 100 ms here
            written += await aws.produce(200)
            await wait_until(lambda: tally.seen(written), 60, "every record")
            await wait_until(lambda: len(consumer.held_leases) == 2, 20, "the child leases")
        assert tally.duplicates == 0
        assert all(p.out_of_order == 0 for p in processors)
        # The parent ended (ChildShards from the subscription) before any child started.
        ended = events.index(("shard_ended", parent.shard_id))
        children = [i for i, (what, shard) in enumerate(events) if what == "initialize"][1:]
        assert len(children) == 2 and all(i > ended for i in children)
        assert sample(registry, "kclasync_fanout_subscriptions_total") >= 3
        # Every read of the consumer went through SubscribeToShard.
        assert relay.operations["GetRecords"] == 0
        assert relay.operations["SubscribeToShard"] >= 3


async def test_fan_out_with_an_injected_stream_client_is_refused() -> None:
    client = MemoryStreamClient()
    client.create_stream("s", 1)

    async def handle(records: Sequence[Record]) -> None:
        return None

    consumer = Consumer(
        stream_name="s",
        application_name="app",
        processor=handle,
        config=ConsumerConfig(retrieval="fanout"),  # type: ignore[arg-type]
        backend=AdapterBackend(MemoryLeaseStore(MemoryLeaseTable()), client),
        registry=CollectorRegistry(),
    )
    with pytest.raises(ConfigError, match="retrieval: fan-out needs the Kinesis client"):
        await asyncio.wait_for(consumer.run(), 10)


def test_retrieval_setting_is_checked() -> None:
    assert ConsumerConfig().retrieval is RetrievalMode.POLLING
    assert ConsumerConfig(retrieval="fanout").retrieval is RetrievalMode.FANOUT  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="retrieval"):
        ConsumerConfig(retrieval="push")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="fanout_refresh_after"):
        ConsumerConfig(fanout_refresh_after=300.0)
