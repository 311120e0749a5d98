"""A simulated worker: an unmodified ``Consumer`` whose adapters and processor are instrumented.

Owns: ``SimWorker`` (the pause gate), ``SimLeaseStore``, ``SimWorkerRegistry`` and
``SimStreamClient`` (the in-memory adapters, gated by the pause and reporting every applied
lease write to the invariant checker) and ``SimProcessor`` (records each batch, takes
simulated time, checkpoints periodically).
Must not: re-implement any part of the runtime, or know how the fleet is run (``WorkerHost`` is
all it sees of the simulation).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

from kclasync._adapters.memory import (
    FaultPlan,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStream,
    MemoryStreamClient,
)
from kclasync._adapters.memory_worker_metrics import DecodedCache, MemoryWorkerMetrics
from kclasync._adapters.protocols import GetRecordsResult, ShardFilter, StartingPosition
from kclasync._consumer import Consumer
from kclasync._core.leases.lease import Lease
from kclasync._core.lineage.shard import Shard
from kclasync._core.retry_policy import Backoff
from kclasync._core.workers.worker_metrics import WorkerMetrics
from kclasync._core.workers.worker_metrics_item import DecodedEntries
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync._simulation.invariants import InvariantChecker
from kclasync.errors import ThrottledError, TransientError

_T = TypeVar("_T")
#: The simulated processor's waits between failed shard-end and shutdown checkpoints.
_PROCESSOR_BACKOFF = Backoff(0.2, 5.0)

#: (send time, operation) of the lease-table write being applied, set per task by
#: ``SimLeaseStore._write`` and read when the table applies it.
_SENT: contextvars.ContextVar[tuple[float, str] | None] = contextvars.ContextVar(
    "_SENT", default=None
)


def now() -> float:
    return asyncio.get_running_loop().time()


class WorkerHost(Protocol):
    """What a worker needs of the simulation it runs in."""

    @property
    def checker(self) -> InvariantChecker: ...

    @property
    def checkpoint_interval(self) -> float: ...

    @property
    def buffered_checkpoints(self) -> bool: ...

    def batch_time(self, records: int) -> float:
        """Simulated seconds a processor spends on a batch of ``records``."""
        ...


class SimWorker:
    def __init__(self, sim: WorkerHost, name: str) -> None:
        self.sim = sim
        self.name = name
        #: The running loop's clock, bound once (read on every write and batch).
        self.now: Callable[[], float] = now
        with contextlib.suppress(RuntimeError):
            self.now = asyncio.get_running_loop().time
        self.running = asyncio.Event()
        self.running.set()
        self.consumer: Consumer | None = None
        self.task: asyncio.Task[None] | None = None
        self.alive = True
        self.stopping = False

    @property
    def paused(self) -> bool:
        return not self.running.is_set()

    async def gate(self) -> None:
        """Blocks while the worker is paused. The adapters' calls test ``paused`` first and
        await this only when it holds: a gate that is open does not suspend, so skipping its
        coroutine changes nothing but the cost (two per adapter call)."""
        if not self.running.is_set():
            await self.running.wait()

    def make_processor(self) -> SimProcessor:
        return SimProcessor(self)


class SimWorkerRegistry(MemoryWorkerMetrics):
    """A worker's view of the shared worker registry, gated by its pause."""

    def __init__(
        self,
        items: dict[str, dict[str, Any]],
        worker: SimWorker,
        totals: Counter[str],
        decoded: DecodedCache,
    ) -> None:
        super().__init__(items, totals, decoded)
        self.worker = worker

    async def report(self, metrics: WorkerMetrics) -> None:
        if self.worker.paused:
            await self.worker.gate()
        await super().report(metrics)

    async def list_workers(self) -> DecodedEntries:
        if self.worker.paused:
            await self.worker.gate()
        result = await super().list_workers()
        if self.worker.paused:
            await self.worker.gate()
        return result

    async def get(self, worker_id: str) -> WorkerMetrics | None:
        if self.worker.paused:
            await self.worker.gate()
        result = await super().get(worker_id)
        if self.worker.paused:
            await self.worker.gate()
        return result


