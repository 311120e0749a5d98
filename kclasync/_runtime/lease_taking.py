"""Taking rounds: scan the lease table, judge expiry and liveness, plan, then take and steal.

Owns: what the last scan showed (lease expiry as this worker observes it, the live workers from
the worker registry, corrupt and unknown-Sticky reports), the exclusion of leases whose pipeline
failed, and applying the planner's takes and steals (a steal is a graceful handoff when enabled).
What to take is the pluggable planner's decision (``kclasync._core.assignment.lease_taker`` and
``balanced_taker``); what was taken is held in the ``HeldLeases`` it is given.
Must not: import the lease coordinator or its other helpers, renew or checkpoint, or read any
clock but the held leases' (the event loop).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

import attrs

from kclasync._core.assignment.lease_taker import (
    LeaseTaker,
    TakePlan,
    TakeView,
    hands_over,
    replan_at_once,
)
from kclasync._core.assignment.startup import first_round_delay
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.held_lease import HeldLease
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._runtime.event_wait import wait_event
from kclasync._runtime.held import HeldLeases
from kclasync._runtime.worker_presence import WorkerPresence
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.leases")


class LeaseTaking:
    def __init__(
        self,
        held: HeldLeases,
        presence: WorkerPresence,
        *,
        taker: LeaseTaker,
        interval: float,
        max_leases_for_worker: int | None,
        max_leases_to_steal: int | None,
        rng: random.Random,
        graceful_handoff: bool,
    ) -> None:
        self.held = held
        self.presence = presence
        self.taker = taker
        self.interval = interval
        self.max_leases_for_worker = max_leases_for_worker
        self.max_leases_to_steal = max_leases_to_steal
        self.rng = rng
        self.graceful_handoff = graceful_handoff
        self.expiry = ExpiryTracker(held.failover_time)
        #: Workers judged live at the last scan (registry ``lut`` changes), this one included.
        self.live_workers: frozenset[str] = frozenset({held.worker_id})
        #: Taking rounds completed (for tests, benchmarks and the demo) ...
        self.rounds = 0
        #: Scans made again at once within a round, after planned moves lost their writes.
        self.replans = 0
        #: Planned takes and steals of the current scan whose conditional write failed.
        self.lost_writes = 0
        #: ... by cause: the first round, the periodic ones, and those a wake-up started
        #: (released leases, new leases from shard sync, a failed early read).
        self.round_causes: dict[str, int] = {"startup": 0, "periodic": 0, "woken": 0}
        #: Lease keys this worker will not take until the given loop time.
        self.excluded: dict[str, float] = {}
        #: Cleared when the worker stops: rounds still scan, but take nothing.
        self.enabled = True
        #: Set while a leader assigns the leases (a leader-based taker, or a table whose Java
        #: workers follow a leader: ``kclasync._core.leases.client_version.lease_mode``): no taking
        #: round runs, early failover takes nothing, and assignment and discovery run instead.
        self.leader_assigns = False
        self.last_scan: tuple[Lease, ...] = ()
        #: Loop time the last scan was sent (it shows the table as it was then or later).
        self.last_scan_sent: float | None = None
        #: Whether early failover knows a worker to be silent now (set by the wiring when
        #: heartbeats run): it judges silence within heartbeats, the registry's live set only
        #: at each taking round and after the worker timeout.
        self.known_silent: Callable[[str], bool] = lambda worker: False
        self._reported_sticky: set[str] = set()
        self._reported_corrupt: set[str] = set()

    def owner_live(self, worker: str | None) -> bool:
        """Whether ``worker`` can still act on its leases, as this worker knows it: live at the
        last scan of the registry, and not silent since as early failover judges it."""
        return worker is not None and worker in self.live_workers and not self.known_silent(worker)

    def exclude(self, key: str, seconds: float) -> None:
        """Do not take ``key`` again for ``seconds`` (a shard whose pipeline failed)."""
        self.excluded[key] = self.held.now() + seconds

    def is_excluded(self, key: str) -> bool:
        return key in self.excluded

    def _report_corrupt(self, corrupt: tuple[CorruptLeaseError, ...]) -> None:
        self.held.metrics.corrupt_leases.labels(*self.held.labels).set(len(corrupt))
        keys = {exc.lease_key for exc in corrupt}
        for exc in corrupt:
            if exc.lease_key not in self._reported_corrupt:
                log.error("%s; this lease is skipped until it is repaired", exc)
        self._reported_corrupt = keys

    def _report_sticky(self, leases: tuple[Lease, ...]) -> None:
        for lease in leases:
            if lease.sticky is not None and lease.sticky_mode is None:
                if lease.key not in self._reported_sticky:
                    self._reported_sticky.add(lease.key)
                    log.warning(
                        "lease %s has an unknown Sticky value (%s); treating it as normal "
                        "(use -1/0 normal, 10 pinned, 20 release)",
                        lease.key,
                        lease.sticky,
                    )
            else:
                self._reported_sticky.discard(lease.key)

    async def take_round(self) -> TakePlan:
        """Scan the table once, plan and apply takes. Returns what was actually acquired;
        ``lost_writes`` counts the planned moves another worker made first."""
        self.lost_writes = 0
        sent = self.held.now()
        scan = await self.held.store.list_leases()
        now = self.held.now()
        self.last_scan_sent = sent
        self._report_corrupt(scan.corrupt)
        self._report_sticky(scan.leases)
        self.last_scan = scan.leases
        self.expiry.observe(scan.leases, now)
        try:
            self.live_workers = await self.presence.live_workers(now)
        except AdapterError as exc:
            log.info("reading the worker registry failed (keeping the last view): %s", exc)
        if not self.enabled:
            return TakePlan()
        for key, until in list(self.excluded.items()):
            if until <= now:
                del self.excluded[key]
        candidates: list[Lease] = []
        # Leases recorded under our id that we do not hold (a restart with a fixed worker id):
        # take them back through the counter condition like any other lease.
        for lease in scan.leases:
            if lease.key in self.excluded:
                continue
            if lease.owner == self.held.worker_id and lease.key not in self.held:
                candidates.append(attrs.evolve(lease, owner=None))
            else:
                candidates.append(lease)
        view = TakeView(
            worker_id=self.held.worker_id,
            leases=candidates,
            now=now,
            expiry=self.expiry,
            max_leases_for_worker=self.max_leases_for_worker,
            max_leases_to_steal=self.max_leases_to_steal,
            live_workers=self.live_workers,
        )
        plan = self.taker.plan(view, self.rng)
        by_key = {lease.key: lease for lease in scan.leases}
        take = [by_key[lease.key] for lease in plan.take]
        steal = [by_key[lease.key] for lease in plan.steal]
        results = await asyncio.gather(
            *(self._take(lease, stolen=False) for lease in take),
            *(self._steal(lease) for lease in steal),
        )
        taken = tuple(lease for lease in results[: len(take)] if lease is not None)
        stolen = tuple(lease for lease in results[len(take) :] if lease is not None)
        return TakePlan(take=taken, steal=stolen)

    async def take(self, lease: Lease) -> Lease | None:
        """Take an available lease (conditional on its counter); None if that failed."""
        return await self._take(lease, stolen=False)

    async def take_assigned(self, lease: Lease) -> bool:
        """Take a lease the leader assigned to this worker (leader-based modes)."""
        return await self._take(lease, stolen=False) is not None

    async def _take(self, lease: Lease, *, stolen: bool) -> Lease | None:
        if lease.key in self.held:
            return None
        sent = self.held.now()
        try:
            taken = await self.held.store.take_lease(lease, self.held.worker_id)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("taking %s failed: %s", lease.key, exc)
            return None
        if taken is None:
            self.lost_writes += 1
            return None  # someone else was faster; normal
        log.info(
            "worker %s %s lease %s%s",
            self.held.worker_id,
            "stole" if stolen else "took",
            taken.key,
            f" from {lease.owner}" if stolen and lease.owner else "",
        )
        self.held.add(HeldLease.taken(taken, sent), counted_as="steal" if stolen else "take")
        return taken

    async def _steal(self, lease: Lease) -> Lease | None:
        """A planned move. With graceful handoff a live old owner finishes and checkpoints first."""
        silent = lease.owner is not None and self.known_silent(lease.owner)
        if not hands_over(lease, graceful_handoff=self.graceful_handoff, owner_live=not silent):
            return await self._take(lease, stolen=True)
        if lease.key in self.held:
            return None
        sent = self.held.now()
        try:
            started = await self.held.store.start_handoff(lease, self.held.worker_id)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("starting the handoff of %s failed: %s", lease.key, exc)
            return None
        if started is None:
            self.lost_writes += 1
            return None
        self.held.add(HeldLease.incoming(started, sent), counted_as="steal")
        log.info(
            "worker %s asked %s to hand over lease %s", self.held.worker_id, lease.owner, lease.key
        )
        return started

    async def loop(self, wake: asyncio.Event | None = None, first_delay: float = 0.0) -> None:
        """Take rounds forever. ``first_delay``: report to the worker registry and, when the
        registry shows another worker, wait this long before the first round, so that workers
        started together see each other and the first round already spreads the leases evenly
        (``kclasync._core.assignment.startup``). A lone worker takes at once."""
        if first_delay > 0:
            presence = self.presence
            await presence.report()
            try:
                registered: list[str] = [
                    e.worker_id for e in (await presence.registry.list_workers()).entries
                ]
            except AdapterError as exc:
                log.info("reading the worker registry failed: %s", exc)
                registered = ["?"]
            delay = first_round_delay(self.held.worker_id, registered, first_delay)
            if delay > 0:
                await asyncio.sleep(delay)
        cause = "startup"
        while True:
            started = self.held.now()
            if self.leader_assigns:
                # The leader's assignment spreads the leases meanwhile; the wake-ups are the
                # discovery's, which shares them. Back to taking: a round within an interval.
                await asyncio.sleep(self.interval)
                continue
            try:
                await self.take_round()
                replans = 0
                while replan_at_once(self.lost_writes, replans):
                    replans += 1
                    self.replans += 1
                    await self.take_round()
            except AdapterError as exc:
                log.warning("lease taking round failed: %s", exc)
            self.rounds += 1
            self.round_causes[cause] += 1
            delay = max(0.0, self.interval - (self.held.now() - started))
            cause = "periodic"
            if wake is None:
                await asyncio.sleep(delay)
            else:
                if await wait_event(wake, delay):
                    cause = "woken"
                wake.clear()
