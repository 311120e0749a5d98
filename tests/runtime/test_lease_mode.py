"""A worker with the default (worker-side) lease taker in a fleet whose other workers only
process what a leader assigns, as Java KCL 3.x workers do in ``CLIENT_VERSION_3X``.

On the in-memory backend: the stand-in for a Java worker is a kclasync worker with
``lease_taker="kcl3"`` (it never takes a lease it was not assigned while another worker holds
the lock) whose registry entry carries no ``impl`` marker and no heartbeat, as a Java entry;
the ``Migration3.0`` item a Java worker writes is set on the backend's coordinator state,
before or after the default worker started. A stand-in "killed" is cancelled abruptly: its
leases, lock and entry stay behind, as after SIGKILL.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Sequence

import attrs
import pytest
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._core.leases.client_version import decode_migration_item
from kclasync._core.workers.worker_metrics import WorkerMetrics
from kclasync._records import Record
from kclasync._runtime.worker_presence import WorkerPresence
from kclasync.testing import MemoryBackend

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(60)]

STREAM = "s"
SHARDS = 4
FAST = {
    "initial_position": "TRIM_HORIZON",
    "failover_time": 1.0,
    "idle_time_between_reads": 0.05,
    "shutdown_timeout": 2.0,
    "leader_lock_duration": 1.0,
    "leader_heartbeat_interval": 0.2,
}


@pytest.fixture(autouse=True)
def java_like_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers named ``java-*`` write registry entries as a Java KCL worker does."""
    write = WorkerPresence._write

    async def as_java(self: WorkerPresence, entry: WorkerMetrics) -> bool:
        if self.worker_id.startswith("java"):
            entry = attrs.evolve(
                entry, implementation=None, heartbeat=None, heartbeat_interval=None
            )
        return await write(self, entry)

    monkeypatch.setattr(WorkerPresence, "_write", as_java)


def java_writes(backend: MemoryBackend, cv: str) -> None:
    """What a Java KCL 3.x worker's migration state machine leaves in ``Migration3.0``."""
    state = decode_migration_item({"cv": {"S": cv}, "mb": {"S": "java-1"}})
    backend._locks.set_migration_state(state)


class Fleet:
    def __init__(self) -> None:
        self.backend = MemoryBackend()
        self.backend.create_stream(STREAM, shard_count=SHARDS)
        self.seen: dict[str, Counter[bytes]] = {}
        self.produced: list[bytes] = []

    def consumer(self, worker_id: str, **config: object) -> Consumer:
        seen = self.seen.setdefault(worker_id, Counter())

        async def handle(records: Sequence[Record]) -> None:
            for record in records:
                seen[record.data] += 1

        return Consumer(
            stream_name=STREAM,
            application_name="app",
            processor=handle,
            config=ConsumerConfig(worker_id=worker_id, **{**FAST, **config}),  # type: ignore[arg-type]
            backend=self.backend,
            registry=CollectorRegistry(),
        )

    def java_3x(self, worker_id: str = "java-like", **config: object) -> Consumer:
        """A Java 3.x stand-in on a table whose ``Migration3.0`` item says ``3X``."""
        java_writes(self.backend, "CLIENT_VERSION_3X")
        return self.consumer(worker_id, lease_taker="kcl3", **config)

    async def read_by(self, *workers: str) -> None:
        """Wait until every record produced was read by one of ``workers``."""
        everything = set(self.produced)
        await until(
            lambda: everything <= set().union(*(self.seen.get(w, ()) for w in workers)),
            "every record read",
        )

    async def produce(self, stop: asyncio.Event) -> None:
        n = 0
        while not stop.is_set():
            for shard in range(SHARDS):
                data = f"{shard}-{n}".encode()
                self.backend.put_record(STREAM, f"pk-{shard}-{n}", data)
                self.produced.append(data)
            n += 1
            await asyncio.sleep(0.02)


async def until(check: object, what: str, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


def leads_all(worker: Consumer) -> bool:
    return len(worker.held_leases) == SHARDS and worker.is_leader


def switch_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and "follows the leader's assignment" in r.getMessage()
    ]


