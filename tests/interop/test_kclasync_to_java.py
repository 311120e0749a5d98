"""kclasync -> Java KCL 3.x on one lease table: kclasync workers process part of a stream and
stop (one abruptly, then the leader gracefully, as in a rolling deploy after a crash); a Java
MultiLangDaemon then starts on the same tables and must process the rest. Records carry (key,
counter), so lost and reprocessed records are counted exactly; the only records Java may process
again are those kclasync processed beyond the checkpoints it left in the lease table."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence

import orjson
import pytest

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import produce
from tests.interop.java_kcl import JavaKcl
from tests.support import aws_for, wait_until

#: One JVM start-up (about 6 s to the first read) plus the scenario, 8 s on a quiet machine;
#: above the default timeout for a loaded one.
pytestmark = [pytest.mark.asyncio, pytest.mark.interop, pytest.mark.timeout(300)]

log = logging.getLogger(__name__)

KEYS = 53


class Seen:
    """What kclasync processed: (key, counter) -> deliveries and (shard, sequence number)."""

    def __init__(self) -> None:
        self.deliveries: Counter[tuple[str, int]] = Counter()
        self.positions: dict[tuple[str, int], tuple[str, str]] = {}

    def handler(self) -> Callable[[Sequence[Record]], asyncio.Future[None]]:
        async def handle(records: Sequence[Record]) -> None:
            for r in records:
                body = orjson.loads(r.data)
                rid = (str(body["k"]), int(body["c"]))
                self.deliveries[rid] += 1
                self.positions.setdefault(rid, (r.shard_id, r.sequence_number))

        return handle  # type: ignore[return-value]


def beyond_checkpoints(
    positions: dict[tuple[str, int], tuple[str, str]], checkpoints: dict[str, str]
) -> set[tuple[str, int]]:
    """Records processed after the checkpoint of their shard (may legitimately be redone)."""
    out = set()
    for rid, (shard, seq) in positions.items():
        cp = checkpoints.get(shard, "TRIM_HORIZON")
        if not cp.isdigit() or int(seq) > int(cp):
            out.add(rid)
    return out


async def test_kclasync_then_java_loses_nothing(
    kinesis: LocalAws, unique_name: str, java_kcl: Callable[..., JavaKcl]
) -> None:
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(4)
        produced = await produce(aws, 0, 1000)
        seen = Seen()
        config = {"leader_lock_duration": 6.0, "leader_heartbeat_interval": 1.0}
        workers = [aws.consumer(seen.handler(), worker_id=f"py-{n}", **config) for n in "ab"]
        tasks = [asyncio.create_task(w.run()) for w in workers]
        await wait_until(lambda: produced <= set(seen.deliveries), 60, "kclasync to read")
        await wait_until(lambda: any(w.is_leader for w in workers), 30, "a kclasync leader")
        lead = 0 if workers[0].is_leader else 1
        # The follower first, abruptly (its leases and registry entry left behind), then the
        # leader gracefully: it deletes the lock, so the Java worker leads at its first try
        # (a lock left to expire costs it 30 s, its fixed interval between tries; that path
        # is test_leader_and_registry's).
        tasks[1 - lead].cancel()
        await asyncio.gather(tasks[1 - lead], return_exceptions=True)
        await workers[lead].stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        locks = DynamoCoordinatorState(aws.dynamodb, coordinator_table_name(unique_name))
        assert await locks.get_lock("Leader") is None, "the graceful leader left its lock"
        timings["kclasync phase"] = time.monotonic() - t0
        scan = await aws.store.list_leases()
        checkpoints = {lease.shard_id: lease.checkpoint.value for lease in scan.leases}
        redo_allowed = beyond_checkpoints(seen.positions, checkpoints)
        produced |= await produce(aws, 1000, 1000)

        java = java_kcl(stream=unique_name, application=unique_name, worker_id="java-1")
        java.start()
        started = time.monotonic()

        def done() -> bool:
            failures = java.parse_failures()
            assert not failures, "Java KCL could not parse the lease table:\n" + "\n".join(
                failures[:5]
            )
            assert java.running, "the Java daemon exited:\n" + java.log()[-3000:]
            got = java.processed().keys()
            if got and "until Java read" not in timings:
                timings["until Java read"] = time.monotonic() - started
            return produced <= set(seen.deliveries) | got

        await wait_until(done, 150, "Java to process the rest")
        timings["Java phase"] = time.monotonic() - started
        # The scenario is over: no graceful shutdown (about 5 s) that nothing checks.
        java.stop(kill=True)
        ours = java.processed()

    lost = produced - set(seen.deliveries) - ours.keys()
    redone = set(seen.deliveries) & ours.keys()
    log.warning(
        "kclasync -> Java: produced %d, lost %d, redone %d (allowed %d), timings %s",
        len(produced),
        len(lost),
        len(redone),
        len(redo_allowed),
        timings,
    )
    log.warning("Java became leader: %s", java.log_lines(r"is new leader")[:1])
    assert not lost
    assert redone <= redo_allowed, sorted(redone - redo_allowed)[:10]
    assert all(n == 1 for n in ours.deliveries.values()), "Java processed a record twice"
    assert not java.parse_failures()
    # Only the leader assigns in KCL 3.x: Java took the lock the kclasync leader released.
    assert java.log_lines(r"java-1 is new leader")
