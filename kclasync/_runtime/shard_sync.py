"""Shard sync: the leases the shard graph calls for, for every stream a consumer reads.

Owns: the list of streams (asked again at every sync), stream identities and multi-stream lease
keys, the start-up sync of empty streams, the full sync (new leases, children of finished
parents, the childShardIds backfill), and dropping the leases of streams that left the list
after ``removed_stream_grace``.
Must not: decide which leases to create (``_core.lineage.shard_lineage``), own leases, or read
any clock but the one it is given (the event loop's).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeAlias

from kclasync._adapters.protocols import (
    LeaseStore,
    ShardFilter,
    ShardFilterType,
    StreamClient,
)
from kclasync._config import ConsumerConfig
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import InitialPositionKind
from kclasync._core.lineage.shard import Shard
from kclasync._core.lineage.shard_end import LeaseKeyFn, children_of_finished_parents
from kclasync._core.lineage.shard_lineage import plan_new_leases
from kclasync._core.lineage.streams import StreamIdentity, parse_multi_stream_key
from kclasync.errors import AdapterError, StreamNotFoundError

log = logging.getLogger("kclasync._consumer")

#: ``streams=``: stream names, or an async callable that returns the current names.
StreamList: TypeAlias = Sequence[str] | Callable[[], Awaitable[Sequence[str]]]


def _same_key(shard_id: str) -> str:
    return shard_id


class ShardSync:
    def __init__(
        self,
        *,
        config: ConsumerConfig,
        streams: StreamList,
        multi_stream: bool,
        store: LeaseStore,
        stream_client: StreamClient,
        clock: Callable[[], float],
        expiry: ExpiryTracker,
        on_created: Callable[[], None],
    ) -> None:
        self.config = config
        self._streams = streams
        self.multi_stream = multi_stream
        self.store = store
        self.client = stream_client
        self._clock = clock
        self._expiry = expiry
        self._on_created = on_created
        self._identities: dict[str, StreamIdentity] = {}
        #: Multi-stream: key prefix of a stream that left the list -> loop time first seen gone.
        self._removed_since: dict[str, float] = {}
        #: Shard syncs run (any reason), and leases dropped because their stream left the list.
        self.syncs = 0
        self.stream_leases_dropped = 0

    # -- streams ---------------------------------------------------------------------------

    async def current_streams(self) -> list[str]:
        """The streams to consume now (``streams=`` is asked again on every call)."""
        spec = self._streams
        names = await spec() if callable(spec) else spec
        return list(dict.fromkeys(names))

    def stream_of(self, lease_key: str) -> str | None:
        """The stream a lease belongs to (None: a key that is not this consumer's kind)."""
        if not self.multi_stream:
            spec = self._streams
            assert not callable(spec)
            return spec[0]
        parsed = parse_multi_stream_key(lease_key)
        return None if parsed is None else parsed[0].name

    def known_identity(self, stream: str) -> StreamIdentity | None:
        """Multi-stream: the identity seen at the last sync (None if not described yet)."""
        return self._identities.get(stream)

    async def _identity(self, stream: str) -> StreamIdentity | None:
        """Multi-stream: the stream's identity (one DescribeStreamSummary); None otherwise."""
        if not self.multi_stream:
            return None
        identity = await self.client.describe_stream(stream)
        self._identities[stream] = identity
        return identity

    @staticmethod
    def _key_fn(identity: StreamIdentity | None) -> LeaseKeyFn:
        return identity.lease_key if identity is not None else _same_key

    @staticmethod
    def leases_of(identity: StreamIdentity | None, leases: Sequence[Lease]) -> list[Lease]:
        """The leases of one stream (all of them in single-stream mode)."""
        if identity is None:
            return list(leases)
        return [lease for lease in leases if identity.owns(lease.key)]

    def _shard_filter(self) -> ShardFilter:
        """ListShards' filter for an empty table, from the initial position."""
        initial = self.config.initial_position
        if initial.kind is InitialPositionKind.LATEST:
            return ShardFilter(ShardFilterType.AT_LATEST)
        if initial.kind is InitialPositionKind.TRIM_HORIZON:
            return ShardFilter(ShardFilterType.AT_TRIM_HORIZON)
        return ShardFilter(ShardFilterType.AT_TIMESTAMP, initial.timestamp)

    # -- syncing ---------------------------------------------------------------------------

    async def initial_sync(self) -> None:
        """At start every worker syncs the streams that have no lease yet (an empty table) and
        creates the missing children of finished parents; the rest is the leader's job. Also
        proves each stream exists (ListShards)."""
        scan = await self.store.list_leases()
        for stream in await self.current_streams():
            try:
                await self.sync_stream(stream, scan.leases, only_if_empty=True)
            except StreamNotFoundError:
                if not self.multi_stream:
                    raise
                log.warning("stream %s does not exist (yet); skipped", stream)
        self.syncs += 1

    async def sync_shards(self) -> int:
        """Create the leases the shard graph calls for, for every stream; in multi-stream mode
        also drop the leases of streams that left the list more than ``removed_stream_grace``
        ago. Returns how many leases were created."""
        scan = await self.store.list_leases()
        streams = await self.current_streams()
        created = 0
        for stream in streams:
            try:
                created += await self.sync_stream(stream, scan.leases)
            except StreamNotFoundError:
                if not self.multi_stream:
                    raise
                log.warning("stream %s does not exist; not synced", stream)
            except AdapterError as exc:
                if not self.multi_stream:
                    raise
                log.warning("shard sync of stream %s failed: %s", stream, exc)
        if self.multi_stream:
            await self._drop_removed_streams(streams, scan.leases)
        self.syncs += 1
        return created

    async def sync_stream(
        self, stream: str, leases: Sequence[Lease], *, only_if_empty: bool = False
    ) -> int:
        """Sync one stream against a scan of the lease table. Returns the leases created."""
        identity = await self._identity(stream)
        key_fn = self._key_fn(identity)
        mine = self.leases_of(identity, leases)
        if not mine:
            # An empty table (for this stream): ListShards' filter for the initial position.
            shards = await self.client.list_shards(stream, self._shard_filter())
            new = plan_new_leases(shards, (), self.config.initial_position, lease_key=key_fn)
        else:
            shards = await self.client.list_shards(stream)
            # At start only the repair (the rest is the leader's): the children of finished
            # parents, which a worker creates before its SHARD_END checkpoint and a table's
            # earlier writer may not have (an older version, a Java worker that got no
            # ChildShards from GetRecords, killed with its leader lock still held).
            new = (
                []
                if only_if_empty
                else plan_new_leases(shards, mine, self.config.initial_position, lease_key=key_fn)
            )
            new += children_of_finished_parents(mine, shards, new, lease_key=key_fn)
        created = 0
        for lease in new:
            if await self.store.create_lease(lease):
                created += 1
        if created:
            log.info("shard sync of %s created %d leases", stream, created)
            self._on_created()
        if mine and not only_if_empty:
            await self._backfill_child_shard_ids(mine, shards)
        return created

    async def _backfill_child_shard_ids(
        self, leases: Sequence[Lease], shards: Sequence[Shard]
    ) -> None:
        """``childShardIds`` of finished leases whose worker died before writing them: written
        once the lease is unowned or expired, conditional on the counter and owner seen."""
        now = self._clock()
        for lease in leases:
            if not lease.is_finished or lease.child_shard_ids:
                continue
            if lease.owner is not None and not self._expiry.is_expired(lease, now):
                continue
            kids = frozenset(s.shard_id for s in shards if lease.shard_id in s.parent_ids)
            if kids and await self.store.update_child_shard_ids(lease, kids):
                log.info("wrote the missing childShardIds of finished lease %s", lease.key)

    async def _drop_removed_streams(self, streams: list[str], leases: Sequence[Lease]) -> None:
        """Delete the leases of streams that left the list (or were re-created under a new
        creation epoch) once they have been gone for ``removed_stream_grace``."""
        now = self._clock()
        current = {self._identities[s].key_prefix for s in streams if s in self._identities}
        undescribed = {s for s in streams if s not in self._identities}
        gone: dict[str, list[Lease]] = {}
        for lease in leases:
            parsed = parse_multi_stream_key(lease.key)
            if parsed is None or parsed[0].key_prefix in current:
                continue
            if parsed[0].name in undescribed:
                continue  # could not describe it this time: do not judge
            gone.setdefault(parsed[0].key_prefix, []).append(lease)
        for prefix in list(self._removed_since):
            if prefix not in gone:
                del self._removed_since[prefix]
        for prefix, stale in gone.items():
            since = self._removed_since.setdefault(prefix, now)
            if now - since < self.config.removed_stream_grace:
                continue
            for lease in stale:
                if await self.store.delete_lease(lease):
                    self.stream_leases_dropped += 1
                    log.info("dropped lease %s: its stream left the list", lease.key)
