"""Whether the Java KCL workers sharing a table are alive, judged on this worker's clock.

A kclasync worker with a worker-side taker (``balanced``, ``kcl2``) on a table whose Java
workers follow a leader (``CLIENT_VERSION_3X``) must let a leader assign while those Java
workers live, or they starve; once they are all dead it must take leases itself again, or it
waits for the dead Java leader's lock (120 s) before anything moves. This module says which:

* a Java worker's registry entry (no ``impl`` marker) is a sign of life when its ``lut``
  changes under this worker's watch, or when the entry appears after this worker's first read
  of the registry (a worker that joined); an entry found at the first read proves nothing
  until it changes (its worker may have died before this one started);
* a lease owned by a worker that is not a kclasync one is a sign of life when its counter
  changes under this worker's watch (the owner renews it);
* a sign of life lasts ``window`` seconds on this worker's clock: for an entry, three of the
  report periods observed between its last two changes (two default Java periods, 60 s, before
  two changes were seen), and never less than the failover time; for a lease, the failover time
  (the lease's own expiry rule);
* a table with Java-owned leases is undecided (``Verdict.UNKNOWN``) until one failover time has
  passed since the first reading; one with Java entries but no Java-owned lease until an
  entry's window has (a follower holding nothing shows life only through its reports): the
  caller then keeps the safe side (follow a leader, take nothing) while the counters get a
  chance to move, rather than switch back and forth.

Remote timestamps are only ever compared for change, never with the local clock.
Owns: those rules. Must not: do I/O, read a clock (``now`` is passed in) or decide the lease
mode (``leases.client_version.lease_mode`` does, from the verdict).
Cost: memory per Java entry and per Java-owned lease seen; no calls of its own.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

import attrs

from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import DEFAULT_REPORT_PERIOD, KCLASYNC, WorkerMetrics

#: An entry's sign of life lasts this many of its observed report periods.
PERIODS = 3.0
#: Before two changes of an entry were seen: two default Java report periods.
UNKNOWN_PERIOD_WINDOW = 2 * DEFAULT_REPORT_PERIOD


class Verdict(enum.Enum):
    ALIVE = "alive"
    SILENT = "silent"
    UNKNOWN = "unknown"


@attrs.frozen
class _Seen:
    #: The value last read (an entry's ``lut``, a lease's counter).
    value: object
    #: Local time of the last observed change (None: never changed under this watch).
    changed_at: float | None = None
    #: Local seconds between the last two observed changes (None: fewer than two seen).
    interval: float | None = None

    def after(self, value: object, now: float) -> _Seen:
        if value == self.value:
            return self
        interval = None if self.changed_at is None else now - self.changed_at
        return _Seen(value, now, interval if interval is not None else self.interval)


class JavaLiveness:
    """Signs of life of the Java workers on one table, as this worker observed them."""

    def __init__(self, failover_time: float) -> None:
        self.failover_time = failover_time
        self._entries: dict[str, _Seen] = {}
        self._leases: dict[str, tuple[str, _Seen]] = {}
        self._first_read: float | None = None

    def observe_registry(self, entries: Iterable[WorkerMetrics], now: float) -> None:
        """Feed one full read of ``<app>-WorkerMetricStats``."""
        joined_after_start = self._first_read is not None
        if self._first_read is None:
            self._first_read = now
        current: dict[str, _Seen] = {}
        for entry in entries:
            if entry.implementation == KCLASYNC:
                continue
            seen = self._entries.get(entry.worker_id)
            if seen is None:
                seen = _Seen(entry.last_update, now if joined_after_start else None)
            current[entry.worker_id] = seen.after(entry.last_update, now)
        self._entries = current  # an entry removed from the registry: its worker left

    def observe_leases(self, leases: Iterable[Lease], kclasync_ids: set[str], now: float) -> None:
        """Feed one full scan of the lease table; ``kclasync_ids``: the owners known to be
        kclasync workers (this one and the registry's kclasync entries)."""
        current: dict[str, tuple[str, _Seen]] = {}
        for lease in leases:
            owner = lease.owner
            if owner is None or owner in kclasync_ids:
                continue
            before = self._leases.get(lease.key)
            if before is None or before[0] != owner:
                seen = _Seen(lease.counter)
            else:
                seen = before[1].after(lease.counter, now)
            current[lease.key] = (owner, seen)
        self._leases = current

    def entry_window(self, seen: _Seen) -> float:
        if seen.interval is None:
            return max(self.failover_time, UNKNOWN_PERIOD_WINDOW)
        return max(self.failover_time, PERIODS * seen.interval)

    def alive_workers(self, now: float) -> set[str]:
        """The Java workers with a sign of life that still lasts."""
        alive = {
            worker
            for worker, seen in self._entries.items()
            if seen.changed_at is not None and now - seen.changed_at <= self.entry_window(seen)
        }
        alive |= {
            owner
            for owner, seen in self._leases.values()
            if seen.changed_at is not None and now - seen.changed_at <= self.failover_time
        }
        return alive

    def verdict(self, now: float) -> Verdict:
        if self.alive_workers(now):
            return Verdict.ALIVE
        if not (self._entries or self._leases):
            return Verdict.SILENT
        if self._first_read is None:
            return Verdict.UNKNOWN
        # Java-owned leases settle it within a failover time (a live owner renews them); Java
        # entries alone only within their window (a follower that holds nothing shows life
        # only through its reports, every 30 s by default).
        wait = self.failover_time
        if not self._leases:
            wait = max(self.entry_window(seen) for seen in self._entries.values())
        return Verdict.UNKNOWN if now - self._first_read < wait else Verdict.SILENT
