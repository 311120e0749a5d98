"""A worker's entry in the worker registry (KCL 3.x format) and the throughput it writes with
each renewal."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import (
    MemoryCoordinatorState,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStreamClient,
)
from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics
from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers import worker_metrics_item as wi
from kclasync._records import Record
from kclasync._runtime.worker_presence import WorkerPresence
from kclasync.errors import ConfigError
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until


class FakeCpu:
    source = "fake"

    def __init__(self, values: Sequence[float | Exception]) -> None:
        self.values = list(values)
        self.closed = False

    async def sample(self) -> float:
        value = self.values.pop(0)
        if isinstance(value, Exception):
            raise value
        return value

    async def close(self) -> None:
        self.closed = True


async def test_the_entry_carries_lut_cpu_samples_and_the_operating_range() -> None:
    registry = MemoryWorkerMetrics()
    wall = [1_700_000_000.7]
    cpu = FakeCpu([12.5, OSError("gone"), 140.0])
    presence = WorkerPresence(
        registry, "w", wall_clock=lambda: wall[0], worker_timeout=5, cpu=cpu, max_cpu_percent=80
    )
    await presence.report()
    entry = wi.decode_item(registry.items["w"])
    assert entry.last_update == 1_700_000_000
    assert entry.metric_stats == {"C": (12.5,)} and entry.operating_range == {"C": (80,)}
    assert wm.is_live(entry, now=1_700_000_001, report_period=30)
    wall[0] += 3
    await presence.report()  # an unreadable source: the failure marker, as the Java worker
    entry = wi.decode_item(registry.items["w"])
    assert entry.metric_stats == {"C": (12.5, -1.0)} and wm.is_failing(entry)
    await presence.report()  # clamped to 100
    assert wi.decode_item(registry.items["w"]).metric_stats["C"][-1] == 100.0
    await presence.leave()
    await presence.close()
    assert registry.items == {} and cpu.closed


class CountingCpu(FakeCpu):
    """A source that, like the real ones, tells the CPUs it measures against once sampled."""

    def __init__(self, values: Sequence[float | Exception], cores: float) -> None:
        super().__init__(values)
        self._cores = cores
        self.cores: float | None = None

    async def sample(self) -> float:
        self.cores = self._cores
        return await super().sample()


async def test_the_entry_carries_the_cpus_from_the_first_report() -> None:
    registry = MemoryWorkerMetrics()
    wall = [1_700_000_000.0]
    # The CPU source's count, from the first report on (before any capacity estimate).
    presence = WorkerPresence(
        registry, "w", wall_clock=lambda: wall[0], worker_timeout=5, cpu=CountingCpu([3.0], 2.5)
    )
    await presence.report()
    entry = wi.decode_item(registry.items["w"])
    assert entry.cores == 2.5 and entry.capacity_kbps is None
    # A configured count wins; a source that tells none (or no source) reports none.
    configured = WorkerPresence(
        registry, "c", wall_clock=lambda: wall[0], worker_timeout=5, cpu=CountingCpu([3.0], 64),
        cores=4.0,
    )  # fmt: skip
    await configured.report()
    assert wi.decode_item(registry.items["c"]).cores == 4.0
    silent = WorkerPresence(registry, "s", wall_clock=lambda: wall[0], worker_timeout=5,
                            cpu=FakeCpu([3.0]))  # fmt: skip
    await silent.report()
    assert wi.decode_item(registry.items["s"]).cores is None


async def test_no_cpu_source_means_no_cpu_metric_and_corrupt_entries_are_counted() -> None:
    registry = MemoryWorkerMetrics()
    counted: list[int] = []
    presence = WorkerPresence(
        registry, "w", wall_clock=lambda: 100.0, worker_timeout=5, on_corrupt=counted.append
    )
    await presence.report()
    entry = wi.decode_item(registry.items["w"])
    assert entry.metric_stats == {} and entry.operating_range == {}
    assert wm.uses_default_metric(entry) and wm.is_valid(entry)
    registry.items["bad"] = {"wid": {"S": "bad"}, "lut": {"S": "x"}}
    registry.items["?"] = {"lut": {"N": "100"}}  # names no worker: never one
    # An unreadable entry is skipped for everything but liveness, which it shows by changing.
    assert await presence.live_workers(now=0.0) == {"w", "bad"}
    assert await presence.live_workers(now=1.0) == {"w", "bad"}
    assert counted == [2, 2] and presence.corrupt == 2
    # Unchanged for longer than the worker timeout: gone, like any silent entry.
    assert await presence.live_workers(now=5.5) == {"w"}
    registry.items["bad"] = {"wid": {"S": "bad"}, "lut": {"S": "y"}}
    assert await presence.live_workers(now=6.0) == {"w", "bad"}


async def test_an_entry_seen_half_written_still_counts_as_its_worker() -> None:
    """moto's UpdateItem stores the key alone before it applies the update, and a concurrent
    Scan can return that: the worker being written is live, not missing from the plan."""
    registry = MemoryWorkerMetrics()
    presence = WorkerPresence(registry, "w", wall_clock=lambda: 100.0, worker_timeout=5)
    registry.items["new"] = {"wid": {"S": "new"}}
    assert await presence.live_workers(now=0.0) == {"w", "new"}
    registry.items["new"] = {**registry.items["new"], "lut": {"N": "101"}}
    assert await presence.live_workers(now=4.0) == {"w", "new"}
    assert await presence.live_workers(now=8.5) == {"w", "new"}  # changed at 4.0
    assert await presence.live_workers(now=9.5) == {"w"}


class WriteOnTheWire(MemoryWorkerMetrics):
    """A registry whose writes are applied when ``server`` opens, whether or not the caller still
    waits for the answer: a request already sent, as a stopping worker's last heartbeat."""

    def __init__(self) -> None:
        super().__init__()
        self.server = asyncio.Event()
        self.server.set()
        self.sent = 0

    async def report(self, metrics: wm.WorkerMetrics) -> None:
        self.sent += 1

        async def apply() -> None:
            await self.server.wait()
            await MemoryWorkerMetrics.report(self, metrics)

        await asyncio.shield(asyncio.ensure_future(apply()))


