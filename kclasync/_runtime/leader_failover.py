"""The leader's early failover in the leader-based modes (``lease_taker`` ``load``, ``kcl3``).

While this worker leads, it reads the worker registry every ``report_watch.watch_interval``
(a sixth of the report period) and folds it into its view of the reports
(``core.report_watch.watch_reports``). For each worker whose report stood still past its period
(a suspect) a follower reads that worker's leases at once (the owner index, and the leases it
owned in the last scan, each read strongly), feeds their counters to the leader's expiry
tracker, and reads the ones still the suspect's again when they are due to expire
(``core.worker_silence.judge_silent_leases``, as early failover of the taker modes). When some
are expired by their own counters it asks for a failover run (``LeaderAssignment.failover_run``:
one scan, a plan of the expired and unowned leases only, the fenced assignment writes) at once,
rather than at the next run, up to 2 x failover away. A suspect whose counters move is left
alone, however stale its registry entry. A new leader suspects the lock's previous owner at
its term's first read (``suspect_previous_leader``).

Each read also tells the elector whether the registry shows a worker of another implementation
(``core.lock_term.other_implementations``): without one the lock is written with the short term
of a kclasync-only fleet, so that a crashed leader is replaced within about 1.5 x failover and
its leases assigned within about 3 x (no further calls: the read is the watch's own).

Costs (W workers, L leases): the leader reads the registry ``WATCHES_PER_REPORT`` times per
report period, W entries each (one strongly consistent scan: about W / 23 read units); the other
workers nothing. Per suspect: one owner-index query and two strong reads per lease it owns
(about L / W), and per failover one scan of the lease table (L items).

Owns: the watch loop, the followers, the request of failover runs and their counters.
Must not: judge reports or expiry itself (``_core``), plan or write leases (the assignment
does), or read any clock but the coordinator's.
"""

from __future__ import annotations

import asyncio
import logging

from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.leases.lock_term import alive_workers, other_implementations
from kclasync._core.workers.report_watch import (
    ReportView,
    suspect_previous_leader,
    watch_interval,
    watch_reports,
)
from kclasync._core.workers.worker_silence import judge_silent_leases
from kclasync._runtime.assignment import LeaderAssignment
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.lease_coordinator import LeaseCoordinator
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.assignment")


