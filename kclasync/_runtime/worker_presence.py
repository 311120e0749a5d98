"""This worker's entry in the worker registry (``<app>-WorkerMetricStats``) and the live set.

Owns: writing this worker's entry each report period, and with early failover a heartbeat (``hb``,
``hbi``) every heartbeat period (``lut`` from the injected wall clock: the runtime's only wall-
clock read, so a simulation passes its virtual clock), reading every entry for the taking rounds,
sampling this worker's CPU each report (when a source exists; none means no CPU metric, as the Java
worker does; CPU is also left out while a present Java worker reports none,
``core.worker_metrics.may_report_metric``), reporting this worker's capacity (configured, or
estimated from its CPU against the throughput it processes: ``CapacityEstimator``) and the CPUs it
may use (configured, or its CPU source's), judging liveness there from changes of ``lut`` stamped
on the loop clock (``core.expiry``, exactly like lease expiry), logging each unreadable entry once
and counting them, and leaving the registry on a graceful stop (after the writes still in flight: a
write whose caller was cancelled may still land on the table, and would otherwise bring the entry
back after the delete, so the others would see a silent worker rather than one that left).
Must not: decide assignment, write to the lease table, or read the wall clock any other way.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable

import aiohttp
import attrs

from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._core.assignment.capacity import CapacityEstimator
from kclasync._core.assignment.cpu_usage import CpuStatsError
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import (
    CPU,
    FAILED_SAMPLE,
    KCLASYNC,
    SilenceDigest,
    WorkerMetrics,
    may_report_metric,
)
from kclasync._core.workers.worker_metrics_item import DecodedEntries, presence_marks
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.registry")

#: How often (wall-clock seconds) a worker with a CPU source re-reads the registry to decide
#: whether to report CPU, when no taking round has read it more recently.
FLEET_REFRESH = 15.0

#: Seconds ``leave`` waits for registry writes still in flight before it deletes the entry.
LEAVE_WAIT = 5.0


def _source_cores(cpu: CpuReader) -> float | None:
    """The CPUs a CPU source measures against (its ``cores``, once it has sampled), if it
    tells; a reader without the attribute (a test's, a simulation's) tells nothing."""
    cores = getattr(cpu, "cores", None)
    if isinstance(cores, int | float) and not isinstance(cores, bool):
        return float(cores) if math.isfinite(cores) and cores > 0 else None
    return None


class WorkerPresence:
    def __init__(
        self,
        registry: WorkerRegistry,
        worker_id: str,
        *,
        wall_clock: Callable[[], float],
        worker_timeout: float,
        on_corrupt: Callable[[int], None] | None = None,
        cpu: CpuReader | None = None,
        max_cpu_percent: int = 100,
        capacity_kbps: float | None = None,
        cores: float | None = None,
        processed_kbps: Callable[[], float] | None = None,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.registry = registry
        self.worker_id = worker_id
        self._wall_clock = wall_clock
        #: Changes of each entry's ``lut``, stamped on the reader's loop clock.
        self.tracker = ExpiryTracker(worker_timeout)
        self._on_corrupt = on_corrupt
        self._reported_corrupt: set[str] = set()
        #: Unreadable entries met in the last read.
        self.corrupt = 0
        #: Reports written (for tests and the demo).
        self.reports = 0
        self.cpu = cpu
        self.max_cpu_percent = max_cpu_percent
        #: A configured capacity (KB/s at 100 % CPU) is reported as is; without one, the estimate
        #: from the CPU samples and ``processed_kbps`` (the throughput of the leases this worker
        #: processes) is, once there is one.
        self.capacity_kbps = capacity_kbps
        self._processed_kbps = processed_kbps
        self.capacity = CapacityEstimator()
        #: The CPUs this worker may use, reported as a hint from the first report (``cor``):
        #: configured, else what the CPU source measures against once it has sampled.
        self.cores = cores
        #: The entry as last built: its CPU samples are the last ones kept (oldest first),
        #: also while they are left out of what is written.
        self.last_entry = WorkerMetrics(worker_id=worker_id, last_update=0, implementation=KCLASYNC)
        #: The registry as last read, and when (wall clock): decides whether CPU is written.
        self._fleet: tuple[WorkerMetrics, ...] = ()
        self._fleet_read_at: float | None = None
        #: Whether the last entry written carried CPU (None before the first report).
        self.reporting_cpu: bool | None = None
        #: Early failover: the heartbeat period written with every entry (``hbi``); None:
        #: entries carry no heartbeat.
        self.heartbeat_interval = heartbeat_interval
        #: The silence digest this worker publishes with its heartbeats while it leads
        #: (``core.workers.silence_digest``; set by early failover, None otherwise).
        self.digest: SilenceDigest | None = None
        self._beat = 0
        #: The entry as last written (a heartbeat re-writes it with a new ``lut`` and ``hb``).
        self._written: WorkerMetrics | None = None
        #: Registry writes not yet answered (``_write``), and whether this worker has left.
        self._in_flight: set[asyncio.Future[None]] = set()
        self._left = False

    async def _cpu_sample(self) -> float:
        """This period's CPU utilisation in percent; the failure marker -1 when the source
        cannot be read (a KCL 3.x leader then leaves this worker out, as for a Java one)."""
        assert self.cpu is not None
        try:
            return min(100.0, max(0.0, await self.cpu.sample()))
        except (OSError, ValueError, CpuStatsError, TimeoutError, aiohttp.ClientError) as exc:
            log.warning("reading CPU utilisation from %s failed: %s", self.cpu.source, exc)
            return FAILED_SAMPLE

    async def entry(self) -> WorkerMetrics:
        """This worker's entry as of now (sampling the CPU when there is a source); CPU is
        left out while a present worker of another implementation reports no metric."""
        now = self._wall_clock()
        entry = self.last_entry.reported_at(now)
        if self.capacity_kbps is not None:
            entry = attrs.evolve(entry, capacity_kbps=self.capacity_kbps, capacity_error=None)
        if self.cores is not None:
            entry = attrs.evolve(entry, cores=self.cores)
        if self.cpu is None:
            self.last_entry = entry
            return entry
        sample = await self._cpu_sample()
        entry = entry.with_sample(CPU, sample, maximum=self.max_cpu_percent)
        cores = self.cores if self.cores is not None else _source_cores(self.cpu)
        if cores is not None:
            entry = attrs.evolve(entry, cores=cores)
        if self.capacity_kbps is None and self._processed_kbps is not None and sample >= 0:
            estimate = self.capacity.update(self._processed_kbps(), sample)
            error = self.capacity.relative_error if estimate is not None else None
            entry = attrs.evolve(
                entry,
                capacity_kbps=estimate,
                capacity_error=error if error is not None and math.isfinite(error) else None,
            )
        self.last_entry = entry
        if self._fleet_read_at is None or now - self._fleet_read_at >= FLEET_REFRESH:
            try:
                await self._read_fleet(now)
            except AdapterError as exc:
                log.info("reading the worker registry failed (keeping the last view): %s", exc)
        allowed = may_report_metric(self._fleet, self.worker_id, now)
        if allowed != self.reporting_cpu and (self.reporting_cpu is not None or not allowed):
            log.info(
                "%s CPU in the worker registry: %s",
                "reporting" if allowed else "not reporting",
                "no worker of another implementation reports without it"
                if allowed
                else "a Java worker there reports no CPU, and a KCL 3.x leader compares "
                "workers only with those reporting the same metrics",
            )
        self.reporting_cpu = allowed
        return entry if allowed else entry.without(CPU)

    async def is_kclasync(self, worker_id: str | None) -> bool:
        """Whether ``worker_id``'s registry entry carries the kclasync marker (the registry is
        re-read when the last read is older than ``FLEET_REFRESH``). An unknown worker counts
        as another implementation."""
        now = self._wall_clock()
        if self._fleet_read_at is None or now - self._fleet_read_at >= FLEET_REFRESH:
            try:
                await self._read_fleet(now)
            except AdapterError as exc:
                log.info("reading the worker registry failed (keeping the last view): %s", exc)
        return any(e.worker_id == worker_id and e.implementation == KCLASYNC for e in self._fleet)

    async def _read_fleet(self, now: float) -> tuple[WorkerMetrics, ...]:
        return (await self._read_decoded(now)).entries

    async def _read_decoded(self, now: float) -> DecodedEntries:
        decoded = await self.registry.list_workers()
        self._report_corrupt([str(exc) for exc in decoded.corrupt])
        self._fleet, self._fleet_read_at = decoded.entries, now
        return decoded

    async def close(self) -> None:
        if self.cpu is not None:
            await self.cpu.close()

    def _with_heartbeat(self, entry: WorkerMetrics, now: float) -> WorkerMetrics:
        if self.heartbeat_interval is None:
            return entry
        entry = attrs.evolve(entry, digest=self.digest)
        # Changes with every write (readers only compare it), even within one millisecond.
        self._beat = max(self._beat + 1, int(now * 1000))
        return attrs.evolve(entry, heartbeat=self._beat, heartbeat_interval=self.heartbeat_interval)

    async def report(self) -> None:
        """Write this worker's entry; a failure is logged and retried at the next period."""
        try:
            entry = self._with_heartbeat(await self.entry(), self._wall_clock())
            if not await self._write(entry):
                return
        except AdapterError as exc:
            log.info("worker registry report failed: %s", exc)
            return
        self._written = entry
        self.reports += 1

    async def beat(self) -> None:
        """A heartbeat: the entry as last written, with a new ``lut`` and ``hb`` (no new
        samples; the first one is a full report). Failures are logged, as for reports."""
        if self._written is None:
            await self.report()
            return
        now = self._wall_clock()
        entry = self._with_heartbeat(self._written.reported_at(now), now)
        try:
            if not await self._write(entry):
                return
        except AdapterError as exc:
            log.info("worker registry heartbeat failed: %s", exc)
            return
        self._written = entry
        self.reports += 1

    async def _write(self, entry: WorkerMetrics) -> bool:
        """Send ``entry`` as a task of its own that cancelling the caller does not stop (the
        request may already be on its way), tracked until it ends. False after ``leave``."""
        if self._left:
            return False
        task = asyncio.ensure_future(self.registry.report(entry))
        self._in_flight.add(task)
        task.add_done_callback(self._written_or_failed)
        await asyncio.shield(task)
        return True

    def _written_or_failed(self, task: asyncio.Future[None]) -> None:
        self._in_flight.discard(task)
        if not task.cancelled():
            task.exception()  # a failure reaches the caller, if it still waits; else nobody

    async def read_registry(self) -> tuple[WorkerMetrics, ...]:
        """Every readable entry (unreadable ones logged once and counted)."""
        return await self._read_fleet(self._wall_clock())

    async def live_workers(self, now: float) -> frozenset[str]:
        """Read the registry and return the workers whose entry changed within the worker
        timeout as this worker observed it (this worker always counts; an unreadable entry
        counts by changes of its content: ``presence_marks``)."""
        decoded = await self._read_decoded(self._wall_clock())
        entries = [
            Lease(key=worker, owner=worker, counter=mark)
            for worker, mark in presence_marks(decoded)
        ]
        self.tracker.observe(entries, now)
        live = {e.key for e in entries if not self.tracker.is_expired(e, now)}
        return frozenset(live | {self.worker_id})

    def _report_corrupt(self, errors: list[str]) -> None:
        self.corrupt = len(errors)
        if self._on_corrupt is not None:
            self._on_corrupt(len(errors))
        for text in errors:
            if text not in self._reported_corrupt:
                log.warning("skipping an unreadable worker-registry entry: %s", text)
        self._reported_corrupt = set(errors)

    async def leave(self, *, wait: float = LEAVE_WAIT) -> None:
        """Delete this worker's entry (graceful stop) once the writes in flight have ended (at
        most ``wait`` seconds); no write is sent after it. A failure only delays its expiry."""
        self._left = True
        if self._in_flight:
            _, late = await asyncio.wait(set(self._in_flight), timeout=wait)
            if late:
                log.info("leaving the registry with %d write(s) still in flight", len(late))
        try:
            await self.registry.remove(self.worker_id)
        except AdapterError as exc:
            log.info("could not remove worker %s from the registry: %s", self.worker_id, exc)
