"""The leader's duties: periodic shard sync, finished-lease cleanup and the hash-range audit.

Owns: the loop that runs them while this worker holds the leader lock (each on its own
interval; all at once when a term starts), and the counters operators and tests read.
Must not: decide what to delete or when a hole warrants a sync (``_core.leases.lease_cleanup``),
elect the leader (``leader.py``), or read any clock but the one it is given.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import attrs

from kclasync._adapters.protocols import LeaseStore, StreamClient
from kclasync._config import ConsumerConfig
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.leases.lease_cleanup import CleanupTracker, HoleAuditor
from kclasync._core.lineage.shard import Shard
from kclasync._core.lineage.shard_lineage import hash_range_holes
from kclasync._runtime.event_wait import wait_event
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.shard_sync import ShardSync
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync._consumer")


class LeaderDuties:
    def __init__(
        self,
        *,
        config: ConsumerConfig,
        elector: LeaderElector,
        shard_sync: ShardSync,
        store: LeaseStore,
        stream_client: StreamClient,
        clock: Callable[[], float],
    ) -> None:
        self.config = config
        self.elector = elector
        self.shard_sync = shard_sync
        self.store = store
        self.client = stream_client
        self._clock = clock
        self._cleanup = CleanupTracker(config.lease_cleanup_delay)
        self._auditor = HoleAuditor(config.lease_audit_threshold)
        #: Shard syncs run as leader, finished leases deleted, syncs the auditor triggered.
        self.shard_syncs = 0
        self.leases_deleted = 0
        self.audit_syncs = 0

    async def run(self) -> None:
        """While this worker leads: each duty on its own interval; all at once per new term."""
        cfg = self.config
        wake = self.elector.subscribe()
        now = self._clock()
        due = {"sync": now, "cleanup": now, "audit": now}
        while True:
            if not self.elector.is_leader():
                await wake.wait()
                wake.clear()
                due = dict.fromkeys(due, self._clock())
                continue
            now = self._clock()
            if now >= due["sync"]:
                due["sync"] = now + cfg.shard_sync_interval
                if await self._guarded("shard sync", self.shard_sync.sync_shards):
                    self.shard_syncs += 1
            if now >= due["cleanup"]:
                due["cleanup"] = now + cfg.lease_cleanup_interval
                if cfg.cleanup_leases_upon_shard_completion:
                    await self._guarded("lease cleanup", self.cleanup_finished_leases)
            if now >= due["audit"]:
                due["audit"] = now + cfg.lease_audit_interval
                await self._guarded("hash-range audit", self.audit_hash_ranges)
            delay = max(0.0, min(due.values()) - self._clock())
            if await wait_event(wake, delay):  # a new term: do everything now
                wake.clear()
                due = dict.fromkeys(due, self._clock())

    async def _guarded(self, what: str, work: Callable[[], Awaitable[int]]) -> bool:
        try:
            await work()
        except (AdapterError, CorruptLeaseError) as exc:
            log.warning("%s failed: %s", what, exc)
            return False
        return True

    async def cleanup_finished_leases(self) -> int:
        """Delete the SHARD_END leases whose children have all started, once they have been
        deletable for ``lease_cleanup_delay`` (``kclasync._core.leases.lease_cleanup``). Returns how
        many were deleted."""
        scan = await self.store.list_leases()
        stream_of = self.shard_sync.stream_of
        # Children of finished leases that lack childShardIds come from the shard list.
        shards: dict[str, list[Shard]] = {}
        for lease in scan.leases:
            stream = stream_of(lease.key)
            if lease.is_finished and not lease.child_shard_ids and stream not in (None, *shards):
                assert stream is not None
                try:
                    shards[stream] = await self.client.list_shards(stream)
                except AdapterError:
                    shards[stream] = []

        def children_of(lease: Lease) -> list[str]:
            listed = shards.get(stream_of(lease.key) or "", [])
            return [s.shard_id for s in listed if lease.shard_id in s.parent_ids]

        deleted = 0
        for lease in self._cleanup.plan(scan.leases, self._clock(), children_of):
            if await self.store.delete_lease(lease):
                deleted += 1
                log.info("deleted finished lease %s (its children have started)", lease.key)
            self._cleanup.deleted(lease.key)
        self.leases_deleted += deleted
        return deleted

    async def audit_hash_ranges(self) -> int:
        """Look for holes in each stream's hash-key space covered by unfinished leases; after
        ``lease_audit_threshold`` audits in a row found one, run that stream's shard sync.
        Returns how many syncs were run."""
        sync = self.shard_sync
        scan = await self.store.list_leases()
        syncs = 0
        for stream in await sync.current_streams():
            identity = sync.known_identity(stream) if sync.multi_stream else None
            if sync.multi_stream and identity is None:
                continue  # not described yet: the next shard sync does it
            mine = sync.leases_of(identity, scan.leases)
            if not mine:
                self._auditor.forget(stream)
                continue
            if any(lease.hash_range is None for lease in mine):
                ranges = {s.shard_id: s.hash_range for s in await self.client.list_shards(stream)}
                mine = [
                    lease
                    if lease.hash_range is not None
                    else attrs.evolve(lease, hash_range=ranges.get(lease.shard_id))
                    for lease in mine
                ]
            holes = hash_range_holes(mine)
            if self._auditor.record(stream, holes):
                log.warning(
                    "stream %s: %d hole(s) in the hash-key space covered by leases, %d audits "
                    "in a row; running a shard sync",
                    stream,
                    len(holes),
                    self.config.lease_audit_threshold,
                )
                await sync.sync_stream(stream, scan.leases)
                syncs += 1
        self.audit_syncs += syncs
        return syncs
