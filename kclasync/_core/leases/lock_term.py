"""How long the leader lock lasts, and how often it is written and read, for the fleet at hand.

The DynamoDB lock client stores the lock's lease duration in the item itself, and every reader
judges expiry by the duration of the item it read (``core.leader_lock``): the holder chooses
how long the others wait. In a fleet of kclasync workers only, the leader writes a short term
(one failover time, ``FAST_TERM_FAILOVERS``) and heartbeats it four times per term, so that a
crashed leader's lock is taken over within about 1.5 x failover and its leases assigned within
about 3 x failover, instead of after the 120 s a Java KCL 3.x leader writes. As soon as the
registry shows a worker of another implementation (a Java KCL worker: an entry without
kclasync's ``impl`` marker, or an entry kclasync cannot read), or while the leader has not read
the registry in its term, the configured term is written: the Java semantics, unchanged.

Why this is safe whatever the term: it is the lock client's own argument, with the term read
from the item. The holder leads only while its last successful write was *sent* less than the
item's duration ago; every other reader waits that duration after *seeing* the write. A term
switch is a write like any other (a new record version), so readers that saw the old item start
afresh with the new duration. Nothing of the Java side changes: a Java reader waits the duration
of the item it read (or its own, longer one), never less than the kclasync holder leads.

Cost (W workers, any number of shards): a worker that may write the short term (a leader-based
taker with ``early_failover``) reads the lock (one strongly consistent GetItem) every
``failover / 4`` instead of every ``leader_heartbeat_interval`` (30 s), whatever the term of the
item, and the leader writes it as often: 4 / failover calls per worker per second, 4 W /
failover for the fleet (W = 100, failover 10 s: 40 reads/s, 20 read units, and 0.4 writes/s).
Independent of the shards, and O(W) in total: no worker reads anything per peer.

Owns: ``lock_term`` (the term to write), ``lock_interval`` (how often to write or read the lock
given the term of the item last seen), ``other_implementations`` (whether the registry shows
a worker that is not kclasync) and ``short_term_failover`` (which workers may write the short
term).
Must not: do I/O, read a clock, or judge expiry (``core.leader_lock`` does).
"""

from __future__ import annotations

from collections.abc import Iterable

import attrs

from kclasync._core.workers.worker_metrics import KCLASYNC, WorkerMetrics

#: In a kclasync-only fleet the lock lasts this many failover times ...
FAST_TERM_FAILOVERS = 1.0
#: ... and its holder writes it (every worker reads it) this many times per term.
WRITES_PER_TERM = 4


@attrs.frozen
class LockTerm:
    #: Seconds written as the item's ``leaseDuration``.
    duration: float
    #: Seconds between the holder's writes (and the others' reads) of an item of that duration.
    interval: float


def short_term_failover(
    failover_time: float, *, leader_based: bool, early_failover: bool
) -> float | None:
    """The failover time a worker's short term derives from, or None when it never writes one:
    only a leader-based taker with ``early_failover`` reads the registry as leader (the watch
    that says whether the fleet is kclasync-only)."""
    return failover_time if leader_based and early_failover else None


def lock_interval(
    configured_interval: float, duration: float, failover_time: float | None = None
) -> float:
    """How often the lock is written by its holder and read by the others when the item (last
    written, or last read) lasts ``duration``: the configured interval, or a quarter of a term
    shorter than four of them. A worker that may write the short term (``failover_time``
    given) keeps that pace whatever the item: a reader that last saw a long item would
    otherwise notice a switch to the short term only at its next slow read, up to the
    configured interval (30 s) later."""
    if failover_time is not None:
        duration = min(duration, FAST_TERM_FAILOVERS * failover_time)
    return min(configured_interval, duration / WRITES_PER_TERM)


def lock_term(
    *,
    configured_duration: float,
    configured_interval: float,
    failover_time: float | None,
    others_present: bool | None,
) -> LockTerm:
    """The term the leader writes. ``others_present``: whether its last read of the registry
    showed a worker of another implementation (None: not read in this term, or not known).
    ``failover_time`` None: the short term is off (the configured one always)."""
    if others_present is not False or failover_time is None:
        return LockTerm(configured_duration, configured_interval)
    duration = min(configured_duration, FAST_TERM_FAILOVERS * failover_time)
    return LockTerm(duration, lock_interval(configured_interval, duration))


def other_implementations(entries: Iterable[WorkerMetrics], unreadable: int = 0) -> bool:
    """Whether a read of the registry shows a worker that is not kclasync: an entry without
    kclasync's marker (a Java KCL worker), or an entry that could not be read (it may be one)."""
    return unreadable > 0 or any(entry.implementation != KCLASYNC for entry in entries)


__all__ = [
    "FAST_TERM_FAILOVERS",
    "WRITES_PER_TERM",
    "LockTerm",
    "lock_interval",
    "lock_term",
    "other_implementations",
    "short_term_failover",
]
