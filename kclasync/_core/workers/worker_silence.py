"""Early failover: noticing that a worker stopped heartbeating, and judging its leases early.

A dead worker's lease is taken once its counter has stood still for the failover time *as this
worker observed it* (``core.expiry``; the KCL's rule, unchanged here). With only periodic
scans, the clock of a dead worker's final counter starts at the first scan after the crash.
Workers that heartbeat their registry entry often (``hb``/``hbi`` in
``<app>-WorkerMetricStats``, ``core.worker_metrics``) let the others learn within a few
heartbeat periods that one stopped; they then read that worker's leases at once, which starts
the clocks of the final counters early, and check each lease again when it is due to expire.

Three decisions, each used unchanged by the runtime (``_runtime/early_failover.py``) and the
simulation:

* ``watch_heartbeats``: from the previous view of the registry, the entries just read and the
  local time, which workers just went silent (and which left the registry: a graceful stop
  removes the entry after releasing the leases, so a taking round then finds them unowned).
  A heartbeat is only ever compared for change,
  and the time it stood still is measured on the local clock from this worker's first read of
  its current value: remote timestamps are never compared with the local clock.
* ``worth_following``: which of the silent workers' leases are worth reading: not those of an
  entry that never moved under this worker's watch and owned nothing in its last scan (a
  worker dead before this one started).
* ``stale_entries``: which silent workers' registry entries the leader removes (long silent,
  owning nothing in a scan sent after the silence began).
* ``judge_silent_leases``: feeds leases read one by one into the expiry tracker exactly as a
  scan would (a changed counter restarts that lease's clock; an unchanged one keeps its
  earlier first-seen time) and says which are expired now, which to check again and when, and
  which to leave alone (another owner now, or, at a re-check, the owner came back: its counter
  moved).
* ``early_take_view``: the taker's view for taking those expired leases through the normal
  planners (``Kcl2LeaseTaker``, ``BalancedLeaseTaker``) with their limits: the leases just read,
  this worker's own, and the other live owners' leases, counted as held: as the follow read
  them (a silent worker's lease that another worker took meanwhile is that worker's), else as
  the last scan saw them.
  ``after_early_take``: the expired leases the plan left (another worker's share, or a race
  lost) are read and planned again a few times, a heartbeat period apart.

Owns: those decisions and the default heartbeat period. Must not: do I/O, read clocks (``now``
is passed in) or draw randomness.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence

import attrs

from kclasync._core.assignment.lease_taker import TakeView
from kclasync._core.leases.expiry import ExpiryTracker
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import WorkerMetrics

#: The default heartbeat period is the failover time over this ...
HEARTBEAT_DIVISOR = 20
#: ... but never below this many seconds (a write and a registry read per period and worker).
HEARTBEAT_FLOOR = 0.5
#: A heartbeat that has not changed for its period x (1 + this), on the reader's clock, is
#: silent: a write may come up to a whole period late before the reader says so (a loaded
#: host delays writes; a false alarm costs reads of that worker's leases).
SILENCE_MARGIN = 1.0
#: Readers read the registry this many times per heartbeat period, so that a silence is seen
#: about one period after the threshold at most.
READS_PER_PERIOD = 2
#: ``is_expired`` is strict (idle > failover): a re-check is due this much after the failover.
RECHECK_SLACK = 0.001


def default_heartbeat_interval(failover_time: float) -> float:
    """The heartbeat period when none is configured: failover / 20, at least 0.5 s."""
    return max(HEARTBEAT_FLOOR, failover_time / HEARTBEAT_DIVISOR)


@attrs.frozen
class Beat:
    """One worker's heartbeat as this worker last read it."""

    value: int
    #: The writer's heartbeat period (``hbi``), seconds.
    interval: float
    #: Local time of this worker's first read of ``value``.
    since: float
    #: Already reported silent (a silence is reported once, until the heartbeat moves again).
    silent: bool = False
    #: This worker saw the value change at least once: the writer was alive while watched.
    moved: bool = False


