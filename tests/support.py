"""Helpers for end-to-end tests: streams on the emulator, recording processors, polling."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws

FAST = {
    "initial_position": "TRIM_HORIZON",
    "idle_time_between_reads": 0.1,
    "min_time_between_reads": 0.0,
    "processor_retry_backoff": 0.01,
    "shutdown_timeout": 10.0,
    "parent_shard_poll_interval": 0.2,
}


def fast_config(**overrides: Any) -> ConsumerConfig:
    kwargs = {"failover_time": 2.0, **FAST, **overrides}
    return ConsumerConfig(**kwargs)


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]], timeout: float, what: str = "condition"
) -> float:
    """Poll until ``predicate`` holds; returns the seconds it took. Fails after ``timeout``."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    while True:
        value = predicate()
        if not isinstance(value, bool):
            value = await value
        if value:
            return loop.time() - start
        if loop.time() - start > timeout:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.05)


#: Seconds a graceful stop of the consumers of a test may take: the pipelines' shutdown
#: (``shutdown_timeout`` in ``FAST``), the releases and leaving the registry, on a loaded machine.
STOP_LIMIT = 90.0


async def stop_all(
    consumers: Sequence[Consumer], tasks: Sequence[asyncio.Task[None]], limit: float = STOP_LIMIT
) -> None:
    """Stop ``consumers`` gracefully and wait for their ``run()`` ``tasks``; a stop that does not
    finish within ``limit`` fails the test (the tasks are then cancelled) instead of hanging it."""
    try:
        async with asyncio.timeout(limit):
            for c in consumers:
                await c.stop()
            await asyncio.gather(*tasks, return_exceptions=True)
    except TimeoutError as exc:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise AssertionError(f"the consumers did not stop within {limit}s") from exc


class Aws:
    """Clients for one test: a stream client with producing helpers and a lease store."""

    def __init__(self, local: LocalAws, kinesis: Any, dynamodb: Any, name: str) -> None:
        self.local = local
        self.stream = KinesisStreamClient(kinesis)
        self.dynamodb = dynamodb
        self.name = name
        self.store = DynamoLeaseStore(dynamodb, name)
        self.next_id = 0

    async def create_stream(self, shards: int) -> None:
        await self.stream.create_stream(self.name, shards)

    async def produce(self, count: int) -> list[int]:
        ids = list(range(self.next_id, self.next_id + count))
        self.next_id += count
        pending = [(f"key-{i % 101}", orjson.dumps({"id": i})) for i in ids]
        while pending:
            chunk, pending = pending[:500], pending[500:]
            results = await self.stream.put_records(self.name, chunk)
            pending = [e for e, r in zip(chunk, results, strict=True) if r is None] + pending
        return ids

    async def create_leases(self) -> int:
        """The lease table and the leases of the stream's shards, as a kclasync worker's shard
        sync writes them (the KCL's schema), before anything consumes. A Java KCL 3.x worker
        that starts on an empty lease table first waits a random 1-30 s for another worker to
        fill it; on a table with leases it starts at once."""
        await self.store.ensure_table()
        return await self.consumer(None)._sync_shards()

    def consumer(
        self, processor: object, registry: CollectorRegistry | None = None, **config: Any
    ) -> Consumer:
        return Consumer(
            stream_name=self.name,
            application_name=self.name,
            processor=processor,
            config=fast_config(**config),
            client_options=self.local.client_options(),
            registry=registry if registry is not None else CollectorRegistry(),
        )


@contextlib.asynccontextmanager
async def aws_for(local: LocalAws, name: str) -> AsyncIterator[Aws]:
    options = local.client_options()
    async with options.create_client("kinesis") as kin, options.create_client("dynamodb") as ddb:
        yield Aws(local, kin, ddb, name)


class Tally:
    """Records every delivery: record id -> count, and who processed what."""

    def __init__(self) -> None:
        self.deliveries: Counter[int] = Counter()
        self.by_worker: dict[str, list[int]] = {}
        self.last_seq: dict[str, str] = {}

    def add(self, worker: str, records: Sequence[Record]) -> None:
        for r in records:
            rid = int(orjson.loads(r.data)["id"])
            self.deliveries[rid] += 1
            self.by_worker.setdefault(worker, []).append(rid)
            self.last_seq[r.shard_id] = r.sequence_number

    def handler(self, worker: str) -> Callable[[Sequence[Record]], Awaitable[None]]:
        async def handle(records: Sequence[Record]) -> None:
            self.add(worker, records)

        return handle

    def seen(self, ids: Sequence[int]) -> bool:
        return all(i in self.deliveries for i in ids)

    @property
    def duplicates(self) -> int:
        return sum(self.deliveries.values()) - len(self.deliveries)


class RecordingProcessor:
    """A full-contract processor that records its calls; checkpoints after every batch."""

    def __init__(self, tally: Tally, worker: str, events: list[tuple[str, str]]) -> None:
        self.tally = tally
        self.worker = worker
        self.events = events
        self.shard: ShardInfo | None = None

    async def initialize(self, shard: ShardInfo) -> None:
        self.shard = shard
        self.events.append(("initialize", shard.shard_id))

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        self.tally.add(self.worker, records)
        await checkpointer.checkpoint()

    async def lease_lost(self) -> None:
        assert self.shard is not None
        self.events.append(("lease_lost", self.shard.shard_id))

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        assert self.shard is not None
        self.events.append(("shutdown_requested", self.shard.shard_id))