@pytest.mark.parametrize("answered", [True, False])
async def test_leaving_waits_for_a_heartbeat_in_flight_so_it_cannot_bring_the_entry_back(
    answered: bool,
) -> None:
    registry = WriteOnTheWire()
    presence = WorkerPresence(
        registry, "w", wall_clock=lambda: 100.0, worker_timeout=5, heartbeat_interval=1.0
    )
    await presence.report()
    registry.server.clear()
    beat = asyncio.create_task(presence.beat())
    await wait_until(lambda: registry.sent == 2, 5, "the heartbeat on the wire")
    beat.cancel()  # the stop cancels the heartbeat loop mid-request
    await asyncio.gather(beat, return_exceptions=True)
    leaving = asyncio.create_task(presence.leave(wait=0.2 if not answered else 5.0))
    if answered:
        for _ in range(10):
            await asyncio.sleep(0)
        assert not leaving.done() and "w" in registry.items  # waits for the write's answer
        registry.server.set()
    await leaving
    if answered:
        assert registry.items == {}
    else:
        # Never answered within the wait: the entry is deleted anyway (a write landing later
        # leaves a silent entry, which expires as any other).
        assert registry.items == {} and registry.calls["remove"] == 1
        registry.server.set()
    await presence.beat()
    await presence.report()
    assert registry.sent == 2, "nothing is written after leaving"


def test_worker_timeout_must_exceed_the_report_period_plus_one_second() -> None:
    with pytest.raises(ConfigError, match="worker_timeout"):
        ConsumerConfig(failover_time=3.0, worker_timeout=1.5)
    assert ConsumerConfig(failover_time=3.0, worker_timeout=2.5).effective_worker_timeout == 2.5
    assert ConsumerConfig().effective_worker_timeout == 11.0
    with pytest.raises(ConfigError, match="max_cpu_percent"):
        ConsumerConfig(max_cpu_percent=101)


