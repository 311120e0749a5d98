"""Leader-based assignment on the in-memory table: the leader's writes, the followers' discovery
through the owner index, graceful moves, and giving the lock up after failed runs."""

from __future__ import annotations

import asyncio
import functools
import random

import attrs
import pytest
from prometheus_client import CollectorRegistry

from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable
from kclasync._config import LeaseTakerKind
from kclasync._core.assignment.balanced_taker import BalancedLeaseTaker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._runtime.assignment import LeaderAssignment
from kclasync._runtime.assignment_discovery import AssignmentDiscovery
from kclasync._runtime.lease_coordinator import HeldLease, HeldState, LeaseCoordinator
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.wiring import lease_coordinator
from kclasync._simulation.clock import run_virtual
from kclasync.errors import AdapterError
from tests.runtime.virtual import WALL_LIMIT, in_virtual_time


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def lease_acquired(self, held: HeldLease) -> None:
        self.log.append(("acquired", held.key))

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        self.log.append(("lost", held.key))

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        self.log.append(("stop", held.key))


class Elector:
    def __init__(self) -> None:
        self.leader = True
        self.released = 0
        #: Leadership terms won (the leader waits one failover time into a new term).
        self.terms = 1

    def is_leader(self) -> bool:
        return self.leader

    async def release(self) -> None:
        self.released += 1
        self.leader = False


def coordinator(name: str, table: MemoryLeaseTable) -> LeaseCoordinator:
    store = MemoryLeaseStore(table)
    return lease_coordinator(
        store=store,
        registry=store.worker_registry(),
        worker_id=name,
        failover_time=10.0,
        renewer_interval=3.0,
        taker_interval=10.0,
        taker=BalancedLeaseTaker(),
        max_leases_for_worker=None,
        max_leases_to_steal=None,
        metrics=ConsumerMetrics(CollectorRegistry()),
        application="app",
        listener=Events(),
        rng=random.Random(0),
        graceful_handoff=True,
    )


def leader_of(c: LeaseCoordinator, policy: LeaseTakerKind, elector: Elector) -> LeaderAssignment:
    c.taking.leader_assigns = True  # as the wiring sets it for a leader-based taker
    return LeaderAssignment(
        holder=c,
        elector=elector,  # type: ignore[arg-type]
        policy=policy,
        interval=20.0,
        registry=c.presence.registry,
        rng=random.Random(1),
    )


@pytest.mark.parametrize("policy", [LeaseTakerKind.LOAD, LeaseTakerKind.KCL3])
async def test_leader_assigns_and_followers_discover_through_the_index(
    policy: LeaseTakerKind,
) -> None:
    table = MemoryLeaseTable()
    workers = {name: coordinator(name, table) for name in ("a", "b", "c")}
    for c in workers.values():
        await c.presence.report()
    for i in range(6):
        await workers["a"].store.create_lease(Lease(key=f"s{i}"))
    leader = leader_of(workers["a"], policy, Elector())
    plan = await leader.run_once()
    assert len(plan.assignments) == 6 and not plan.moves
    owners = [table.leases[f"s{i}"].owner for i in range(6)]
    if policy is LeaseTakerKind.LOAD:
        assert sorted(owners) == ["a", "a", "b", "b", "c", "c"]
    else:  # KCL 3.x counts leases without throughput as 0: they may pile up on one worker
        assert set(owners) <= {"a", "b", "c"}
    for name, c in workers.items():
        discovery = AssignmentDiscovery(holder=c, interval=3.0)
        taken = await discovery.discover_once()
        assert sorted(taken) == sorted(f"s{i}" for i in range(6) if owners[i] == name)
        assert all(c.held[k].state is HeldState.ACTIVE for k in taken)
        assert c.store.calls["lease_keys_of"] == 1
        # only the leader scans
        assert ("list_leases" in c.store.calls) == (name == "a")
        # nothing new: one query, no reads
        assert await discovery.discover_once() == [] and discovery.reads == len(taken)
    # A second run assigns nothing again.
    assert not (await leader.run_once()).assignments


