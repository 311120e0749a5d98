"""Which way a worker spreads leases at run time: taking them itself, or following (and, as
leader, making) a leader's assignment, from the Java KCL's migration state on the table and
whether its Java workers are alive.

Owns: reading the ``Migration3.0`` item of ``<app>-CoordinatorState`` (never writing it) at
start and then once per leader-lock heartbeat interval; while that state says the Java workers
follow a leader (``3X``), also reading the worker registry and, while a leader assigns, the lease
table once per taking interval, fed to ``core.workers.java_liveness``; applying
``lease_mode``'s answer to the lease taking (``LeaseTaking.leader_assigns``) and logging each
switch once, with why. A switch keeps every held lease: renewals and pipelines go on, only who
decides about the next lease changes (taking rounds, or the leader's assignment and this
worker's discovery), and every move is still a fenced conditional write, so no shard is
processed twice.
Cost: one strongly consistent GetItem per worker per ``leader_heartbeat_interval`` (30 s by
default); on a ``3X`` table with a worker-side taker, one registry read per taking interval
(O(workers) items per worker) and, while a leader assigns, one lease scan per taking interval
(the scan a taking round would make): the fleet's cost of a mixed fleet grows with
workers x (workers + shards), as in ``balanced`` mode.
Must not: decide what a client version means (``_core.leases.client_version``) or whether a
Java worker lives (``_core.workers.java_liveness``), take, assign or renew leases itself, or
read any clock but the event loop's.
"""

from __future__ import annotations

import asyncio
import logging

from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore
from kclasync._core.leases.client_version import (
    LeaseMode,
    MigrationState,
    java_fleet_follows_leader,
    lease_mode,
)
from kclasync._core.workers.java_liveness import JavaLiveness, Verdict
from kclasync._core.workers.worker_metrics import KCLASYNC
from kclasync._runtime.lease_taking import LeaseTaking
from kclasync._runtime.worker_presence import WorkerPresence
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync._consumer")


class LeaseModeWatch:
    """Keeps ``taking.leader_assigns`` in step with the table's migration state."""

    def __init__(
        self,
        *,
        locks: CoordinatorStateStore,
        taking: LeaseTaking,
        presence: WorkerPresence,
        store: LeaseStore,
        worker_id: str,
        failover_time: float,
        configured: str,
        configured_leader_based: bool,
        interval: float,
        wake: asyncio.Event,
    ) -> None:
        self._locks = locks
        self._taking = taking
        self._presence = presence
        self._store = store
        self._worker_id = worker_id
        self.java = JavaLiveness(failover_time)
        #: The migration state read last.
        self.state: MigrationState | None = None
        self.configured = configured
        self.configured_leader_based = configured_leader_based
        self.interval = interval
        self._wake = wake
        #: The mode applied last (None before the first read).
        self.mode: LeaseMode | None = None
        #: Switches made after the first read, and migration-state reads.
        self.switches = 0
        self.reads = 0

    async def check(self) -> LeaseMode:
        """Read the migration state (and, on a ``3X`` table, the Java workers' signs of life)
        once and apply the mode it calls for. Raises AdapterError when a read fails (the mode
        in force stays)."""
        state = await self._locks.get_migration_state()
        self.reads += 1
        self.state = state
        java = Verdict.SILENT
        if not self.configured_leader_based and java_fleet_follows_leader(state):
            java = await self._java_verdict()
        mode = lease_mode(state, configured_leader_based=self.configured_leader_based, java=java)
        previous = self.mode
        self.mode = mode
        if previous is None:
            if mode.leader_assigns and not self.configured_leader_based:
                self._switched(mode)
            elif state is not None:
                log.info("%s; lease_taker=%s", mode.reason, self.configured)
        elif previous.leader_assigns != mode.leader_assigns:
            self.switches += 1
            self._switched(mode)
        self._taking.leader_assigns = mode.leader_assigns
        return mode

    async def _java_verdict(self) -> Verdict:
        loop = asyncio.get_running_loop()
        entries = await self._presence.read_registry()
        self.java.observe_registry(entries, loop.time())
        if self.mode is None or self.mode.leader_assigns:
            # No taking round scans the table meanwhile: a Java owner renewing its leases is
            # seen here (and a dead one's counters standing still).
            scan = await self._store.list_leases()
            ours = {e.worker_id for e in entries if e.implementation == KCLASYNC}
            ours.add(self._worker_id)
            self.java.observe_leases(scan.leases, ours, loop.time())
        return self.java.verdict(loop.time())

    def _next_check(self) -> float:
        """On a table whose Java workers follow a leader, every taking interval (a Java fleet's
        death is noticed as soon as a taking round would notice an expired lease); else every
        leader-lock heartbeat interval."""
        if not self.configured_leader_based and java_fleet_follows_leader(self.state):
            return min(self.interval, self._taking.interval)
        return self.interval

    def _switched(self, mode: LeaseMode) -> None:
        if mode.leader_assigns:
            log.warning(
                "%s; this worker follows the leader's assignment and assigns every live worker "
                "its share when it leads, instead of taking leases itself (lease_taker=%s); "
                "the leases it holds stay held (see docs/migration.md)",
                mode.reason,
                self.configured,
            )
        else:
            log.warning(
                "%s; this worker takes leases itself again (lease_taker=%s); the leases it "
                "holds stay held",
                mode.reason,
                self.configured,
            )
        self._wake.set()  # the discovery (or the next taking round) at once

    async def run(self) -> None:
        """Re-read the state every interval, so a Java worker that joins (or a rollback) after
        this worker started is followed."""
        while True:
            await asyncio.sleep(self._next_check())
            try:
                await self.check()
            except AdapterError as exc:
                log.info("reading the Java KCL's migration state failed (mode kept): %s", exc)
