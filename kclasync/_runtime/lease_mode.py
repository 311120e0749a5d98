"""Which way a worker spreads leases at run time: taking them itself, or following (and, as
leader, making) a leader's assignment, from the Java KCL's migration state on the table.

Owns: reading the ``Migration3.0`` item of ``<app>-CoordinatorState`` (never writing it) at
start and then once per leader-lock heartbeat interval, applying ``lease_mode``'s answer to
the lease taking (``LeaseTaking.leader_assigns``) and logging each switch once, with why. A
switch keeps every held lease: renewals and pipelines go on, only who decides about the next
lease changes (taking rounds, or the leader's assignment and this worker's discovery), and every
move is still a fenced conditional write, so no shard is processed twice.
Cost: one strongly consistent GetItem per worker per ``leader_heartbeat_interval`` (30 s by
default, as often as the leader lock is read): grows with workers, not with shards.
Must not: decide what a client version means (``_core.leases.client_version``), take, assign
or renew leases itself, or read any clock but the event loop's.
"""

from __future__ import annotations

import asyncio
import logging

from kclasync._adapters.protocols import CoordinatorStateStore
from kclasync._core.leases.client_version import LeaseMode, lease_mode
from kclasync._runtime.lease_taking import LeaseTaking
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync._consumer")


class LeaseModeWatch:
    """Keeps ``taking.leader_assigns`` in step with the table's migration state."""

    def __init__(
        self,
        *,
        locks: CoordinatorStateStore,
        taking: LeaseTaking,
        configured: str,
        configured_leader_based: bool,
        interval: float,
        wake: asyncio.Event,
    ) -> None:
        self._locks = locks
        self._taking = taking
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
        """Read the migration state once and apply the mode it calls for. Raises AdapterError
        when the item cannot be read (the mode in force stays)."""
        state = await self._locks.get_migration_state()
        self.reads += 1
        mode = lease_mode(state, configured_leader_based=self.configured_leader_based)
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
            await asyncio.sleep(self.interval)
            try:
                await self.check()
            except AdapterError as exc:
                log.info("reading the Java KCL's migration state failed (mode kept): %s", exc)
