"""The runtime under injected faults, on the in-memory adapters (our own, with DynamoDB's
conditional semantics): throttling, expired iterators, unknown-outcome writes, an unreachable
lease table."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import (
    FaultPlan,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStreamClient,
    OpFaults,
)
from kclasync._records import Record
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

STREAM = "s"


def fill(client: MemoryStreamClient, shards: int, records: int) -> list[bytes]:
    client.create_stream(STREAM, shards)
    payloads = [str(i).encode() for i in range(records)]
    for i, data in enumerate(payloads):
        client.put_record(STREAM, f"k{i % 37}", data)
    return payloads


def consumer(
    handle: object,
    table: MemoryLeaseTable,
    client: MemoryStreamClient,
    registry: CollectorRegistry,
    store_faults: FaultPlan | None = None,
    **config: object,
) -> Consumer:
    settings: dict[str, object] = {
        "failover_time": 0.6,
        "initial_position": "TRIM_HORIZON",
        "idle_time_between_reads": 0.02,
        "min_time_between_reads": 0.0,
        "throttle_backoff": 0.01,
        "max_backoff": 0.05,
        "worker_id": "w",
        **config,
    }
    return Consumer(
        stream_name=STREAM,
        application_name="app",
        processor=handle,
        config=ConsumerConfig(**settings),  # type: ignore[arg-type]
        backend=AdapterBackend(MemoryLeaseStore(table, faults=store_faults), client),
        registry=registry,
        rng=random.Random(0),
    )


class Seen:
    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.per_shard: dict[str, list[int]] = {}

    async def __call__(self, records: Sequence[Record]) -> None:
        for r in records:
            self.data.append(r.data)
            self.per_shard.setdefault(r.shard_id, []).append(int(r.sequence_number))


@in_virtual_time
async def test_throttled_get_records_backs_off_and_loses_nothing() -> None:
    faults = FaultPlan(random.Random(7), operations={"get_records": OpFaults(throttle=0.5)})
    client = MemoryStreamClient(faults=faults)
    payloads = fill(client, 2, 300)
    seen = Seen()
    registry = CollectorRegistry()
    c = consumer(seen, MemoryLeaseTable(), client, registry, max_records=20)
    async with c:
        await wait_until(lambda: len(seen.data) >= len(payloads), 20, "every record")
    assert sorted(seen.data) == sorted(payloads)
    assert faults.injected["get_records:throttled"] > 5
    throttles = registry.get_sample_value(
        "kclasync_throttled_total", {"application": "app", "worker": "w", "service": "kinesis"}
    )
    assert throttles == faults.injected["get_records:throttled"]


@in_virtual_time
async def test_expired_iterator_resumes_after_the_last_record_fetched() -> None:
    # A slow processor fills the queue; the blocked fetcher's iterator expires meanwhile.
    client = MemoryStreamClient(iterator_ttl=0.05)
    payloads = fill(client, 1, 120)
    seen = Seen()

    async def slow(records: Sequence[Record]) -> None:
        await asyncio.sleep(0.03)
        await seen(records)

    c = consumer(
        slow, MemoryLeaseTable(), client, CollectorRegistry(), max_records=10, max_queued_batches=1
    )
    async with c:
        await wait_until(lambda: len(seen.data) >= len(payloads), 20, "every record")
    assert seen.data == payloads  # in order, none twice, none skipped
    (sequences,) = seen.per_shard.values()
    assert sequences == sorted(sequences)


@in_virtual_time
async def test_renewals_with_unknown_outcome_keep_the_lease() -> None:
    # Half the renewals are applied but answered with an error, like a timeout after the write.
    faults = FaultPlan(
        random.Random(3),
        operations={"renew_lease": OpFaults(transient=0.5, transient_after_write=1.0)},
    )
    client = MemoryStreamClient()
    fill(client, 2, 10)
    table = MemoryLeaseTable()
    registry = CollectorRegistry()
    c = consumer(Seen(), table, client, registry, store_faults=faults)
    async with c:
        await wait_until(lambda: len(c.held_leases) == 2, 5, "both leases")
        await wait_until(
            lambda: faults.injected["renew_lease:transient_after"] >= 4, 10, "lost replies"
        )
        assert len(c.held_leases) == 2
    lost = registry.get_sample_value(
        "kclasync_leases_lost_total", {"application": "app", "worker": "w"}
    )
    assert lost == 0


@in_virtual_time
async def test_unreachable_table_drops_the_lease_after_failover_then_recovers() -> None:
    faults = FaultPlan(random.Random(1))
    client = MemoryStreamClient()
    fill(client, 1, 5)
    lost: list[float] = []
    seen = Seen()

    class Processor:
        async def initialize(self, shard: object) -> None:
            return None

        async def process_records(
            self, records: Sequence[Record], checkpointer: object, behind: int | None
        ) -> None:
            await seen(records)

        async def lease_lost(self) -> None:
            lost.append(asyncio.get_running_loop().time())

        async def shard_ended(self, checkpointer: object) -> None:
            return None

        async def shutdown_requested(self, checkpointer: object) -> None:
            return None

    c = consumer(Processor, MemoryLeaseTable(), client, CollectorRegistry(), store_faults=faults)
    async with c:
        await wait_until(lambda: len(c.held_leases) == 1, 5, "the lease")
        loop = asyncio.get_running_loop()
        outage = loop.time()
        faults.operations["renew_lease"] = OpFaults(throttle=1.0)
        faults.operations["list_leases"] = OpFaults(throttle=1.0)
        await wait_until(lambda: bool(lost), 5, "the lease to be given up")
        # Not before the failover time has passed without a renewal, and not much after.
        assert 0.6 - 0.25 <= lost[0] - outage <= 0.6 + 0.5
        assert c.held_leases == []
        faults.operations.clear()
        await wait_until(lambda: len(c.held_leases) == 1, 5, "the lease back after the outage")


@in_virtual_time
async def test_transient_errors_at_start_are_retried() -> None:
    from kclasync.errors import TransientError

    class FlakyAtStart(MemoryLeaseStore):
        failures = 2

        async def ensure_table(self) -> None:
            if self.failures:
                self.failures -= 1
                raise TransientError("injected: table not reachable yet")
            await super().ensure_table()

    client = MemoryStreamClient()
    payloads = fill(client, 1, 20)
    seen = Seen()
    store = FlakyAtStart(MemoryLeaseTable())
    c = Consumer(
        stream_name=STREAM,
        application_name="app",
        processor=seen,
        config=ConsumerConfig(
            initial_position="TRIM_HORIZON",
            worker_id="w",  # type: ignore[arg-type]
            throttle_backoff=0.01,
            idle_time_between_reads=0.02,
        ),
        backend=AdapterBackend(store, client),
        registry=CollectorRegistry(),
    )
    async with c:
        await wait_until(lambda: len(seen.data) == len(payloads), 10, "the records")
    assert store.failures == 0