class LeaderFailover:
    def __init__(
        self,
        *,
        holder: LeaseCoordinator,
        elector: LeaderElector,
        assignment: LeaderAssignment,
        registry: WorkerRegistry,
        report_period: float,
    ) -> None:
        self._holder = holder
        self._elector = elector
        self._assignment = assignment
        self._registry = registry
        self.report_period = report_period
        self.interval = watch_interval(report_period)
        self.view = ReportView()
        self._following: set[str] = set()
        self._due = asyncio.Event()
        assignment.suspects = self.suspected
        #: Counters: registry reads, suspects followed, lease items read (index keys and strong
        #: reads), follows that found an expired lease, failover runs asked for.
        self.registry_reads = 0
        self.suspects = 0
        self.lease_reads = 0
        self.failovers = 0

    def suspected(self) -> frozenset[str]:
        """The workers suspected now: reports standing still, or leases being followed."""
        return self.view.suspects() | self._following

    def _active(self) -> bool:
        taking = self._holder.taking
        return self._elector.is_leader() and taking.enabled and taking.leader_assigns

    async def run(self) -> None:
        elector = self._elector
        became_leader = elector.subscribe()
        async with asyncio.TaskGroup() as followers:
            followers.create_task(self._failover_runs(), name="leader-failover-runs")
            holder = self._holder
            #: The lock's owner before this worker's term (None once the term's first read
            #: has suspected it).
            previous: str | None = None
            while True:
                started = holder.now()
                if self._active():
                    await self._watch(followers, previous)
                    previous = None
                else:
                    self.view = ReportView()  # a new term watches afresh
                    elector.observe_fleet(None)
                    previous = elector.leader_id()
                    if not elector.is_leader():
                        # Nothing to watch until this worker leads: wait for its term (the
                        # elector's event) rather than look every interval; the first watch
                        # follows an interval later, as the next look would have at the latest.
                        # The previous owner is the one its winning read saw.
                        became_leader.clear()
                        await became_leader.wait()
                        previous = elector.previous_owner()
                        started = holder.now()
                await asyncio.sleep(max(0.0, self.interval - (holder.now() - started)))

    async def _watch(self, followers: asyncio.TaskGroup, previous: str | None = None) -> None:
        holder = self._holder
        sent = holder.now()
        try:
            decoded = await self._registry.list_workers()
        except AdapterError as exc:
            log.info("reading the worker registry failed (keeping the last view): %s", exc)
            return
        self.registry_reads += 1
        change = watch_reports(
            self.view,
            decoded.entries,
            holder.worker_id,
            holder.now(),
            report_period=self.report_period,
            sent=sent,
        )
        suspects = change.suspects
        if previous is not None:
            taken_over = suspect_previous_leader(change.view, previous, holder.worker_id)
            change, suspects = taken_over, suspects | taken_over.suspects
        self.view = change.view
        for worker in sorted(suspects - self._following):
            self._following.add(worker)
            self.suspects += 1
            followers.create_task(self._follow(worker), name=f"leader-follow-{worker}")
        # The term to write, and the successors to name: kclasync workers not suspected (a
        # followed worker stays suspect in the view while its report stands still).
        self._elector.observe_fleet(
            other_implementations(decoded.entries, unreadable=len(decoded.corrupt)),
            alive_workers(decoded.entries, self.view.suspects() | self._following),
        )

    async def _follow(self, owner: str) -> None:
        try:
            await self._follow_leases(owner)
        except (AdapterError, CorruptLeaseError) as exc:
            # The periodic run settles it (a suspect is followed once per silence).
            log.info("following the leases of worker %s failed: %s", owner, exc)
        finally:
            self._following.discard(owner)

    async def _follow_leases(self, owner: str) -> None:
        holder = self._holder
        tracker = self._assignment.expiry
        keys = set(await holder.store.lease_keys_of(owner))
        self.lease_reads += len(keys)
        keys.update(lease.key for lease in holder.taking.last_scan if lease.owner == owner)
        log.info(
            "worker %s's registry entry stood still; leader %s reads its %d lease(s)",
            owner,
            holder.worker_id,
            len(keys),
        )
        last: dict[str, Lease] = {}
        before: dict[str, Lease] = {}
        recheck = False
        while keys and self._active():
            read = await self._read(keys)
            before = dict(last)
            last.update({lease.key: lease for lease in read if lease is not None})
            check = judge_silent_leases(
                tracker, owner, read, holder.now(), recheck=recheck, before=before
            )
            if check.expired:
                self.failovers += 1
                self._due.set()
            if check.recheck_at is None:
                return
            await asyncio.sleep(max(0.0, check.recheck_at - holder.now()))
            if not self.view.is_suspect(owner):
                return  # it reports again: its renewals keep its leases
            keys, recheck = set(check.waiting), True

    async def _read(self, keys: set[str]) -> list[Lease | None]:
        store = self._holder.store
        leases = await asyncio.gather(*(store.get_lease(key) for key in sorted(keys)))
        self.lease_reads += len(keys)
        return list(leases)

    async def _failover_runs(self) -> None:
        """One failover run per wake-up; expiries close together share it."""
        while True:
            await self._due.wait()
            self._due.clear()
            if not self._active():
                continue
            try:
                await self._assignment.failover_run(self.view.suspects())
            except AdapterError as exc:
                log.info("failover run failed (the next assignment run retries): %s", exc)


def leader_failover_for(
    *,
    enabled: bool,
    holder: LeaseCoordinator,
    elector: LeaderElector,
    assignment: LeaderAssignment,
    registry: WorkerRegistry,
) -> LeaderFailover | None:
    """The leader's early failover of a leader-based worker with ``early_failover`` on (the
    workers report with each renewal round: ``renewer_interval``), else None."""
    if not enabled:
        return None
    return LeaderFailover(
        holder=holder,
        elector=elector,
        assignment=assignment,
        registry=registry,
        report_period=holder.renewer_interval,
    )
