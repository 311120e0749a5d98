"""The leader lock and the worker registry against the real Java KCL 3.x leader.

One JVM run: a kclasync worker held the leader lock and died; the Java worker takes the lock once
it expired (the item's ``leaseDuration`` honoured); as leader it counts the kclasync worker's
``WorkerMetricStats`` entry as live and assigns it a lease; on its graceful stop it deletes the
lock item and a kclasync worker becomes leader at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable

import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync._adapters.cpu_metrics import detect_cpu_reader
from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._adapters.worker_registry import worker_metrics_table_name
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.worker_presence import WorkerPresence
from kclasync.testing.emulators import LocalAws
from tests.interop.java_kcl import JavaKcl
from tests.support import aws_for, wait_until

#: One JVM start-up and Java's fixed 30 s between two looks at the lock: 35 s on a quiet
#: machine; above the default timeout for a loaded one.
pytestmark = [pytest.mark.asyncio, pytest.mark.interop, pytest.mark.timeout(300)]

LOCK_SECONDS = 6.0


class SteadyCpu:
    source = "steady"

    async def sample(self) -> float:
        return 5.0

    async def close(self) -> None:
        return None


async def test_lock_and_registry_shared_with_the_java_leader(
    kinesis: LocalAws, unique_name: str, java_kcl: Callable[..., JavaKcl]
) -> None:
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(2)
        assert await aws.create_leases() == 2  # Java starts on leases, without its random wait
        locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(unique_name))
        await locks.ensure_table()
        registry = DynamoWorkerMetrics(aws.dynamodb, worker_metrics_table_name(unique_name))
        await registry.ensure_table()

        def elector(name: str) -> LeaderElector:
            return LeaderElector(
                store=locks,
                worker_id=name,
                lock_duration=LOCK_SECONDS,
                heartbeat_interval=1.0,
                rng=random.Random(name),
            )

        dead = elector("py-1")
        assert await dead.step() and dead.is_leader()
        crashed_at = time.monotonic()  # it never heartbeats again nor releases

        # The entry as a kclasync worker writes it: first without a CPU source (empty maps),
        # later with CPU samples and the operating range (max_cpu_percent). The samples are
        # fixed and low: this shared machine's real utilisation is not under the test's control.
        real = detect_cpu_reader(asyncio.get_running_loop().time)
        assert real is not None, "no CPU source on this machine"
        await real.close()
        # With its CPU count (kclasync's extra ``cor``) and, once it has CPU samples, an
        # estimated capacity and its error (``cap``, ``cer``): the Java leader must ignore them.
        presence = WorkerPresence(
            registry,
            "py-1",
            wall_clock=time.time,
            worker_timeout=5.0,
            cores=4.0,
            processed_kbps=lambda: 100.0,
        )

        async def report_forever() -> None:
            while True:
                await presence.report()
                await asyncio.sleep(1.0)

        reporter = asyncio.create_task(report_forever())
        java = java_kcl(stream=unique_name, application=unique_name, worker_id="java-1")
        java.start()
        try:

            async def java_leads() -> bool:
                lock = await locks.get_lock("Leader")
                return lock is not None and lock.owner == "java-1"

            await wait_until(java_leads, 90, "Java to take the expired lock")
            took_after = time.monotonic() - crashed_at
            assert took_after >= LOCK_SECONDS  # not before the item's leaseDuration

            async def assigned_to_us() -> bool:
                scan = await aws.store.list_leases()
                return any(lease.owner == "py-1" for lease in scan.leases)

            await wait_until(assigned_to_us, 90, "the Java leader to assign a lease to py-1")
            assert not java.log_lines(r"invalid entries.*py-1")
            # With a CPU source py-1 still leaves CPU out of its entry while java-1 (no CPU
            # source here) reports none: a KCL 3.x leader compares workers only on the same
            # metrics, and would otherwise give py-1 nothing. The leader keeps counting py-1.
            presence.cpu, presence.max_cpu_percent = SteadyCpu(), 90

            async def java_runs(more: int, what: str) -> None:
                counted = len(java.log_lines(r"Worker : py-1 and total leases"))
                await wait_until(
                    lambda: (
                        len(java.log_lines(r"Worker : py-1 and total leases")) >= counted + more
                    ),
                    60,
                    what,
                )

            await java_runs(2, "two assignment runs of the Java leader counting py-1 with CPU")
            assert not java.log_lines(r"invalid entries.*py-1")

            async def estimated() -> bool:
                entries = (await registry.list_workers()).entries
                mine = [e for e in entries if e.worker_id == "py-1"]
                return bool(mine) and mine[0].capacity_error is not None

            await wait_until(estimated, 30, "py-1's entry to carry an estimated capacity")
            await java_runs(1, "an assignment run of the Java leader reading that entry")
            assert not java.log_lines(r"invalid entries.*py-1")
            (entry,) = [e for e in (await registry.list_workers()).entries if e.worker_id == "py-1"]
            assert entry.capacity_kbps == pytest.approx(2000.0) and entry.capacity_error
            assert presence.reporting_cpu is False
            assert "C" not in entry.metric_stats and "C" not in entry.operating_range, entry
            assert entry.implementation == "kclasync" and entry.cores == 4.0
            assert java.log_lines(r"java-1 is new leader")
            java.begin_stop()  # a graceful stop: the lock item is deleted first

            async def lock_deleted() -> bool:
                return await locks.get_lock("Leader") is None

            await wait_until(lock_deleted, 30, "the graceful stop to delete the lock")
            successor = elector("py-2")
            assert await successor.step() and successor.is_leader()
            # The rest of the stop (the processors' final shutdown, until the failover time)
            # is not what this scenario checks.
            java.stop(kill=True)
        finally:
            reporter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reporter
            await presence.close()
            java.stop()
        assert not java.parse_failures()
