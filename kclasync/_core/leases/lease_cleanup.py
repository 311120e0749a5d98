"""Deleting finished leases, and the hash-range auditor's patience.

Owns: when a lease at SHARD_END may be deleted (``ready_for_deletion``, ``CleanupTracker``), and
when holes in the hash-key space covered by leases call for a shard sync (``HoleAuditor``).
Must not: do I/O, read clocks (``now`` is passed in), or mutate its inputs.

Why a finished lease is kept at all: it is the tombstone that tells shard sync the lineage below
it is handled. Were it deleted before its children's leases existed, a sync would see an open
child with no leased ancestor and create a lease for the parent again (TRIM_HORIZON), replaying
it. So a finished lease goes only once every child lease exists and has *started*:

* a child lease has **started** when its checkpoint is a sequence number or SHARD_END (it has
  processed and checkpointed at least once), or when it has an owner and every one of its parent
  leases is finished or gone. In that second case the owner's parent gate is open, so nothing
  holds it back from reading; an idle child shard that has no records to checkpoint still counts.

A lease that was never read (TRIM_HORIZON, LATEST, AT_TIMESTAMP) without an owner has not started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import attrs

from kclasync._core.leases.lease import Lease
from kclasync._core.lineage.shard import HashRange
from kclasync._core.lineage.shard_end import parents_finished

__all__ = [
    "CleanupTracker",
    "HoleAuditor",
    "child_started",
    "ready_for_deletion",
]


def _prefix(lease_key: str) -> str:
    shard_id = lease_key.rsplit(":", 1)[-1]
    return lease_key[: len(lease_key) - len(shard_id)]


def child_started(child: Lease, leases_by_key: Mapping[str, Lease]) -> bool:
    """Whether a child lease has started processing (see the module docstring)."""
    if child.checkpoint.sentinel is None or child.is_finished:
        return True
    return child.owner is not None and parents_finished(child, leases_by_key)


def ready_for_deletion(
    lease: Lease, leases_by_key: Mapping[str, Lease], children: Iterable[str] = ()
) -> bool:
    """Whether a finished lease may be deleted now: it is at SHARD_END, it knows at least one
    child (``childShardIds``, else ``children`` from the shard list), and every child's lease
    (same stream prefix) exists and has started."""
    if not lease.is_finished:
        return False
    child_ids = lease.child_shard_ids or frozenset(children)
    if not child_ids:
        return False
    prefix = _prefix(lease.key)
    for child_id in child_ids:
        child = leases_by_key.get(prefix + child_id)
        if child is None or not child_started(child, leases_by_key):
            return False
    return True


@attrs.define
class CleanupTracker:
    """Delays deletion: a finished lease goes ``delay`` seconds after it was first seen ready."""

    delay: float
    _ready_since: dict[str, float] = attrs.field(factory=dict, init=False)

    def plan(
        self,
        leases: Sequence[Lease],
        now: float,
        children_of: Callable[[Lease], Iterable[str]] = lambda lease: (),
    ) -> list[Lease]:
        """The leases to delete now, from a full scan taken at ``now``. ``children_of`` gives a
        finished lease's children from the shard list when it has no ``childShardIds``."""
        by_key = {lease.key: lease for lease in leases}
        due: list[Lease] = []
        ready_now: set[str] = set()
        for lease in leases:
            if not lease.is_finished:
                continue
            if not ready_for_deletion(lease, by_key, children_of(lease)):
                continue
            ready_now.add(lease.key)
            since = self._ready_since.setdefault(lease.key, now)
            if now - since >= self.delay:
                due.append(lease)
        for key in list(self._ready_since):
            if key not in ready_now:
                del self._ready_since[key]
        return sorted(due, key=lambda lease: lease.key)

    def deleted(self, key: str) -> None:
        self._ready_since.pop(key, None)


@attrs.define
class HoleAuditor:
    """Counts consecutive audits that found holes in one stream's hash-key coverage.

    ``record`` returns True (run a shard sync) when ``threshold`` audits in a row found a hole,
    and starts counting again after that. An audit without holes resets the count, so the
    moment between a parent's SHARD_END and its children's creation never triggers a sync.
    """

    threshold: int = 3
    _consecutive: dict[str, int] = attrs.field(factory=dict, init=False)

    def record(self, stream: str, holes: Sequence[HashRange]) -> bool:
        if not holes:
            self._consecutive.pop(stream, None)
            return False
        count = self._consecutive.get(stream, 0) + 1
        if count >= self.threshold:
            self._consecutive.pop(stream, None)
            return True
        self._consecutive[stream] = count
        return False

    def consecutive(self, stream: str) -> int:
        return self._consecutive.get(stream, 0)

    def forget(self, stream: str) -> None:
        self._consecutive.pop(stream, None)
