"""Who owned each lease when, in a simulated fleet, as the lease table's applied writes show it.

The harness reports every write the table applies; from them this ledger keeps each worker's
ownerships of each lease (``Tenure``: from the write that took it to the one that ended it, and
how it ended: taken by another worker, released, handed off, a handoff forced), each worker's
last *fresh* write per lease (the send time of its last renew, take or checkpoint that the table
applied: what the worker's own rule of expiry counts from), and the failovers: how long the
leases of a crashed or paused worker took to be taken by another.

Owns: that bookkeeping. Must not: judge anything (``invariants`` does, from what this records),
read clocks (times are passed in) or touch the runtime.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import attrs

from kclasync._core.leases.lease import Lease


@attrs.define(eq=False)
class Tenure:
    """One worker's ownership of one lease, from the write that took it to the one that ended it."""

    ident: int
    key: str
    worker: str
    start: float
    end: float | None = None
    #: "taken" (by a take, even by the same worker), "released", "handoff" (a graceful handoff
    #: began), "handoff_forced" (the new owner took over before the old one finished); None
    #: while it lasts.
    end_kind: str | None = None
    successor: Tenure | None = None
    #: Send time of the owner's last write to this lease that the table applied.
    last_fresh: float | None = None
    #: For an ownership that began with a graceful handoff: the old owner's ownership.
    handoff_from: Tenure | None = None

    @property
    def planned_end(self) -> bool:
        return self.end_kind in ("released", "handoff")


class OwnershipLedger:
    """The tenures, fresh writes and failovers of one simulated fleet."""

    def __init__(self, lease_of: Callable[[str], Lease | None]) -> None:
        self._lease_of = lease_of
        self.tenures: list[Tenure] = []
        self._current: dict[str, Tenure] = {}
        self._worker_tenure: dict[tuple[str, str], Tenure] = {}
        self._fresh: dict[tuple[str, str], float] = {}
        #: Failovers: lease key -> (fault time, worker) awaiting a take by another worker.
        self._awaiting_failover: dict[str, tuple[float, str]] = {}
        self.failover_times: list[float] = []
        #: The leases of workers that led when they crashed, while they await failover ...
        self._leader_keys: set[str] = set()
        #: ... and their failover times (also among ``failover_times``).
        self.leader_failover_times: list[float] = []

    def fresh(self, worker: str, key: str) -> float | None:
        """Send time of ``worker``'s last applied write to lease ``key`` (None: never)."""
        return self._fresh.get((worker, key))

    def tenure_of(self, worker: str, key: str) -> Tenure | None:
        """``worker``'s latest ownership of lease ``key``."""
        return self._worker_tenure.get((worker, key))

    def lease_written(
        self,
        old: Lease | None,
        new: Lease,
        *,
        op: str,
        writer: str,
        now: float,
        writer_sent: float | None,
    ) -> None:
        """The table applied ``op`` (a store method) by ``writer``, sent at ``writer_sent``."""
        key = new.key
        current = self._current.get(key)
        if op == "take_lease":
            # A take always starts a new ownership, even a worker re-taking its own lease.
            if current is not None and current.end is None:
                self._end(current, now, "taken")
            if current is not None and current.handoff_from is not None:
                # The new owner forced a handoff the old owner did not finish: unplanned.
                current.handoff_from.end_kind = "handoff_forced"
            self._begin(key, new.owner, now, current)
        elif op == "release_lease":
            if current is not None and current.end is None:
                self._end(current, now, "released")
        elif op == "start_handoff" and new.owner is not None:
            previous = current
            if previous is not None and previous.end is None:
                self._end(previous, now, "handoff")
            tenure = self._begin(key, new.owner, now, previous)
            tenure.handoff_from = previous
        elif (old.owner if old is not None else None) != new.owner:
            # Any other change of owner (e.g. an unknown new write): treat as unplanned.
            if current is not None and current.end is None:
                self._end(current, now, "taken")
            if new.owner is not None:
                self._begin(key, new.owner, now, current)
        if new.is_finished:
            self._awaiting_failover.pop(key, None)
        if new.owner is not None and new.owner == writer and writer_sent is not None:
            self._fresh[(writer, key)] = writer_sent
            owning = self._current.get(key)
            if owning is not None and owning.worker == writer:
                owning.last_fresh = writer_sent

    def _end(self, tenure: Tenure, now: float, kind: str) -> None:
        tenure.end = now
        tenure.end_kind = kind

    def _begin(self, key: str, owner: str | None, now: float, previous: Tenure | None) -> Tenure:
        assert owner is not None
        tenure = Tenure(len(self.tenures), key, owner, now)
        self.tenures.append(tenure)
        if previous is not None:
            previous.successor = tenure
        self._current[key] = tenure
        self._worker_tenure[(owner, key)] = tenure
        waiting = self._awaiting_failover.get(key)
        if waiting is not None and waiting[1] != owner:
            self.failover_times.append(now - waiting[0])
            if key in self._leader_keys:
                self.leader_failover_times.append(now - waiting[0])
            del self._awaiting_failover[key]
            self._leader_keys.discard(key)
        return tenure

    def lease_deleted(self, key: str, now: float) -> None:
        current = self._current.pop(key, None)
        if current is not None:
            current.end = now
            current.end_kind = "released"
        self._awaiting_failover.pop(key, None)

    def worker_failed(
        self, worker: str, keys: list[str], now: float, *, leader: bool = False
    ) -> None:
        """A crash or a pause began: each lease it owned should be taken by another worker."""
        for key in keys:
            if key not in self._awaiting_failover:
                if leader:
                    self._leader_keys.add(key)
                else:
                    self._leader_keys.discard(key)
            self._awaiting_failover.setdefault(key, (now, worker))

    def worker_back(self, worker: str) -> None:
        """A paused worker resumed: leases it still owns need no failover."""
        for key, (_, who) in list(self._awaiting_failover.items()):
            if who == worker:
                lease = self._lease_of(key)
                if lease is not None and lease.owner == worker:
                    del self._awaiting_failover[key]

    @property
    def failovers_pending(self) -> int:
        """Leases of a crashed or paused worker that no other worker took. A finished lease
        (SHARD_END) needs no failover: its children carry on, and cleanup deletes it."""
        pending = 0
        for key in self._awaiting_failover:
            lease = self._lease_of(key)
            if lease is not None and not lease.is_finished:
                pending += 1
        return pending

    def failover_summary(self) -> tuple[float | None, float | None]:
        if not self.failover_times:
            return None, None
        return statistics.median(self.failover_times), max(self.failover_times)


__all__ = ["OwnershipLedger", "Tenure"]
