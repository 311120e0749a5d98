"""One application's tables shared with the real Java KCL 3.x (the MultiLangDaemon of kclpy-ext),
both ways, in two stories on two applications, one JVM at a time.

Story 1 (kclasync first, then a Java leader):
  kclasync workers read, the stream is split and merged while they read, every kclasync worker
  is killed (SIGKILL) -> Java takes the expired kclasync lock, finishes the parents, reads the
  children -> a kclasync worker with a CPU source joins: mixed fleet under a producer for
  ``MIXED_SECONDS``, Java leading -> the Java leader is killed -> the kclasync worker takes the
  lock once its 120 s ``leaseDuration`` is over (the KCL's fixed value), assigns itself the
  leases and reads the rest. That wait runs while story 2 has the JVM.
Story 2 (kclasync leads, Java joins):
  two kclasync workers under a producer, one leading (they start during story 1's mixed fleet,
  no JVM needed) -> a Java worker joins once the Java leader of story 1 is killed: mixed fleet for
  ``MIXED_SECONDS`` -> one kclasync worker stops gracefully, the kclasync leader is killed ->
  Java takes the lock and the leases -> Java stops gracefully (deleting the lock) -> a kclasync
  worker leads at once and reads the rest.

Records carry (key, counter): lost and reprocessed records are counted exactly. Every duplicate
must be a record processed after the checkpoint its shard had when its worker was killed; the
lease table must hold only leases at every sample; the Java log must show no parse failure.

About 170 s with one JVM at a time, and not much less: two waits are the Java KCL's own. A
worker that is not the leader looks at the lock only every 30 s (its fixed heartbeat) and takes
an expired lock at the first look that finds it unchanged since the previous one, so story 1's
Java worker leads about 31 s after its start (its first look is at its start-up) and story 2's
30-60 s after the kclasync leader died; the Java lock's fixed 120 s then run from story 1's
Java take (its last heartbeat) plus the few seconds until py-c first looks at it. Story 2 runs
inside that wait. It runs with the rest of the interop suite.
"""

from __future__ import annotations

import asyncio
import logging
import pathlib
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._adapters.worker_registry import worker_metrics_table_name
from kclasync._core.workers import worker_metrics as wm
from kclasync.testing.emulators import LocalAws
from tests.interop.fleet import (
    ASSIGNMENT_INTERVAL,
    KclasyncProcess,
    Producer,
    children_after_parents,
    delivered,
    owner_change_times,
    ping_pong,
    reshard,
    unexplained_switches,
)
from tests.interop.java_kcl import JavaKcl
from tests.interop.story import Mixed, Story, leader, owners, report
from tests.support import aws_for, wait_until

#: Two JVM runs, two mixed-fleet windows and the Java lock's 120 s, partly overlapping.
pytestmark = [
    pytest.mark.asyncio,
    pytest.mark.interop,
    pytest.mark.timeout(480),
]

log = logging.getLogger(__name__)

#: Each mixed-fleet window: eight assignment runs of a kclasync leader (every
#: ``fleet.ASSIGNMENT_INTERVAL``; a Java leader runs twice as often) with records flowing, and
#: five failover times (a follower taking leases itself would do so at its first taking round,
#: every ``FAILOVER``).
MIXED_SECONDS = 8 * ASSIGNMENT_INTERVAL
#: failoverTimeMillis / failover_time on both sides; a lease moved abruptly may be read by
#: both implementations for about this long (plus a batch).
FAILOVER = 3.0
#: The leader lock's leaseDuration the Java KCL 3.x writes (not configurable).
JAVA_LOCK_SECONDS = 120.0
#: kclasync's leaseDuration here (``fleet.KCLASYNC_CONFIG``).
LOCK_SECONDS = 6.0


async def mixed_fleet(story: Story, scenario: str, since: float, leader_log: str) -> None:
    """Hold the mixed fleet for ``MIXED_SECONDS`` from ``since``. Every owner change must be
    one the leader logged (``leader_log`` names the lease and the new owner as ``{key}`` and
    ``{worker}``: no follower moved a lease itself), and no shard may pass between the
    implementations except around an owner change (both never read it at once)."""
    while time.time() - since < MIXED_SECONDS:
        story.check_alive()
        await asyncio.sleep(1.0)
    until = time.time()
    moves = story.watch.owner_changes(since, until)
    logs = "\n".join(w.log() for w in story.workers) + "\n".join(j.log() for j in story.jvms)
    by_follower = [
        (key, owner)
        for key, owners in moves.items()
        for owner in owners[1:]
        if leader_log.format(key=key, worker=owner) not in logs
    ]
    assert not by_follower, (scenario, "moves no leader made", by_follower)
    changes = owner_change_times(story.watch.samples)
    both = unexplained_switches(story.deliveries(), changes, since, until, FAILOVER + 2.0)
    assert not both, (scenario, "read by both implementations", both)
    story.mixed.append(
        Mixed(
            scenario,
            round(until - since),
            sum(len(v) - 1 for v in moves.values()),
            ping_pong(moves),
        )
    )


