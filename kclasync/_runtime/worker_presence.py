"""This worker's entry in the worker registry (``<app>-WorkerMetricStats``) and the live set.

Owns: writing this worker's entry each report period (``lut`` from the injected wall clock: the
runtime's only wall-clock read, so a simulation passes its virtual clock), reading every entry
for the taking rounds, judging liveness there from changes of ``lut`` stamped on the loop clock
(``core.expiry``, exactly like lease expiry), logging each unreadable entry once and counting
them, and leaving the registry on a graceful stop.
Must not: decide assignment, write to the lease table, or read the wall clock any other way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._core.expiry import ExpiryTracker
from kclasync._core.lease import Lease
from kclasync._core.worker_metrics import WorkerMetrics
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

    def entry(self) -> WorkerMetrics:
        """This worker's entry as of now."""
        return WorkerMetrics(worker_id=self.worker_id, last_update=int(self._wall_clock()))

    async def report(self) -> None:
        """Write this worker's entry; a failure is logged and retried at the next period."""
        try:
            await self.registry.report(self.entry())
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
