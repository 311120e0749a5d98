"""The worker registry interface: one entry per worker in ``<app>-WorkerMetricStats``.

Owns: ``WorkerRegistry`` (the small protocol the runtime reports through and the leader reads
from) and the table's name. Implementations: ``adapters.worker_metrics_table`` (DynamoDB) and
``adapters.memory_worker_metrics`` (in memory, for simulation and tests).
Must not: decide liveness or assignment (``core.worker_metrics`` does).
"""

from __future__ import annotations

from typing import Protocol

from kclasync._core.workers.worker_metrics import WorkerMetrics
from kclasync._core.workers.worker_metrics_item import DecodedEntries


def worker_metrics_table_name(lease_table: str) -> str:
    """The KCL 3.x default name of the worker-metrics table of a lease table."""
    return f"{lease_table}-WorkerMetricStats"


class WorkerRegistry(Protocol):
    async def ensure_table(self) -> None:
        """Create the table if missing (PAY_PER_REQUEST) and wait until it is usable."""

    async def report(self, metrics: WorkerMetrics) -> None:
        """Write this worker's entry (creating it); attributes it does not own are kept."""

    async def list_workers(self) -> DecodedEntries:
        """Every entry, strongly consistent; unreadable items come back as errors."""

    async def get(self, worker_id: str) -> WorkerMetrics | None:
        """One entry, strongly consistent (None: no such entry); raises
        ``CorruptWorkerMetricsError`` for an unreadable one."""

    async def remove(self, worker_id: str, *, heartbeat: int | None = None) -> bool:
        """Delete the worker's entry (graceful stop); a missing entry is not an error. With
        ``heartbeat``: only if the entry's heartbeat is still that value (a dead worker's entry
        removed by the leader); False when that condition failed."""
