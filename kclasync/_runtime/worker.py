"""One worker's task tree: its runtime parts, wired together and run in two task groups.

Owns: building the parts (lease coordinator, leader elector, shard sync, leader duties, shard
supervisor) on given adapters, start-up retries, running the loops (renewer, taker, leader lock,
leader duties) in one task group and the shard pipelines in another, and the order of a
graceful stop: taking stops, leadership is given up, pipelines drain and checkpoint, leases are
released, renewals stop, the worker leaves the registry (``<app>-WorkerMetricStats``).
Must not: do any part's job itself, make protocol decisions, or create AWS clients (``Consumer``).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

import attrs

from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.protocols import (
    CoordinatorStateStore,
    LeaseStore,
    StreamClient,
)
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import ConsumerConfig, LeaseTakerKind, RetrievalMode
from kclasync._core.client_version import java_fleet_follows_leader
from kclasync._core.expiry import ExpiryTracker
from kclasync._core.fanout_session import ResubscribePolicy
from kclasync._core.lease_taker import LeaseTaker
from kclasync._core.retry_policy import policy_table
from kclasync._processor import ProcessorFactory
from kclasync._runtime.assignment import AssignmentDiscovery, LeaderAssignment, assignment_tasks
from kclasync._runtime.early_failover import EarlyFailover
from kclasync._runtime.fanout_streams import FanOutConsumers
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.leader_duties import LeaderDuties
from kclasync._runtime.lease_coordinator import HeldLease, LeaseCoordinator
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.retrying import (
    Retrier,
    RetryingCoordinatorState,
    RetryingLeaseStore,
    RetryingStreamClient,
    RetryingWorkerRegistry,
)
from kclasync._runtime.shard_supervisor import ShardSupervisor
from kclasync._runtime.shard_sync import ShardSync, StreamList
from kclasync.errors import AdapterError, ConfigError

log = logging.getLogger("kclasync._consumer")


@attrs.frozen
class WorkerSpec:
    """What a ``Consumer`` was built with, as its worker needs it."""

    config: ConsumerConfig
    worker_id: str
    application: str
    streams: StreamList
    multi_stream: bool
    factory: ProcessorFactory
    taker: LeaseTaker
    rng: random.Random
    metrics: ConsumerMetrics


def shard_sync_for(
    spec: WorkerSpec,
    store: LeaseStore,
    client: StreamClient,
    coordinator: LeaseCoordinator | None,
    on_created: Callable[[], None],
) -> ShardSync:
    """The shard sync of a worker (with no coordinator: a one-off sync, e.g. a table set-up)."""

    def loop_time() -> float:
        return asyncio.get_running_loop().time()

    if not isinstance(store, RetryingLeaseStore):  # a one-off sync outside a worker
        retrier = retrier_for(spec)
        store = RetryingLeaseStore(store, retrier)
        client = RetryingStreamClient(client, retrier)

    return ShardSync(
        config=spec.config,
        streams=spec.streams,
        multi_stream=spec.multi_stream,
        store=store,
        stream_client=client,
        clock=coordinator.now if coordinator is not None else loop_time,
        expiry=(
            coordinator.taking.expiry
            if coordinator is not None
            else ExpiryTracker(spec.config.failover_time)
        ),
        on_created=on_created,
    )


async def overlapped(*steps: Coroutine[Any, Any, None]) -> None:
    """Run independent start-up steps at once; the first failure cancels the others and is
    raised as it is (not wrapped in an exception group)."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            raise failure


def retrier_for(spec: WorkerSpec) -> Retrier:
    """The retry policy table of a worker, with jitter from its seeded generator."""
    cfg = spec.config
    policies = policy_table(
        failover_time=cfg.failover_time,
        renewer_interval=cfg.renewer_interval,
        throttle_backoff=cfg.throttle_backoff,
        max_backoff=cfg.max_backoff,
        leader_heartbeat_interval=cfg.leader_heartbeat_interval,
    )
    return Retrier(policies, spec.rng)


def fanout_consumers_for(spec: WorkerSpec, client: FanOutClient | None) -> FanOutConsumers | None:
    """The worker's stream consumers when it reads with enhanced fan-out (else None)."""
    cfg = spec.config
    if cfg.retrieval is not RetrievalMode.FANOUT:
        return None
    if client is None:
        raise ConfigError(
            "retrieval", "fan-out needs the Kinesis client kclasync creates (no stream_client=)"
        )
    return FanOutConsumers(
        client,
        cfg.fanout_consumer_name or spec.application,
        policy=ResubscribePolicy(refresh_after=cfg.fanout_refresh_after),
        rng=spec.rng,
        activation_timeout=cfg.fanout_activation_timeout,
        deregister_on_stop=cfg.fanout_deregister_on_stop,
    )


class _NotListening:
    """The coordinator's listener until the supervisor is attached (nothing is held yet)."""

    def lease_acquired(self, held: HeldLease) -> None:
        raise AssertionError(f"lease {held.key} acquired before the supervisor was attached")

    def lease_lost(self, held: HeldLease, reason: str) -> None:
        return None

    def lease_stop_requested(self, held: HeldLease, reason: str) -> None:
        return None


