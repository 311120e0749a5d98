"""The dashboard's view of a fleet: what one snapshot shows, and what changed since the last.

Owns: turning one read of the lease table, the worker registry, the leader lock and the workers'
metrics into the JSON-ready document the page renders, and the bookkeeping across reads (when a
checkpoint or lease counter last moved, records per second, ownership changes).
Must not: do I/O or read clocks: ``now`` (monotonic seconds) and ``wall`` (Unix seconds) are
passed in by the caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs

from kclasync._core.leases.leader_lock import LeaderLockState, LockItem
from kclasync._core.leases.lease import Lease

#: How many ownership changes the view remembers.
CHANGES_KEPT = 50


@attrs.frozen
class WorkerEntry:
    """One worker as the registry knows it; ``beat`` changes while the worker is alive."""

    worker_id: str
    beat: str


@attrs.frozen
class WorkerMetrics:
    """What one worker's Prometheus endpoint said, reduced to what the page shows."""

    worker_id: str
    leases_held: float | None = None
    #: Cumulative records processed, by lease key (the ``shard`` label).
    records: Mapping[str, float] = attrs.field(factory=dict)
    millis_behind: Mapping[str, float] = attrs.field(factory=dict)
    renewal_failures: float = 0.0
    processor_errors: float = 0.0


@attrs.frozen
class FleetRead:
    """Everything one poll read. ``leader`` is None when the lock item does not exist."""

    leases: Sequence[Lease]
    corrupt: Sequence[str] = ()
    workers: Sequence[WorkerEntry] = ()
    leader: LockItem | None = None
    metrics: Sequence[WorkerMetrics] = ()
    errors: Sequence[str] = ()
    #: False when the lease table could not be read (``leases`` is then empty, not the truth).
    leases_read: bool = True


@attrs.define
class _Moved:
    value: object
    at: float | None  # None: not seen to change yet (first sight)


def _age(moved: _Moved | None, now: float) -> float | None:
    if moved is None or moved.at is None:
        return None
    return round(now - moved.at, 1)


def ownership_changes(
    before: Mapping[str, str | None], after: Mapping[str, str | None]
) -> list[tuple[str, str | None, str | None]]:
    """(lease, old owner, new owner) for every lease whose owner differs; a lease that
    disappeared ends with the owner "(deleted)", a new lease starts from "(new)"."""
    changes: list[tuple[str, str | None, str | None]] = []
    for key in sorted(set(before) | set(after)):
        if key not in after:
            changes.append((key, before[key], "(deleted)"))
        elif key not in before:
            changes.append((key, "(new)", after[key]))
        elif before[key] != after[key]:
            changes.append((key, before[key], after[key]))
    return changes


