"""Renewals sent late by a busy event loop are measured and reported before leases are lost: a
task that holds the (virtual-time) loop for 1.5 s every 2 s delays the renewals of a worker
whose failover time is 10 s; the worker records the lateness, warns, and keeps its leases."""

from __future__ import annotations

import asyncio
import logging

import pytest

from kclasync._adapters.memory import MemoryLeaseStore
from kclasync._core.leases.lease import Lease
from kclasync._simulation.clock import VirtualTimeLoop
from tests.runtime.test_early_failover import FAILOVER, Fleet
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until


async def hog(block: float, every: float) -> None:
    """Hold the loop for ``block`` seconds of virtual time every ``every`` seconds, as a
    CPU-bound callback would."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop)
    while True:
        await asyncio.sleep(every - block)
        loop.clock.advance(block)  # nothing else runs meanwhile


async def _run(block: float | None) -> tuple[float, int, int]:
    fleet = Fleet()
    worker = fleet.start("a")
    hogging = asyncio.create_task(hog(block, 2.0)) if block else None
    try:
        await wait_until(lambda: len(fleet.table.leases) == 4, 20 * FAILOVER, "4 leases")
        await wait_until(
            lambda: len(worker.held_leases) == 4, 20 * FAILOVER, "the worker holding all 4"
        )
        await asyncio.sleep(6 * FAILOVER)
        coordinator = worker._coordinator
        assert coordinator is not None
        renewals = coordinator.renewals
        lost = sum(
            int(sample.value)
            for family in worker.metrics.leases_lost.collect()
            for sample in family.samples
            if sample.name.endswith("_total") and sample.labels.get("worker") == "a"
        )
        return renewals.max_lateness, len(worker.held_leases), lost
    finally:
        if hogging is not None:
            hogging.cancel()
        await fleet.close()


@in_virtual_time
async def test_a_busy_loop_makes_renewals_late_and_the_worker_says_so() -> None:
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("kclasync.leases")
    logger.addHandler(handler)
    # Another test in this process may have left the root logger at ERROR (the demo's CLI).
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        quiet, held_quiet, _ = await _run(None)
        warned_quiet = [r for r in records if "sends lease renewals late" in r.getMessage()]
        busy, held_busy, lost = await _run(1.5)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    warned = [r for r in records if "sends lease renewals late" in r.getMessage()]
    assert quiet < 0.01 and not warned_quiet
    assert busy >= 1.0  # up to the hog's 1.5 s
    assert warned and all(r.levelno == logging.WARNING for r in warned)
    # Late, but within the failover time: nothing lost.
    assert held_quiet == held_busy == 4 and lost == 0


pytestmark = pytest.mark.timeout(120)


@in_virtual_time
async def test_renewals_are_spread_over_the_interval_not_sent_in_one_burst() -> None:
    """200 leases taken in one round: each is renewed at its own point of the interval, so
    that a busy loop sends a trickle of renewals, each on time, instead of a burst whose last
    requests go out late by the time the burst takes."""
    loop = asyncio.get_running_loop()
    sent: list[float] = []
    renew = MemoryLeaseStore.renew_lease

    async def counted(self: MemoryLeaseStore, lease: Lease, *args: object) -> Lease | None:
        sent.append(loop.time())
        return await renew(self, lease, *args)  # type: ignore[arg-type]

    MemoryLeaseStore.renew_lease = counted  # type: ignore[method-assign]
    fleet = Fleet(shards=200)
    worker = fleet.start("a")
    try:
        await wait_until(lambda: len(worker.held_leases) == 200, 20 * FAILOVER, "200 leases")
        coordinator = worker._coordinator
        assert coordinator is not None
        interval = coordinator.renewals.interval
        await asyncio.sleep(3 * interval)
        start = loop.time()
        del sent[:]
        await asyncio.sleep(4 * interval)
        window = [t for t in sent if start <= t < start + 4 * interval]
        # Every lease renewed once per interval ...
        assert 4 * 200 - 200 <= len(window) <= 4 * 200 + 200
        # ... and no tenth of an interval carries more than a fifth of them (one burst would
        # carry all 200).
        tenth = interval / 10
        slices = [sum(1 for t in window if start + i * tenth <= t < start + (i + 1) * tenth)
                  for i in range(40)]  # fmt: skip
        assert max(slices) <= 40, slices
        assert coordinator.renewals.max_lateness < 0.05 * FAILOVER
    finally:
        MemoryLeaseStore.renew_lease = renew  # type: ignore[method-assign]
        await fleet.close()
