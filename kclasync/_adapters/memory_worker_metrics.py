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

#: worker id -> (an item, what it decodes to): shared by the views of one table.
DecodedCache = dict[str, tuple[dict[str, Any], wm.WorkerMetrics]]


class MemoryWorkerMetrics:
    def __init__(
        self,
        items: dict[str, dict[str, Any]] | None = None,
        totals: Counter[str] | None = None,
        decoded: DecodedCache | None = None,
    ) -> None:
        #: worker id -> item, as DynamoDB would hold it.
        self.items: dict[str, dict[str, Any]] = items if items is not None else {}
        #: Each readable item once decoded: a scan decodes only the items written since the
        #: last one (every worker of a fleet scans every entry). Items are replaced, never
        #: changed in place, so an entry holds while its item is the one stored.
        self.decoded: DecodedCache = decoded if decoded is not None else {}
        #: Calls made through this view, by operation.
        self.calls: Counter[str] = Counter()
        #: Calls through every view of the same table, by operation, and ``items_read`` (the
        #: entries ``list_workers`` returned): the whole fleet's use of the table.
        self.totals: Counter[str] = totals if totals is not None else Counter()
        self.corrupt_seen = 0

    def shared(self) -> MemoryWorkerMetrics:
        """Another worker's view of the same table."""
        return MemoryWorkerMetrics(self.items, self.totals, self.decoded)

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
        entries: list[wm.WorkerMetrics] = []
        corrupt: list[wi.CorruptWorkerMetricsError] = []
        for worker_id, item in self.items.items():
            known = self.decoded.get(worker_id)
            if known is not None and known[0] is item:
                entries.append(known[1])
                continue
            one = wi.decode_items((item,))
            corrupt.extend(one.corrupt)
            for entry in one.entries:
                self.decoded[worker_id] = (item, entry)
                entries.append(entry)
        self.corrupt_seen += len(corrupt)
        return wi.DecodedEntries(tuple(entries), tuple(corrupt))

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
        self.decoded.pop(worker_id, None)
        return True