@in_virtual_time
async def test_renewals_write_the_throughput_ema_of_delivered_bytes() -> None:
    table, client = MemoryLeaseTable(), MemoryStreamClient()
    client.create_stream("s", 1)
    for i in range(400):
        client.put_record("s", f"k{i}", b"x" * 1000)
    delivered: list[int] = []

    async def handle(records: Sequence[Record]) -> None:
        delivered.extend(len(r.data) for r in records)

    consumer = Consumer(
        stream_name="s",
        application_name="app",
        processor=handle,
        config=ConsumerConfig(
            failover_time=3.0,
            initial_position="TRIM_HORIZON",
            worker_id="w",
            max_records=100,
            min_time_between_reads=0.5,
        ),
        backend=AdapterBackend(MemoryLeaseStore(table), client, locks=MemoryCoordinatorState()),
        registry=CollectorRegistry(),
        rng=random.Random(1),
    )
    task = asyncio.create_task(consumer.run())
    try:
        await wait_until(lambda: len(delivered) == 400, 30, "every record delivered")
        (lease,) = table.leases.values()
        await wait_until(
            lambda: (table.get(lease.key).throughput_kbps or 0) > 0, 10, "a throughput written"
        )
        kbps = table.get(lease.key).throughput_kbps
        # 400 kB in about 2 s of reading: an average of that order, never more than all of it
        # in one renewal period (~0.99 s).
        assert kbps is not None and 0 < kbps <= 400_000 / 1024 / 0.9
        assert "w" in table.workers  # the worker's entry, in the worker-metrics table
        await wait_until(
            lambda: (table.get(lease.key).throughput_kbps or 1) < kbps, 20, "the EMA to decay"
        )
    finally:
        await consumer.stop()
        await task
    assert "w" not in table.workers


async def test_cpu_is_left_out_while_a_java_worker_reports_none_and_back_once_it_has_gone() -> None:
    registry = MemoryWorkerMetrics()
    wall = [1_700_000_000.0]
    presence = WorkerPresence(
        registry, "py-1", wall_clock=lambda: wall[0], worker_timeout=5, cpu=FakeCpu([20.0] * 20)
    )
    # A Java KCL worker that cannot read its CPU writes empty maps (the default metric).
    await registry.report(wm.WorkerMetrics(worker_id="java-1", last_update=int(wall[0])))
    await presence.report()
    entry = wi.decode_item(registry.items["py-1"])
    assert entry.implementation == "kclasync" and wm.uses_default_metric(entry)
    assert presence.reporting_cpu is False and presence.last_entry.metric_stats["C"] == (20.0,)
    # The Java worker stops reporting; after two KCL report periods it no longer counts.
    for _ in range(5):
        wall[0] += 16
        await presence.report()
    entry = wi.decode_item(registry.items["py-1"])
    assert presence.reporting_cpu is True
    assert entry.metric_stats["C"] == (20.0,) * 6 and entry.operating_range == {"C": (100,)}


async def test_an_estimated_capacity_is_reported_with_its_standard_error() -> None:
    registry = MemoryWorkerMetrics()
    wall = [1_700_000_000.0]
    readings = [20.0, 20.4, 19.6, 20.2, 19.9, 20.1]
    presence = WorkerPresence(
        registry, "w", wall_clock=lambda: wall[0], worker_timeout=5, cpu=FakeCpu(readings),
        processed_kbps=lambda: 400.0,
    )  # fmt: skip
    for _ in readings:
        wall[0] += 3
        await presence.report()
    entry = wi.decode_item(registry.items["w"])
    assert entry.capacity_kbps is not None and abs(entry.capacity_kbps - 2000.0) < 40.0
    # Five usable readings at 20 % CPU: at least a CPU point over sqrt(5) x 20.
    assert entry.capacity_error is not None and 0.02 <= entry.capacity_error < 0.05
    # A configured capacity is exact: no error goes with it, and an earlier one is removed.
    presence.capacity_kbps = 2500.0
    presence.cpu = FakeCpu([20.0])
    wall[0] += 3
    await presence.report()
    entry = wi.decode_item(registry.items["w"])
    assert entry.capacity_kbps == 2500.0 and entry.capacity_error is None
    assert "cer" not in registry.items["w"]
