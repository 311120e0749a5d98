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

Who reads at that pace (the successor watch): a reader takes an expired lock over only after
seeing the same record version for the item's duration, so a crashed leader is replaced as
fast as the fastest reader notices. That needs a few fast readers, not all of them. The holder
names its successors in the item (``successors``: an extra attribute, which a Java KCL reader
ignores and a Java KCL writer drops): up to ``SUCCESSORS`` kclasync workers its last read of
the registry showed alive and not suspected, kept from term to term while they stay so, so
that the ones named have been reading fast long before they are needed; a named worker that
dies is replaced at the leader's next registry read. A kclasync holder always writes the
attribute; until its first registry read of its term it names its predecessor's successors
but itself (or an empty list), and the short term is only ever written after that read, so
whoever must notice the switch to it reads fast already. A worker reads the lock every
``failover / 4`` (``watch_interval``) when the item names it, when the list is empty (every
worker, until the holder's first registry read of its term), when the item is a short term
without the attribute (a kclasync leader of an earlier version: the former pace for all), or
when it found no item; every other worker reads at the configured interval (30 s), or at a
Java KCL item's own pace (its 120 s term: every 30 s).

Safe whatever the successors' fate: the pace only decides how soon a reader notices expiry,
never whether it may take over (``core.leader_lock`` judges that on the reader's own clock,
whatever its pace), so a stale or missing list (a Java KCL writer drops the attribute) can
slow a takeover, never make two leaders. How slow: the leader and its first successor crashed
together, the second one takes over as before (about 1.5 x failover); the leader and every
named successor crashed together (a correlated failure), the others notice at their own pace,
within the configured interval plus the term and a read (30 + 10 + 2.5 s at the defaults),
still well within the Java term of 120 s.

Cost (W workers, any number of shards): the leader writes the lock every ``failover / 4``; up
to ``SUCCESSORS`` workers read it at that pace; the other W - 1 - ``SUCCESSORS`` read it every
configured interval. The fast watch is O(1) for the fleet: (1 + ``SUCCESSORS``) x 4 /
failover calls a second whatever W (failover 10 s: 1.2 calls a second), plus W / 30 s slow
reads as without the short term (W = 1,000: about 33); before the successor watch every worker
read it fast, 4 W / failover (400 a second at 1,000 workers).

Owns: ``lock_term`` (the term to write), ``lock_interval`` (how often to write or read the lock
given the term of the item last seen), ``other_implementations`` (whether the registry shows
a worker that is not kclasync), ``short_term_failover`` (which workers may write the short
term), ``alive_workers`` and ``successors`` (whom the holder names) and ``watch_interval``
(a reader's pace).
Must not: do I/O, read a clock, or judge expiry (``core.leader_lock`` does).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs

from kclasync._core.workers.worker_metrics import KCLASYNC, WorkerMetrics

#: In a kclasync-only fleet the lock lasts this many failover times ...
FAST_TERM_FAILOVERS = 1.0
#: ... and its holder writes it (its successors read it) this many times per term.
WRITES_PER_TERM = 4
#: How many workers besides the holder the item names to read it at the holder's pace.
SUCCESSORS = 2


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


def alive_workers(entries: Iterable[WorkerMetrics], suspected: Iterable[str]) -> set[str]:
    """The workers a leader may name as successors after a read of the registry: kclasync
    entries (a Java KCL worker does not watch the lock fast) not ``suspected`` of being dead
    (the leader's failover watch follows them)."""
    excluded = set(suspected)
    return {
        entry.worker_id
        for entry in entries
        if entry.implementation == KCLASYNC and entry.worker_id not in excluded
    }


def successors(
    holder: str,
    alive: Iterable[str],
    previous: Sequence[str] | None,
    count: int = SUCCESSORS,
) -> tuple[str, ...]:
    """The workers the holder names in the lock item: those of ``previous`` (the item's last
    successors) still in ``alive`` (the kclasync workers its last read of the registry showed,
    silent ones left out), in their order, then the lowest ids of the rest, up to ``count``.
    Never the holder itself."""
    candidates = set(alive)
    candidates.discard(holder)
    named = [worker for worker in previous or () if worker in candidates][:count]
    for worker in sorted(candidates):
        if len(named) >= count:
            break
        if worker not in named:
            named.append(worker)
    return tuple(named)


def watch_interval(
    worker_id: str,
    *,
    configured_interval: float,
    duration: float,
    failover_time: float | None,
    named: Sequence[str] | None,
) -> float:
    """How often a worker that does not hold the lock reads it, the item last read lasting
    ``duration`` and naming ``named`` as successors (None: no such attribute). A worker that
    may write the short term (``failover_time`` given) keeps the short term's pace when the
    item names it, when it names an empty list (a kclasync holder that has not read the
    registry in its term yet: it may switch to the short term at its next write), or when
    the item is a short term without the attribute (a kclasync leader of an earlier
    version). Else: an item naming successors is read at the configured interval, one naming
    nobody (a Java KCL's) at its own pace (``lock_interval``). A worker that found no item at
    all (released, or never written) paces itself with ``lock_interval`` on the configured
    term, fast with ``failover_time``: the next holder has named nobody yet."""
    if failover_time is not None:
        if named is not None and (not named or worker_id in named):
            return lock_interval(configured_interval, duration, failover_time)
        if named is None and duration <= FAST_TERM_FAILOVERS * failover_time:
            return lock_interval(configured_interval, duration, failover_time)
    if named is None:
        return lock_interval(configured_interval, duration)
    return configured_interval


def other_implementations(entries: Iterable[WorkerMetrics], unreadable: int = 0) -> bool:
    """Whether a read of the registry shows a worker that is not kclasync: an entry without
    kclasync's marker (a Java KCL worker), or an entry that could not be read (it may be one)."""
    return unreadable > 0 or any(entry.implementation != KCLASYNC for entry in entries)


__all__ = [
    "FAST_TERM_FAILOVERS",
    "SUCCESSORS",
    "WRITES_PER_TERM",
    "LockTerm",
    "alive_workers",
    "lock_interval",
    "lock_term",
    "other_implementations",
    "short_term_failover",
    "successors",
    "watch_interval",
]