@in_virtual_time
async def test_a_move_is_a_graceful_handoff_picked_up_after_the_checkpoint() -> None:
    table = MemoryLeaseTable()
    a, b = coordinator("a", table), coordinator("b", table)
    await a.presence.report()
    await b.presence.report()
    for i in range(4):
        await a.store.create_lease(Lease(key=f"s{i}", owner=None))
        table.leases[f"s{i}"] = Lease(key=f"s{i}", owner="a", counter=1, throughput_kbps=10.0)
    for i in range(4):
        await a.taking._take(table.leases[f"s{i}"], stolen=False)
    leader = leader_of(a, LeaseTakerKind.LOAD, Elector())
    # A new leader moves nothing before it has watched the table for one failover time.
    assert not (await leader.run_once()).moves
    for _ in range(4):  # 12 virtual seconds, every lease renewed
        await asyncio.sleep(3.0)
        await a.renew_all()
        await a.presence.report()
        await b.presence.report()
    plan = await leader.run_once()
    assert len(plan.moves) == 2 and {m.to_worker for m in plan.moves} == {"b"}
    moved = [m.lease_key for m in plan.moves]
    for key in moved:
        assert table.leases[key].owner == "b" and table.leases[key].checkpoint_owner == "a"
    discovery = AssignmentDiscovery(holder=b, interval=3.0)
    assert sorted(await discovery.discover_once()) == sorted(moved)
    assert all(b.held[k].state is HeldState.INCOMING for k in moved)
    await a.renew_all()  # the old owner notices and drains
    assert all(a.held[k].state is HeldState.OUTGOING for k in moved)
    for key in moved:
        await a.held.checkpoint(key, Checkpoint("7"))
        assert await a.held.release(key)
    await b.renew_all()
    for key in moved:
        assert b.held[key].state is HeldState.ACTIVE
        assert b.held[key].lease.checkpoint == Checkpoint("7")
        assert table.leases[key].checkpoint_owner is None
    # The leader does not plan the same moves again.
    assert not (await leader.run_once()).moves


async def test_three_failed_runs_give_the_lock_up() -> None:
    table = MemoryLeaseTable()
    a = coordinator("a", table)

    class Broken(MemoryLeaseStore):
        async def list_leases(self):  # type: ignore[no-untyped-def]
            raise AdapterError("Scan", "down")

    a.held.store = Broken(table)
    elector = Elector()
    leader = leader_of(a, LeaseTakerKind.LOAD, elector)
    leader.interval = 0.0
    task = asyncio.create_task(leader.run())
    for _ in range(100):
        await asyncio.sleep(0)
        if elector.released:
            break
    task.cancel()
    assert elector.released == 1 and not elector.leader


async def test_a_new_leader_resumes_from_the_table_and_waits_for_expiry() -> None:
    table = MemoryLeaseTable()
    a, b = coordinator("a", table), coordinator("b", table)
    await b.presence.report()
    table.leases["s0"] = Lease(key="s0", owner="gone", counter=5)
    leader = leader_of(b, LeaseTakerKind.LOAD, Elector())
    assert not (await leader.run_once()).all  # not judged expired on first sight
    assert table.leases["s0"].owner == "gone"
    del a


async def test_a_follower_keeps_the_old_owners_liveness_current_while_a_handoff_waits() -> None:
    # No taker rounds run in the leader-based modes: without this refresh a live old owner
    # (a Java worker checkpointing in shutdownRequested) looked dead and was cut off after the
    # failover time instead of being given the handoff timeout.
    table = MemoryLeaseTable()
    b = coordinator("b", table)
    old_owner = coordinator("java-1", table)
    await old_owner.presence.report()
    discovery = AssignmentDiscovery(holder=b, interval=3.0)
    await discovery.refresh_liveness()
    assert b.taking.live_workers == {"b"}  # nothing incoming: the registry is not read
    assert "list_workers" not in b.presence.registry.calls  # type: ignore[attr-defined]
    await b.store.create_lease(Lease(key="s0"))
    table.leases["s0"] = Lease(key="s0", owner="b", counter=3, checkpoint_owner="java-1")
    assert await discovery.discover_once() == ["s0"]
    assert b.held["s0"].state is HeldState.INCOMING
    await discovery.refresh_liveness()
    assert b.taking.live_workers == {"b", "java-1"}


async def test_a_finished_lease_assigned_to_a_follower_is_deleted_once_its_children_started() -> (
    None
):
    # A KCL 3.x leader assigns SHARD_END leases like any other; skipped, they would expire and
    # be assigned again at every run.
    table = MemoryLeaseTable()
    b = coordinator("b", table)
    for key in ("p", "c1", "c2"):
        await b.store.create_lease(Lease(key=key))
    end = Checkpoint("SHARD_END")
    table.leases["p"] = Lease(
        key="p", owner="b", counter=4, checkpoint=end, child_shard_ids=frozenset({"c1", "c2"})
    )
    table.leases["c1"] = Lease(
        key="c1",
        owner="java-1",
        counter=2,
        checkpoint=Checkpoint("9"),
        parent_shard_ids=frozenset({"p"}),
    )
    table.leases["c2"] = Lease(key="c2", counter=0, parent_shard_ids=frozenset({"p"}))
    discovery = AssignmentDiscovery(holder=b, interval=3.0)
    assert await discovery.discover_once() == [] and "p" in table.leases  # c2 not started
    table.leases["c2"] = Lease(
        key="c2",
        owner="java-1",
        counter=1,
        checkpoint=Checkpoint("3"),
        parent_shard_ids=frozenset({"p"}),
    )
    assert await discovery.discover_once() == []
    assert "p" not in table.leases and "p" not in b.held


