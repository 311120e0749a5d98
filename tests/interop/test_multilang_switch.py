"""The same properties file and the same amazon_kclpy processor, switched between the Java
MultiLangDaemon and ``kclasync multilang`` on one lease table, both ways: Java processes the
first part and stops (SIGTERM: its children get ``shutdownRequested`` and checkpoint; the daemon
is killed once it has stopped renewing its leases), kclasync runs the file (only ``workerId``
changed), resumes at Java's checkpoints and stops on SIGTERM too (its children checkpoint the
same way), and a second Java daemon resumes at kclasync's. Records carry (key, counter): 0 lost,
and a record processed twice must lie beyond the checkpoint its shard had at the switch (the
un-checkpointed batch)."""

from __future__ import annotations

import pathlib
import time
from collections.abc import Callable

import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import Delivery, beyond_checkpoints, checkpoints, delivered, produce
from tests.interop.java_kcl import STOPPED_TRACKING, JavaKcl
from tests.multilang.worker import MultiLangWorker
from tests.support import aws_for, wait_until

#: Two JVM start-ups (about 6 s each to the first read) plus kclasync's part: 23 s on a quiet
#: machine.
pytestmark = [pytest.mark.asyncio, pytest.mark.interop, pytest.mark.timeout(420)]


async def test_same_properties_java_then_kclasync_then_java(
    kinesis: LocalAws,
    unique_name: str,
    java_kcl: Callable[..., JavaKcl],
    tmp_path: pathlib.Path,
) -> None:
    timings: dict[str, float] = {}
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(2)
        sent = await produce(aws, 0, 200)
        assert await aws.create_leases() == 2  # Java starts on leases, without its random wait
        java1 = java_kcl(stream=unique_name, application=unique_name, worker_id="java-1")
        ours = tmp_path / "ml-1.properties"
        ours.write_text(
            java1.properties_file.read_text().replace("workerId = java-1", "workerId = ml-1")
        )
        ml = MultiLangWorker(ours, worker_id="ml-1", workdir=tmp_path)
        everyone: list[Callable[[], list[Delivery]]] = [java1.deliveries, ml.deliveries]

        def all_delivered() -> set[tuple[str, int]]:
            return set().union(*(delivered(d()) for d in everyone))

        try:
            started = time.monotonic()
            java1.start()

            async def java1_done() -> bool:
                assert java1.running, java1.log()[-3000:]
                return sent <= delivered(java1.deliveries())

            await wait_until(java1_done, 200, "the Java daemon to process the first part")
            timings["java-1 to all records"] = time.monotonic() - started
            java1.begin_stop()
            locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(unique_name))

            async def java1_stopped() -> bool:
                # Its leases no longer renewed and its leader lock deleted (left behind, the
                # lock would hold the second daemon back for its 120 s).
                if not java1.log_lines(STOPPED_TRACKING):
                    return False
                return await locks.get_lock("Leader") is None

            await wait_until(java1_stopped, 40, "the Java daemon to stop")
            # The rest of its stop (waiting for the processors' final shutdown until the
            # failover time) is not what this scenario checks.
            assert java1.stop(kill=True) is not None
            at_switch = await checkpoints(aws)
            allowed = beyond_checkpoints(java1.deliveries(), at_switch)

            sent |= await produce(aws, 200, 200)
            started = time.monotonic()
            ml.start()

            async def ml_done() -> bool:
                assert ml.running, ml.log()[-3000:]
                return sent <= all_delivered()

            await wait_until(ml_done, 60, "kclasync multilang to resume")
            timings["kclasync to all records"] = time.monotonic() - started
            twice = delivered(java1.deliveries()) & delivered(ml.deliveries())
            assert twice <= allowed, sorted(twice - allowed)[:10]
            assert ml.stop(grace=30) == 0, ml.log()[-3000:]
            at_switch = await checkpoints(aws)
            allowed |= beyond_checkpoints(ml.deliveries(), at_switch)

            java2 = java_kcl(stream=unique_name, application=unique_name, worker_id="java-2")
            everyone.append(java2.deliveries)
            sent |= await produce(aws, 400, 200)
            started = time.monotonic()
            java2.start()

            async def java2_done() -> bool:
                assert java2.running, java2.log()[-3000:]
                return sent <= all_delivered()

            await wait_until(java2_done, 200, "the second Java daemon to resume")
            timings["java-2 to all records"] = time.monotonic() - started
            before = delivered(java1.deliveries()) | delivered(ml.deliveries())
            twice = before & delivered(java2.deliveries())
            assert twice <= allowed, sorted(twice - allowed)[:10]
            assert not sent - all_delivered()
            assert not java2.parse_failures()
            print(f"\n{unique_name}: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
        finally:
            ml.stop(kill=True)