@attrs.frozen
class HeartbeatView:
    """What this worker knows of the other workers' heartbeats."""

    beats: Mapping[str, Beat] = attrs.field(factory=dict)
    #: At least one registry read was folded in (so a new entry is a worker that joined, not
    #: one that was there before this worker started).
    read: bool = False

    def silent_workers(self) -> frozenset[str]:
        return frozenset(w for w, beat in self.beats.items() if beat.silent)


def is_silent(beat: Beat, now: float) -> bool:
    """Whether a heartbeat stood still for longer than its period plus the margin."""
    return now - beat.since > beat.interval * (1 + SILENCE_MARGIN)


@attrs.frozen
class HeartbeatChange:
    """What a read of the registry showed."""

    view: HeartbeatView
    #: Workers that just went silent: read their leases now.
    silent: frozenset[str] = frozenset()
    #: Watched workers whose entry is gone (a graceful stop deletes it after releasing its
    #: leases): a taking round now finds those leases unowned.
    left: frozenset[str] = frozenset()
    #: Workers whose entry appeared since the last read (none on the first read): a taking
    #: round now gives them their share, rather than at the next periodic scan.
    joined: frozenset[str] = frozenset()


def watch_heartbeats(
    previous: HeartbeatView,
    entries: Iterable[WorkerMetrics],
    me: str,
    now: float,
    *,
    sent: float | None = None,
) -> HeartbeatChange:
    """Fold a read of the registry into the view; return the new view, the workers that just
    went silent, those that left and those that joined (none on the first read). The read was
    sent at ``sent`` (default ``now``) and answered at ``now``: a new value is stamped with
    ``now`` (it was written before then) and silence is measured up to ``sent`` (nothing new was
    visible then), so a slow read or a stalled server never makes a heartbeat look silent.
    Entries without a heartbeat period (Java workers, kclasync workers reporting only with their
    renewals) and this worker's own are not watched; a worker that left the registry is
    forgotten."""
    asked = now if sent is None else sent
    beats: dict[str, Beat] = {}
    newly: set[str] = set()
    for entry in entries:
        if entry.worker_id == me or entry.heartbeat is None or entry.heartbeat_interval is None:
            continue
        old = previous.beats.get(entry.worker_id)
        if old is None or old.value != entry.heartbeat:
            moved = old is not None
            beats[entry.worker_id] = Beat(
                entry.heartbeat, entry.heartbeat_interval, now, moved=moved
            )
            continue
        beat = attrs.evolve(old, interval=entry.heartbeat_interval)
        if not beat.silent and is_silent(beat, asked):
            beat = attrs.evolve(beat, silent=True)
            newly.add(entry.worker_id)
        beats[entry.worker_id] = beat
    # An entry removed after its worker went silent is not a graceful stop (that worker released
    # nothing): waking the taker for it would cost a scan and find nothing.
    left = frozenset(
        w for w, beat in previous.beats.items() if w not in beats and w != me and not beat.silent
    )
    joined = frozenset(w for w in beats if w not in previous.beats and previous.read)
    return HeartbeatChange(HeartbeatView(beats, read=True), frozenset(newly), left, joined)


def worth_following(
    silent: Iterable[str], view: HeartbeatView, last_scan: Iterable[Lease]
) -> frozenset[str]:
    """Of the workers that just went silent, those whose leases are worth reading now: those
    this worker saw heartbeat (their value changed while it watched) and those that owned a
    lease in its last scan. The others stopped before this worker started watching and owned
    nothing when it last scanned: a SIGKILLed worker's entry stays in the registry (nothing
    removes it but a KCL 3.x leader, after a day), and each worker that starts later would
    otherwise query the owner index for it once and find nothing. A lease such a worker took
    after that scan is found by the periodic scan, as without early failover."""
    owners = {lease.owner for lease in last_scan if lease.owner is not None}
    chosen: set[str] = set()
    for worker in silent:
        beat = view.beats.get(worker)
        if worker in owners or (beat is not None and beat.moved):
            chosen.add(worker)
    return frozenset(chosen)


