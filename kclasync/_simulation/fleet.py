"""The fleet of simulated workers: starting, replacing, crashing, stopping and pausing them.

Owns: ``Fleet`` (the workers, the ``Consumer`` each one runs, the delayed restarts of workers that
crashed or exited, and what the invariant checker must hear when a worker fails or resumes).
Must not: decide when a fault happens (``injectors`` does) or run the simulation (``harness``).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.memory import (
    FaultPlan,
    MemoryCoordinatorState,
    MemoryLeaseTable,
    MemoryStream,
)
from kclasync._consumer import Consumer
from kclasync._simulation.settings import APPLICATION, STREAM, SimulationSettings
from kclasync._simulation.worker import (
    SimLeaseStore,
    SimStreamClient,
    SimWorker,
    WorkerHost,
    now,
)


class Fleet:
    """The simulated workers, sharing one lease table and one stream."""

    def __init__(
        self,
        host: WorkerHost,
        settings: SimulationSettings,
        *,
        table: MemoryLeaseTable,
        stream: MemoryStream,
        store_plan: FaultPlan,
        stream_plan: FaultPlan,
        rng_workers: random.Random,
        rng_faults: random.Random,
        events: Counter[str],
    ) -> None:
        self.host = host
        self.settings = settings
        self.table = table
        self.stream = stream
        self.store_plan = store_plan
        self.stream_plan = stream_plan
        self.rng_workers = rng_workers
        self.rng_faults = rng_faults
        self.events = events
        self.registry = CollectorRegistry()
        self.taker = settings.lease_taker()
        #: The leader lock items every worker shares.
        self.locks = MemoryCoordinatorState()
        self.workers: list[SimWorker] = []
        self.startup_failures = 0
        #: Delayed worker starts not yet done.
        self.restarts: set[asyncio.Task[None]] = set()
        #: Load scenarios: the CPU source of each new worker (None: no CPU metric).
        self.cpu_reader_for: Callable[[SimWorker], CpuReader] | None = None

    def live_workers(self) -> list[SimWorker]:
        return [w for w in self.workers if w.alive and not w.stopping]

    def owned_by(self, name: str) -> list[str]:
        return sorted(k for k, lease in self.table.leases.items() if lease.owner == name)

    # -- starting and replacing --------------------------------------------------------------

    def start_worker(self) -> SimWorker:
        s = self.settings
        name = f"w{len(self.workers):04d}"
        worker = SimWorker(self.host, name)
        worker.consumer = Consumer(
            stream_name=STREAM,
            application_name=APPLICATION,
            processor=worker.make_processor,
            config=s.consumer_config(name),
            registry=self.registry,
            backend=AdapterBackend(
                SimLeaseStore(self.table, self.store_plan, worker),
                SimStreamClient(self.stream, self.stream_plan, worker),
                locks=self.locks.shared(),
                cpu_reader=(
                    self.cpu_reader_for(worker) if self.cpu_reader_for is not None else None
                ),
            ),
            rng=random.Random(self.rng_workers.getrandbits(64)),
        )
        worker.consumer._use_taker(self.taker)
        self.workers.append(worker)
        worker.task = asyncio.create_task(self._run_worker(worker), name=f"worker {name}")
        return worker

    async def _run_worker(self, worker: SimWorker) -> None:
        assert worker.consumer is not None
        try:
            await worker.consumer.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # run() ended with an error (e.g. a failed first shard sync): like a process that
            # exits, it is replaced.
            worker.alive = False
            self.startup_failures += 1
            self.events[f"worker exited: {type(exc).__name__}"] += 1
            self.later(self.settings.failover_time, self.start_worker)
            return
        worker.alive = False

    def later(self, delay: float, action: Callable[[], object]) -> None:
        async def run() -> None:
            await asyncio.sleep(delay)
            action()

        task = asyncio.create_task(run())
        self.restarts.add(task)
        task.add_done_callback(self.restarts.discard)

    # -- failures ------------------------------------------------------------------------------

    def crash(self, worker: SimWorker) -> None:
        assert worker.task is not None
        self.events["crashes"] += 1
        leader = worker.consumer is not None and worker.consumer.is_leader
        if leader:
            self.events["leader crashes"] += 1
        worker.alive = False
        self.host.checker.worker_failed(
            worker.name, self.owned_by(worker.name), now(), leader=leader
        )
        worker.task.cancel()
        f = self.settings.failover_time
        self.later(self.rng_faults.uniform(0.5, 2.0) * f, self.start_worker)

    async def graceful_stop(self, worker: SimWorker) -> None:
        assert worker.consumer is not None and worker.task is not None
        self.events["graceful stops"] += 1
        worker.stopping = True
        limit = worker.consumer.config.shutdown_timeout + 3 * self.settings.failover_time
        try:
            await asyncio.wait_for(worker.consumer.stop(), limit)
        except TimeoutError:
            self.host.checker.violate(
                "stop_hung", now(), f"{worker.name}: stop() did not return within {limit}s"
            )
            worker.task.cancel()
        await asyncio.gather(worker.task, return_exceptions=True)
        worker.alive = False
        self.start_worker()

    async def pause(self, worker: SimWorker, seconds: float) -> None:
        checker = self.host.checker
        self.events["pauses"] += 1
        worker.running.clear()
        checker.paused(worker.name, now())
        checker.worker_failed(worker.name, self.owned_by(worker.name), now())
        try:
            await asyncio.sleep(seconds)
        finally:
            worker.running.set()
            checker.resumed(worker.name, now())
            checker.worker_back(worker.name)

    async def cancel_all(self) -> None:
        """Cancel every worker and pending restart, and wait for them to end."""
        for worker in self.workers:
            if worker.task is not None:
                worker.task.cancel()
        for task in list(self.restarts):
            task.cancel()
        await asyncio.gather(
            *(w.task for w in self.workers if w.task is not None),
            *self.restarts,
            return_exceptions=True,
        )


__all__ = ["Fleet"]
