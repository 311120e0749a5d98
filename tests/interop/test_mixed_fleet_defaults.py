"""A mixed fleet under kclasync's default lease taker (``balanced``), both ways, with the real
Java KCL 3.x MultiLangDaemon: Java 3.x workers in ``CLIENT_VERSION_3X`` only process what a
leader assigns, so a kclasync worker on such a table follows (and, leading, makes) the leader's
assignment whatever its configured taker.

- kclasync first, then a Java worker joins (and writes ``Migration3.0``): the kclasync leader
  notices the state at its next re-read, switches, and assigns the Java worker its share;
- Java first (leader, ``3X``), then a default kclasync worker joins: it never runs a taking
  round, the Java leader assigns it leases.

Records flow at 10 records/s per shard throughout; 0 lost, no record processed by both sides.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._adapters.worker_registry import worker_metrics_table_name
from kclasync._core.leases.client_version import ClientVersion
from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import KCLASYNC_CONFIG, Producer
from tests.interop.java_kcl import JavaKcl
from tests.interop.test_kclasync_to_java import Seen
from tests.support import Aws, aws_for, wait_until

#: One JVM start-up (about 6-7 s to the first read) plus the scenario: 9-13 s on a quiet machine.
pytestmark = [pytest.mark.asyncio, pytest.mark.interop, pytest.mark.timeout(300)]

log = logging.getLogger(__name__)

SHARDS = 4
#: 10 records/s per shard.
RATE = 10 * SHARDS
#: The interop timings (failover 3 s, as the Java side's), but the default lease taker.
DEFAULTS = {k: v for k, v in KCLASYNC_CONFIG.items() if k != "lease_taker"}


def switch_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "follows the leader's assignment" in r.getMessage()
    ]


async def owned_by(aws: Aws, worker: str) -> set[str]:
    scan = await aws.store.list_leases()
    return {lease.key for lease in scan.leases if lease.owner == worker}


async def test_java_joins_a_default_kclasync_leader_and_gets_its_share(
    kinesis: LocalAws,
    unique_name: str,
    java_kcl: Callable[..., JavaKcl],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    timings: dict[str, float] = {}
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(SHARDS)
        seen = Seen()
        locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(unique_name))
        kclasync = aws.consumer(seen.handler(), worker_id="py-1", **DEFAULTS)
        assert kclasync.config.lease_taker.value == "balanced"
        task = asyncio.create_task(kclasync.run())
        producer = Producer(aws, 0, RATE)
        producer.start()
        producing = True
        java = java_kcl(stream=unique_name, application=unique_name, worker_id="java-1")
        try:
            await wait_until(
                lambda: len(kclasync.held_leases) == SHARDS and kclasync.is_leader, 60, "py-1"
            )
            await wait_until(lambda: bool(seen.deliveries), 30, "py-1 to read")
            assert await locks.get_migration_state() is None
            java.start()
            started = time.monotonic()

            async def in_3x() -> bool:
                state = await locks.get_migration_state()
                return state is not None and state.version is ClientVersion.V3X

            await wait_until(in_3x, 120, "the Java worker to write Migration3.0 = 3X")
            timings["until 3X"] = time.monotonic() - started
            await wait_until(lambda: bool(switch_warnings(caplog)), 30, "py-1 to switch")
            timings["until py-1 switched"] = time.monotonic() - started

            async def java_has_a_lease() -> bool:
                assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
                return bool(await owned_by(aws, "java-1"))

            await wait_until(java_has_a_lease, 90, "py-1 to assign java-1 a lease")
            timings["until assigned"] = time.monotonic() - started
            await wait_until(lambda: bool(java.processed().keys()), 60, "java-1 to read")
            timings["until Java read"] = time.monotonic() - started
            produced = await producer.stop()
            producing = False

            def all_read() -> bool:
                assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
                return produced <= set(seen.deliveries) | java.processed().keys()

            await wait_until(all_read, 60, "the mixed fleet to read everything")
            java_leases = await owned_by(aws, "java-1")
            lock = await locks.get_lock("Leader")
            assert lock is not None and lock.owner == "py-1", "the lock left the kclasync leader"
            registry = DynamoWorkerMetrics(aws.dynamodb, worker_metrics_table_name(unique_name))
            assert {e.worker_id for e in (await registry.list_workers()).entries} >= {
                "py-1",
                "java-1",
            }
        finally:
            if producing:
                await producer.stop()
            # The scenario is over: no graceful shutdown (about 5 s) that nothing checks.
            java.stop(kill=True)
            await kclasync.stop()
            await asyncio.gather(task, return_exceptions=True)

    ours = java.processed()
    lost = produced - set(seen.deliveries) - ours.keys()
    log.warning(
        "default kclasync leader -> Java worker joins: produced %d, lost %d, Java read %d on %s, "
        "leases it owned %s, timings %s",
        len(produced),
        len(lost),
        len(ours.keys()),
        sorted(ours.shards),
        sorted(java_leases),
        timings,
    )
    assert not lost
    assert java_leases, "the Java worker owns no lease at the end"
    assert len(ours.keys()) > 0, "the Java worker read nothing"
    assert len(switch_warnings(caplog)) == 1, switch_warnings(caplog)
    assert "CLIENT_VERSION_3X" in switch_warnings(caplog)[0]
    assert all(n == 1 for n in ours.deliveries.values()), "Java processed a record twice"
    assert not set(seen.deliveries) & ours.keys(), "records read by both implementations"
    assert not java.parse_failures()
    assert not java.log_lines(r"is new leader"), "the Java worker took the lock"


async def test_a_default_kclasync_worker_joins_a_java_3x_leader_and_follows_it(
    kinesis: LocalAws,
    unique_name: str,
    java_kcl: Callable[..., JavaKcl],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    timings: dict[str, float] = {}
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(SHARDS)
        locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(unique_name))
        assert await aws.create_leases() == SHARDS  # Java starts without its random wait
        producer = Producer(aws, 0, RATE)
        producer.start()
        producing = True
        java = java_kcl(stream=unique_name, application=unique_name, worker_id="java-1")
        java.start()
        started = time.monotonic()
        seen = Seen()
        kclasync = aws.consumer(seen.handler(), worker_id="py-1", **DEFAULTS)
        task: asyncio.Task[None] | None = None
        try:

            async def java_leads_in_3x() -> bool:
                assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
                if not java.processed().keys():
                    return False
                lock, state = await locks.get_lock("Leader"), await locks.get_migration_state()
                return (
                    lock is not None
                    and lock.owner == "java-1"
                    and state is not None
                    and state.version is ClientVersion.V3X
                )

            await wait_until(java_leads_in_3x, 150, "java-1 to lead and read in 3X")
            timings["Java leads"] = time.monotonic() - started
            task = asyncio.create_task(kclasync.run())
            joined = time.monotonic()
            await wait_until(lambda: bool(kclasync.held_leases), 90, "java-1 to assign py-1")
            timings["until assigned"] = time.monotonic() - joined
            await wait_until(lambda: bool(seen.deliveries), 60, "py-1 to read")
            timings["until py-1 read"] = time.monotonic() - joined
            worker = kclasync._worker
            assert worker is not None
            assert worker.coordinator.taking.leader_assigns
            assert worker.coordinator.taking.rounds == 0, "py-1 ran a taking round on 3X"
            assert worker.early_failover is None or worker.early_failover.early_takes == 0
            assert not kclasync.is_leader
            produced = await producer.stop()
            producing = False

            def all_read() -> bool:
                assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
                return produced <= set(seen.deliveries) | java.processed().keys()

            await wait_until(all_read, 60, "the mixed fleet to read everything")
            lock = await locks.get_lock("Leader")
            assert lock is not None and lock.owner == "java-1"
        finally:
            if producing:
                await producer.stop()
            await kclasync.stop()
            if task is not None:
                await asyncio.gather(task, return_exceptions=True)
            # The scenario is over: no graceful shutdown (about 5 s) that nothing checks.
            java.stop(kill=True)

    ours = java.processed()
    lost = produced - set(seen.deliveries) - ours.keys()
    log.warning(
        "Java 3X leader, default kclasync joins: produced %d, lost %d, py-1 read %d, timings %s",
        len(produced),
        len(lost),
        len(seen.deliveries),
        timings,
    )
    assert not lost
    assert len(switch_warnings(caplog)) == 1, switch_warnings(caplog)
    assert all(n == 1 for n in seen.deliveries.values()), "kclasync processed a record twice"
    assert not set(seen.deliveries) & ours.keys(), "records read by both implementations"
    assert not java.parse_failures()
