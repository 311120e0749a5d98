"""The public ``Consumer``: one worker of a fleet that shares the shards of one or more streams.

Owns: validating what the user passed, creating the AWS clients it was not given, starting and
stopping the worker (``_runtime.worker``: the task tree), and the public surface: ``run``,
``stop``, ``async with``, ``batches``, ``wait_started``, ``health``, ``held_leases``,
``is_leader``, ``worker_id``, ``config``, ``metrics``.
Must not: make protocol decisions (``kclasync._core``), call AWS directly (adapters), or do the
runtime parts' jobs (``kclasync._runtime``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore, StreamClient
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._batches import BatchFeed, BatchIterator
from kclasync._config import ConsumerConfig, LeaseTakerKind
from kclasync._core.balanced_taker import BalancedLeaseTaker
from kclasync._core.lease_taker import Kcl2LeaseTaker, LeaseTaker
from kclasync._processor import ProcessorFactory, processor_factory
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.lease_coordinator import LeaseCoordinator
from kclasync._runtime.metrics import ConsumerMetrics, metrics_for
from kclasync._runtime.shard_sync import StreamList
from kclasync._runtime.worker import Worker
from kclasync._runtime.worker_parts import WorkerSpec, shard_sync_for
from kclasync.errors import ConfigError
from kclasync.logging import log_context

if TYPE_CHECKING:
    from kclasync._adapters.fanout import FanOutClient

log = logging.getLogger("kclasync._consumer")

__all__ = ["Consumer", "StreamList", "default_worker_id"]


_COUNTERS = (
    "shard_syncs",
    "leader_shard_syncs",
    "leases_deleted",
    "audit_syncs",
    "stream_leases_dropped",
)


def default_worker_id() -> str:
    """``host:pid:random`` so two workers never share an id by accident."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


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

    Without ``processor=``, iterate the batches instead: ``async for batch in
    consumer.batches(): ...; await batch.commit()``.
    """

    def __init__(
        self,
        *,
        stream_name: str | None = None,
        application_name: str,
        processor: object = None,
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
        worker_registry: WorkerRegistry | None = None,
        wall_clock: Callable[[], float] | None = None,
        cpu_reader: CpuReader | None = None,
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
        self._multi_stream = streams is not None
        self._streams: StreamList
        if streams is None:
            self._streams = (stream_name or "",)
        elif callable(streams):
            self._streams = streams
        else:
            self._streams = tuple(streams)
        self._application_name = application_name
        self.config = config if config is not None else ConsumerConfig()
        if not isinstance(self.config, ConsumerConfig):
            raise ConfigError("config", f"must be a ConsumerConfig, got {config!r}")
        self._worker: Worker | None = None
        #: Set when built without a processor: the shards' batches go to ``batches()``.
        self._feed: BatchFeed | None = None
        self._factory: ProcessorFactory
        if processor is None:
            self._feed = BatchFeed(lambda: self._worker)
            self._factory = self._feed.new_processor
        else:
            try:
                self._factory = processor_factory(
                    processor, buffered=self.config.buffered_handler_checkpoints
                )
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
        self._client_options = client_options
        self.worker_id: str = self.config.worker_id or default_worker_id()
        self._table_name = self.config.table_name or application_name
        #: The worker's Prometheus metrics (in ``registry=``, or the default registry).
        self.metrics: ConsumerMetrics = metrics_for(registry)
        self._labels = (application_name, self.worker_id)
        self._store = lease_store
        self._stream_client = stream_client
        #: Enhanced fan-out over the Kinesis client made in ``run()`` (retrieval="fanout").
        self._fanout_client: FanOutClient | None = None
        if lease_taker is None:
            lease_taker = (
                Kcl2LeaseTaker()
                if self.config.lease_taker is LeaseTakerKind.KCL2
                else BalancedLeaseTaker()
            )
        self._spec = WorkerSpec(
            config=self.config,
            worker_id=self.worker_id,
            application=application_name,
            streams=self._streams,
            multi_stream=self._multi_stream,
            factory=self._factory,
            taker=lease_taker,
            rng=rng if rng is not None else random.Random(),
            metrics=self.metrics,
        )
        self._coordinator_state = coordinator_state
        self._worker_registry = worker_registry
        self._wall_clock = wall_clock
        #: Where this worker's CPU utilisation comes from (None: detected with a DynamoDB
        #: table, none with injected stores).
        self._cpu_reader = cpu_reader
        self._stop_requested = asyncio.Event()
        self._started = asyncio.Event()
        self._background: asyncio.Task[None] | None = None
        #: What the last ``run()`` raised (None while it runs or after a clean stop).
        self._run_error: Exception | None = None

    # -- introspection -------------------------------------------------------------------

    @property
    def held_leases(self) -> list[str]:
        """Keys of the leases this worker holds now."""
        return sorted(self._coordinator.held) if self._coordinator else []

    @property
    def is_leader(self) -> bool:
        """Whether this worker holds the leader lock now."""
        return self._elector is not None and self._elector.is_leader()

    @property
    def health(self) -> dict[str, object]:
        """A snapshot for health checks: running, the error that stopped it, leases held."""
        task = self._background
        failed = task is not None and task.done() and not task.cancelled() and task.exception()
        failure = self._worker.failure if self._worker is not None else None
        failure = failure or self._run_error
        return {
            "worker_id": self.worker_id,
            "running": self._started.is_set() and not self._stop_requested.is_set(),
            "error": repr(failure or failed) if (failure or failed) else None,
            "leases": len(self.held_leases),
            "leader": self.is_leader,
        }

    async def wait_started(self) -> None:
        await self._started.wait()

    def batches(self) -> BatchIterator:
        """The shards' batches, for a consumer built without ``processor=``.

        ``async for batch in consumer.batches():`` yields a ``ShardBatch`` at a time; a shard's
        next batch comes only after the loop finished with its previous one (asked for the
        next batch), batches of different shards interleave. ``await batch.commit()``
        checkpoints. Leaving the loop stops the consumer gracefully; ``async with
        consumer.batches() as batches:`` waits for that stop on exit. See docs/batches.md."""
        if self._feed is None:
            raise ConfigError("processor", "batches() needs a Consumer built without processor=")
        return BatchIterator(self, self._feed)

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
        if self._feed is not None:
            # Batches not yielded yet are withdrawn; the one in the loop finishes as it moves on.
            self._feed.close(finish_current=False)
        if self._background is not None and not self._background.done():
            with contextlib.suppress(Exception):
                await asyncio.shield(self._background)

    async def run(self) -> None:
        """Consume until ``stop()``. Raises the error that stopped it, if any (and keeps it in
        ``health["error"]``, so ``liveness()`` answers 503 after a ``run()`` that raised, even
        one that raised before the worker started)."""
        self._run_error = None
        try:
            await self._run()
        except Exception as exc:
            self._run_error = exc
            raise

    async def _run(self) -> None:
        async with contextlib.AsyncExitStack() as stack:
            stack.enter_context(log_context(worker=self.worker_id))
            session = (
                self._client_options.new_session()
                if self._store is None or self._stream_client is None
                else None
            )
            legacy_cleanup: Callable[[], Awaitable[list[str]]] | None = None
            cpu_reader: CpuReader | None = self._cpu_reader
            if self._store is None:
                from kclasync._adapters.dynamodb import DynamoLeaseStore

                ddb = await stack.enter_async_context(
                    self._client_options.create_client("dynamodb", session)
                )
                self._store = DynamoLeaseStore(ddb, self._table_name)
                if self._coordinator_state is None:
                    from kclasync._adapters.coordinator_state import (
                        DynamoCoordinatorState,
                        coordinator_table_name,
                    )

                    self._coordinator_state = DynamoCoordinatorState(
                        ddb, coordinator_table_name(self._table_name)
                    )
                if self._worker_registry is None:
                    from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
                    from kclasync._adapters.worker_registry import worker_metrics_table_name

                    self._worker_registry = DynamoWorkerMetrics(
                        ddb, worker_metrics_table_name(self._table_name)
                    )
                legacy_cleanup = self._legacy_cleanup(ddb, self._table_name)
                wall_clock = self._wall_clock or time.time
                from kclasync._adapters.cpu_metrics import detect_cpu_reader

                if cpu_reader is None:
                    cpu_reader = detect_cpu_reader(asyncio.get_running_loop().time)
            else:
                # Injected (in-memory) stores live on the event loop's clock, virtual or not.
                wall_clock = self._wall_clock or asyncio.get_running_loop().time
            if self._coordinator_state is None:
                # An injected lease store without a lock store: this worker leads on its own
                # (every such worker runs the leader's duties, which are safe to run twice).
                from kclasync._adapters.memory import MemoryCoordinatorState

                self._coordinator_state = MemoryCoordinatorState()
            if self._worker_registry is None:
                # The registry that goes with an in-memory table is shared by its workers.
                from kclasync._adapters.memory import MemoryLeaseStore
                from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics

                store = self._store
                self._worker_registry = (
                    store.worker_registry()
                    if isinstance(store, MemoryLeaseStore)
                    else MemoryWorkerMetrics()
                )
            if self._stream_client is None:
                from kclasync._adapters.fanout import FanOutClient
                from kclasync._adapters.kinesis import KinesisStreamClient

                kin = await stack.enter_async_context(
                    self._client_options.create_client("kinesis", session)
                )
                self._stream_client = KinesisStreamClient(kin)
                self._fanout_client = FanOutClient(kin)
            self._worker = Worker(
                self._spec,
                store=self._store,
                stream_client=self._stream_client,
                locks=self._coordinator_state,
                stop_requested=self._stop_requested,
                started=self._started,
                registry=self._worker_registry,
                wall_clock=wall_clock,
                legacy_cleanup=legacy_cleanup,
                cpu_reader=cpu_reader,
                fanout=self._fanout_client,
            )
            await self._worker.run()

    @staticmethod
    def _legacy_cleanup(ddb: Any, table: str) -> Callable[[], Awaitable[list[str]]]:
        async def cleanup() -> list[str]:
            from kclasync._adapters.worker_metrics_table import remove_legacy_registry_items

            return await remove_legacy_registry_items(ddb, table)

        return cleanup

    # -- for tests and tools (not public) ------------------------------------------------

    @property
    def _coordinator(self) -> LeaseCoordinator | None:
        return self._worker.coordinator if self._worker is not None else None

    @property
    def _elector(self) -> LeaderElector | None:
        return self._worker.elector if self._worker is not None else None

    @property
    def _counters(self) -> dict[str, int]:
        """Shard syncs (any reason, as leader), finished leases deleted, syncs the hash-range
        audit triggered, leases dropped because their stream left the list."""
        w = self._worker
        if w is None:
            return dict.fromkeys(_COUNTERS, 0)
        sync, duties = w.shard_sync, w.duties
        values = (sync.syncs, duties.shard_syncs, duties.leases_deleted, duties.audit_syncs)
        return dict(zip(_COUNTERS, (*values, sync.stream_leases_dropped), strict=True))

    async def _sync_shards(self) -> int:
        """One full shard sync, running or not (tests prepare tables with it)."""
        if self._worker is not None:
            return await self._worker.shard_sync.sync_shards()
        assert self._store is not None and self._stream_client is not None
        sync = shard_sync_for(self._spec, self._store, self._stream_client, None, lambda: None)
        return await sync.sync_shards()
