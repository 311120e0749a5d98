"""One worker's task tree: its parts run in two task groups, and stopped in order.

Owns: running the loops (renewer, heartbeats, taker or the leader-based assignment, leader lock,
leader duties) in one task group and the shard pipelines in another, turning a loop's failure
into a graceful stop whose error ``run()`` raises, and the order of a graceful stop: taking
stops, leadership is given up, pipelines drain and checkpoint, leases are released, renewals
stop, the worker leaves the registry (``<app>-WorkerMetricStats``).
Must not: build the parts (``worker_parts``), run the start-up steps (``worker_startup``), do
any part's job itself, make protocol decisions, or create AWS clients (``Consumer``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from functools import partial
from typing import Any

from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore, StreamClient
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import LeaseTakerKind
from kclasync._core.startup import settle_time
from kclasync._runtime.worker_parts import WorkerSpec, build_parts
from kclasync._runtime.worker_startup import WorkerStartup

log = logging.getLogger("kclasync._consumer")


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
        self.spec = spec
        self._stop_requested = stop_requested
        self._started = started
        self._taker_wake = asyncio.Event()
        #: The error that stopped the worker (``run()`` raises it after the graceful stop).
        self.failure: BaseException | None = None
        parts = build_parts(
            spec,
            store=store,
            stream_client=stream_client,
            locks=locks,
            registry=registry,
            wall_clock=wall_clock,
            cpu_reader=cpu_reader,
            fanout=fanout,
            wake_taker=self._taker_wake.set,
            on_failure=self.fail,
        )
        self.retrier = parts.retrier
        self.store = parts.store
        self.locks = parts.locks
        self.registry = parts.registry
        self.coordinator = parts.coordinator
        self.early_failover = parts.early_failover
        self.elector = parts.elector
        self.shard_sync = parts.shard_sync
        self.duties = parts.duties
        self.fanout = parts.fanout
        self.supervisor = parts.supervisor
        self.assignment = parts.assignment
        self.discovery = parts.discovery
        self._startup = WorkerStartup(
            spec.config,
            store=parts.store,
            locks=parts.locks,
            registry=parts.registry,
            shard_sync=parts.shard_sync,
            legacy_cleanup=legacy_cleanup,
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
        await self._startup.run()
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
                first_delay = settle_time(
                    batch_taker=cfg.lease_taker is LeaseTakerKind.BALANCED,
                    renewer_interval=cfg.renewer_interval,
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