async def test_a_handoff_from_a_java_owner_is_watched_without_writing_until_it_lets_go() -> None:
    # The Java old owner renews and makes its final checkpoint under the lease counter: any
    # counter write of the new owner would make it lose the lease before that checkpoint.
    table = MemoryLeaseTable()
    b = coordinator("b", table)
    await b.presence.report()  # b's entry is marked kclasync; java-1 has none of ours
    await b.store.create_lease(Lease(key="s0"))
    table.leases["s0"] = Lease(key="s0", owner="b", counter=5, checkpoint_owner="java-1")
    discovery = AssignmentDiscovery(holder=b, interval=3.0)
    assert await discovery.discover_once() == ["s0"]
    assert b.held["s0"].state is HeldState.INCOMING and b.held["s0"].watch_only
    await b.renew_all()
    assert table.leases["s0"].counter == 5  # not written
    table.leases["s0"] = attrs.evolve(table.leases["s0"], counter=6)  # the old owner renews
    await b.renew_all()
    assert table.leases["s0"].counter == 6 and b.held["s0"].state is HeldState.INCOMING
    # The old owner checkpoints and lets go: checkpointOwner removed, counter + 1.
    table.leases["s0"] = attrs.evolve(
        table.leases["s0"], counter=7, checkpoint=Checkpoint("42"), checkpoint_owner=None
    )
    await b.renew_all()
    assert b.held["s0"].state is HeldState.ACTIVE and table.leases["s0"].counter == 8
    assert b.held["s0"].lease.checkpoint == Checkpoint("42")


async def test_a_leader_counts_a_java_worker_live_between_its_30_s_reports() -> None:
    from kclasync._core.workers.worker_metrics import WorkerMetrics

    table = MemoryLeaseTable()
    a = coordinator("a", table)
    await a.presence.report()
    registry = a.presence.registry
    await registry.report(WorkerMetrics(worker_id="java-1", last_update=1000))
    await registry.report(
        WorkerMetrics(worker_id="py-dead", last_update=1000, implementation="kclasync")
    )
    leader = leader_of(a, LeaseTakerKind.KCL3, Elector())
    scan = await a.store.list_leases()
    live, _ = await leader.live_workers(scan, 0.0)
    assert {"java-1", "py-dead"} <= live
    # 40 s without a change: past the kclasync worker timeout, within two Java report periods.
    live, _ = await leader.live_workers(scan, 40.0)
    assert "java-1" in live and "py-dead" not in live
    live, _ = await leader.live_workers(scan, 70.0)
    assert "java-1" not in live


@pytest.mark.parametrize("policy", [LeaseTakerKind.LOAD, LeaseTakerKind.KCL3])
def test_a_java_worker_renewing_none_of_its_leases_gets_nothing_until_it_reports(
    policy: LeaseTakerKind,
) -> None:
    run_virtual(functools.partial(_java_worker_stalls, policy), wall_limit=WALL_LIMIT)


async def _java_worker_stalls(policy: LeaseTakerKind) -> None:
    from kclasync._core.workers.worker_metrics import WorkerMetrics

    table = MemoryLeaseTable()
    a = coordinator("a", table)
    await a.presence.report()
    registry = a.presence.registry
    await registry.report(WorkerMetrics(worker_id="java-1", last_update=1000))
    for i in range(4):
        table.leases[f"s{i}"] = Lease(key=f"s{i}", owner="a", counter=1)
    for key in ("j0", "j1"):
        table.leases[key] = Lease(key=key, owner="java-1", counter=1)
    leader = leader_of(a, policy, Elector())
    await leader.run_once()
    assert leader.stalled == {}
    # Past the failover time "a" renewed its leases, java-1 none (it died) and its entry stood
    # still: within the registry's 60 s it still counts live, and holds the fewest leases.
    await asyncio.sleep(11.0)
    for i in range(4):
        table.leases[f"s{i}"] = attrs.evolve(table.leases[f"s{i}"], counter=2)
    await a.presence.report()
    live, _ = await leader.live_workers(await a.store.list_leases(), 11.0)
    assert "java-1" in live
    plan = await leader.run_once()
    assert {x.lease_key for x in plan.assignments} >= {"j0", "j1"}
    assert table.leases["j0"].owner == "a" and table.leases["j1"].owner == "a"
    assert leader.stalled == {"java-1": 1000}
    assert "java-1" not in a.taking.live_workers
    # Holding nothing now, it stays no target while its entry stands still ...
    table.leases["n0"] = Lease(key="n0")
    await asyncio.sleep(1.0)
    await leader.run_once()
    assert table.leases["n0"].owner == "a" and leader.stalled == {"java-1": 1000}
    # ... and is one again once it reports.
    await registry.report(WorkerMetrics(worker_id="java-1", last_update=1030))
    await asyncio.sleep(1.0)
    await leader.run_once()
    assert leader.stalled == {} and "java-1" in a.taking.live_workers
