"""Early failover: heartbeats in the worker registry, and following the workers that go silent.

Every heartbeat period this worker re-writes its registry entry (a full report with a CPU sample
once per renewer period, a plain heartbeat otherwise), and twice per period it watches the
registry (``READS_PER_PERIOD``): the leader (and a worker that knows no leader, or whose leader's
entry carries no digest or went silent) reads every entry and, leading, publishes its silence
digest with its next heartbeat; the others read the leader's entry alone
(``core.workers.silence_digest``: O(workers) items per period for the fleet, not O(workers^2)).
For each worker
that just went silent (``core.worker_silence.watch_heartbeats``) a follower task reads that
worker's leases at once (the owner index, and the leases it held in the last scan, each read
strongly), feeds them to the taker's expiry tracker as a scan would, and reads the ones still
the silent worker's again when they are due to expire (``judge_silent_leases``). Expired ones
are taken through the taker's own plan (``early_take_view``) and the normal conditional take;
those the plan left to others are planned again a few times (``after_early_take``).

Silent workers this worker never saw heartbeat and whose leases its last scan did not show
(dead before it started) are not followed (``worth_following``). The leader removes the entries
of workers long silent and owning nothing (``stale_entries``), conditional on the silent value.

A worker that joined the registry, or left it (a graceful stop deletes its entry after releasing
its leases), wakes the taker, so a newcomer gets its share and released leases are taken at once
rather than at the next periodic scan; so do expired leases that no plan of this worker's took in a
few rounds, and a follower whose reads failed.

Owns: the heartbeat loop, the followers, the removal of dead entries, and their counters (for
the benchmarks and the simulation report). Must not: judge expiry or choose leases itself
(``_core``), renew or release, or read any clock but the coordinator's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.workers.silence_digest import (
    DigestView,
    follow,
    full_view_restart_wakes,
    publish,
)
from kclasync._core.workers.worker_metrics_item import CorruptWorkerMetricsError
from kclasync._core.workers.worker_silence import (
    READS_PER_PERIOD,
    RETAKE_ROUNDS,
    HeartbeatView,
    SilentLeaseCheck,
    after_early_take,
    early_take_view,
    judge_silent_leases,
    stale_entries,
    watch_heartbeats,
    worth_following,
)
from kclasync._runtime.lease_coordinator import LeaseCoordinator
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.leases")

OUTCOMES = ("failover", "false_alarm", "no_leases", "other")


class EarlyFailover:
    def __init__(
        self,
        holder: LeaseCoordinator,
        interval: float,
        wake_taker: Callable[[], None] | None = None,
        is_leader: Callable[[], bool] | None = None,
        leader_id: Callable[[], str | None] | None = None,
    ) -> None:
        self._holder = holder
        self._wake_taker = wake_taker
        self._is_leader = is_leader
        self._leader_id = leader_id
        #: What this worker read from the leader's entry (``silence_digest.follow``).
        self.digest_view = DigestView()
        #: Reads of the leader's entry alone (the rest are ``registry_reads``).
        self.leader_reads = 0
        self.interval = interval
        self.view = HeartbeatView()
        #: Whether ``view`` followed every watch since it began (False after a watch that read
        #: the leader's entry alone: the view is then restarted before the next full read, or
        #: every worker that wrote nothing meanwhile would look silent at once).
        self._view_current = True
        #: Silent workers being followed, by id.
        self._following: set[str] = set()
        #: Counters: silences noticed, lease-table items read (keys from the owner index, and
        #: strong reads of single leases), leases taken early, registry reads.
        self.silences = 0
        self.index_reads = 0
        self.lease_reads = 0
        self.early_takes = 0
        self.registry_reads = 0
        #: Silences not followed: entries of workers dead before this one watched them.
        self.skipped_silences = 0
        #: Dead workers' registry entries this worker removed as the leader.
        self.entries_removed = 0
        #: Owner-index queries (one request each, even when it finds no key).
        self.index_queries = 0
        #: Lease items read by followers (index keys and single reads), by how the follow ended:
        #: ``failover`` (a lease was found expired), ``false_alarm`` (the heartbeat moved
        #: again), ``no_leases`` (nothing to read), ``other`` (taken or released by others).
        self.reads_by_outcome: dict[str, int] = dict.fromkeys(OUTCOMES, 0)
        self.follows_by_outcome: dict[str, int] = dict.fromkeys(OUTCOMES, 0)

    async def run(self) -> None:
        """Heartbeat and watch forever, on two schedules (a slow registry read never delays a
        heartbeat); followers run in this task's own group."""
        async with asyncio.TaskGroup() as followers:
            followers.create_task(self._heartbeats(), name="heartbeat-writes")
            holder = self._holder
            period = self.interval / READS_PER_PERIOD
            while True:
                started = holder.now()
                await self._watch(followers)
                await asyncio.sleep(max(0.0, period - (holder.now() - started)))

    async def _heartbeats(self) -> None:
        holder = self._holder
        last_report: float | None = None
        while True:
            started = holder.now()
            if last_report is None or started - last_report >= holder.renewer_interval:
                last_report = started
                await holder.presence.report()  # with a CPU sample
            else:
                await holder.presence.beat()
            await asyncio.sleep(max(0.0, self.interval - (holder.now() - started)))

    async def _watch(self, followers: asyncio.TaskGroup) -> None:
        holder = self._holder
        read_digest = self.digest_view
        leader = self._leader_id() if self._leader_id is not None else None
        if leader is not None and leader != holder.worker_id:
            holder.presence.digest = None  # published only while leading
            if await self._watch_leader(followers, leader):
                self._view_current = False
                return
        else:
            self.digest_view = DigestView()
        if not self._view_current:
            self.view = HeartbeatView()
            self._view_current = True
            if full_view_restart_wakes(read_digest) and self._wake_taker is not None:
                self._wake_taker()
        sent = holder.now()
        try:
            entries = await holder.presence.read_registry()
        except AdapterError as exc:
            log.info("reading the worker registry failed (keeping the last view): %s", exc)
            return
        self.registry_reads += 1
        change = watch_heartbeats(self.view, entries, holder.worker_id, holder.now(), sent=sent)
        self.view = change.view
        leading = self._is_leader is not None and self._is_leader()
        if leading and self._leader_id is not None:
            holder.presence.digest = publish(
                self.view, change, holder.taking.last_scan, holder.presence.digest
            )
        if (change.left or change.joined) and self._wake_taker is not None:
            # Released leases, or a newcomer's share: a taking round now, not at the next period.
            self._wake_taker()
        silent = change.silent - self._following
        follow = worth_following(silent, self.view, holder.taking.last_scan)
        self.skipped_silences += len(silent - follow)
        self._start_following(followers, follow)
        if leading:
            await self._remove_stale()

    async def _watch_leader(self, followers: asyncio.TaskGroup, leader: str) -> bool:
        """Read the leader's entry alone and act on its digest; False when the whole registry
        must be read instead (no digest there, or the leader itself is silent)."""
        holder = self._holder
        sent = holder.now()
        try:
            entry = await holder.presence.registry.get(leader)
        except AdapterError as exc:
            log.info("reading the leader's registry entry failed: %s", exc)
            return True  # as a failed full read: the next period reads again
        except CorruptWorkerMetricsError:
            entry = None
        if entry is None or entry.digest is None:
            self.digest_view = DigestView()
            return False
        self.leader_reads += 1
        change = follow(self.digest_view, leader, entry, holder.worker_id, holder.now(), sent=sent)
        self.digest_view = change.view
        if change.wake and self._wake_taker is not None:
            self._wake_taker()
        self._start_following(followers, change.silent - self._following)
        # A silent leader publishes nothing new: read the whole registry too, until its
        # heartbeat moves again or another worker leads.
        return not change.leader_silent

    def is_silent(self, worker: str) -> bool:
        """Whether ``worker`` is silent now as far as this worker knows (``_silent_now``)."""
        return self._silent_now(worker) is True

    def _silent_now(self, owner: str) -> bool | None:
        """Whether ``owner`` is still silent as this worker knows it: silent if its own view of
        the registry (while current) or the leader's digest (or the leader's own heartbeat)
        says so; a view restarted when the leader went silent has not watched long enough to
        say it, so it cannot clear a silence the digest reported. None: nothing knows it."""
        known: list[bool] = []
        if self._view_current:
            beat = self.view.beats.get(owner)
            if beat is not None:
                known.append(beat.silent)
        digest = self.digest_view
        leader_beat = digest.beats.beats.get(owner)
        if leader_beat is not None:
            known.append(leader_beat.silent)
        elif owner in digest.acted:
            known.append(True)
        return any(known) if known else None

    def _start_following(self, followers: asyncio.TaskGroup, workers: Iterable[str]) -> None:
        holder = self._holder
        for worker in sorted(workers):
            if not holder.taking.enabled or holder.taking.leader_assigns:
                break
            self._following.add(worker)
            self.silences += 1
            followers.create_task(self._follow(worker), name=f"follow-{worker}")

    async def _remove_stale(self) -> None:
        """As the leader: delete the entries of workers long dead (``stale_entries``)."""
        holder = self._holder
        taking = holder.taking
        stale = stale_entries(
            self.view, taking.last_scan, taking.last_scan_sent, holder.now(), holder.failover_time
        )
        for worker, beat in sorted(stale.items()):
            try:
                removed = await holder.presence.registry.remove(worker, heartbeat=beat)
            except AdapterError as exc:
                log.info("could not remove dead worker %s from the registry: %s", worker, exc)
                return
            if removed:
                self.entries_removed += 1
                log.info("removed the registry entry of worker %s (silent, no leases)", worker)

    async def _follow(self, owner: str) -> None:
        tally = _Tally()
        try:
            await self._follow_leases(owner, tally)
        except (AdapterError, CorruptLeaseError) as exc:
            log.info("following the leases of silent worker %s failed: %s", owner, exc)
            if self._wake_taker is not None:
                self._wake_taker()  # a full taking round instead, not the next period's
        finally:
            self._following.discard(owner)
            if tally.expired:
                outcome = "failover"
            elif self._silent_now(owner) is False:
                outcome = "false_alarm"
            elif tally.items == 0:
                outcome = "no_leases"
            else:
                outcome = "other"
            self.reads_by_outcome[outcome] += tally.items
            self.follows_by_outcome[outcome] += 1

    async def _follow_leases(self, owner: str, tally: _Tally) -> None:
        holder = self._holder
        taking = holder.taking
        keys = set(await holder.store.lease_keys_of(owner))
        self.index_queries += 1
        self.index_reads += len(keys)
        tally.items += len(keys)
        keys.update(lease.key for lease in taking.last_scan if lease.owner == owner)
        log.info(
            "worker %s stopped heartbeating; %s reads its %d lease(s)",
            owner,
            holder.worker_id,
            len(keys),
        )
        # The silent worker's leases that another worker took: newer than the last scan, so
        # the plans below count them as that worker's (``early_take_view``).
        others: dict[str, Lease] = {}
        # What the previous look read, so that a re-check can tell the old owner's finishing of
        # a handoff to the silent worker from the silent worker's own renewal.
        before: dict[str, Lease] = {}
        last: dict[str, Lease] = {}

        def seen(leases: list[Lease | None]) -> list[Lease | None]:
            before.clear()
            before.update(last)
            for lease in leases:
                if lease is None:
                    continue
                last[lease.key] = lease
                if lease.owner in (None, owner, holder.worker_id):
                    others.pop(lease.key, None)
                else:
                    others[lease.key] = lease
            return leases

        check = judge_silent_leases(
            taking.expiry, owner, seen(await self._read(keys, tally)), holder.now(), recheck=False
        )
        rounds_left = RETAKE_ROUNDS
        while True:
            if check.expired:
                tally.expired = True
                taken = await self._take(check, list(others.values()))
                check = after_early_take(check, taken, holder.now(), self.interval, rounds_left)
                rounds_left -= 1
                if check.unplanned and self._wake_taker is not None:
                    self._wake_taker()
            if check.recheck_at is None or not taking.enabled:
                return
            await asyncio.sleep(max(0.0, check.recheck_at - holder.now()))
            if not self._silent_now(owner):
                return  # it heartbeats again: its renewals keep its leases
            check = judge_silent_leases(
                taking.expiry,
                owner,
                seen(await self._read(check.waiting, tally)),
                holder.now(),
                recheck=True,
                before=before,
            )

    async def _read(self, keys: set[str] | tuple[str, ...], tally: _Tally) -> list[Lease | None]:
        ordered = sorted(keys)
        self.lease_reads += len(ordered)
        tally.items += len(ordered)
        return list(await asyncio.gather(*(self._holder.store.get_lease(k) for k in ordered)))

    async def _take(self, check: SilentLeaseCheck, taken_by_others: list[Lease]) -> set[str]:
        """Take what the taker's plan chooses of the expired leases; the keys taken.
        ``taken_by_others``: leases of the silent worker this follow read under another
        owner."""
        holder = self._holder
        taking = holder.taking
        if not taking.enabled or taking.leader_assigns:
            return set()
        expired = [lease for lease in check.expired if not taking.is_excluded(lease.key)]
        now = holder.now()
        view = early_take_view(
            worker_id=holder.worker_id,
            expired=expired,
            held=[held.lease for held in holder.held.values()],
            last_scan=taking.last_scan,
            silent=self.view.silent_workers(),
            tracker=taking.expiry,
            now=now,
            live_workers=taking.live_workers,
            max_leases_for_worker=taking.max_leases_for_worker,
            max_leases_to_steal=taking.max_leases_to_steal,
            taken_by_others=taken_by_others,
        )
        plan = taking.taker.plan(view, taking.rng)
        by_key = {lease.key: lease for lease in expired}
        chosen = [by_key[lease.key] for lease in plan.take if lease.key in by_key]
        results = await asyncio.gather(*(taking.take(lease) for lease in chosen))
        taken = {lease.key for lease in results if lease is not None}
        self.early_takes += len(taken)
        return taken


class _Tally:
    """One follow's lease items read, and whether it found an expired lease."""

    def __init__(self) -> None:
        self.items = 0
        self.expired = False
