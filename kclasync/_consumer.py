"""The public ``Consumer``: one worker of a fleet that shares the shards of one or more streams.

Owns: validating what the user passed, asking the backend (``_adapters.backends``: AWS by
default) for the worker's adapters, starting and stopping the worker (built by
``_runtime.wiring``; its task tree is ``_runtime.worker``'s), and the public surface: ``run``,
``stop``, ``async with``, ``batches``, ``wait_started``, ``health``, ``held_leases``,
``is_leader``, ``worker_id``, ``config``, ``metrics``.
Must not: make protocol decisions (``kclasync._core``), call AWS directly (adapters), or do the
runtime parts' jobs (``kclasync._runtime``), or build adapters (the backend does).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any

import attrs
from prometheus_client import CollectorRegistry

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.backends import AWSBackend, Backend
from kclasync._batches import BatchFeed, BatchIterator
from kclasync._config import ConsumerConfig, LeaseTakerKind
from kclasync._core.assignment.balanced_taker import BalancedLeaseTaker
from kclasync._core.assignment.lease_taker import Kcl2LeaseTaker, LeaseTaker
from kclasync._processor import ProcessorFactory, processor_factory
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.lease_coordinator import LeaseCoordinator
from kclasync._runtime.metrics import ConsumerMetrics, metrics_for
from kclasync._runtime.shard_sync import StreamList
from kclasync._runtime.wiring import build_worker, shard_sync_for
from kclasync._runtime.worker import Worker, WorkerSpec
from kclasync.errors import ConfigError
from kclasync.logging import log_context

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

    ``backend=`` says where the lease table and the streams live: ``AWSBackend(...)`` (the
    default, built from ``region_name``, ``endpoint_url``, ``session`` or ``client_options``)
    or, in tests, ``kclasync.testing.MemoryBackend()``.
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
        backend: Backend | None = None,
        rng: random.Random | None = None,
        wall_clock: Callable[[], float] | None = None,
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
            self._feed = BatchFeed(lambda: self._worker.held if self._worker else None)
            self._factory = self._feed.new_processor
        else:
            try:
                self._factory = processor_factory(
                    processor, buffered=self.config.buffered_handler_checkpoints
                )
            except TypeError as exc:
                raise ConfigError("processor", str(exc)) from None
        if backend is None:
            if client_options is not None and (region_name or endpoint_url or session):
                raise ConfigError(
                    "client_options", "give either client_options or region/endpoint/session"
                )
            backend = AWSBackend(
                region_name=region_name,
                endpoint_url=endpoint_url,
                session=session,
                client_options=client_options,
            )
        elif client_options is not None or region_name or endpoint_url or session:
            raise ConfigError(
                "backend", "give the AWS settings to AWSBackend(...), not beside backend="
            )
        elif not isinstance(backend, Backend):
            raise ConfigError("backend", f"must be a Backend, got {backend!r}")
        self._backend = backend
        self.worker_id: str = self.config.worker_id or default_worker_id()
        self._table_name = self.config.table_name or application_name
        #: The worker's Prometheus metrics (in ``registry=``, or the default registry).
        self.metrics: ConsumerMetrics = metrics_for(registry)
        self._labels = (application_name, self.worker_id)
        lease_taker: LeaseTaker = (
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
        #: Overrides the backend's clock for registry entries (a simulation's virtual clock).
        self._wall_clock = wall_clock
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

    def _sdk_retry(self, service: str, operation: str, code: str) -> None:
        """botocore's own retries on a client kclasync made, in ``kclasync_aws_retries_total``."""
        labels = (self._spec.application, self.worker_id, "sdk", service, operation, code)
        self.metrics.retries.labels(*labels).inc()

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
            adapters = await self._backend._connect(
                stack, self._table_name, on_retry=self._sdk_retry
            )
            if self._wall_clock is not None:
                adapters = attrs.evolve(adapters, wall_clock=self._wall_clock)
            self._worker = build_worker(
                self._spec, adapters, stop_requested=self._stop_requested, started=self._started
            )
            await self._worker.run()

    # -- for tests and tools (not public) ------------------------------------------------

    @property
    def _running(self) -> bool:
        """Whether ``run()`` has built its worker."""
        return self._worker is not None

    @property
    def _coordinator(self) -> LeaseCoordinator | None:
        return self._worker.coordinator if self._worker is not None else None

    @property
    def _store(self) -> object:
        """The backend's lease store (under the worker's retry wrapper), while running."""
        return self._worker.store.inner if self._worker is not None else None

    @property
    def _stream_client(self) -> object:
        """The backend's stream client (under the worker's retry wrapper), while running."""
        return self._worker.stream_client.inner if self._worker is not None else None

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

    def _use_taker(self, taker: LeaseTaker) -> None:
        """Plan takes with ``taker`` instead of the configured one (the simulation's)."""
        self._spec = attrs.evolve(self._spec, taker=taker)

    async def _sync_shards(self) -> int:
        """One full shard sync, running or not (tests prepare tables with it)."""
        if self._worker is not None:
            return await self._worker.shard_sync.sync_shards()
        async with contextlib.AsyncExitStack() as stack:
            adapters = await self._backend._connect(stack, self._table_name)
            sync = shard_sync_for(
                self._spec, adapters.store, adapters.stream_client, None, lambda: None
            )
            return await sync.sync_shards()
