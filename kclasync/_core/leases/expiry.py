"""Lease expiry judged on this worker's own clock.

Workers do not share clocks. Each one remembers, per lease, the last ``leaseCounter`` it saw and
the local time at which it saw that counter change. A lease is expired when the counter has not
moved for longer than the failover time. A lease first seen without an owner is available at
once; a lease first seen with an owner gets a full failover period before it counts as expired.

Owns: that bookkeeping. Must not: read a clock (``now`` is always passed in) or do I/O.
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from kclasync._core.leases.lease import Lease

# Stamp for a lease that has been available since before this worker looked.
NEVER = float("-inf")


@attrs.define
class _Seen:
    counter: int
    owner: str | None
    stamp: float
    #: When this worker first saw the current counter and owner (also for an unowned lease).
    since: float


@attrs.define
class ExpiryTracker:
    """Remembers when each lease's counter last changed, in this worker's clock."""

    failover_time: float
    _seen: dict[str, _Seen] = attrs.field(factory=dict, init=False)

    def observe(self, leases: Iterable[Lease], now: float) -> None:
        """Record a full scan of the table taken at ``now``. Forgets leases no longer present."""
        present: set[str] = set()
        for lease in leases:
            present.add(lease.key)
            self.observe_one(lease, now)
        for key in list(self._seen):
            if key not in present:
                del self._seen[key]

    def observe_one(self, lease: Lease, now: float) -> None:
        seen = self._seen.get(lease.key)
        if seen is None:
            stamp = NEVER if lease.owner is None else now
            self._seen[lease.key] = _Seen(lease.counter, lease.owner, stamp, now)
        elif seen.counter != lease.counter or seen.owner != lease.owner:
            seen.counter = lease.counter
            seen.owner = lease.owner
            seen.stamp = NEVER if lease.owner is None else now
            seen.since = now

    def observe_not_renewed(self, lease: Lease, now: float) -> None:
        """Record a change that was not a renewal by the lease's owner (its old owner finishing
        a handoff to it: ``worker_silence.handoff_finished_by_other``): the new counter, and
        the owner's last change where it was. A lease not seen before under this owner is
        observed as any other."""
        seen = self._seen.get(lease.key)
        if seen is None or seen.owner != lease.owner:
            self.observe_one(lease, now)
            return
        if seen.counter != lease.counter:
            seen.counter = lease.counter
            seen.since = now

    def has_seen(self, lease: Lease) -> bool:
        """Whether this worker last saw the lease with this counter and owner."""
        seen = self._seen.get(lease.key)
        return seen is not None and seen.counter == lease.counter and seen.owner == lease.owner

    def subset(self, keys: Iterable[str]) -> ExpiryTracker:
        """A tracker that remembers only these leases, exactly as this one does."""
        copy = ExpiryTracker(self.failover_time)
        for key in keys:
            seen = self._seen.get(key)
            if seen is not None:
                copy._seen[key] = attrs.evolve(seen)
        return copy

    def last_change(self, key: str) -> float | None:
        seen = self._seen.get(key)
        return None if seen is None else seen.stamp

    def is_expired(self, lease: Lease, now: float) -> bool:
        """True for an unowned lease, or an owned one whose counter stood still too long."""
        if lease.owner is None:
            return True
        seen = self._seen.get(lease.key)
        if seen is None or seen.counter != lease.counter:
            return False
        return now - seen.stamp > self.failover_time

    def idle_for(self, lease: Lease, now: float) -> float:
        """Seconds since the counter last moved (infinite for an unowned lease)."""
        seen = self._seen.get(lease.key)
        if lease.owner is None or seen is None:
            return float("inf") if lease.owner is None else 0.0
        return now - seen.stamp

    def unchanged_for(self, lease: Lease, now: float) -> float:
        """Seconds since this worker first saw the lease as it is now (same counter and owner),
        for an unowned lease too; 0 for a lease it has not seen so."""
        seen = self._seen.get(lease.key)
        if seen is None or seen.counter != lease.counter or seen.owner != lease.owner:
            return 0.0
        return now - seen.since