class SimLeaseStore(MemoryLeaseStore):
    """A worker's view of the shared table: gated by its pause, and observed by the checker."""

    def __init__(self, table: MemoryLeaseTable, faults: FaultPlan, worker: SimWorker) -> None:
        super().__init__(table, faults=faults)
        self.worker = worker

    async def _read(self, op: str, apply: Callable[[], _T]) -> _T:
        if self.worker.paused:
            await self.worker.gate()
        result = await super()._read(op, apply)
        if self.worker.paused:
            await self.worker.gate()
        return result

    async def _write(self, op: str, apply: Callable[[], _T]) -> _T:
        token = _SENT.set((self.worker.now(), op))
        try:
            if self.worker.paused:
                await self.worker.gate()
            result = await super()._write(op, apply)
        finally:
            _SENT.reset(token)
        if self.worker.paused:
            await self.worker.gate()
        return result

    def worker_registry(self) -> MemoryWorkerMetrics:
        """The shared registry, gated by the pause too: a paused worker writes nothing."""
        shared = self.table.worker_metrics
        return SimWorkerRegistry(shared.items, self.worker, shared.totals, shared.decoded)

    def _store(self, lease: Lease) -> Lease:
        old = self.table.leases.get(lease.key)
        stored = super()._store(lease)
        sent = _SENT.get()
        self.worker.sim.checker.lease_written(
            old,
            stored,
            op=sent[1] if sent is not None else "unknown",
            writer=self.worker.name,
            now=self.worker.now(),
            writer_sent=sent[0] if sent is not None else None,
        )
        return stored

    async def renew_lease(self, lease: Lease, throughput_kbps: float | None = None) -> Lease | None:
        # Load scenarios: the simulated records are few and small, so the throughput written
        # with the renewal is the scenario's rate for the shard, folded into the lease's EMA the
        # way the coordinator folds delivered bytes (alpha 0.5 per renewal).
        rate = getattr(self.worker.sim, "lease_throughput", None)
        if rate is not None:
            kbps = float(rate(lease.key))
            previous = lease.throughput_kbps
            throughput_kbps = kbps if previous is None else 0.5 * kbps + 0.5 * previous
        return await super().renew_lease(lease, throughput_kbps)

    async def delete_lease(self, lease: Lease) -> bool:
        deleted = await super().delete_lease(lease)
        if deleted:
            self.worker.sim.checker.lease_deleted(lease.key, self.worker.now())
        return deleted


class SimStreamClient(MemoryStreamClient):
    def __init__(self, stream: MemoryStream, faults: FaultPlan, worker: SimWorker) -> None:
        super().__init__([stream], faults=faults)
        self.worker = worker
        self.now = worker.now

    async def list_shards(
        self, stream: str, shard_filter: ShardFilter | None = None
    ) -> list[Shard]:
        if self.worker.paused:
            await self.worker.gate()
        result = await super().list_shards(stream, shard_filter)
        if self.worker.paused:
            await self.worker.gate()
        return result

    async def get_shard_iterator(
        self, stream: str, shard_id: str, position: StartingPosition
    ) -> str:
        if self.worker.paused:
            await self.worker.gate()
        result = await super().get_shard_iterator(stream, shard_id, position)
        if self.worker.paused:
            await self.worker.gate()
        return result

    async def get_records(
        self, stream: str, shard_id: str, iterator: str, limit: int
    ) -> GetRecordsResult:
        if self.worker.paused:
            await self.worker.gate()
        result = await super().get_records(stream, shard_id, iterator, limit)
        if self.worker.paused:
            await self.worker.gate()
        return result


class SimProcessor:
    """Records each batch with the checker, takes simulated time, checkpoints periodically."""

    def __init__(self, worker: SimWorker) -> None:
        self.worker = worker
        self.sim = worker.sim
        self.shard_id = ""
        self.last_checkpoint_at = 0.0

    async def initialize(self, shard: ShardInfo) -> None:
        self.shard_id = shard.shard_id
        self.last_checkpoint_at = self.worker.now()

    async def process_records(
        self,
        records: Sequence[Record],
        checkpointer: Checkpointer,
        millis_behind_latest: int | None,
    ) -> None:
        sim = self.sim
        call = sim.checker.call_started(
            self.worker.name,
            self.shard_id,
            records[0].sequence_number,
            records[-1].sequence_number,
            len(records),
            self.worker.now(),
        )
        completed = False
        try:
            await asyncio.sleep(sim.batch_time(len(records)))
            await self.worker.gate()  # a pause freezes the batch in the middle
            completed = True
        finally:
            sim.checker.call_ended(call, self.worker.now(), completed=completed)
        if sim.buffered_checkpoints:
            await checkpointer.checkpoint(persist=False)  # no I/O; the runtime writes it
        elif self.worker.now() - self.last_checkpoint_at >= sim.checkpoint_interval:
            try:
                await checkpointer.checkpoint()
                self.last_checkpoint_at = self.worker.now()
            except (ThrottledError, TransientError):
                pass  # the next batch checkpoints; the records are safe until then

    async def lease_lost(self) -> None:
        return None

    async def _retrying(self, write: Callable[[], object]) -> None:
        for attempt in range(1, 9):
            try:
                await write()  # type: ignore[misc]
                return
            except (ThrottledError, TransientError):
                await asyncio.sleep(_PROCESSOR_BACKOFF.delay(attempt))
        await write()  # type: ignore[misc]

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        if self.worker.paused:
            await self.worker.gate()
        await self._retrying(checkpointer.checkpoint_shard_end)

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        delivered = checkpointer.last_delivered
        if delivered is not None and delivered != checkpointer.last_checkpoint:
            await self._retrying(checkpointer.checkpoint)


__all__ = ["SimLeaseStore", "SimProcessor", "SimStreamClient", "SimWorker", "WorkerHost", "now"]
