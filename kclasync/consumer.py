"""The public ``Consumer``: one worker of a fleet that shares a stream's shards.

Owns: the task tree of one worker (renewer, taker, shard sync, one pipeline per owned lease),
starting and stopping it, and the processor-failure policy.
Must not: make protocol decisions itself (``kclasync.core``) or call AWS directly (adapters).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import socket
from types import TracebackType
from typing import Any

import attrs
from prometheus_client import CollectorRegistry

from kclasync.adapters.aws import ClientOptions
from kclasync.adapters.protocols import AdapterError, ChildShard, LeaseStore, StreamClient
from kclasync.config import ConsumerConfig, ProcessorErrorPolicy
from kclasync.core.lease_taker import Kcl2LeaseTaker, LeaseTaker
from kclasync.core.shard_lineage import (
    child_leases_for_finished_parent,
    parents_finished,
    plan_new_leases,
)
from kclasync.errors import ConfigError, KclAsyncError, ProcessorFailedError
from kclasync.processor import ProcessorFactory, RecordProcessor, processor_factory
from kclasync.runtime.lease_coordinator import HeldLease, LeaseCoordinator
from kclasync.runtime.metrics import metrics_for
from kclasync.runtime.shard_consumer import ShardConsumer, ShardOutcome

log = logging.getLogger("kclasync.consumer")


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
    """A worker that consumes a Kinesis stream under the KCL lease protocol.

    >>> async def handle(records): ...
    >>> await Consumer(stream_name="orders", application_name="billing", processor=handle).run()

    ``run()`` returns after ``stop()``; cancelling ``run()`` is an abrupt stop (leases are left
    to expire, as after a crash). ``async with Consumer(...)`` runs it in the background and
    stops it gracefully on exit.
    """

    def __init__(
        self,
        *,
        stream_name: str,
        application_name: str,
        processor: object,
        config: ConsumerConfig | None = None,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        session: Any = None,
        client_options: ClientOptions | None = None,
        registry: CollectorRegistry | None = None,
        lease_store: LeaseStore | None = None,
        stream_client: StreamClient | None = None,
        lease_taker: LeaseTaker | None = None,
        rng: random.Random | None = None,
    ) -> None:
        if not stream_name:
            raise ConfigError("stream_name", "must not be empty")
        if not application_name:
            raise ConfigError("application_name", "must not be empty")
        self.stream_name = stream_name
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
        self._taker = lease_taker if lease_taker is not None else Kcl2LeaseTaker()
        self._rng = rng if rng is not None else random.Random()
        self._coordinator: LeaseCoordinator | None = None
        self._runs: dict[str, _ShardRun] = {}
        self._stop_requested = asyncio.Event()
        self._failure: BaseException | None = None
        self._started = asyncio.Event()
        self._background: asyncio.Task[None] | None = None
        self._taker_wake = asyncio.Event()

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
                from kclasync.adapters.dynamodb import DynamoLeaseStore

                ddb = await stack.enter_async_context(self.client_options.create_client("dynamodb"))
                self._store = DynamoLeaseStore(ddb, self.table_name)
            if self._stream_client is None:
                from kclasync.adapters.kinesis import KinesisStreamClient

                kin = await stack.enter_async_context(self.client_options.create_client("kinesis"))
                self._stream_client = KinesisStreamClient(kin)
            await self._run(self._store, self._stream_client)

    async def _run(self, store: LeaseStore, stream_client: StreamClient) -> None:
        cfg = self.config
        await store.ensure_table()
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
            rng=self._rng,
        )
        self._coordinator = coordinator
        await self.sync_shards()  # also proves the stream exists before anything else starts
        loops = [
            asyncio.create_task(coordinator.renewer_loop(), name="renewer"),
            asyncio.create_task(coordinator.taker_loop(self._taker_wake), name="taker"),
            asyncio.create_task(self._shard_sync_loop(), name="shard-sync"),
        ]
        self._started.set()
        log.info("worker %s started on stream %s", self.worker_id, self.stream_name)
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

    async def _shutdown(
        self, coordinator: LeaseCoordinator, loops: list[asyncio.Task[None]]
    ) -> None:
        coordinator.taking_enabled = False
        for task in loops[1:]:
            task.cancel()
        await asyncio.gather(*loops[1:], return_exceptions=True)
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
        loops[0].cancel()
        await asyncio.gather(loops[0], return_exceptions=True)
        log.info("worker %s stopped", self.worker_id)

    # -- shard sync ----------------------------------------------------------------------

    async def sync_shards(self) -> int:
        """Create the leases the shard graph calls for. Returns how many were created."""
        store, client = self.lease_store, self._stream_client
        assert client is not None
        shards = await client.list_shards(self.stream_name)
        scan = await store.list_leases()
        new = plan_new_leases(shards, scan.leases, self.config.initial_position)
        # Children of finished parents (normally created at SHARD_END by the parent's worker;
        # this catches a worker that died between its SHARD_END checkpoint and that step).
        for parent in scan.leases:
            if parent.is_finished:
                new += child_leases_for_finished_parent(parent, shards, [*scan.leases, *new])
        created = 0
        for lease in new:
            if await store.create_lease(lease):
                created += 1
        if created:
            log.info("shard sync created %d leases", created)
            self._taker_wake.set()
        return created

    async def _shard_sync_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.shard_sync_interval)
            try:
                await self.sync_shards()
            except AdapterError as exc:
                log.warning("shard sync failed: %s", exc)

    async def _wait_for_parents(self, held: HeldLease) -> None:
        """A child is not read until each parent lease is at SHARD_END or deleted."""
        parents = held.lease.parent_shard_ids
        while parents:
            leases = {}
            for parent in parents:
                lease = await self.lease_store.get_lease(parent)
                if lease is not None:
                    leases[parent] = lease
            if parents_finished(held.lease, leases):
                return
            await asyncio.sleep(self.config.parent_shard_poll_interval)

    async def _shard_ended(self, held: HeldLease, children: tuple[ChildShard, ...]) -> None:
        try:
            await self.sync_shards()
        except AdapterError as exc:  # the periodic sync will create the children
            log.warning("could not create child leases of %s yet: %s", held.key, exc)

    # -- LeaseListener -------------------------------------------------------------------

    def lease_acquired(self, held: HeldLease) -> None:
        assert self._stream_client is not None and self._coordinator is not None
        processor = self._factory()
        shard = ShardConsumer(
            held=held,
            stream=self.stream_name,
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