async def story_one_until_java_leader_killed(
    s: Story, during_mixed: Callable[[], Any]
) -> Callable[[], Any]:
    aws = s.aws
    first = [s.kclasync("py-a", held=True), s.kclasync("py-b", held=True)]
    joined = s.kclasync("py-c", held=True)  # joins the Java leader later
    await aws.create_stream(4)
    s.watch.start()
    await s.produce(600)
    for worker in first:
        worker.release()
    await s.all_read("kclasync to read the first part", 90)
    lineage = await reshard(aws)  # while kclasync reads
    await s.produce(400)
    await wait_until(
        lambda: any(d.rid[1] >= 600 for d in s.deliveries()), 30, "kclasync to read on"
    )
    for worker in first:
        worker.stop(kill=True)
    before = s.deliveries()
    allowed = await s.killed_or_stopped(before)
    java = s.java("java-1")
    started = time.time()
    await s.all_read("Java to finish the parents and read the children", 150)
    s.row("kclasync (all SIGKILL, mid-reshard) -> Java", delivered(before), allowed, started)
    assert not children_after_parents(s.deliveries(), lineage)
    took, beat = s.watch.leader_since("java-1"), s.watch.last_version_change("py-a", "py-b")
    assert took is not None and beat is not None and took - beat >= LOCK_SECONDS - 1.0

    # Mixed fleet, Java first: the Java leader assigns to a kclasync worker that has a CPU
    # source (which leaves CPU out of its entry while java-1 reports none).
    producer = s.producer(100)
    joined.release()
    await wait_until(lambda: "py-c" in owners(s).values(), 60, "the Java leader to assign py-c")
    since = time.time()
    during_mixed()
    registry = DynamoWorkerMetrics(aws.dynamodb, worker_metrics_table_name(aws.name))
    entries = {e.worker_id: e for e in (await registry.list_workers()).entries}
    assert wm.uses_default_metric(entries["java-1"]), entries["java-1"]
    assert entries["py-c"].implementation == "kclasync" and wm.uses_default_metric(entries["py-c"])
    assert "not reporting CPU" in joined.log(), joined.log()[-2000:]
    assert java.log_lines(r"Assigning lease : \S+ to worker : py-c")
    await mixed_fleet(
        s, "mixed fleet, Java first", since, "Assigning lease : {key} to worker : {worker}"
    )
    s.produced |= await producer.stop()
    await s.all_read("the mixed fleet to read everything")

    # The Java leader is killed; py-c takes the lock once its leaseDuration is over.
    java.stop(kill=True)
    killed = time.time()
    java_side = [d for d in s.deliveries() if d.who == "java-1"]
    allowed = await s.killed_or_stopped(java_side)
    await s.produce(300)

    async def rest() -> None:
        await wait_until(lambda: leader(s) == "py-c", JAVA_LOCK_SECONDS + 60, "py-c to lead")
        took = s.watch.leader_since("py-c")
        last_beat = s.watch.last_version_change("java-1")
        assert took is not None and last_beat is not None
        assert took - last_beat >= JAVA_LOCK_SECONDS - 2.0, (took, last_beat)
        await s.all_read("py-c to assign itself Java's leases and read the rest", 60)
        s.row("Java leader SIGKILL -> kclasync takes lock", delivered(java_side), allowed, killed)
        s.rows[-1].until_read = round(took - killed, 1)  # reading waits for the lock here
        joined.stop()

    return rest


@attrs.define
class KclasyncFleet:
    """Story 2 before the Java worker joins: two kclasync workers reading under a producer."""

    producer: Producer
    leader: KclasyncProcess
    other: KclasyncProcess


