"""The public ``Consumer``: one worker of a fleet that shares the shards of one or more streams.

Owns: the task tree of one worker (renewer, taker, leader election, the leader's duties: periodic
shard sync, hash-range audit and finished-lease cleanup; one pipeline per owned lease), the
SHARD_END hand-over to child leases, multi-stream lease keys, starting and stopping it, and the
processor-failure policy.
Must not: make protocol decisions itself (``kclasync._core``) or call AWS directly (adapters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
from collections.abc import Awaitable, Callable, Sequence
from types import TracebackType
from typing import Any, TypeAlias

import attrs
from prometheus_client import CollectorRegistry

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.protocols import (
    ChildShard,
    CoordinatorStateStore,
    LeaseStore,
    ShardFilter,
    ShardFilterType,
    StreamClient,
)
from kclasync._config import ConsumerConfig, LeaseTakerKind, ProcessorErrorPolicy
from kclasync._core.balanced_taker import BalancedLeaseTaker
from kclasync._core.lease import CorruptLeaseError, Lease
from kclasync._core.lease_cleanup import CleanupTracker, HoleAuditor
from kclasync._core.lease_taker import Kcl2LeaseTaker, LeaseTaker
from kclasync._core.position import InitialPositionKind
from kclasync._core.shard import Shard
from kclasync._core.shard_lineage import (
    LeaseKeyFn,
    child_leases_for_finished_parent,
    hash_range_holes,
    parents_finished,
    plan_new_leases,
)
from kclasync._core.streams import StreamIdentity, parse_multi_stream_key
from kclasync._processor import ProcessorFactory, RecordProcessor, processor_factory
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.lease_coordinator import HeldLease, LeaseCoordinator
from kclasync._runtime.metrics import metrics_for
from kclasync._runtime.shard_consumer import ShardConsumer, ShardOutcome
from kclasync.errors import (
    AdapterError,
    ConfigError,
    KclAsyncError,
    LeaseLostError,
    ProcessorFailedError,
    StreamNotFoundError,
)

log = logging.getLogger("kclasync._consumer")

#: ``streams=``: stream names, or an async callable that returns the current names.
StreamList: TypeAlias = Sequence[str] | Callable[[], Awaitable[Sequence[str]]]


def _same_key(shard_id: str) -> str:
    return shard_id


def _key_prefix(lease: Lease) -> str:
    """The stream part of a lease key ('' in single-stream mode)."""
    return lease.key[: len(lease.key) - len(lease.shard_id)]


def default_worker_id() -> str:
    """``host:pid:random`` so two workers never share an id by accident."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@attrs.define(eq=False)
class _ShardRun:
    held: HeldLease
    shard: ShardConsumer
    processor: RecordProcessor
    task: asyncio.Task[None] | None = None
    lost: bool = False