#: The leader removes a silent worker's registry entry once it has been silent this many
#: failover times and the leader's last scan, sent after the silence began, shows it owning
#: nothing.
STALE_ENTRY_FAILOVERS = 3


def stale_entries(
    view: HeartbeatView,
    last_scan: Iterable[Lease],
    scan_sent: float | None,
    now: float,
    failover_time: float,
) -> dict[str, int]:
    """The registry entries the leader removes, with the heartbeat each delete is conditional
    on (a worker that writes again is never removed): workers silent for
    ``STALE_ENTRY_FAILOVERS`` failover times (on this worker's clock, from its first read of
    the final value) that own no lease in a scan sent after that first read. A SIGKILL leaves
    the entry behind; left there, it costs every later reader an item per registry read (and,
    before ``worth_following``, an owner-index query per new worker). The KCL 3.x leader
    removes entries a day after their last update; a worker that comes back writes its entry
    anew."""
    if scan_sent is None:
        return {}
    owners = {lease.owner for lease in last_scan if lease.owner is not None}
    return {
        worker: beat.value
        for worker, beat in view.beats.items()
        if beat.silent
        and worker not in owners
        and scan_sent > beat.since
        and now - beat.since > STALE_ENTRY_FAILOVERS * failover_time
    }


@attrs.frozen
class SilentLeaseCheck:
    """What to do with the leases of a silent worker after reading them."""

    #: Still the silent worker's, counter unchanged for the failover time: take them now
    #: (through the taker's plan).
    expired: tuple[Lease, ...] = ()
    #: Still the silent worker's, not expired yet: read again at ``recheck_at``.
    waiting: tuple[str, ...] = ()
    recheck_at: float | None = None
    #: Expired, but no plan of this worker's took them in ``RETAKE_ROUNDS`` rounds (the plans
    #: of workers that saw different tables disagreed): a full taking round settles them.
    unplanned: tuple[str, ...] = ()


def judge_silent_leases(
    tracker: ExpiryTracker,
    owner: str,
    leases: Iterable[Lease | None],
    now: float,
    *,
    recheck: bool,
    before: Mapping[str, Lease] | None = None,
) -> SilentLeaseCheck:
    """Observe ``leases`` (read at ``now``; None for a deleted one) of the silent ``owner`` and
    decide. On the first look after the silence (``recheck`` False) a changed counter only
    restarts that lease's clock (the owner renewed before it stopped); at a re-check (``recheck``
    True) it means the owner came back, and the lease is left alone. A lease that names
    another owner now is left alone either way (someone took it, or it was released).

    One change at a re-check is not the owner's: the old owner finishing a handoff to it
    (``handoff_finished_by_other``, judged against ``before``, what the previous look read).
    It neither means the owner came back nor restarts the lease's clock
    (``ExpiryTracker.observe_not_renewed``): the owner has still not written the lease since
    the clock's start, so the lease is taken at this check, not left to the next taking round.
    A live owner would have renewed it meanwhile (an incoming lease too), every renewal period,
    and the check comes at least a failover time after the clock's start."""
    expired: list[Lease] = []
    waiting: list[str] = []
    due: list[float] = []
    earlier = before or {}
    for lease in leases:
        if lease is None:
            continue
        unchanged = tracker.has_seen(lease)
        previous = earlier.get(lease.key)
        not_renewed = (
            recheck
            and not unchanged
            and previous is not None
            and handoff_finished_by_other(previous, lease)
        )
        if not_renewed:
            tracker.observe_not_renewed(lease, now)
        else:
            tracker.observe_one(lease, now)
        if lease.owner != owner or (recheck and not unchanged and not not_renewed):
            continue
        if tracker.is_expired(lease, now):
            expired.append(lease)
            continue
        stamp = tracker.last_change(lease.key)
        assert stamp is not None  # observed just now
        waiting.append(lease.key)
        due.append(stamp + tracker.failover_time + RECHECK_SLACK)
    return SilentLeaseCheck(
        expired=tuple(expired),
        waiting=tuple(waiting),
        recheck_at=min(due) if due else None,
    )