@attrs.define
class FleetView:
    """Remembers successive reads of one application and renders each as a document."""

    application: str
    table: str
    _checkpoints: dict[str, _Moved] = attrs.field(factory=dict, init=False)
    _counters: dict[str, _Moved] = attrs.field(factory=dict, init=False)
    _beats: dict[str, _Moved] = attrs.field(factory=dict, init=False)
    _owners: dict[str, str | None] | None = attrs.field(default=None, init=False)
    _records: dict[tuple[str, str], tuple[float, float]] = attrs.field(factory=dict, init=False)
    _lock: LeaderLockState = attrs.field(factory=lambda: LeaderLockState("(dashboard)"), init=False)
    changes: deque[dict[str, Any]] = attrs.field(
        factory=lambda: deque(maxlen=CHANGES_KEPT), init=False
    )

    @staticmethod
    def _track(seen: dict[str, _Moved], key: str, value: object, now: float) -> _Moved:
        moved = seen.get(key)
        if moved is None:
            moved = seen[key] = _Moved(value, None)
        elif moved.value != value:
            moved.value, moved.at = value, now
        return moved

    def _rates(self, metrics: Sequence[WorkerMetrics], now: float) -> dict[tuple[str, str], float]:
        """Records per second by (worker, lease) since the previous read of that series."""
        rates: dict[tuple[str, str], float] = {}
        for m in metrics:
            for key, total in m.records.items():
                previous = self._records.get((m.worker_id, key))
                self._records[(m.worker_id, key)] = (total, now)
                if previous is not None and now > previous[1] and total >= previous[0]:
                    rates[(m.worker_id, key)] = (total - previous[0]) / (now - previous[1])
        return rates

    def update(self, read: FleetRead, now: float, wall: float) -> dict[str, Any]:
        """Take in one read; returns the document for the page."""
        by_worker = {m.worker_id: m for m in read.metrics}
        rates = self._rates(read.metrics, now)
        leases = sorted(read.leases, key=lambda lease: lease.key)
        owners = {lease.key: lease.owner for lease in leases}
        if self._owners is not None:
            for key, old, new in ownership_changes(self._owners, owners):
                self.changes.appendleft({"at": wall, "lease": key, "from": old, "to": new})
        self._owners = owners
        for seen in (self._checkpoints, self._counters):
            for key in set(seen) - set(owners):
                del seen[key]

        lease_docs = [self._lease_doc(lease, by_worker, rates, now) for lease in leases]
        workers = self._workers_doc(read, leases, by_worker, rates, now)
        return {
            "application": self.application,
            "table": self.table,
            "at": wall,
            "leases": lease_docs,
            "corrupt": list(read.corrupt),
            "workers": workers,
            "leader": self._leader_doc(read.leader, now),
            "changes": list(self.changes),
            "errors": list(read.errors),
            "metrics_sources": len(read.metrics),
        }

    def _lease_doc(
        self,
        lease: Lease,
        by_worker: Mapping[str, WorkerMetrics],
        rates: Mapping[tuple[str, str], float],
        now: float,
    ) -> dict[str, Any]:
        checkpoint = str(lease.checkpoint)
        cp_moved = self._track(self._checkpoints, lease.key, checkpoint, now)
        renewed = self._track(self._counters, lease.key, (lease.counter, lease.owner), now)
        owner_metrics = by_worker.get(lease.owner) if lease.owner else None
        behind = owner_metrics.millis_behind.get(lease.key) if owner_metrics else None
        rate = rates.get((lease.owner, lease.key)) if lease.owner else None
        sticky = lease.sticky_mode
        return {
            "key": lease.key,
            "owner": lease.owner,
            "counter": lease.counter,
            "checkpoint": checkpoint,
            "pending_checkpoint": (
                None if lease.pending_checkpoint is None else str(lease.pending_checkpoint)
            ),
            "finished": lease.is_finished,
            "millis_behind_latest": behind,
            "records_per_second": None if rate is None else round(rate, 1),
            "throughput_kbps": lease.throughput_kbps,
            "checkpoint_age": _age(cp_moved, now),
            "renewal_age": _age(renewed, now),
            "sticky": None if lease.sticky is None else str(lease.sticky),
            "sticky_mode": None if sticky is None else sticky.value,
            "sticky_worker": lease.sticky_worker,
            "parents": sorted(lease.parent_shard_ids),
            "children": sorted(lease.child_shard_ids),
        }

    def _workers_doc(
        self,
        read: FleetRead,
        leases: Iterable[Lease],
        by_worker: Mapping[str, WorkerMetrics],
        rates: Mapping[tuple[str, str], float],
        now: float,
    ) -> list[dict[str, Any]]:
        counts: dict[str, int] = {}
        for lease in leases:
            if lease.owner is not None:
                counts[lease.owner] = counts.get(lease.owner, 0) + 1
        registered = {w.worker_id: w for w in read.workers}
        for key in set(self._beats) - set(registered):
            del self._beats[key]
        leader = read.leader.owner if read.leader is not None and not read.leader.released else None
        docs = []
        for worker_id in sorted(set(counts) | set(registered) | set(by_worker)):
            entry = registered.get(worker_id)
            beat = None if entry is None else self._track(self._beats, worker_id, entry.beat, now)
            m = by_worker.get(worker_id)
            doc: dict[str, Any] = {
                "id": worker_id,
                "leases": counts.get(worker_id, 0),
                "registered": entry is not None,
                "heartbeat_age": _age(beat, now),
                "leader": worker_id == leader,
                "metrics": None,
            }
            if m is not None:
                worker_rates = [r for (w, _), r in rates.items() if w == worker_id]
                doc["metrics"] = {
                    "leases_held": m.leases_held,
                    "records_per_second": round(sum(worker_rates), 1) if worker_rates else None,
                    "max_millis_behind": max(m.millis_behind.values(), default=None),
                    "renewal_failures": m.renewal_failures,
                    "processor_errors": m.processor_errors,
                }
            docs.append(doc)
        return docs

    def _leader_doc(self, item: LockItem | None, now: float) -> dict[str, Any]:
        self._lock.observe(item, now)
        if item is None:
            return {"owner": None, "state": "none"}
        if item.released:
            state = "released"
        elif self._lock.is_expired(item, now):
            state = "expired"
        else:
            state = "held"
        return {"owner": item.owner, "state": state, "lease_duration": item.lease_duration}
