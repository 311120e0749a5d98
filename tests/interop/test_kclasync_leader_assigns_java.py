"""A kclasync leader assigns leases to a Java KCL 3.x worker (the reverse of
``test_leader_and_registry.py``): one kclasync worker in the KCL 3.x-compatible mode
(``lease_taker="kcl3"``, and kclasync's own load-aware policy, ``"load"``) holds the leader lock
and every lease; a Java MultiLangDaemon joins as a follower. The kclasync leader sees the Java
worker through the ``WorkerMetricStats`` entry the Java worker writes, hands it leases (graceful
handoffs), and the Java worker processes them: 0 lost, the lock stays with kclasync, and the Java
log shows no lease it could not parse.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence

import orjson
import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._adapters.worker_registry import worker_metrics_table_name
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import KCLASYNC_CONFIG, Producer, Rid, produce
from tests.interop.java_kcl import JavaKcl
from tests.support import aws_for, wait_until

#: One JVM start-up (about 7 s to the first read) plus the scenario, 11 s on a quiet machine;
#: above the default timeout for a loaded one.
pytestmark = [pytest.mark.asyncio, pytest.mark.interop, pytest.mark.timeout(300)]

log = logging.getLogger(__name__)

HANDED = re.compile(r"lease (\S+) to java-1$")


@pytest.mark.parametrize("policy", ["kcl3", "load"])
async def test_kclasync_leader_assigns_leases_to_a_java_worker(
    policy: str,
    kinesis: LocalAws,
    unique_name: str,
    java_kcl: Callable[..., JavaKcl],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kclasync.assignment")
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(4)
        produced = await produce(aws, 0, 400)
        seen: Counter[Rid] = Counter()

        async def handle(records: Sequence[Record]) -> None:
            for r in records:
                body = orjson.loads(r.data)
                seen[(str(body["k"]), int(body["c"]))] += 1

        locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(unique_name))
        registry = DynamoWorkerMetrics(aws.dynamodb, worker_metrics_table_name(unique_name))

        async def lock_owner() -> str | None:
            lock = await locks.get_lock("Leader")
            return None if lock is None else lock.owner

        leader = aws.consumer(
            handle, worker_id="py-1", **{**KCLASYNC_CONFIG, "lease_taker": policy}
        )
        task = asyncio.create_task(leader.run())
        java = java_kcl(stream=unique_name, application=unique_name, worker_id="java-1")
        producer, producing = Producer(aws, 400, 50), False
        try:
            await wait_until(lambda: produced <= set(seen), 60, "py-1 to read")
            assert await lock_owner() == "py-1"
            assert len(leader.held_leases) == 4
            # A KCL 3.x leader balances load (throughput here), not lease counts: with an idle
            # stream there is nothing to move, so records keep coming while Java joins.
            producer.start()
            producing = True

            java.start()
            started = time.monotonic()

            async def java_reports() -> bool:
                entries = (await registry.list_workers()).entries
                return any(e.worker_id == "java-1" and e.implementation is None for e in entries)

            await wait_until(java_reports, 90, "java-1's WorkerMetricStats entry")
            timings["until Java reported"] = time.monotonic() - started

            async def java_owns() -> set[str]:
                scan = await aws.store.list_leases()
                return {lease.key for lease in scan.leases if lease.owner == "java-1"}

            async def assigned() -> bool:
                return bool(await java_owns())

            await wait_until(assigned, 90, "the kclasync leader to assign java-1 a lease")
            timings["until assigned"] = time.monotonic() - started
            await wait_until(lambda: bool(java.processed().keys()), 60, "java-1 to read")
            timings["until Java read"] = time.monotonic() - started
            produced |= await producer.stop()
            producing = False

            def all_read() -> bool:
                assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
                return produced <= set(seen) | java.processed().keys()

            await wait_until(all_read, 90, "the mixed fleet to read everything")
            timings["until all read"] = time.monotonic() - started
            owned_by_java = await java_owns()
            assert await lock_owner() == "py-1", "the lock left the kclasync leader"
        finally:
            if producing:
                await producer.stop()
            # The scenario is over: no graceful shutdown (about 5 s) that nothing checks.
            java.stop(kill=True)
            await leader.stop()
            await asyncio.gather(task, return_exceptions=True)

    ours = java.processed()
    lost = produced - set(seen) - ours.keys()
    handed = [
        r.getMessage()
        for r in caplog.records
        if r.name == "kclasync.assignment" and r.getMessage().endswith(" to java-1")
    ]
    log.warning(
        "kclasync leader -> Java worker: produced %d, lost %d, java-1 read %d on %s, "
        "leases it owned %s, writes %s, timings %s (total %.0f s)",
        len(produced),
        len(lost),
        len(ours.keys()),
        sorted(ours.shards),
        sorted(owned_by_java),
        handed,
        timings,
        time.monotonic() - t0,
    )
    assert not lost
    assert handed, "no assignment to java-1 logged by the kclasync leader"
    # Java read only shards of leases the kclasync leader gave it, each record once, and none
    # that kclasync read too: every move was a graceful handoff at a checkpoint.
    given = {m.group(1) for m in map(HANDED.search, handed) if m}
    assert ours.shards and ours.shards <= {key.rsplit(":", 1)[-1] for key in given}
    assert all(n == 1 for n in ours.deliveries.values()), "Java processed a record twice"
    assert not set(seen) & ours.keys(), "records read by both implementations"
    assert not java.parse_failures()
    assert not java.log_lines(r"is new leader"), "the Java worker took the lock"