def handoff_finished_by_other(previous: Lease, current: Lease) -> bool:
    """Whether the one write between two reads of a lease was its old owner finishing a
    handoff to the lease's owner: ``checkpointOwner`` named another worker and is gone now,
    the owner unchanged, the counter one higher (that write's own increment). Any write of
    the owner itself (a renewal, a forced start) would have raised the counter further or
    left ``checkpointOwner`` in place."""
    return (
        previous.checkpoint_owner is not None
        and previous.checkpoint_owner != previous.owner
        and current.checkpoint_owner is None
        and current.owner == previous.owner
        and current.counter == previous.counter + 1
    )


#: Expired leases of a silent worker that this worker's plan left to others (or that another
#: worker's take raced) are read and planned again this many times, a heartbeat period apart:
#: workers planning independently may both pick the same lease and leave another one.
RETAKE_ROUNDS = 3


def after_early_take(
    check: SilentLeaseCheck, taken: Collection[str], now: float, delay: float, rounds_left: int
) -> SilentLeaseCheck:
    """What to read again after taking ``taken`` of ``check.expired``: the expired leases not
    taken by this worker, ``delay`` from now (while ``rounds_left``), and the waiting ones."""
    left = tuple(lease.key for lease in check.expired if lease.key not in taken)
    if not left or rounds_left <= 0:
        return SilentLeaseCheck(waiting=check.waiting, recheck_at=check.recheck_at, unplanned=left)
    due = now + delay if check.recheck_at is None else min(check.recheck_at, now + delay)
    return SilentLeaseCheck(waiting=(*check.waiting, *left), recheck_at=due)


def early_take_view(
    *,
    worker_id: str,
    expired: Sequence[Lease],
    held: Sequence[Lease],
    last_scan: Sequence[Lease],
    silent: Collection[str],
    tracker: ExpiryTracker,
    now: float,
    live_workers: frozenset[str],
    max_leases_for_worker: int | None,
    max_leases_to_steal: int | None,
    taken_by_others: Sequence[Lease] = (),
) -> TakeView:
    """The view a taker plans an early take with. Only ``expired`` (just read, and expired by
    the unchanged rule) can come out as available: ``held`` (this worker's leases as it holds
    them) and the leases of the other owners that are not silent count as held (they were not
    read as expired, so nothing says they expired), with their expiry judged from a tracker
    that knows only the expired leases' true stamps. The other owners' leases are
    ``taken_by_others`` (read by this follow, newer than the last scan: the silent worker's
    leases that another worker took first) and the rest of the last scan's. Unowned leases of
    the last scan and the silent workers' other leases are left out: the periodic round
    handles them.

    Without ``taken_by_others``, two followers of one silent worker plan from the same last
    scan: the one that checks second does not see the first one's take, so its plan can give
    it no share of what is left, and the lease waits for the retakes (``after_early_take``)
    and then a full taking round."""
    view_tracker = tracker.subset(lease.key for lease in expired)
    fresh = {lease.key for lease in expired}
    mine = {lease.key for lease in held}
    read = {lease.key: lease for lease in taken_by_others}
    leases: list[Lease] = list(expired)
    for lease in held:
        if lease.key not in fresh:
            leases.append(lease)
            view_tracker.observe_one(lease, now)
    scanned = [lease for lease in last_scan if lease.key not in read]
    for lease in (*read.values(), *scanned):
        if lease.key in fresh or lease.key in mine or lease.owner is None:
            continue
        if lease.owner == worker_id or lease.owner in silent:
            continue
        leases.append(lease)
        view_tracker.observe_one(lease, now)
    return TakeView(
        worker_id=worker_id,
        leases=leases,
        now=now,
        expiry=view_tracker,
        max_leases_for_worker=max_leases_for_worker,
        max_leases_to_steal=max_leases_to_steal,
        live_workers=live_workers - frozenset(silent),
    )
