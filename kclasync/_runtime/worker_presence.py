"""This worker's entry in the worker registry (``<app>-WorkerMetricStats``) and the live set.

Owns: writing this worker's entry each report period (``lut`` from the injected wall clock: the
runtime's only wall-clock read, so a simulation passes its virtual clock), reading every entry
for the taking rounds, sampling this worker's CPU each report (when a source exists; none
means no CPU metric, as the Java worker does), reporting this worker's capacity (configured,
or estimated from its CPU against the throughput it processes: ``CapacityEstimator``), judging
liveness there from changes of ``lut`` stamped on the loop clock (``core.expiry``, exactly like
lease expiry), logging each unreadable entry once and counting them, and leaving the registry
on a graceful stop.
Must not: decide assignment, write to the lease table, or read the wall clock any other way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import aiohttp
import attrs

from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._core.capacity import CapacityEstimator
from kclasync._core.cpu_usage import CpuStatsError
from kclasync._core.expiry import ExpiryTracker
from kclasync._core.lease import Lease
from kclasync._core.worker_metrics import CPU, FAILED_SAMPLE, WorkerMetrics
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync.registry")


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
        processed_kbps: Callable[[], float] | None = None,
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
        #: The entry as last built: its CPU samples are the last ones kept (oldest first).
        self.last_entry = WorkerMetrics(worker_id=worker_id, last_update=0)

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
        """This worker's entry as of now (sampling the CPU when there is a source)."""
        entry = self.last_entry.reported_at(self._wall_clock())
        if self.cpu is not None:
            sample = await self._cpu_sample()
            entry = entry.with_sample(CPU, sample, maximum=self.max_cpu_percent)
            if self.capacity_kbps is None and self._processed_kbps is not None and sample >= 0:
                estimate = self.capacity.update(self._processed_kbps(), sample)
                entry = attrs.evolve(entry, capacity_kbps=estimate)
        if self.capacity_kbps is not None:
            entry = attrs.evolve(entry, capacity_kbps=self.capacity_kbps)
        self.last_entry = entry
        return entry

    async def close(self) -> None:
        if self.cpu is not None:
            await self.cpu.close()

    async def report(self) -> None:
        """Write this worker's entry; a failure is logged and retried at the next period."""
        try:
            await self.registry.report(await self.entry())
        except AdapterError as exc:
            log.info("worker registry report failed: %s", exc)
            return
        self.reports += 1

    async def live_workers(self, now: float) -> frozenset[str]:
        """Read the registry and return the workers whose ``lut`` changed within the worker
        timeout as this worker observed it (this worker always counts)."""
        decoded = await self.registry.list_workers()
        self._report_corrupt([str(exc) for exc in decoded.corrupt])
        entries = [
            Lease(key=e.worker_id, owner=e.worker_id, counter=e.last_update)
            for e in decoded.entries
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

    async def leave(self) -> None:
        """Delete this worker's entry (graceful stop); a failure only delays its expiry."""
        try:
            await self.registry.remove(self.worker_id)
        except AdapterError as exc:
            log.info("could not remove worker %s from the registry: %s", self.worker_id, exc)
