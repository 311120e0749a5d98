"""An in-memory ``WorkerRegistry`` for simulation and tests.

Owns: a dict of encoded items shared by the simulated workers, so that what a worker reports goes
through the same codec as on DynamoDB (``core.worker_metrics``), corrupt items included.
Must not: decide anything.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers import worker_metrics_item as wi


class MemoryWorkerMetrics:
    def __init__(
        self, items: dict[str, dict[str, Any]] | None = None, totals: Counter[str] | None = None
    ) -> None:
        #: worker id -> item, as DynamoDB would hold it.
        self.items: dict[str, dict[str, Any]] = items if items is not None else {}
        #: Calls made through this view, by operation.
        self.calls: Counter[str] = Counter()
        #: Calls through every view of the same table, by operation, and ``items_read`` (the
        #: entries ``list_workers`` returned): the whole fleet's use of the table.
        self.totals: Counter[str] = totals if totals is not None else Counter()
        self.corrupt_seen = 0

    def shared(self) -> MemoryWorkerMetrics:
        """Another worker's view of the same table."""
        return MemoryWorkerMetrics(self.items, self.totals)

    def _tally(self, op: str) -> None:
        """Count ``op`` for this view and for the fleet (``totals``)."""
        self.calls[op] += 1
        self.totals[op] += 1

    async def ensure_table(self) -> None:
        self._tally("ensure_table")

    async def report(self, metrics: wm.WorkerMetrics) -> None:
        self._tally("report")
        item = wi.encode_item(metrics)
        kept = dict(self.items.get(metrics.worker_id, {}))
        # As the DynamoDB update: REMOVE cap, the heartbeat and the digest when absent.
        for name in wi.REPLACED_OR_REMOVED:
            kept.pop(name, None)
        self.items[metrics.worker_id] = {**kept, **item}

    async def list_workers(self) -> wi.DecodedEntries:
        self._tally("list_workers")
        self.totals["items_read"] += len(self.items)
        decoded = wi.decode_items(list(self.items.values()))
        self.corrupt_seen += len(decoded.corrupt)
        return decoded

    async def get(self, worker_id: str) -> wm.WorkerMetrics | None:
        self._tally("get")  # one item at most: ``items_read`` counts the scans' items
        item = self.items.get(worker_id)
        return None if item is None else wi.decode_item(item)

    async def remove(self, worker_id: str, *, heartbeat: int | None = None) -> bool:
        self._tally("remove")
        if heartbeat is not None:
            item = self.items.get(worker_id)
            if item is None or item.get(wi.HEARTBEAT) != {"N": str(heartbeat)}:
                return False
        self.items.pop(worker_id, None)
        return True
