"""One worker's task tree: its parts run in two task groups, and stopped in order.

Owns: ``WorkerSpec`` (what a ``Consumer`` was built with), ``WorkerParts`` (what a worker runs,
built by ``wiring``), running the loops (renewer, heartbeats, taker and the leader-based
assignment, leader lock, leader duties, the lease-mode watch) in one task group and the shard
pipelines in another,
turning a loop's failure into a graceful stop whose error ``run()`` raises (``WorkerStop``), and
the order of a graceful stop: taking stops, leadership is given up, pipelines drain and
checkpoint, leases are released, renewals stop, the worker leaves the registry
(``<app>-WorkerMetricStats``).
Must not: build the parts (``wiring``), run the start-up steps (``worker_startup``), do any
part's job itself, make protocol decisions, or create AWS clients (the backend does).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any

import attrs

from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import ConsumerConfig, LeaseTakerKind
from kclasync._core.assignment.lease_taker import LeaseTaker
from kclasync._core.assignment.startup import settle_time
from kclasync._processor import ProcessorFactory
from kclasync._runtime.assignment import LeaderAssignment
from kclasync._runtime.assignment_discovery import AssignmentDiscovery
from kclasync._runtime.early_failover import EarlyFailover
from kclasync._runtime.fanout_streams import FanOutConsumers
from kclasync._runtime.held import HeldLeases
from kclasync._runtime.leader import LeaderElector
from kclasync._runtime.leader_duties import LeaderDuties
from kclasync._runtime.leader_failover import LeaderFailover
from kclasync._runtime.lease_coordinator import LeaseCoordinator
from kclasync._runtime.lease_mode import LeaseModeWatch
from kclasync._runtime.metrics import ConsumerMetrics
from kclasync._runtime.retrying import (
    Retrier,
    RetryingCoordinatorState,
    RetryingLeaseStore,
    RetryingStreamClient,
)
from kclasync._runtime.shard_supervisor import ShardSupervisor
from kclasync._runtime.shard_sync import ShardSync, StreamList
from kclasync._runtime.worker_startup import WorkerStartup

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


class WorkerStop:
    """How a worker is asked to stop, and the error that stopped it."""

    def __init__(self, requested: asyncio.Event) -> None:
        self.requested = requested
        #: The error that stopped the worker (``run()`` raises it after the graceful stop).
        self.failure: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        """Stop gracefully because of ``exc``; ``run()`` raises it at the end."""
        self.failure = self.failure or exc
        self.requested.set()


@attrs.frozen
class WorkerParts:
    """The parts of one worker, on adapters wrapped in its retry policy table."""

    retrier: Retrier
    store: RetryingLeaseStore
    stream_client: RetryingStreamClient
    locks: RetryingCoordinatorState
    registry: WorkerRegistry
    coordinator: LeaseCoordinator
    #: Heartbeats and the following of silent workers (``early_failover``), else None.
    early_failover: EarlyFailover | None
    elector: LeaderElector
    shard_sync: ShardSync
    duties: LeaderDuties
    #: The stream consumers shards are read through (retrieval="fanout"), else None.
    fanout: FanOutConsumers | None
    supervisor: ShardSupervisor
    #: The leader's loop and this worker's discovery: they act while ``coordinator.taking``
    #: says a leader assigns (a leader-based taker, or ``lease_mode`` switched to it).
    assignment: LeaderAssignment
    discovery: AssignmentDiscovery
    #: Follows the Java KCL's migration state: whether a leader assigns the leases.
    lease_mode: LeaseModeWatch
    startup: WorkerStartup
    #: Set to start a taking round early (new leases, a worker joined).
    taker_wake: asyncio.Event
    #: The leader's early failover in the leader-based modes (``early_failover``), else None.
    leader_failover: LeaderFailover | None = None


class Worker:
    def __init__(
        self, spec: WorkerSpec, parts: WorkerParts, *, stop: WorkerStop, started: asyncio.Event
    ) -> None:
        self.spec = spec
        self._stop = stop
        self._stop_requested = stop.requested
        self._started = started
        self._taker_wake = parts.taker_wake
        self.retrier = parts.retrier
        self.store = parts.store
        self.stream_client = parts.stream_client
        self.locks = parts.locks
        self.registry = parts.registry
        self.coordinator = parts.coordinator
        self.held: HeldLeases = parts.coordinator.held
        self.early_failover = parts.early_failover
        self.elector = parts.elector
        self.shard_sync = parts.shard_sync
        self.duties = parts.duties
        self.fanout = parts.fanout
        self.supervisor = parts.supervisor
        self.assignment = parts.assignment
        self.discovery = parts.discovery
        self.leader_failover = parts.leader_failover
        self.lease_mode = parts.lease_mode
        self._startup = parts.startup

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the worker (``run()`` raises it after the graceful stop)."""
        return self._stop.failure

    def fail(self, exc: BaseException) -> None:
        """Stop gracefully because of ``exc``; ``run()`` raises it at the end."""
        self._stop.fail(exc)

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
        await self._startup.run()
        coordinator = self.coordinator
        # Cancelling run() cancels both groups: an abrupt stop leaves the leases to expire.
        async with asyncio.TaskGroup() as pipelines:
            self.supervisor.attach(pipelines)
            async with asyncio.TaskGroup() as loops:
                renewer = [
                    loops.create_task(self._watched(coordinator.renewals.loop), name="renewer")
                ]
                if self.early_failover is not None:
                    # Heartbeats go on while the pipelines drain, as renewals do.
                    renewer.append(
                        loops.create_task(self._watched(self.early_failover.run), name="heartbeats")
                    )
                # Long enough for workers started together to see each other.
                first_delay = settle_time(
                    batch_taker=cfg.lease_taker is LeaseTakerKind.BALANCED,
                    renewer_interval=cfg.renewer_interval,
                )
                taking = [
                    loops.create_task(self._watched(self.assignment.run), name="assignment"),
                    loops.create_task(
                        self._watched(partial(self.discovery.run, self._taker_wake)),
                        name="assignment-discovery",
                    ),
                ]
                if self.leader_failover is not None:
                    taking.append(
                        loops.create_task(
                            self._watched(self.leader_failover.run), name="leader-failover"
                        )
                    )
                if not cfg.lease_taker.leader_based:
                    # Takes while no leader assigns; the mode follows the Java fleet's state.
                    taker = partial(
                        coordinator.taking.loop, self._taker_wake, first_delay=first_delay
                    )
                    taking.append(loops.create_task(self._watched(taker), name="taker"))
                    taking.append(
                        loops.create_task(self._watched(self.lease_mode.run), name="lease-mode")
                    )
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
