"""Early failover in the runtime, on the in-memory adapters and the virtual-time loop: a killed
worker's leases are taken within about failover + two heartbeat periods while the periodic scans
run at the Java KCL's period, and a worker silent in the registry but still renewing keeps its
leases."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import (
    MemoryCoordinatorState,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStreamClient,
)
from kclasync._core.leases.lease import Lease
from kclasync._records import Record
from tests.runtime.virtual import in_virtual_time
from tests.support import wait_until

STREAM = "s"
FAILOVER = 10.0


async def ignore(records: Sequence[Record]) -> None:
    return None


def consumer(
    table: MemoryLeaseTable,
    client: MemoryStreamClient,
    name: str,
    locks: MemoryCoordinatorState | None = None,
    **cfg: object,
) -> Consumer:
    settings: dict[str, object] = {
        "failover_time": FAILOVER,
        "initial_position": "TRIM_HORIZON",
        "idle_time_between_reads": 0.5,
        "worker_id": name,
        **cfg,
    }
    return Consumer(
        stream_name=STREAM,
        application_name="app",
        processor=ignore,
        config=ConsumerConfig(**settings),  # type: ignore[arg-type]
        backend=AdapterBackend(
            MemoryLeaseStore(table), client, locks=None if locks is None else locks.shared()
        ),
        registry=CollectorRegistry(),
        rng=random.Random(name),
    )


def owners(table: MemoryLeaseTable) -> dict[str, str | None]:
    return {key: lease.owner for key, lease in table.leases.items()}


class Fleet:
    """Workers on one in-memory table and stream, each run as a task."""

    def __init__(self, *, one_leader: bool = False, shards: int = 4, **cfg: object) -> None:
        #: One leader lock for the fleet (else each worker leads alone).
        self.locks = MemoryCoordinatorState() if one_leader else None
        self.client = MemoryStreamClient()
        self.client.create_stream(STREAM, shards)
        self.table = MemoryLeaseTable()
        self.cfg = cfg
        self.consumers: dict[str, Consumer] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str) -> Consumer:
        c = consumer(self.table, self.client, name, self.locks, **self.cfg)
        self.consumers[name] = c
        self.tasks[name] = asyncio.create_task(c.run())
        return c

    async def start_all(self, names: tuple[str, ...], shards: int) -> dict[str, Consumer]:
        """Start ``names`` and wait until the table has ``shards`` leases, each worker some."""
        workers = {name: self.start(name) for name in names}
        await wait_until(
            lambda: (
                len(self.table.leases) == shards and set(owners(self.table).values()) == set(names)
            ),
            40 * FAILOVER,
            "leases on every worker",
        )
        return workers

    async def kill(self, name: str) -> None:
        """An abrupt stop (as SIGKILL): no release, no registry leave."""
        task = self.tasks.pop(name)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    async def both_hold(self) -> None:
        await wait_until(
            lambda: len(self.table.leases) == 4 and set(owners(self.table).values()) == {"a", "b"},
            20 * FAILOVER,
            "both workers holding leases",
        )

    async def close(self) -> None:
        for name in list(self.tasks):
            await self.kill(name)


@in_virtual_time
async def test_a_killed_workers_leases_are_taken_within_1_2x_with_scans_at_the_kcl_period() -> None:
    loop = asyncio.get_running_loop()
    fleet = Fleet()
    a = fleet.start("a")
    fleet.start("b")
    await fleet.both_hold()
    worker = a._worker
    assert worker is not None and worker.early_failover is not None
    # The periodic scan is back at the KCL 2.x period.
    assert worker.coordinator.taking.interval == 2 * (FAILOVER + 0.025)
    rng = random.Random(3)
    times: list[float] = []
    for _ in range(4):
        await asyncio.sleep(rng.uniform(0, FAILOVER))
        killed = loop.time()
        await fleet.kill("b")
        await wait_until(
            lambda: set(owners(fleet.table).values()) == {"a"}, 5 * FAILOVER, "a owning all"
        )
        times.append(loop.time() - killed)
        fleet.start("b")  # back with the same id: takes its share again
        await fleet.both_hold()
    # Every lease came through the early path, not a periodic scan.
    assert worker.early_failover.early_takes >= 4
    # failover + detection (two heartbeat periods of 0.5 s after the last heartbeat, plus up
    # to a read period) + the reads: within 1.2 x. (Less than the failover time when a had
    # read the final counter before the kill.)
    assert max(times) < 1.2 * FAILOVER, times
    await fleet.close()


@in_virtual_time
async def test_a_worker_silent_in_the_registry_but_renewing_keeps_its_leases() -> None:
    """The registry is only a hint: b stops heartbeating but goes on renewing; a reads b's
    leases, checks them when due, sees their counters moved and takes nothing."""
    loop = asyncio.get_running_loop()
    fleet = Fleet()
    a, b = fleet.start("a"), fleet.start("b")
    await fleet.both_hold()
    assert a._worker is not None and b._worker is not None
    early = a._worker.early_failover
    assert early is not None
    b_leases = sorted(k for k, owner in owners(fleet.table).items() if owner == "b")

    async def no_write(*args: object) -> None:
        return None

    b._worker.coordinator.presence.registry.report = no_write  # type: ignore[method-assign]
    silent_from = loop.time()
    await wait_until(lambda: early.silences >= 1, 5 * FAILOVER, "a noticing b's silence")
    assert loop.time() - silent_from < 2.0  # a few heartbeat periods
    reads = early.lease_reads
    # Past the check at the predicted expiry, and past a periodic scan: b keeps its leases.
    await asyncio.sleep(3 * FAILOVER)
    assert early.lease_reads > reads  # the check at the predicted expiry read them again
    assert sorted(k for k, owner in owners(fleet.table).items() if owner == "b") == b_leases
    assert early.early_takes == 0
    await fleet.close()


@in_virtual_time
async def test_a_worker_started_after_a_kill_does_not_follow_the_dead_workers_entry() -> None:
    """A SIGKILLed worker's entry stays in the registry. A worker started after its leases were
    taken never saw it heartbeat and finds none of its leases in its first scan: it does not
    query the owner index for it (the old code did, once per new worker)."""
    fleet = Fleet()
    a = fleet.start("a")
    fleet.start("b")
    await fleet.both_hold()

    def a_saw_b_beat() -> bool:
        early = a._worker.early_failover if a._worker is not None else None
        beat = early.view.beats.get("b") if early is not None else None
        return beat is not None and beat.moved

    # b dies in steady state (a has watched it beat), so a takes its leases early and the
    # leader's removal of b's entry (three failover times of silence) is still ahead when c
    # starts; c's arrival wakes a taking round in a, which must not remove it early.
    await wait_until(a_saw_b_beat, FAILOVER, "a watching b's heartbeat")
    await asyncio.sleep(2 * FAILOVER)  # virtual time: past start-up, every handoff settled
    await fleet.kill("b")
    await wait_until(
        lambda: set(owners(fleet.table).values()) == {"a"}, 5 * FAILOVER, "a owning all"
    )
    c = fleet.start("c")
    await wait_until(
        lambda: (
            c._worker is not None
            and c._worker.early_failover is not None
            and c._worker.early_failover.skipped_silences >= 1
        ),
        5 * FAILOVER,
        "c noticing b's stale entry",
    )
    assert c._worker is not None and c._worker.early_failover is not None
    early = c._worker.early_failover
    await asyncio.sleep(2 * FAILOVER)
    assert early.index_queries == 0 and early.lease_reads == 0 and early.silences == 0
    await fleet.close()


@in_virtual_time
async def test_the_leader_removes_a_killed_workers_entry_once_its_leases_are_taken() -> None:
    fleet = Fleet()
    a = fleet.start("a")
    fleet.start("b")
    await fleet.both_hold()
    await fleet.kill("b")
    await wait_until(
        lambda: set(owners(fleet.table).values()) == {"a"}, 5 * FAILOVER, "a owning all"
    )
    assert "b" in fleet.table.worker_metrics.items
    # a (the only worker, so the leader) removes it after three failover times and a scan
    # that shows b owning nothing.
    await wait_until(
        lambda: "b" not in fleet.table.worker_metrics.items, 8 * FAILOVER, "b's entry removed"
    )
    assert a._worker is not None and a._worker.early_failover is not None
    assert a._worker.early_failover.entries_removed == 1
    await fleet.close()


@in_virtual_time
async def test_two_followers_share_a_killed_workers_leases_without_waiting_for_retakes() -> None:
    """Three workers on 4 shards; the one holding two is killed. Both survivors follow it and
    check its leases when they expire; the one that checks second must count the lease the
    first one just took as that worker's (its last scan still shows it as the dead worker's),
    else its plan leaves the second lease to the first survivor and the lease waits for the
    retakes, a heartbeat period each, and then a full taking round."""
    loop = asyncio.get_running_loop()
    fleet = Fleet()
    for name, offset in (("a", 0.0), ("b", 0.13), ("c", 0.29)):
        await asyncio.sleep(offset)  # the followers read at different moments, as on hosts
        fleet.start(name)

    def counts() -> dict[str | None, int]:
        held: dict[str | None, int] = {}
        for owner in owners(fleet.table).values():
            held[owner] = held.get(owner, 0) + 1
        return held

    await wait_until(
        lambda: len(fleet.table.leases) == 4 and sorted(counts().values()) == [1, 1, 2],
        20 * FAILOVER,
        "the leases spread 2/1/1",
    )
    await asyncio.sleep(2 * FAILOVER)  # steady state: every worker has watched the others beat
    [victim] = [w for w, n in counts().items() if n == 2]
    assert victim is not None
    orphaned = sorted(k for k, owner in owners(fleet.table).items() if owner == victim)
    killed = loop.time()
    await fleet.kill(victim)
    taken_at: dict[str, float] = {}

    def all_taken() -> bool:
        now = loop.time()
        for key in orphaned:
            if owners(fleet.table)[key] != victim:
                taken_at.setdefault(key, now)
        return len(taken_at) == len(orphaned)

    await wait_until(all_taken, 5 * FAILOVER, "the survivors taking the dead worker's leases")
    survivors = {owners(fleet.table)[key] for key in orphaned}
    assert len(survivors) == 2, survivors  # one each
    times = sorted(t - killed for t in taken_at.values())
    # Both within the early path's bound, and the second take within a heartbeat period of
    # the first (the heartbeat interval is 0.5 s here): no retake rounds.
    assert times[-1] < 1.2 * FAILOVER, times
    assert times[-1] - times[0] < 0.5, times
    await fleet.close()


@in_virtual_time
async def test_followers_read_only_the_leaders_entry_and_still_fail_over_early() -> None:
    """The leader's silence digest: the other workers read one registry item per watch, not
    the whole registry, and a killed follower or a killed leader is still taken over early,
    the followers taking their share of its leases."""
    loop = asyncio.get_running_loop()
    fleet = Fleet(one_leader=True, shards=40)
    names = [f"w{i}" for i in range(8)]
    workers = {name: fleet.start(name) for name in names}

    def parts(name: str) -> Any:
        worker = workers[name]._worker
        assert worker is not None and worker.early_failover is not None
        return worker.early_failover

    await wait_until(
        lambda: len(fleet.table.leases) == 40 and set(owners(fleet.table).values()) == set(names),
        40 * FAILOVER,
        "leases on every worker",
    )
    leader = next(n for n in names if workers[n].is_leader)
    followers = [n for n in names if n != leader]
    await asyncio.sleep(FAILOVER)  # every follower has read the leader's digest by now
    before = {n: parts(n).registry_reads for n in names}
    own = {n: parts(n).leader_reads for n in followers}
    await asyncio.sleep(FAILOVER)
    for n in followers:
        assert parts(n).registry_reads == before[n], n
        # Two reads per heartbeat period (0.5 s) of the leader's entry alone.
        assert parts(n).leader_reads - own[n] >= 30, n
    assert parts(leader).registry_reads - before[leader] >= 30

    async def killed_and_taken(victim: str) -> float:
        killed = loop.time()
        await fleet.kill(victim)
        await wait_until(
            lambda: victim not in owners(fleet.table).values(), 5 * FAILOVER, "leases taken"
        )
        return loop.time() - killed

    # A follower killed: the others learn of it from the digest and take their share early.
    takes = {n: parts(n).early_takes for n in followers}
    took = await killed_and_taken(followers[0])
    assert took < 1.2 * FAILOVER + 1.0  # one heartbeat period more at most
    assert sum(parts(n).early_takes > takes[n] for n in followers[1:]) >= 2
    for n in followers[1:]:
        assert parts(n).follows_by_outcome["false_alarm"] == 0, n
    # The leader killed: the followers watch its entry's heartbeat and take its leases early.
    took = await killed_and_taken(leader)
    assert took < 1.2 * FAILOVER + 1.0
    await fleet.close()


class SlowDrain(MemoryLeaseStore):
    """An old owner whose last batch takes long: its handoff's last write lands late."""

    async def finish_handoff(self, lease: Lease) -> Lease | None:
        await asyncio.sleep(DRAIN)
        return await super().finish_handoff(lease)