class Consumer:
    """A worker that consumes Kinesis streams under the KCL lease protocol.

    >>> async def handle(records): ...
    >>> await Consumer(stream_name="orders", application_name="billing", processor=handle).run()

    Several streams: ``streams=["orders", "refunds"]``, or an async callable returning the
    current list (asked at every shard sync). Lease keys are then the KCL's multi-stream keys
    ``<account>:<stream>:<creationEpoch>:<shardId>``; ``ShardInfo.stream`` and ``Record.stream``
    say which stream a shard belongs to.

    ``run()`` returns after ``stop()``; cancelling ``run()`` is an abrupt stop (leases are left
    to expire, as after a crash). ``async with Consumer(...)`` runs it in the background and
    stops it gracefully on exit.
    """

    def __init__(
        self,
        *,
        stream_name: str | None = None,
        application_name: str,
        processor: object,
        config: ConsumerConfig | None = None,
        streams: StreamList | None = None,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        session: Any = None,
        client_options: ClientOptions | None = None,
        registry: CollectorRegistry | None = None,
        lease_store: LeaseStore | None = None,
        stream_client: StreamClient | None = None,
        lease_taker: LeaseTaker | None = None,
        rng: random.Random | None = None,
        coordinator_state: CoordinatorStateStore | None = None,
    ) -> None:
        if streams is None:
            if not stream_name:
                raise ConfigError("stream_name", "must not be empty")
        elif stream_name is not None:
            raise ConfigError("streams", "give either stream_name or streams, not both")
        elif isinstance(streams, str):
            raise ConfigError("streams", "must be a list of stream names, not a string")
        elif not callable(streams) and (
            not streams or not all(isinstance(name, str) and name for name in streams)
        ):
            raise ConfigError("streams", f"must be non-empty stream names, got {streams!r}")
        if not application_name:
            raise ConfigError("application_name", "must not be empty")
        #: The stream of a single-stream consumer; None with ``streams=``.
        self.stream_name = stream_name
        self.multi_stream = streams is not None
        self._streams: StreamList
        if streams is None:
            self._streams = (stream_name or "",)
        elif callable(streams):
            self._streams = streams
        else:
            self._streams = tuple(streams)
        self.application_name = application_name
        self.config = config if config is not None else ConsumerConfig()
        if not isinstance(self.config, ConsumerConfig):
            raise ConfigError("config", f"must be a ConsumerConfig, got {config!r}")
        try:
            self._factory: ProcessorFactory = processor_factory(processor)
        except TypeError as exc:
            raise ConfigError("processor", str(exc)) from None
        if client_options is None:
            client_options = ClientOptions(
                region_name=region_name, endpoint_url=endpoint_url, session=session
            )
        elif region_name or endpoint_url or session:
            raise ConfigError(
                "client_options", "give either client_options or region/endpoint/session"
            )
        self.client_options = client_options
        self.worker_id = self.config.worker_id or default_worker_id()
        self.table_name = self.config.table_name or application_name
        self.metrics = metrics_for(registry)
        self._labels = (application_name, self.worker_id)
        self._store = lease_store
        self._stream_client = stream_client
        if lease_taker is None:
            lease_taker = (
                Kcl2LeaseTaker()
                if self.config.lease_taker is LeaseTakerKind.KCL2
                else BalancedLeaseTaker()
            )
        self._taker = lease_taker
        self._rng = rng if rng is not None else random.Random()
        self._coordinator: LeaseCoordinator | None = None
        self._runs: dict[str, _ShardRun] = {}
        self._stop_requested = asyncio.Event()
        self._failure: BaseException | None = None
        self._started = asyncio.Event()
        self._background: asyncio.Task[None] | None = None
        self._taker_wake = asyncio.Event()
        self._background_tasks: set[asyncio.Task[bool]] = set()
        self._stopping = False
        self._coordinator_state = coordinator_state
        self._elector: LeaderElector | None = None
        self._identities: dict[str, StreamIdentity] = {}
        #: Multi-stream: key prefix of a stream that left the list -> loop time first seen gone.
        self._removed_since: dict[str, float] = {}
        self._cleanup = CleanupTracker(self.config.lease_cleanup_delay)
        self._auditor = HoleAuditor(self.config.lease_audit_threshold)
        #: Counters for tests and operators: shard syncs run (any reason) and those run as
        #: leader, finished leases deleted, syncs the hash-range auditor triggered, and leases
        #: dropped because their stream left the list.
        self.shard_syncs = 0
        self.leader_shard_syncs = 0
        self.leases_deleted = 0
        self.audit_syncs = 0
        self.stream_leases_dropped = 0

    # -- introspection -------------------------------------------------------------------

    @property
    def held_leases(self) -> list[str]:
        """Keys of the leases this worker holds now."""
        return sorted(self._coordinator.held) if self._coordinator else []

    @property
    def lease_store(self) -> LeaseStore:
        if self._store is None:
            raise RuntimeError("the consumer is not running")
        return self._store

    @property
    def coordinator(self) -> LeaseCoordinator:
        if self._coordinator is None:
            raise RuntimeError("the consumer is not running")
        return self._coordinator

    @property
    def is_leader(self) -> bool:
        """Whether this worker holds the leader lock now."""
        return self._elector is not None and self._elector.is_leader()

    @property
    def leader_elector(self) -> LeaderElector:
        if self._elector is None:
            raise RuntimeError("the consumer is not running")
        return self._elector

    @property
    def health(self) -> dict[str, object]:
        """A snapshot for health checks: running, the error that stopped it, leases held."""
        task = self._background
        failed = task is not None and task.done() and not task.cancelled() and task.exception()
        return {
            "worker_id": self.worker_id,
            "running": self._started.is_set() and not self._stop_requested.is_set(),
            "error": repr(self._failure or failed) if (self._failure or failed) else None,
            "leases": len(self.held_leases),
            "leader": self.is_leader,
        }

    async def wait_started(self) -> None:
        await self._started.wait()

    # -- lifecycle -----------------------------------------------------------------------

    async def __aenter__(self) -> Consumer:
        self._background = asyncio.create_task(self.run(), name=f"consumer {self.worker_id}")
        started = asyncio.ensure_future(self._started.wait())
        await asyncio.wait({started, self._background}, return_when=asyncio.FIRST_COMPLETED)
        if self._background.done():
            started.cancel()
            self._background.result()  # raises the start-up error
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()
        if self._background is not None:
            await self._background

    async def stop(self) -> None:
        """Stop gracefully: in-flight batches finish, processors get ``shutdown_requested`` and
        may checkpoint, then the leases are released so other workers take them at once."""
        self._stop_requested.set()
        if self._background is not None and not self._background.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._background)

    async def run(self) -> None:
        """Consume until ``stop()``. Raises the error that stopped it, if any."""
        async with contextlib.AsyncExitStack() as stack:
            if self._store is None:
                from kclasync._adapters.dynamodb import DynamoLeaseStore

                ddb = await stack.enter_async_context(self.client_options.create_client("dynamodb"))
                self._store = DynamoLeaseStore(ddb, self.table_name)
                if self._coordinator_state is None:
                    from kclasync._adapters.coordinator_state import (
                        DynamoCoordinatorState,
                        coordinator_table_name,
                    )

                    self._coordinator_state = DynamoCoordinatorState(
                        ddb, coordinator_table_name(self.table_name)
                    )
            if self._coordinator_state is None:
                # An injected lease store without a lock store: this worker leads on its own
                # (every such worker runs the leader's duties, which are safe to run twice).
                from kclasync._adapters.memory import MemoryCoordinatorState

                self._coordinator_state = MemoryCoordinatorState()
            if self._stream_client is None:
                from kclasync._adapters.kinesis import KinesisStreamClient

                kin = await stack.enter_async_context(self.client_options.create_client("kinesis"))
                self._stream_client = KinesisStreamClient(kin)
            await self._run(self._store, self._stream_client)

    async def _run(self, store: LeaseStore, stream_client: StreamClient) -> None:
        cfg = self.config
        await self._at_start("creating the lease table", store.ensure_table)
        assert self._coordinator_state is not None
        await self._at_start(
            "creating the coordinator-state table", self._coordinator_state.ensure_table
        )
        coordinator = LeaseCoordinator(
            store=store,
            worker_id=self.worker_id,
            failover_time=cfg.failover_time,
            renewer_interval=cfg.renewer_interval,
            taker_interval=cfg.taker_interval,
            taker=self._taker,
            max_leases_for_worker=cfg.max_leases_for_worker,
            max_leases_to_steal=cfg.max_leases_to_steal,
            metrics=self.metrics,
            application=self.application_name,
            listener=self,
            graceful_handoff=cfg.graceful_handoff,
            handoff_timeout=cfg.handoff_timeout,
            worker_timeout=cfg.effective_worker_timeout,
            rng=self._rng,
        )
        self._coordinator = coordinator
        elector = LeaderElector(
            store=self._coordinator_state,
            worker_id=self.worker_id,
            lock_duration=cfg.leader_lock_duration,
            heartbeat_interval=cfg.leader_heartbeat_interval,
            rng=self._rng,
        )
        self._elector = elector
        # Also proves the stream exists (StreamNotFoundError is not retried) before anything starts.
        await self._at_start("the first shard sync", self._initial_sync)
        loops = [
            asyncio.create_task(coordinator.renewer_loop(), name="renewer"),
            asyncio.create_task(
                coordinator.taker_loop(
                    self._taker_wake,
                    # Long enough for workers started together to see each other.
                    first_delay=(
                        min(cfg.renewer_interval, 1.0)
                        if cfg.lease_taker is LeaseTakerKind.BALANCED
                        else 0.0
                    ),
                ),
                name="taker",
            ),
            asyncio.create_task(elector.run(), name="leader-lock"),
            asyncio.create_task(self._leader_loop(elector), name="leader-duties"),
        ]
        self._started.set()
        log.info(
            "worker %s started on %s",
            self.worker_id,
            f"stream {self.stream_name}" if not self.multi_stream else "several streams",
        )
        stop_wait = asyncio.ensure_future(self._stop_requested.wait())
        try:
            await asyncio.wait({stop_wait, *loops}, return_when=asyncio.FIRST_COMPLETED)
            for loop_task in loops:
                if loop_task.done() and not loop_task.cancelled() and loop_task.exception():
                    self._failure = self._failure or loop_task.exception()
            await self._shutdown(coordinator, loops)
        finally:
            stop_wait.cancel()
            # Reached with pending tasks only when run() itself was cancelled (abrupt stop):
            # cancel everything and leave the leases to expire, as a crash would.
            pending = [t for t in loops if not t.done()]
            pending += [r.task for r in self._runs.values() if r.task and not r.task.done()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._failure is not None:
            raise self._failure

    async def _at_start(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        """Run a start-up step, retrying throttling and transient errors a few times with
        backoff; anything else, or the last failure, stops ``run()`` with that error."""
        delay = self.config.throttle_backoff
        for attempt in range(1, 6):
            try:
                await step()
                return
            except AdapterError as exc:
                if attempt == 5:
                    raise
                log.warning("%s failed (%s); retrying in %.2fs", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.config.max_backoff)

    async def _shutdown(
        self, coordinator: LeaseCoordinator, loops: list[asyncio.Task[None]]
    ) -> None:
        coordinator.taking_enabled = False
        self._stopping = True
        for task in loops[1:]:
            task.cancel()
        await asyncio.gather(*loops[1:], return_exceptions=True)
        if self._elector is not None:
            await self._elector.release()  # another worker leads at once
        runs = list(self._runs.values())
        for run in runs:
            run.shard.request_shutdown()
        tasks = [r.task for r in runs if r.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=self.config.shutdown_timeout)
            for task in late:
                log.warning(
                    "a shard did not shut down within %ss; cancelling it",
                    self.config.shutdown_timeout,
                )
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        # Whatever is still held (pipelines that never started) is released too.
        await asyncio.gather(*(coordinator.release(key) for key in list(coordinator.held)))
        await asyncio.gather(*self._background_tasks, return_exceptions=True)
        loops[0].cancel()
        await asyncio.gather(loops[0], return_exceptions=True)
        try:
            await coordinator.store.remove_worker(self.worker_id)
        except AdapterError as exc:
            log.info("could not remove worker %s from the registry: %s", self.worker_id, exc)
        log.info("worker %s stopped", self.worker_id)

    # -- streams -------------------------------------------------------------------------

    async def current_streams(self) -> list[str]:
        """The streams to consume now (``streams=`` is asked again on every call)."""
        spec = self._streams
        names = await spec() if callable(spec) else spec
        return list(dict.fromkeys(names))

    async def _identity(self, stream: str) -> StreamIdentity | None:
        """Multi-stream: the stream's identity (one DescribeStreamSummary); None otherwise."""
        if not self.multi_stream:
            return None
        assert self._stream_client is not None
        identity = await self._stream_client.describe_stream(stream)
        self._identities[stream] = identity
        return identity

    @staticmethod
    def _key_fn(identity: StreamIdentity | None) -> LeaseKeyFn:
        return identity.lease_key if identity is not None else _same_key

    def _leases_of(self, identity: StreamIdentity | None, leases: Sequence[Lease]) -> list[Lease]:
        if identity is None:
            return list(leases)
        return [lease for lease in leases if identity.owns(lease.key)]

    def stream_of(self, lease_key: str) -> str | None:
        """The stream a lease belongs to (None: a key that is not this consumer's kind)."""
        if not self.multi_stream:
            return self.stream_name
        parsed = parse_multi_stream_key(lease_key)
        return None if parsed is None else parsed[0].name

    def _shard_filter(self) -> ShardFilter:
        """ListShards' filter for an empty table, from the initial position."""
        initial = self.config.initial_position
        if initial.kind is InitialPositionKind.LATEST:
            return ShardFilter(ShardFilterType.AT_LATEST)
        if initial.kind is InitialPositionKind.TRIM_HORIZON:
            return ShardFilter(ShardFilterType.AT_TRIM_HORIZON)
        return ShardFilter(ShardFilterType.AT_TIMESTAMP, initial.timestamp)

    # -- shard sync ----------------------------------------------------------------------

    async def _initial_sync(self) -> None:
        """At start every worker syncs the streams that have no lease yet (an empty table);
        the rest is the leader's job. Also proves each stream exists (ListShards)."""
        scan = await self.lease_store.list_leases()
        for stream in await self.current_streams():
            try:
                await self._sync_stream(stream, scan.leases, only_if_empty=True)
            except StreamNotFoundError:
                if not self.multi_stream:
                    raise
                log.warning("stream %s does not exist (yet); skipped", stream)
        self.shard_syncs += 1

    async def sync_shards(self) -> int:
        """Create the leases the shard graph calls for, for every stream; in multi-stream mode
        also drop the leases of streams that left the list more than ``removed_stream_grace``
        ago. Returns how many leases were created."""
        scan = await self.lease_store.list_leases()
        streams = await self.current_streams()
        created = 0
        for stream in streams:
            try:
                created += await self._sync_stream(stream, scan.leases)
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
        self.shard_syncs += 1
        return created

    async def _sync_stream(
        self, stream: str, leases: Sequence[Lease], *, only_if_empty: bool = False
    ) -> int:
        client = self._stream_client
        assert client is not None
        identity = await self._identity(stream)
        key_fn = self._key_fn(identity)
        mine = self._leases_of(identity, leases)
        if not mine:
            # An empty table (for this stream): ListShards' filter for the initial position.
            shards = await client.list_shards(stream, self._shard_filter())
            new = plan_new_leases(shards, (), self.config.initial_position, lease_key=key_fn)
        else:
            shards = await client.list_shards(stream)
            if only_if_empty:
                return 0
            new = plan_new_leases(shards, mine, self.config.initial_position, lease_key=key_fn)
            # Children of finished parents (normally created at SHARD_END by the parent's
            # worker; this catches a worker that died between its SHARD_END checkpoint and
            # that step).
            for parent in mine:
                if parent.is_finished:
                    new += child_leases_for_finished_parent(
                        parent, shards, [*mine, *new], lease_key=key_fn
                    )
        created = 0
        for lease in new:
            if await self.lease_store.create_lease(lease):
                created += 1
        if created:
            log.info("shard sync of %s created %d leases", stream, created)
            self._taker_wake.set()
        if mine:
            await self._backfill_child_shard_ids(mine, shards)
        return created

    async def _backfill_child_shard_ids(
        self, leases: Sequence[Lease], shards: Sequence[Shard]
    ) -> None:
        """``childShardIds`` of finished leases whose worker died before writing them: written
        once the lease is unowned or expired, conditional on the counter and owner seen."""
        now = self.coordinator.now()
        for lease in leases:
            if not lease.is_finished or lease.child_shard_ids:
                continue
            if lease.owner is not None and not self.coordinator.expiry.is_expired(lease, now):
                continue
            kids = frozenset(s.shard_id for s in shards if lease.shard_id in s.parent_ids)
            if kids and await self.lease_store.update_child_shard_ids(lease, kids):
                log.info("wrote the missing childShardIds of finished lease %s", lease.key)

    async def _drop_removed_streams(self, streams: list[str], leases: Sequence[Lease]) -> None:
        """Delete the leases of streams that left the list (or were re-created under a new
        creation epoch) once they have been gone for ``removed_stream_grace``."""
        now = self.coordinator.now()
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
                if await self.lease_store.delete_lease(lease):
                    self.stream_leases_dropped += 1
                    log.info("dropped lease %s: its stream left the list", lease.key)

    # -- the leader's duties -------------------------------------------------------------

    async def _leader_loop(self, elector: LeaderElector) -> None:
        """While this worker leads: periodic shard sync, finished-lease cleanup and the
        hash-range audit, each on its own interval; all at once when a term starts."""
        cfg = self.config
        wake = elector.subscribe()
        now = self.coordinator.now()
        due = {"sync": now, "cleanup": now, "audit": now}
        while True:
            if not elector.is_leader():
                await wake.wait()
                wake.clear()
                due = dict.fromkeys(due, self.coordinator.now())
                continue
            now = self.coordinator.now()
            if now >= due["sync"]:
                due["sync"] = now + cfg.shard_sync_interval
                if await self._guarded("shard sync", self.sync_shards):
                    self.leader_shard_syncs += 1
            if now >= due["cleanup"]:
                due["cleanup"] = now + cfg.lease_cleanup_interval
                if cfg.cleanup_leases_upon_shard_completion:
                    await self._guarded("lease cleanup", self.cleanup_finished_leases)
            if now >= due["audit"]:
                due["audit"] = now + cfg.lease_audit_interval
                await self._guarded("hash-range audit", self.audit_hash_ranges)
            delay = max(0.0, min(due.values()) - self.coordinator.now())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), delay)
            if wake.is_set():  # a new term: do everything now
                wake.clear()
                due = dict.fromkeys(due, self.coordinator.now())

    async def _guarded(self, what: str, work: Callable[[], Awaitable[int]]) -> bool:
        try:
            await work()
        except (AdapterError, CorruptLeaseError) as exc:
            log.warning("%s failed: %s", what, exc)
            return False
        return True

    async def cleanup_finished_leases(self) -> int:
        """Delete the SHARD_END leases whose children have all started, once they have been
        deletable for ``lease_cleanup_delay`` (``kclasync._core.lease_cleanup``). Returns how
        many were deleted."""
        client = self._stream_client
        assert client is not None
        scan = await self.lease_store.list_leases()
        # Children of finished leases that lack childShardIds come from the shard list.
        shards: dict[str, list[Shard]] = {}
        for lease in scan.leases:
            stream = self.stream_of(lease.key)
            if lease.is_finished and not lease.child_shard_ids and stream not in (None, *shards):
                assert stream is not None
                try:
                    shards[stream] = await client.list_shards(stream)
                except AdapterError:
                    shards[stream] = []

        def children_of(lease: Lease) -> list[str]:
            listed = shards.get(self.stream_of(lease.key) or "", [])
            return [s.shard_id for s in listed if lease.shard_id in s.parent_ids]

        deleted = 0
        for lease in self._cleanup.plan(scan.leases, self.coordinator.now(), children_of):
            if await self.lease_store.delete_lease(lease):
                deleted += 1
                log.info("deleted finished lease %s (its children have started)", lease.key)
            self._cleanup.deleted(lease.key)
        self.leases_deleted += deleted
        return deleted

    async def audit_hash_ranges(self) -> int:
        """Look for holes in each stream's hash-key space covered by unfinished leases; after
        ``lease_audit_threshold`` audits in a row found one, run that stream's shard sync.
        Returns how many syncs were run."""
        client = self._stream_client
        assert client is not None
        scan = await self.lease_store.list_leases()
        syncs = 0
        for stream in await self.current_streams():
            identity = self._identities.get(stream) if self.multi_stream else None
            if self.multi_stream and identity is None:
                continue  # not described yet: the next shard sync does it
            mine = self._leases_of(identity, scan.leases)
            if not mine:
                self._auditor.forget(stream)
                continue
            if any(lease.hash_range is None for lease in mine):
                ranges = {s.shard_id: s.hash_range for s in await client.list_shards(stream)}
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
                await self._sync_stream(stream, scan.leases)
                syncs += 1
        self.audit_syncs += syncs
        return syncs

    # -- parents and children ------------------------------------------------------------

    async def _wait_for_parents(self, held: HeldLease) -> None:
        """A child is not read until each parent lease is at SHARD_END or deleted."""
        parents = held.lease.parent_shard_ids
        prefix = _key_prefix(held.lease)
        while parents:
            leases = {}
            for parent in parents:
                lease = await self.lease_store.get_lease(prefix + parent)
                if lease is not None:
                    leases[lease.key] = lease
            if parents_finished(held.lease, leases):
                return
            await asyncio.sleep(self.config.parent_shard_poll_interval)

    async def _shard_ended(self, held: HeldLease, children: tuple[ChildShard, ...]) -> None:
        """After the SHARD_END checkpoint: create the child leases that are missing (a merge
        child needs both parents finished), then write ``childShardIds``. The lease is
        released by ``_run_shard`` afterwards. If this fails the leader's shard sync creates
        the children from the shard list."""
        try:
            await self._hand_over_to_children(held, children)
        except (AdapterError, CorruptLeaseError) as exc:
            log.warning("could not create the child leases of %s yet: %s", held.key, exc)

    async def _hand_over_to_children(
        self, held: HeldLease, children: tuple[ChildShard, ...]
    ) -> None:
        parent = held.lease
        prefix = _key_prefix(parent)
        kids = [c for c in children if parent.shard_id in c.parent_shard_ids]
        if not kids:
            # No ChildShards in the response (a lease taken at SHARD_END, a trimmed shard, or
            # an emulator that omits them): ask the shard list.
            stream = self.stream_of(parent.key)
            assert stream is not None and self._stream_client is not None
            kids = [
                ChildShard(s.shard_id, s.parent_ids, s.hash_range)
                for s in await self._stream_client.list_shards(stream)
                if parent.shard_id in s.parent_ids
            ]
        if not kids:
            log.info("shard %s ended without child shards", parent.key)
            return
        related = {prefix + c.shard_id for c in kids}
        related |= {prefix + p for c in kids for p in c.parent_shard_ids}
        related.discard(parent.key)
        found = await asyncio.gather(*(self.lease_store.get_lease(k) for k in sorted(related)))
        known = [lease for lease in found if lease is not None]
        created = 0
        for lease in child_leases_for_finished_parent(parent, kids, known):
            if await self.lease_store.create_lease(lease):
                created += 1
        if created:
            log.info("shard %s ended; created %d child leases", parent.key, created)
            self._taker_wake.set()
        child_ids = frozenset(c.shard_id for c in kids)
        if parent.child_shard_ids != child_ids:
            await self._write_child_shard_ids(held, child_ids)

    async def _write_child_shard_ids(self, held: HeldLease, child_ids: frozenset[str]) -> None:
        """Fenced like a checkpoint, under the lease's lock so it never races a renewal."""
        coordinator = self.coordinator
        async with held.lock:
            if held.lost:
                return
            sent = coordinator.now()
            written = await self.lease_store.update_child_shard_ids(held.lease, child_ids)
            if written is None:  # a retried request that did succeed?
                current = await self.lease_store.get_lease(held.key)
                if (
                    current is not None
                    and current.owner == self.worker_id
                    and current.counter == held.lease.counter + 1
                    and current.child_shard_ids == child_ids
                ):
                    written = current
            if written is None:
                log.warning("could not write childShardIds of %s: the lease changed", held.key)
                return
            held.lease = written
            held.renewed_at = sent

    # -- LeaseListener -------------------------------------------------------------------

    def _release_soon(self, key: str) -> None:
        task = asyncio.create_task(self.coordinator.release(key))
        self._background_tasks.add(task)
        task.add_done_callback(self._background_tasks.discard)

    def lease_acquired(self, held: HeldLease) -> None:
        assert self._stream_client is not None and self._coordinator is not None
        if self._stopping:
            # A handoff to us completed while we stop: pass the lease on instead of starting.
            self._release_soon(held.key)
            return
        stream = self.stream_of(held.key)
        if stream is None:
            log.error("lease %s is not a multi-stream lease key; releasing it", held.key)
            task = asyncio.create_task(self.coordinator.release(held.key))
            self._background_tasks.add(task)
            task.add_done_callback(self._background_tasks.discard)
            return
        processor = self._factory()
        shard = ShardConsumer(
            held=held,
            stream=stream,
            stream_client=self._stream_client,
            coordinator=self._coordinator,
            processor=processor,
            config=self.config,
            metrics=self.metrics,
            labels=self._labels,
            on_shard_end=self._shard_ended,
            wait_for_parents=self._wait_for_parents,
        )
        run = _ShardRun(held=held, shard=shard, processor=processor)
        self._runs[held.key] = run
        run.task = asyncio.create_task(self._run_shard(run), name=f"shard {held.key}")

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        run = self._runs.get(held.key)
        if run is not None and run.held is held:
            run.shard.request_shutdown()
        else:  # no pipeline (it failed or never started): let go right away
            task = asyncio.create_task(self.coordinator.release(held.key))
            self._background_tasks.add(task)
            task.add_done_callback(self._background_tasks.discard)

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        run = self._runs.get(held.key)
        if run is not None and run.held is held and run.task is not None:
            run.lost = True
            run.task.cancel()

    async def _run_shard(self, run: _ShardRun) -> None:
        key = run.held.key
        coordinator = self.coordinator
        try:
            outcome = await run.shard.run()
        except asyncio.CancelledError:
            if not run.lost:
                raise
            if run.shard.initialized:
                try:
                    await run.processor.lease_lost()
                except Exception:
                    log.exception("processor.lease_lost raised for %s", key)
            return
        except LeaseLostError as exc:
            # Lost while writing a checkpoint: the coordinator has already dropped the lease.
            log.info("shard %s stopped: %s", key, exc)
            if run.shard.initialized:
                try:
                    await run.processor.lease_lost()
                except Exception:
                    log.exception("processor.lease_lost raised for %s", key)
            return
        except ProcessorFailedError as exc:
            log.error("%s", exc)
            await coordinator.release(key)
            if self.config.processor_error_policy is ProcessorErrorPolicy.FAIL:
                self._failure = self._failure or exc
                self._stop_requested.set()
            else:
                coordinator.excluded[key] = coordinator.now() + self.config.failed_shard_backoff
            return
        except (KclAsyncError, Exception) as exc:
            log.exception("shard %s stopped with an error; releasing its lease", key)
            await coordinator.release(key)
            if not isinstance(exc, AdapterError):
                coordinator.excluded[key] = coordinator.now() + self.config.failed_shard_backoff
            return
        finally:
            if self._runs.get(key) is run:
                del self._runs[key]
        if outcome in (ShardOutcome.ENDED, ShardOutcome.SHUTDOWN):
            await coordinator.release(key)
