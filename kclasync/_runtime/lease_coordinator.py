"""The lease coordinator: the lease path of one worker, as a handful of collaborators.

Owns: nothing of its own but the bundle: the held leases (``held.HeldLeases``: the table, losing,
releasing, the fenced writes), the taking rounds that feed it (``lease_taking``), the renewal
rounds (``lease_renewals``), the incoming handoff steps (``lease_handoffs``) and this worker's
registry presence (``worker_presence``), each built by ``wiring`` and given only what is below
it: taking, renewals and handoffs call down into ``HeldLeases`` and never back up here.
Must not: build its collaborators, make decisions, or be imported by the modules it bundles.
"""

from __future__ import annotations

from kclasync._adapters.protocols import LeaseStore
from kclasync._core.leases.held_lease import HeldLease, HeldState
from kclasync._runtime.held import HeldLeases, LeaseListener
from kclasync._runtime.lease_handoffs import LeaseHandoffs
from kclasync._runtime.lease_renewals import LeaseRenewals
from kclasync._runtime.lease_taking import LeaseTaking
from kclasync._runtime.worker_presence import WorkerPresence

__all__ = ["HeldLease", "HeldState", "LeaseCoordinator", "LeaseListener"]


class LeaseCoordinator:
    def __init__(
        self,
        *,
        held: HeldLeases,
        taking: LeaseTaking,
        renewals: LeaseRenewals,
        handoffs: LeaseHandoffs,
        presence: WorkerPresence,
    ) -> None:
        #: The held leases, by key, and every write made through them.
        self.held = held
        #: The taking rounds (scan, plan, take, steal) that feed ``held``.
        self.taking = taking
        #: The renewal rounds of the held leases.
        self.renewals = renewals
        #: The steps of incoming graceful handoffs.
        self.handoffs = handoffs
        #: This worker's registry entry and its view of the live workers.
        self.presence = presence

    # -- read-only views for the other parts of a worker ----------------------------------

    @property
    def worker_id(self) -> str:
        return self.held.worker_id

    @property
    def store(self) -> LeaseStore:
        return self.held.store

    @property
    def failover_time(self) -> float:
        return self.held.failover_time

    @property
    def renewer_interval(self) -> float:
        return self.renewals.interval

    @property
    def rounds(self) -> int:
        """Taking rounds completed."""
        return self.taking.rounds

    def now(self) -> float:
        return self.held.now()

    async def renew_all(self) -> None:
        """One renewal round over every held lease (the renewer loop is ``renewals.loop``)."""
        await self.renewals.renew_all()