async def test_a_default_leader_assigns_a_follower_its_share_once_the_table_is_in_3x(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    fleet = Fleet()
    first = fleet.consumer("py-1")  # the default lease taker: balanced
    stop = asyncio.Event()
    producing = asyncio.create_task(fleet.produce(stop))
    async with first:
        await until(lambda: leads_all(first), "py-1")
        follower = fleet.consumer("java-like", lease_taker="kcl3")
        async with follower:
            worker = first._worker
            assert worker is not None
            assert worker.lease_mode.mode is not None
            assert not worker.lease_mode.mode.leader_assigns
            rounds = worker.coordinator.taking.rounds
            java_writes(fleet.backend, "CLIENT_VERSION_3X")
            await until(lambda: len(follower.held_leases) >= 1, "the follower's share")
            assert worker.coordinator.taking.leader_assigns
            await until(lambda: worker.assignment.writes_ok >= 1, "an assignment write")
            # No taking round ran after the switch (at most the one in flight when it came).
            assert worker.coordinator.taking.rounds <= rounds + 1
            assert first.is_leader, "the lock moved instead of the leader assigning"
            await until(lambda: bool(fleet.seen["java-like"]), "the follower to read")
            stop.set()
            await producing
            await fleet.read_by("py-1", "java-like")
    assert len(switch_warnings(caplog)) == 1, switch_warnings(caplog)
    assert "CLIENT_VERSION_3X" in switch_warnings(caplog)[0]
    assert fleet.seen["java-like"], "the follower read nothing"
    # Each lease moved by a graceful handoff at the old owner's checkpoint: no record twice.
    both = fleet.seen["py-1"] + fleet.seen["java-like"]
    assert max(both.values()) == 1, [k for k, n in both.items() if n > 1][:5]


async def test_a_default_worker_joining_a_3x_table_never_takes_a_lease_itself(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    fleet = Fleet()
    leader = fleet.java_3x()
    async with leader:
        await until(lambda: leads_all(leader), "leader")
        joining = fleet.consumer("py-1")  # the default lease taker: balanced
        stop = asyncio.Event()
        producing = asyncio.create_task(fleet.produce(stop))
        async with joining:
            await until(lambda: len(joining.held_leases) >= 1, "the leader to assign py-1")
            worker = joining._worker
            assert worker is not None
            assert worker.coordinator.taking.rounds == 0, "a taking round ran on a 3X table"
            assert worker.early_failover is None or (worker.early_failover.early_takes == 0)
            assert leader.is_leader
            await until(lambda: bool(fleet.seen.get("py-1")), "py-1 to read")
            stop.set()
            await producing
            await fleet.read_by("py-1", "java-like")
    assert len(switch_warnings(caplog)) == 1
    both = fleet.seen.get("py-1", Counter()) + fleet.seen["java-like"]
    assert set(fleet.produced) <= set(both)
    assert max(both.values()) == 1


async def test_a_rollback_to_2x_gives_the_worker_its_own_taking_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    fleet = Fleet()
    leader = fleet.java_3x()
    stop = asyncio.Event()
    producing = asyncio.create_task(fleet.produce(stop))  # the leader balances by throughput
    async with leader:
        await until(lambda: leads_all(leader), "leader")
        joining = fleet.consumer("py-1", lease_taker_interval=0.5)
        async with joining:
            worker = joining._worker
            assert worker is not None
            await until(lambda: len(joining.held_leases) >= 1, "py-1 to be assigned a share")
            assert worker.coordinator.taking.rounds == 0
            java_writes(fleet.backend, "CLIENT_VERSION_2X")
            await until(lambda: worker.coordinator.taking.rounds >= 1, "a taking round")
            assert not worker.coordinator.taking.leader_assigns
            assert len(joining.held_leases) >= 1, "the switch dropped leases"
            assert worker.lease_mode.switches == 1
            stop.set()
            await producing
    assert any("takes leases itself again" in r.getMessage() for r in caplog.records)


async def test_a_lone_default_worker_on_a_3x_table_takes_leases_itself() -> None:
    """No Java worker ever reported: nothing to wait for."""
    fleet = Fleet()
    java_writes(fleet.backend, "CLIENT_VERSION_3X")
    alone = fleet.consumer("py-1", lease_taker_interval=0.5)
    async with alone:
        worker = alone._worker
        assert worker is not None
        await until(lambda: len(alone.held_leases) == SHARDS, "py-1 to take every lease")
        assert not worker.coordinator.taking.leader_assigns
        assert worker.coordinator.taking.rounds >= 1


async def crash(task: asyncio.Task[None]) -> None:
    """Stop a worker abruptly: its leases, the lock and its registry entry stay behind."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_a_default_worker_starting_after_the_java_fleet_died_takes_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The dead Java leader's lock (60 s here, 120 s in the KCL) is not waited for: the Java
    workers' signs of life (entry, lease counters) stand still for a failover time."""
    caplog.set_level(logging.INFO)
    fleet = Fleet()
    java = fleet.java_3x("java-1", leader_lock_duration=60.0)
    java_run = asyncio.create_task(java.run())
    await until(lambda: leads_all(java), "java-1 leads")
    await crash(java_run)
    stop = asyncio.Event()
    producing = asyncio.create_task(fleet.produce(stop))
    py = fleet.consumer("py-1", lease_taker_interval=0.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with py:
        await until(lambda: len(py.held_leases) == SHARDS, "py-1 to take every lease", 15.0)
        took = loop.time() - started
        worker = py._worker
        assert worker is not None
        assert not worker.coordinator.taking.leader_assigns
        assert not py.is_leader, "the dead leader's lock was taken before its duration"
        stop.set()
        await producing
        await fleet.read_by("py-1")
    # The probation (one failover time), then a taking round after expiry: well within
    # 5 x the failover time (1 s) plus a taking interval.
    assert took < 5 * 1.0 + 0.5 + 2.0, took


async def test_a_java_leader_killed_under_a_default_follower_is_taken_over(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    fleet = Fleet()
    java = fleet.java_3x("java-1", leader_lock_duration=60.0)
    java_run = asyncio.create_task(java.run())
    stop = asyncio.Event()
    producing = asyncio.create_task(fleet.produce(stop))
    try:
        await until(lambda: leads_all(java), "java-1 leads")
        py = fleet.consumer("py-1", lease_taker_interval=0.5)
        async with py:
            worker = py._worker
            assert worker is not None
            await until(lambda: len(py.held_leases) >= 1, "java-1 to assign py-1 a share")
            assert worker.coordinator.taking.leader_assigns
            assert worker.coordinator.taking.rounds == 0
            await crash(java_run)
            loop = asyncio.get_running_loop()
            killed = loop.time()
            await until(lambda: len(py.held_leases) == SHARDS, "py-1 to take over", 20.0)
            took = loop.time() - killed
            assert not worker.coordinator.taking.leader_assigns
            assert not py.is_leader
            stop.set()
            await producing
            await fleet.read_by("py-1", "java-1")
    finally:
        stop.set()
        await crash(java_run)
    assert any("takes leases itself again" in r.getMessage() for r in caplog.records)
    # The entry's window (3 observed report periods, at least the failover time), the
    # leases' expiry and a taking round: within a few failover times.
    assert took < 10.0, took