class Worker:
    def __init__(
        self,
        spec: WorkerSpec,
        *,
        store: LeaseStore,
        stream_client: StreamClient,
        locks: CoordinatorStateStore,
        stop_requested: asyncio.Event,
        started: asyncio.Event,
        registry: WorkerRegistry,
        wall_clock: Callable[[], float],
        legacy_cleanup: Callable[[], Awaitable[list[str]]] | None = None,
        cpu_reader: CpuReader | None = None,
        fanout: FanOutClient | None = None,
    ) -> None:
        cfg = spec.config
        self.spec = spec
        # Every adapter call of every part goes through the one retry policy table.
        self.retrier = retrier_for(spec)
        store = RetryingLeaseStore(store, self.retrier)
        stream_client = RetryingStreamClient(stream_client, self.retrier)
        locks = RetryingCoordinatorState(locks, self.retrier)
        self.store = store
        self.locks = locks
        self._stop_requested = stop_requested
        self._started = started
        self._taker_wake = asyncio.Event()
        self.registry: WorkerRegistry = RetryingWorkerRegistry(registry, self.retrier)
        registry = self.registry
        self._legacy_cleanup = legacy_cleanup
        #: The error that stopped the worker (``run()`` raises it after the graceful stop).
        self.failure: BaseException | None = None
        self.coordinator = LeaseCoordinator(
            store=store,
            worker_id=spec.worker_id,
            failover_time=cfg.failover_time,
            renewer_interval=cfg.renewer_interval,
            taker_interval=cfg.taker_interval,
            taker=spec.taker,
            max_leases_for_worker=cfg.max_leases_for_worker,
            max_leases_to_steal=cfg.max_leases_to_steal,
            metrics=spec.metrics,
            application=spec.application,
            listener=_NotListening(),
            graceful_handoff=cfg.graceful_handoff,
            handoff_timeout=cfg.handoff_timeout,
            worker_timeout=cfg.effective_worker_timeout,
            rng=spec.rng,
            registry=registry,
            wall_clock=wall_clock,
            cpu_reader=cpu_reader,
            max_cpu_percent=cfg.max_cpu_percent,
            capacity_kbps=cfg.worker_capacity_kbps,
            heartbeat_interval=cfg.effective_heartbeat_interval,
        )
        #: Heartbeats and the following of silent workers (``early_failover``), else None.
        self.early_failover = (
            EarlyFailover(
                self.coordinator,
                cfg.effective_heartbeat_interval,
                wake_taker=self._taker_wake.set,
                is_leader=lambda: self.elector.is_leader(),
            )
            if cfg.effective_heartbeat_interval is not None
            else None
        )
        self.elector = LeaderElector(
            store=locks,
            worker_id=spec.worker_id,
            lock_duration=cfg.leader_lock_duration,
            heartbeat_interval=cfg.leader_heartbeat_interval,
            rng=spec.rng,
            # The loop's clock, bound now: ``is_leader`` (and so ``Consumer.health``) is then
            # readable from any thread, e.g. a web framework's thread pool.
            clock=asyncio.get_running_loop().time,
        )
        self.shard_sync = shard_sync_for(
            spec, store, stream_client, self.coordinator, self._taker_wake.set
        )
        self.duties = LeaderDuties(
            config=cfg,
            elector=self.elector,
            shard_sync=self.shard_sync,
            store=store,
            stream_client=stream_client,
            clock=self.coordinator.now,
        )
        #: The stream consumers shards are read through (retrieval="fanout"), else None.
        self.fanout = fanout_consumers_for(spec, fanout)
        self.supervisor = ShardSupervisor(
            config=cfg,
            coordinator=self.coordinator,
            store=store,
            stream_client=stream_client,
            factory=spec.factory,
            metrics=spec.metrics,
            labels=(spec.application, spec.worker_id),
            stream_of=self.shard_sync.stream_of,
            on_children_created=self._taker_wake.set,
            on_failure=self.fail,
            fanout=self.fanout,
        )
        self.coordinator.listener = self.supervisor
        #: Leader-based modes (``kcl3``, ``load``): the leader's loop and this worker's discovery.
        self.assignment: LeaderAssignment | None = None
        self.discovery: AssignmentDiscovery | None = None
        if cfg.lease_taker.leader_based:
            self.assignment, self.discovery = assignment_tasks(
                self.coordinator,
                self.elector,
                policy=cfg.lease_taker,
                interval=cfg.effective_assignment_interval,
                discovery_interval=cfg.effective_discovery_interval,
                registry=self.registry,
                rng=spec.rng,
                balancer=cfg.balancer_settings(),
                kcl3=cfg.kcl3_settings(),
            )

    def fail(self, exc: BaseException) -> None:
        """Stop gracefully because of ``exc``; ``run()`` raises it at the end."""
        self.failure = self.failure or exc
        self._stop_requested.set()

    async def _watched(self, loop: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """A loop of the task tree: if it ends or fails, the worker stops gracefully.

        Takes the loop's factory, not its coroutine: a task cancelled before its first step
        (a stop right after start) then leaves no coroutine that was never awaited."""
        try:
            await loop()
        except Exception as exc:
            self.fail(exc)
        else:
            self._stop_requested.set()

    async def run(self) -> None:
        cfg = self.spec.config
        await overlapped(
            self._at_start("creating the coordinator-state table", self.locks.ensure_table),
            self._at_start("creating the worker-metrics table", self.registry.ensure_table),
            self._lease_table_and_first_sync(),
        )
        await self._at_start("reading the Java KCL's migration state", self._check_java_fleet)
        coordinator = self.coordinator
        # Cancelling run() cancels both groups: an abrupt stop leaves the leases to expire.
        async with asyncio.TaskGroup() as pipelines:
            self.supervisor.attach(pipelines)
            async with asyncio.TaskGroup() as loops:
                renewer = [
                    loops.create_task(self._watched(coordinator.renewer_loop), name="renewer")
                ]
                if self.early_failover is not None:
                    # Heartbeats go on while the pipelines drain, as renewals do.
                    renewer.append(
                        loops.create_task(self._watched(self.early_failover.run), name="heartbeats")
                    )
                # Long enough for workers started together to see each other.
                first_delay = (
                    min(cfg.renewer_interval, 1.0)
                    if cfg.lease_taker is LeaseTakerKind.BALANCED
                    else 0.0
                )
                if self.assignment is not None and self.discovery is not None:
                    taking = [
                        loops.create_task(self._watched(self.assignment.run), name="assignment"),
                        loops.create_task(
                            self._watched(partial(self.discovery.run, self._taker_wake)),
                            name="assignment-discovery",
                        ),
                    ]
                else:
                    taker = partial(
                        coordinator.taking.loop, self._taker_wake, first_delay=first_delay
                    )
                    taking = [loops.create_task(self._watched(taker), name="taker")]
                duties = [
                    *taking,
                    loops.create_task(self._watched(self.elector.run), name="leader-lock"),
                    loops.create_task(self._watched(self.duties.run), name="leader-duties"),
                ]
                self._started.set()
                log.info(
                    "worker %s started on %s",
                    self.spec.worker_id,
                    "several streams"
                    if self.spec.multi_stream
                    else f"stream {self.shard_sync.stream_of('')}",
                )
                await self._stop_requested.wait()
                await self._shutdown(renewer, duties)
        if self.failure is not None:
            raise self.failure

    async def _lease_table_and_first_sync(self) -> None:
        await self._at_start("creating the lease table", self.store.ensure_table)
        if self._legacy_cleanup is not None:
            await self._at_start("removing old registry items", self._remove_legacy_items)
        # Also proves the stream exists (StreamNotFoundError is not retried) before anything starts.
        await self._at_start("the first shard sync", self.shard_sync.initial_sync)

    async def _check_java_fleet(self) -> None:
        """Read ``Migration3.0`` (never written): say whether this worker's lease taking fits
        the Java workers sharing the table."""
        state = await self.locks.get_migration_state()
        follows = java_fleet_follows_leader(state)
        if state is None:
            return
        if follows:
            log.warning(
                "the Java KCL on this table runs %s: its workers only process what their leader "
                "assigns and never steal; this worker takes leases itself (lease_taker=%s), so "
                "in a mixed fleet leases may move back and forth (see docs/migration.md)",
                state.raw,
                self.spec.config.lease_taker.value,
            )
        else:
            log.info("the Java KCL on this table runs %s", state.raw)

    async def _remove_legacy_items(self) -> None:
        """The one-time repair of a lease table an older kclasync wrote registry items into."""
        assert self._legacy_cleanup is not None
        removed = await self._legacy_cleanup()
        log.info(
            "removed %d worker-registry item(s) of an earlier kclasync from the lease table",
            len(removed),
        )

    async def _at_start(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        """Run a start-up step, retrying throttling and transient errors a few times with
        backoff; anything else, or the last failure, stops ``run()`` with that error."""
        cfg = self.spec.config
        delay = cfg.throttle_backoff
        for attempt in range(1, 6):
            try:
                await step()
                return
            except AdapterError as exc:
                if attempt == 5:
                    raise
                log.warning("%s failed (%s); retrying in %.2fs", what, exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, cfg.max_backoff)

    async def _shutdown(
        self, renewer: list[asyncio.Task[None]], duties: list[asyncio.Task[None]]
    ) -> None:
        self.coordinator.taking.enabled = False
        self.supervisor.stopping = True
        for task in duties:
            task.cancel()
        await asyncio.gather(*duties, return_exceptions=True)
        await self.elector.release()  # another worker leads at once
        await self.supervisor.drain()  # renewals go on meanwhile
        if self.fanout is not None:
            await self.fanout.close()  # deregisters, if configured to
        for task in renewer:
            task.cancel()
        await asyncio.gather(*renewer, return_exceptions=True)
        await self.coordinator.presence.leave()
        await self.coordinator.presence.close()
        log.info("worker %s stopped", self.spec.worker_id)