DRAIN = 4.0


@in_virtual_time
async def test_a_worker_killed_while_leases_are_handed_to_it_is_taken_over_early() -> None:
    """``b`` asks ``a`` for leases and is killed at once; ``a`` finishes the handoffs late (a
    slow drain), after its follow of ``b`` first read them. That write changes the lease
    without ``b`` coming back: the follow must keep waiting for the lease to expire and take
    it, not leave it to the next taking round (KCL 2.x's period, 2 x the failover time)."""
    loop = asyncio.get_running_loop()
    fleet = Fleet()
    a = Consumer(
        stream_name=STREAM,
        application_name="app",
        processor=ignore,
        config=ConsumerConfig(
            failover_time=FAILOVER,
            initial_position="TRIM_HORIZON",
            idle_time_between_reads=0.5,
            worker_id="a",
        ),
        backend=AdapterBackend(SlowDrain(fleet.table), fleet.client),
        registry=CollectorRegistry(),
        rng=random.Random("a"),
    )
    fleet.consumers["a"] = a
    fleet.tasks["a"] = asyncio.create_task(a.run())
    await wait_until(
        lambda: len(fleet.table.leases) == 4 and set(owners(fleet.table).values()) == {"a"},
        20 * FAILOVER,
        "a holding every lease",
    )
    await asyncio.sleep(2 * FAILOVER)  # a has watched its own registry a while
    fleet.start("b")
    await wait_until(
        lambda: any(lease.checkpoint_owner == "a" for lease in fleet.table.leases.values()),
        20 * FAILOVER,
        "b asking a for leases",
    )
    killed = loop.time()
    await fleet.kill("b")
    worker = a._worker
    assert worker is not None and worker.early_failover is not None
    early = worker.early_failover
    await wait_until(
        lambda: "b" not in owners(fleet.table).values(),
        10 * FAILOVER,
        "a taking back what it handed to b",
    )
    took = loop.time() - killed
    # The handoff's last write, then one failover time unchanged, then a heartbeat period or two.
    assert took < DRAIN + 1.3 * FAILOVER, took
    assert early.early_takes >= 1
    await fleet.close()
