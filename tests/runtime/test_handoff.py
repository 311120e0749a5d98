"""The handoff protocol between two lease coordinators, step by step, on the in-memory table."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry

from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable
from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics
from kclasync._adapters.protocols import LeaseScan
from kclasync._core.assignment.balanced_taker import BalancedLeaseTaker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._runtime.lease_coordinator import HeldLease, HeldState, LeaseCoordinator
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.wiring import lease_coordinator
from kclasync.errors import LeaseLostError
from tests.support import wait_until

pytestmark = pytest.mark.asyncio


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []
        self.reasons: list[str] = []

    def lease_acquired(self, held: HeldLease) -> None:
        self.log.append(("acquired", held.key))

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        self.log.append(("lost", held.key))
        self.reasons.append(reason)

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        self.log.append(("stop", held.key))


def coordinator(
    name: str,
    table: MemoryLeaseTable,
    events: Events,
    registry: MemoryWorkerMetrics | None = None,
    store: MemoryLeaseStore | None = None,
) -> LeaseCoordinator:
    return lease_coordinator(
        registry=registry if registry is not None else MemoryWorkerMetrics(),
        store=store if store is not None else MemoryLeaseStore(table),
        worker_id=name,
        failover_time=10.0,
        renewer_interval=3.0,
        taker_interval=10.0,
        taker=BalancedLeaseTaker(),
        max_leases_for_worker=None,
        max_leases_to_steal=None,
        metrics=ConsumerMetrics(CollectorRegistry()),
        application="app",
        listener=events,
        rng=random.Random(0),
        graceful_handoff=True,
    )


async def test_planned_move_drains_checkpoints_and_finishes() -> None:
    table = MemoryLeaseTable()
    a_events, b_events = Events(), Events()
    a, b = coordinator("a", table, a_events), coordinator("b", table, b_events)
    await a.store.create_lease(Lease(key="L"))
    assert await a.taking._take(table.leases["L"], stolen=False) is not None
    assert await b.taking._steal(table.leases["L"]) is not None
    assert b.held["L"].state is HeldState.INCOMING and b_events.log == []
    await a.renew_all()  # a notices: drain instead of being cut off
    assert a.held["L"].state is HeldState.OUTGOING and a_events.log == [
        ("acquired", "L"),
        ("stop", "L"),
    ]
    written = await a.held.checkpoint("L", Checkpoint("42"))  # the old owner's final checkpoint
    assert written.owner == "b" and written.checkpoint == Checkpoint("42")
    await b.renew_all()  # still waiting: the old owner has not finished
    assert b.held["L"].state is HeldState.INCOMING
    assert await a.held.release("L")  # finish the handoff
    await b.renew_all()
    assert b.held["L"].state is HeldState.ACTIVE and b_events.log == [("acquired", "L")]
    assert b.held["L"].lease.checkpoint == Checkpoint("42")  # reads from the old checkpoint
    assert table.leases["L"].checkpoint_owner is None and table.leases["L"].owner == "b"


async def test_a_move_from_a_silent_owner_takes_the_lease_without_a_handoff() -> None:
    """Early failover knows ``a`` stopped heartbeating: asking it to hand the lease over would
    leave ``b`` waiting for it up to the handoff timeout. The move is a plain take, fenced on
    the counter; from a live owner it stays a handoff."""
    table = MemoryLeaseTable()
    a, b = coordinator("a", table, Events()), coordinator("b", table, Events())
    for key in ("L", "M"):
        await a.store.create_lease(Lease(key=key))
        assert await a.taking._take(table.leases[key], stolen=False) is not None
    b.taking.live_workers = frozenset({"a", "b"})  # as the last registry read showed
    assert await b.taking._steal(table.leases["L"]) is not None
    assert table.leases["L"].checkpoint_owner == "a"  # a live owner: a handoff
    b.taking.known_silent = lambda worker: worker == "a"
    assert not b.handoffs._is_live("a")
    before = table.leases["M"].counter
    assert await b.taking._steal(table.leases["M"]) is not None
    taken = table.leases["M"]
    assert taken.owner == "b" and taken.checkpoint_owner is None
    assert taken.counter == before + 1
    assert b.held["M"].state is HeldState.ACTIVE


async def test_lease_handed_back_before_it_was_started_is_passed_on_at_once() -> None:
    # Regression: b was given L, but before its renewer noticed the transfer had finished, a
    # asked for L back. b must pass it on immediately, not drop it and leave a waiting for the
    # handoff timeout.
    table = MemoryLeaseTable()
    a_events, b_events = Events(), Events()
    a, b = coordinator("a", table, a_events), coordinator("b", table, b_events)
    await a.store.create_lease(Lease(key="L"))
    await a.taking._take(table.leases["L"], stolen=False)
    await b.taking._steal(table.leases["L"])
    await a.renew_all()
    assert await a.held.release("L")  # a finished the handoff to b ...
    assert b.held["L"].state is HeldState.INCOMING  # ... which b has not noticed yet
    assert await a.taking._steal(table.leases["L"]) is not None  # and a asks for it back
    await b.renew_all()
    assert "L" not in b.held
    assert ("lost", "L") not in b_events.log and ("acquired", "L") not in b_events.log
    assert table.leases["L"].owner == "a" and table.leases["L"].checkpoint_owner is None
    await a.renew_all()
    assert a.held["L"].state is HeldState.ACTIVE and a_events.log[-1] == ("acquired", "L")


async def test_reconciled_renewal_is_not_credited_at_the_retry_time() -> None:
    # Regression (found by the simulation, seed 7 at 50 x 500): a renewal applied but whose reply
    # was lost, then reconciled on the next attempt, must not count as renewed at that later
    # attempt's time; the write that counted was sent earlier, and other workers' expiry clocks
    # started from it.
    from kclasync.errors import TransientError

    class LostReply(MemoryLeaseStore):
        lose_next = False

        async def renew_lease(
            self, lease: Lease, throughput_kbps: float | None = None
        ) -> Lease | None:
            renewed = await super().renew_lease(lease, throughput_kbps)
            if self.lose_next:
                self.lose_next = False
                raise TransientError("injected: the write happened, the reply was lost")
            return renewed

    now = [0.0]
    table = MemoryLeaseTable()
    store = LostReply(table)
    c = lease_coordinator(
        store=store,
        registry=MemoryWorkerMetrics(),
        worker_id="w",
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
        clock=lambda: now[0],
    )
    await store.create_lease(Lease(key="L"))
    await c.taking._take(table.leases["L"], stolen=False)
    now[0] = 3.0
    store.lose_next = True
    await c.renew_all()  # applied, but we did not hear back
    assert c.held["L"].renewed_at == 0.0
    now[0] = 6.0
    await c.renew_all()  # the condition fails; a re-read shows our own increment
    assert c.held["L"].lease.counter == table.leases["L"].counter  # adopted
    assert c.held["L"].renewed_at == 0.0  # not credited at 6.0
    now[0] = 9.0
    await c.renew_all()  # a confirmed renewal
    assert c.held["L"].renewed_at == 9.0


class GatedWrites(MemoryLeaseStore):
    """A store whose handoff writes wait for permits, so that a test can interleave the scans
    and writes of several workers exactly."""

    def __init__(self, table: MemoryLeaseTable) -> None:
        super().__init__(table)
        self.permits = asyncio.Semaphore(0)
        #: Leases whose handoff may be written without a permit.
        self.free: set[str] = set()
        self.scans = 0

    async def list_leases(self) -> LeaseScan:
        self.scans += 1
        return await super().list_leases()

    async def start_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        if lease.key not in self.free:
            await self.permits.acquire()
        return await super().start_handoff(lease, new_owner)


def gated(name: str, table: MemoryLeaseTable, registry: MemoryWorkerMetrics) -> LeaseCoordinator:
    return coordinator(name, table, Events(), registry=registry, store=GatedWrites(table))


async def test_a_plan_made_from_a_half_written_snapshot_is_completed_in_the_same_round() -> None:
    """Three workers join a worker holding 16 leases. Two plan from the table before any move;
    the third scans while the first is half way through its handoffs, so its plan hands some
    leases to other receivers and collides with the second's moves. Its lost writes make it
    scan again at once, and it still ends its first round with its share."""
    table, registry = MemoryLeaseTable(), MemoryWorkerMetrics()
    w1 = coordinator("w1", table, Events(), registry=registry)
    for i in range(16):
        await w1.store.create_lease(Lease(key=f"L{i:02}"))
        assert await w1.taking._take(table.leases[f"L{i:02}"], stolen=False) is not None
    w2, w3, w4 = (gated(name, table, registry) for name in ("w2", "w3", "w4"))
    for c in (w1, w2, w3, w4):
        await c.presence.report()
    # w2 plans L00, L03, L06, L09 (its part of the fleet plan); L09 lands first. From the
    # table as it is then, the plan gives w4 L01, L04, L07, L11: three of them are w3's.
    w2.store.free.add("L09")
    first = [asyncio.create_task(c.taking.take_round()) for c in (w2, w3)]
    await wait_until(lambda: table.leases["L09"].owner == "w2", 5, "w2's first handoff")
    assert w3.store.scans == 1
    third = asyncio.create_task(w4.taking.loop())
    await wait_until(lambda: w4.store.scans == 1, 5, "w4's scan")
    for c in (w2, w3):
        for _ in range(4):
            c.store.permits.release()  # more than they need
    await asyncio.gather(*first)
    for _ in range(8):
        w4.store.permits.release()
    await wait_until(lambda: w4.taking.rounds == 1, 5, "w4's first round")
    third.cancel()
    assert w4.taking.lost_writes == 0 and w4.taking.replans == 1 and w4.store.scans == 2
    owners = Counter(lease.owner for lease in table.leases.values())
    assert sorted(owners.values()) == [4, 4, 4, 4], owners


class InterleavedHandoff(MemoryLeaseStore):
    """A store whose next renewal or checkpoint is applied, then a concurrent handoff to
    ``new_owner``, and the item is returned as it is after both: what moto's server returned
    on a loaded machine, where an UpdateItem's steps interleave with another request's."""

    def __init__(self, table: MemoryLeaseTable, new_owner: str, *, steal: bool = False) -> None:
        super().__init__(table)
        self.new_owner = new_owner
        #: Apply a take (no handoff) instead.
        self.steal = steal
        self.armed = False

    async def _interleave(self, written: Lease | None) -> Lease | None:
        if written is None or not self.armed:
            return written
        self.armed = False
        if self.steal:
            handed = await super().take_lease(written, self.new_owner)
        else:
            handed = await super().start_handoff(written, self.new_owner)
        assert handed is not None
        return handed

    async def renew_lease(self, lease: Lease, throughput_kbps: float | None = None) -> Lease | None:
        return await self._interleave(await super().renew_lease(lease, throughput_kbps))

    async def checkpoint(
        self, lease: Lease, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease | None:
        return await self._interleave(await super().checkpoint(lease, checkpoint, pending))


@pytest.mark.parametrize("write", ["renewal", "checkpoint"])
async def test_a_write_returning_a_concurrent_handoff_hands_the_lease_over(write: str) -> None:
    table = MemoryLeaseTable()
    a_events, b_events = Events(), Events()
    a, b = coordinator("a", table, a_events), coordinator("b", table, b_events)
    store = InterleavedHandoff(table, "b")
    a.held.store = store
    await a.store.create_lease(Lease(key="L"))
    assert await a.taking._take(table.leases["L"], stolen=False) is not None
    b.held.add(HeldLease.incoming(table.leases["L"], 0.0), counted_as=None)
    store.armed = True
    if write == "renewal":
        await a.renew_all()
    else:
        await a.held.checkpoint("L", Checkpoint("7"))
        assert table.leases["L"].checkpoint == Checkpoint("7")
    # a drains instead of renewing a lease the table gives to b.
    assert a.held["L"].state is HeldState.OUTGOING and a_events.log[-1] == ("stop", "L")
    await a.held.checkpoint("L", Checkpoint("8"))  # the final checkpoint, in handoff mode
    assert await a.held.release("L")
    await b.renew_all()
    assert b.held["L"].state is HeldState.ACTIVE and b_events.log == [("acquired", "L")]
    assert b.held["L"].lease.checkpoint == Checkpoint("8")


@pytest.mark.parametrize("write", ["renewal", "checkpoint"])
async def test_a_write_returning_a_concurrent_take_loses_the_lease_and_says_why(write: str) -> None:
    table = MemoryLeaseTable()
    events = Events()
    a = coordinator("a", table, events)
    store = InterleavedHandoff(table, "b", steal=True)
    a.held.store = store
    await a.store.create_lease(Lease(key="L"))
    assert await a.taking._take(table.leases["L"], stolen=False) is not None
    store.armed = True
    if write == "renewal":
        await a.renew_all()
    else:
        with pytest.raises(LeaseLostError):
            await a.held.checkpoint("L", Checkpoint("7"))
    assert "L" not in a.held and events.log[-1] == ("lost", "L")
    assert events.reasons == [f"{write} written, but the item returned names another owner"]
    assert table.leases["L"].owner == "b"
