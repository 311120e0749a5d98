"""Early failover at the cost of one registry item per follower: the leader's silence digest.

Without it, every worker reads the whole worker registry twice per heartbeat period to notice
a silent worker: O(workers) items per worker, O(workers^2) for the fleet (1,000 workers at the
default heartbeat would read millions of items a second). Instead:

* the leader alone reads the whole registry at that rate and judges silences on its own clock
  (``worker_silence.watch_heartbeats``, unchanged); into its own registry entry, with each
  heartbeat it writes, goes a digest (``publish``): the workers it judged silent and worth
  following, each with the heartbeat value it stood still at, and a membership counter that
  moves whenever an entry joined or left;
* every other worker reads only the leader's entry (one strongly consistent GetItem) at that
  rate (``follow``): a worker newly named in the digest is followed exactly as before (its
  leases read at once, expiry still judged on the follower's own clock, so the digest can only
  start a follower's clocks early, never make it take a lease that is not expired for it); a
  moved membership counter wakes the taker, as a join or a leave did; and the leader's own
  heartbeat is watched for silence like any other, so a dead leader is followed too;
* a follower reads the whole registry as before while no leader is known, while the leader's
  entry carries no digest (a Java leader, an older kclasync), or while the leader itself is
  silent (until a new leader publishes).

Each silence then reaches a follower at most one heartbeat period later than before (the
leader writes the digest with its next heartbeat). Cost per heartbeat period: the leader
2 x workers items, each follower 2 items: O(workers) for the fleet.
Owns: what is published and how a follower reads it. Must not: do I/O or read a clock (``now``
and ``sent`` are passed in), or decide expiry (the followers' trackers do).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import attrs

from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import SilenceDigest, WorkerMetrics
from kclasync._core.workers.worker_silence import (
    HeartbeatChange,
    HeartbeatView,
    watch_heartbeats,
    worth_following,
)


def publish(
    view: HeartbeatView,
    change: HeartbeatChange,
    last_scan: Iterable[Lease],
    previous: SilenceDigest | None,
) -> SilenceDigest:
    """The leader's digest after a full read of the registry folded into ``view``: every
    worker silent now and worth following (it moved under the leader's watch or owned a lease
    in its last scan), with the value its heartbeat stood still at; the membership counter
    moves when the read showed a worker that joined or left."""
    worth = worth_following(view.silent_workers(), view, last_scan)
    silent = {worker: view.beats[worker].value for worker in sorted(worth)}
    members = 0 if previous is None else previous.members
    if change.joined or change.left:
        members += 1
    if previous is not None and previous.silent == silent and previous.members == members:
        return previous
    return SilenceDigest(silent=silent, members=members)


@attrs.frozen
class DigestView:
    """What a follower knows from the leader's entry."""

    #: The leader whose entry this is (a new leader starts a new view).
    leader: str | None = None
    #: The leader's heartbeat, watched like any worker's.
    beats: HeartbeatView = attrs.field(factory=HeartbeatView)
    #: Silences already acted on: worker -> the value it stood still at.
    acted: Mapping[str, int] = attrs.field(factory=dict)
    #: The membership counter last read (None before the first read of this leader).
    members: int | None = None


@attrs.frozen
class DigestChange:
    view: DigestView
    #: Workers to follow now (newly named silent, or the leader itself gone silent).
    silent: frozenset[str] = frozenset()
    #: The membership moved: a taking round now.
    wake: bool = False
    #: The leader is silent: read the whole registry until a new leader publishes.
    leader_silent: bool = False


def full_view_restart_wakes(previous: DigestView) -> bool:
    """Whether a follower that goes back to reading the whole registry (the leader's entry is
    gone or has no digest, the leader is silent, or no leader is known any more) wakes its
    taker. Its view of the registry then starts afresh and cannot show who left or joined
    while it read the leader's digest; a leader that stopped gracefully released its leases
    and deleted its entry, and a taking round now takes them rather than the next periodic
    one. True when it had been reading a leader's digest (``previous``)."""
    return previous.members is not None


def follow(
    previous: DigestView,
    leader: str,
    entry: WorkerMetrics,
    me: str,
    now: float,
    *,
    sent: float | None = None,
) -> DigestChange:
    """Fold one read of the leader's entry (which carries a digest) into the view."""
    digest = entry.digest
    assert digest is not None, "follow() needs an entry with a digest"
    if previous.leader != leader:
        previous = DigestView(leader=leader)
    watched = watch_heartbeats(previous.beats, [entry], me, now, sent=sent)
    silent = set(watched.silent)
    leader_beat = watched.view.beats.get(leader)
    leader_silent = leader_beat is not None and leader_beat.silent
    fresh = {
        worker: value
        for worker, value in digest.silent.items()
        if worker != me and previous.acted.get(worker) != value
    }
    silent |= set(fresh)
    # A worker no longer named is forgotten: if it goes silent again, it is followed again.
    acted = {w: v for w, v in previous.acted.items() if w in digest.silent}
    acted.update(fresh)
    wake = previous.members is not None and digest.members != previous.members
    view = DigestView(leader, watched.view, acted, digest.members)
    return DigestChange(view, frozenset(silent), wake, leader_silent)
