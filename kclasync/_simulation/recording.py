"""``kclasync simulate --record FILE``: a simulated fleet's lease table and metrics, observed as
the dashboard observes a real one and written in the same format (``kclasync._observations``),
so ``kclasync dashboard --replay FILE`` shows a simulated hour in the same charts and timeline.

Owns: sampling the simulated table and the fleet's metrics registry every ``interval`` virtual
seconds. Must not: change what the simulation does (it only reads; it draws no random numbers)
or read the wall clock but once, for the recording's start.
"""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry, generate_latest

from kclasync._adapters.memory import MemoryLeaseTable
from kclasync._observations import LeaseTracker, RecordingWriter, lease_reads, workers_line
from kclasync._simulation.settings import APPLICATION
from kclasync.dashboard._source import parse_worker_metrics
from kclasync.dashboard._view import FleetRead, FleetView

#: Virtual seconds between two samples (an hour is 720 lines of workers, plus the changes).
RECORD_INTERVAL = 5.0


class SimulationRecorder:
    """Writes one observation of the simulated fleet every ``interval`` virtual seconds; the
    times written are the real time the recording started plus the virtual time elapsed."""

    def __init__(
        self,
        writer: RecordingWriter,
        table: MemoryLeaseTable,
        registry: CollectorRegistry,
        *,
        interval: float = RECORD_INTERVAL,
    ) -> None:
        self.writer = writer
        self.table = table
        self.registry = registry
        self.interval = interval
        self.view = FleetView(APPLICATION, APPLICATION)
        self.tracker = LeaseTracker()
        self._base = time.time()

    def sample(self) -> None:
        """One observation, now."""
        elapsed = asyncio.get_running_loop().time()
        t = self._base + elapsed
        metrics = parse_worker_metrics(generate_latest(self.registry).decode(), APPLICATION)
        read = FleetRead(leases=list(self.table.snapshot().values()), metrics=metrics)
        document = self.view.update(read, elapsed, t)
        self.writer.write_all(self.tracker.observe(t, lease_reads(document["leases"])))
        self.writer.write(workers_line(t, document["workers"]))

    async def run(self) -> None:
        """Sample until cancelled (then once more, so the end of the run is in the file)."""
        try:
            while True:
                self.sample()
                await asyncio.sleep(self.interval)
        finally:
            self.sample()
            self.writer.close()
