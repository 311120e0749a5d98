"""The handoff protocol between two lease coordinators, step by step, on the in-memory table."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry

from kclasync._adapters.memory import MemoryLeaseStore, MemoryLeaseTable
from kclasync._core.balanced_taker import BalancedLeaseTaker
from kclasync._core.lease import Lease
from kclasync._core.position import Checkpoint
from kclasync._runtime.lease_coordinator import HeldLease, HeldState, LeaseCoordinator
from kclasync._runtime.metrics import ConsumerMetrics

pytestmark = pytest.mark.asyncio


class Events:
    def __init__(self) -> None:
        self.log: list[tuple[str, str]] = []

    def lease_acquired(self, held: HeldLease) -> None:
        self.log.append(("acquired", held.key))

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        self.log.append(("lost", held.key))

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        self.log.append(("stop", held.key))


def coordinator(name: str, table: MemoryLeaseTable, events: Events) -> LeaseCoordinator:
    return LeaseCoordinator(
        store=MemoryLeaseStore(table),
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
    written = await a.checkpoint("L", Checkpoint("42"))  # the old owner's final checkpoint
    assert written.owner == "b" and written.checkpoint == Checkpoint("42")
    await b.renew_all()  # still waiting: the old owner has not finished
    assert b.held["L"].state is HeldState.INCOMING
    assert await a.release("L")  # finish the handoff
    await b.renew_all()
    assert b.held["L"].state is HeldState.ACTIVE and b_events.log == [("acquired", "L")]
    assert b.held["L"].lease.checkpoint == Checkpoint("42")  # reads from the old checkpoint
    assert table.leases["L"].checkpoint_owner is None and table.leases["L"].owner == "b"


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
    assert await a.release("L")  # a finished the handoff to b ...
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
    c = LeaseCoordinator(
        store=store,
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
