"""Java KCL 3.x -> kclasync on one lease table after the Java leader is killed (SIGKILL): the
Java daemon processes part of a stream and dies without releasing anything; a kclasync worker
then starts on the same tables, resumes at Java's checkpoints and processes the rest. Records
carry (key, counter), so lost and reprocessed records are counted exactly; the only records
kclasync may process again are those Java processed beyond the checkpoints it left. The leader
lock Java left behind carries its own ``leaseDuration`` (120 s in KCL 3.x): kclasync must not
take it before that, so the scenario checks it is left alone rather than waiting it out."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._adapters.worker_registry import worker_metrics_table_name
from kclasync.testing.emulators import LocalAws
from tests.interop.java_kcl import JavaKcl
from tests.interop.test_kclasync_to_java import Seen, beyond_checkpoints, produce
from tests.support import aws_for, wait_until

#: One JVM start-up (about 6 s to the first read) plus the scenario, 17 s on a quiet machine;
#: above the default timeout for a loaded one.
pytestmark = [pytest.mark.asyncio, pytest.mark.interop, pytest.mark.timeout(300)]

log = logging.getLogger(__name__)


async def test_java_killed_then_kclasync_loses_nothing(
    kinesis: LocalAws, unique_name: str, java_kcl: Callable[..., JavaKcl]
) -> None:
    timings: dict[str, float] = {}
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(4)
        produced = await produce(aws, 0, 1000)
        locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(unique_name))
        java = java_kcl(stream=unique_name, application=unique_name, worker_id="java-1")
        java.start()
        started = time.monotonic()

        # Java creates its tables on an empty application (the lease table with its schema and
        # owner index: what kclasync then adopts). On an empty lease table a KCL 3.x worker
        # waits a random 1-30 s, looking every 3 s for another worker to fill it; the leases
        # are written into Java's table as a kclasync worker's shard sync writes them, and Java
        # starts at its next look. Leases the Java KCL creates itself are read by kclasync in
        # ``test_java_reshard_to_kclasync`` (the split children).
        async def java_table() -> bool:
            assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
            try:
                table = await aws.dynamodb.describe_table(TableName=unique_name)
            except aws.dynamodb.exceptions.ResourceNotFoundException:
                return False
            return bool(table["Table"]["TableStatus"] == "ACTIVE")

        await wait_until(java_table, 60, "Java to create its lease table")
        # Java may have written some of them itself meanwhile (it ended its wait first).
        timings["leases written here"] = await aws.create_leases()
        assert len((await aws.store.list_leases()).leases) == 4

        async def java_done() -> bool:
            assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
            if not produced <= java.processed().keys():
                return False
            return await locks.get_lock("Leader") is not None  # the table exists by now

        await wait_until(java_done, 150, "Java to process the first part and lead")
        timings["Java phase"] = time.monotonic() - started
        java.stop(kill=True)  # SIGKILL: leases, lock and registry entry left behind
        ours = java.processed()
        scan = await aws.store.list_leases()
        assert not scan.corrupt
        checkpoints = {lease.shard_id: lease.checkpoint.value for lease in scan.leases}
        redo_allowed = beyond_checkpoints(ours.positions, checkpoints)
        left = await locks.get_lock("Leader")
        assert left is not None and left.owner == "java-1"
        java_entries = await DynamoWorkerMetrics(
            aws.dynamodb, worker_metrics_table_name(unique_name)
        ).list_workers()
        assert [e.worker_id for e in java_entries.entries] == ["java-1"]
        produced |= await produce(aws, 1000, 1000)

        seen = Seen()
        worker = aws.consumer(seen.handler(), worker_id="py-a")
        killed = time.monotonic()
        async with worker:

            def done() -> bool:
                if seen.deliveries and "until kclasync read" not in timings:
                    timings["until kclasync read"] = time.monotonic() - killed
                return produced <= ours.keys() | set(seen.deliveries)

            await wait_until(done, 90, "kclasync to process the rest")
            timings["kclasync phase"] = time.monotonic() - killed
            # The lock Java left is not expired before its own leaseDuration (120 s).
            assert not worker.is_leader
            lock = await locks.get_lock("Leader")
            assert lock is not None and lock.owner == "java-1"
        # The lease table holds leases only, before and after kclasync ran on it.
        raw = await aws.dynamodb.scan(TableName=unique_name, ConsistentRead=True)
        assert all("leaseCounter" in item for item in raw["Items"]), raw["Items"]

    lost = produced - ours.keys() - set(seen.deliveries)
    redone = ours.keys() & set(seen.deliveries)
    log.warning(
        "Java -> kclasync (SIGKILL): produced %d, lost %d, redone %d (allowed %d), timings %s",
        len(produced),
        len(lost),
        len(redone),
        len(redo_allowed),
        timings,
    )
    log.warning("Java became leader: %s", java.log_lines(r"is new leader")[:1])
    assert not lost
    assert redone <= redo_allowed, sorted(redone - redo_allowed)[:10]
    assert all(n == 1 for n in seen.deliveries.values()), "kclasync processed a record twice"
    assert not java.parse_failures(), java.parse_failures()[:5]
    assert java.log_lines(r"java-1 is new leader")
