"""The worker registry: idle workers count, dead ones drop out after the worker timeout."""

from __future__ import annotations

import asyncio
import random

from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import (
    MemoryCoordinatorState,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStreamClient,
)
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until


def worker(
    name: str,
    table: MemoryLeaseTable,
    client: MemoryStreamClient,
    state: MemoryCoordinatorState,
    **config: object,
) -> Consumer:
    async def handle(records: object) -> None:
        return None

    settings: dict[str, object] = {
        "failover_time": 0.6,
        "initial_position": "TRIM_HORIZON",
        "worker_id": name,
        "idle_time_between_reads": 0.05,
        **config,
    }
    return Consumer(
        stream_name="s",
        application_name="app",
        processor=handle,
        config=ConsumerConfig(**settings),  # type: ignore[arg-type]
        backend=AdapterBackend(MemoryLeaseStore(table), client, locks=state),
        registry=CollectorRegistry(),
        rng=random.Random(name),
    )


def live_workers(consumer: Consumer) -> frozenset[str]:
    coordinator = consumer._coordinator
    return coordinator.taking.live_workers if coordinator is not None else frozenset()


@in_virtual_time
async def test_idle_workers_count_and_dead_ones_drop_out() -> None:
    table, client, state = MemoryLeaseTable(), MemoryStreamClient(), MemoryCoordinatorState()
    client.create_stream("s", 1)  # one lease for three workers: two of them stay idle
    timeout = 1.6  # above the report period (the renewer interval) + 1 s: ``lut`` is whole seconds
    workers = {n: worker(n, table, client, state, worker_timeout=timeout) for n in "abc"}
    tasks = {n: asyncio.create_task(w.run()) for n, w in workers.items()}
    try:
        await wait_until(
            lambda: all(live_workers(w) == {"a", "b", "c"} for w in workers.values()),
            10,
            "every worker to see the two idle ones",
        )
        assert sum(len(w.held_leases) for w in workers.values()) == 1
        tasks.pop("c").cancel()  # a crash: its registry entry stays but stops changing
        loop = asyncio.get_running_loop()
        crashed = loop.time()
        await wait_until(lambda: live_workers(workers["a"]) == {"a", "b"}, 10, "c to drop out")
        # Not before the worker timeout, less the up to 1 s ``lut`` may have stood still already.
        assert loop.time() - crashed >= timeout - 1.0 - 0.1
        # Dropped by judgement, not by deletion; the leader removes the dead entry itself only
        # after three failover times of silence (``worker_silence.stale_entries``).
        removed = [
            w._worker.early_failover.entries_removed
            for w in workers.values()
            if w._worker is not None and w._worker.early_failover is not None
        ]
        assert "c" in table.workers or sum(removed) == 1
        await wait_until(lambda: "c" not in table.workers, 10, "the leader removing c's entry")
        await workers["b"].stop()
        await tasks.pop("b")
        assert "b" not in table.workers  # a graceful stop deregisters
    finally:
        for w in workers.values():
            await w.stop()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