async def story_two_kclasync(s: Story) -> KclasyncFleet:
    """Needs no JVM: it runs during story 1's mixed fleet."""
    aws = s.aws
    await aws.create_stream(4)
    s.watch.start()
    producer = s.producer(100)
    py_x = s.kclasync("py-x")
    await wait_until(lambda: leader(s) == "py-x", 30, "py-x to lead")
    py_w = s.kclasync("py-w")
    await wait_until(lambda: bool(s.deliveries()), 60, "kclasync to read")
    return KclasyncFleet(producer, py_x, py_w)


async def story_two(s: Story, fleet: KclasyncFleet) -> None:
    producer, py_x, py_w = fleet.producer, fleet.leader, fleet.other
    assert leader(s) == "py-x"
    java = s.java("java-2")
    await wait_until(lambda: "java-2" in owners(s).values(), 90, "kclasync to assign java-2")
    await wait_until(lambda: bool(java.deliveries()), 60, "java-2 to read")
    since = time.time()
    await mixed_fleet(s, "mixed fleet, kclasync first", since, "lease {key} to {worker}")

    # kclasync -> Java: one kclasync worker stops gracefully, then the kclasync leader is killed.
    py_w.stop()
    assert leader(s) == "py-x"
    s.produced |= await producer.stop()
    await s.all_read("the mixed fleet to read everything")
    py_x.stop(kill=True)
    killed = time.time()
    py_side = [d for d in s.deliveries() if d.who.startswith("py")]
    allowed = await s.killed_or_stopped(py_side)
    await s.produce(300)
    await wait_until(lambda: leader(s) == "java-2", 90, "java-2 to take the lock")
    took, beat = s.watch.leader_since("java-2"), s.watch.last_version_change("py-x")
    assert took is not None and beat is not None and took - beat >= LOCK_SECONDS - 1.0
    await s.all_read("java-2 to read the rest")
    s.row("kclasync leader SIGKILL -> Java takes lock", delivered(py_side), allowed, killed)
    s.rows[-1].until_read = round(took - killed, 1)

    # Java -> kclasync after a graceful stop. (Not across a reshard: with finished parent
    # shards still leased, the 3.1.3 daemon's graceful shutdown waits for their processors'
    # shutdown notification until shutdownGraceMillis runs out and exits without releasing the
    # leases or deleting the lock, observed three times; the rollback then waits 120 s.)
    await s.produce(400)
    java.stop()
    stopped = time.time()
    assert (await s.watch.sample()).leader is None  # deleted on a graceful stop
    java_side = [d for d in s.deliveries() if d.who == "java-2"]
    allowed = await s.killed_or_stopped(java_side)
    last = s.kclasync("py-y")
    await wait_until(lambda: leader(s) == "py-y", 20, "py-y to lead at once")
    await s.all_read("kclasync to finish the parents and read the children")
    s.row("Java (graceful) -> kclasync", delivered(java_side), allowed, stopped)
    last.stop()


async def test_migration_rollback_and_mixed_fleets(
    kinesis: LocalAws, java_kcl: Callable[..., JavaKcl], tmp_path: pathlib.Path
) -> None:
    stamp = f"{time.time_ns() % 10**10}"
    async with aws_for(kinesis, f"one-{stamp}") as aws1, aws_for(kinesis, f"two-{stamp}") as aws2:
        one = Story(aws1, kinesis, tmp_path / "one", java_kcl)
        two = Story(aws2, kinesis, tmp_path / "two", java_kcl)
        tasks: list[asyncio.Task[Any]] = []
        try:
            # Story 2's kclasync workers start during story 1's mixed fleet (no JVM there);
            # its Java worker joins once java-1 is killed.
            fleet: list[asyncio.Task[KclasyncFleet]] = []

            def start_two() -> None:
                fleet.append(asyncio.create_task(story_two_kclasync(two)))
                tasks.append(fleet[0])

            rest = await story_one_until_java_leader_killed(one, start_two)
            tail = asyncio.create_task(rest())  # the 120 s lock wait, while story 2 runs
            tasks.append(tail)
            await story_two(two, await fleet[0])
            await asyncio.wait_for(tail, JAVA_LOCK_SECONDS + 120)
        finally:
            for task in tasks:
                task.cancel()
            one.stop_all()
            two.stop_all()
            await one.watch.stop()
            await two.watch.stop()
        for story in (one, two):
            story.check_alive()
            assert not story.produced - delivered(story.deliveries())
            dupes = story.duplicates()
            assert set(dupes) <= story.allowed, sorted(set(dupes) - story.allowed)[:10]
    report(one, two)
