"""A lease this worker holds: its states, transitions, and what a refused write means.

Owns: ``HeldLease``, the state of one lease this worker holds (a pure object the runtime keeps
and moves by events, as h11 keeps a connection's state), the held-lease state machine, the
handoff and staleness deadlines, the Sticky release
reasons, and the one explanation of a failed conditional write (renewal, checkpoint, childShardIds).
Must not: do I/O, read a clock (times are passed in as numbers), or know about asyncio.

The rules
---------

A lease enters the machine in one of two ways:

* taken or stolen outright                      -> ACTIVE    (its pipeline starts)
* a graceful handoff to us is started           -> INCOMING  (the old owner still drains)

and then moves only along these edges::

    INCOMING --handoff_done--> ACTIVE      the old owner finished (checkpointOwner cleared), or
                                            we forced the transfer after the handoff timeout
    ACTIVE   --handoff_away--> OUTGOING    a failed write shows checkpointOwner=us, owner=other:
                                            our pipeline finishes, checkpoints, then lets go
    INCOMING --handoff_away--> OUTGOING    (same, seen by a checkpoint; only in theory)
    any live --lose----------> LOST        another worker changed the lease, the lease went
                                            unrenewed for the failover time, or a handoff timed out
    any live --release-------> RELEASED    we let go (release, finish a handoff, pass one on)

LOST and RELEASED are final: no write goes through a handle in either. Anything else is a
programming error and raises ``HeldLeaseError``.

A failed conditional write is explained from one fresh read of the lease
(``explain_failed_write``), in this order:

1. no lease                                                   -> LOST
2. owner=us, counter=ours+1, and the written field holds what  -> OURS   (our own earlier attempt
   we wrote (checkpoint / childShardIds; nothing for renewals)             went through; adopt it)
3. a checkpoint or childShardIds write: owner=us,              -> RETRY  (a renewal of ours,
   counter=ours+1, the written field as we last had it                   its reply lost, went
                                                                         through: write once more)
4. renewal while INCOMING, owner=other, checkpointOwner=us     -> PASS_ON (handed on again before we
                                                                           started: finish at once)
5. renewal while INCOMING, owner=us, checkpointOwner unchanged -> HANDOFF_PROGRESS (the old owner
   or cleared                                                              checkpointed or finished)
6. renewal while ACTIVE, or a checkpoint: owner=other,          -> HANDOFF_STARTED (go OUTGOING)
   checkpointOwner=us
7. anything else                                               -> LOST

Adopting after rule 2 or 5 does not count as renewing now: the write that counted was sent
earlier, so the renewal time is not moved (``credits_renewal``).
"""

from __future__ import annotations

import enum

import attrs

from kclasync._core.leases.lease import Lease, StickyMode
from kclasync._core.leases.position import Checkpoint


class HeldLeaseError(Exception):
    """A transition the rules do not allow (a bug in the caller)."""


class HeldState(enum.Enum):
    ACTIVE = "active"  # ours; its pipeline runs
    INCOMING = "incoming"  # handed to us; waiting for the old owner's final checkpoint
    OUTGOING = "outgoing"  # being handed away; our pipeline finishes, checkpoints, lets go
    LOST = "lost"  # taken from us; final
    RELEASED = "released"  # let go by us; final


class Event(enum.Enum):
    HANDOFF_DONE = "handoff_done"
    HANDOFF_AWAY = "handoff_away"
    LOSE = "lose"
    RELEASE = "release"


FINAL: frozenset[HeldState] = frozenset({HeldState.LOST, HeldState.RELEASED})

_LIVE = (HeldState.ACTIVE, HeldState.INCOMING, HeldState.OUTGOING)

#: (state, event) -> next state. A missing pair is not allowed.
TRANSITIONS: dict[tuple[HeldState, Event], HeldState] = {
    (HeldState.INCOMING, Event.HANDOFF_DONE): HeldState.ACTIVE,
    (HeldState.ACTIVE, Event.HANDOFF_AWAY): HeldState.OUTGOING,
    (HeldState.INCOMING, Event.HANDOFF_AWAY): HeldState.OUTGOING,
    **{(state, Event.LOSE): HeldState.LOST for state in _LIVE},
    **{(state, Event.RELEASE): HeldState.RELEASED for state in _LIVE},
}


def next_state(state: HeldState, event: Event) -> HeldState:
    """The state after ``event``; raises ``HeldLeaseError`` for an edge the rules lack."""
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise HeldLeaseError(f"a held lease cannot {event.value} from {state.value}") from None


@attrs.define(eq=False)
class HeldLease:
    """The local state of a lease this worker holds: the lease as last written, when it was
    last renewed, where it is in the machine above, and what its renewals carry. Pure: the
    runtime keeps one per held lease (and a lock beside it) and applies events to it."""

    lease: Lease
    #: Loop time at which the last successful counter-changing write was sent.
    renewed_at: float
    state: HeldState = HeldState.ACTIVE
    #: Loop time a handoff (either way) started.
    since: float = 0.0
    #: Sticky=20 was seen: the pipeline is stopping and the lease will be released.
    release_requested: bool = False
    #: Record bytes delivered to the processor since the last renewal (for ``throughputKBps``).
    bytes_delivered: int = 0
    #: Loop time the last renewal was sent (None until the first one): the EMA's period start.
    throughput_since: float | None = None
    #: INCOMING from a worker of another implementation (a Java KCL worker): this worker does
    #: not write the lease until the old owner has finished (the old owner renews and makes its
    #: final checkpoint under the lease counter); it only reads it.
    watch_only: bool = False
    #: Loop time the lease counter was last seen moving (the old owner's renewals).
    progress_at: float = 0.0

    @classmethod
    def taken(cls, lease: Lease, sent: float) -> HeldLease:
        """Taken or stolen outright by a write sent at ``sent``: ACTIVE."""
        return cls(lease=lease, renewed_at=sent)

    @classmethod
    def incoming(cls, lease: Lease, sent: float, *, watch_only: bool = False) -> HeldLease:
        """A graceful handoff to us, started (or, ``watch_only``, seen) at ``sent``: INCOMING."""
        return cls(
            lease=lease,
            renewed_at=sent,
            state=HeldState.INCOMING,
            since=sent,
            watch_only=watch_only,
            progress_at=sent if watch_only else 0.0,
        )

    @property
    def key(self) -> str:
        return self.lease.key

    @property
    def lost(self) -> bool:
        """No write goes through this handle any more (lost, or let go)."""
        return self.state in FINAL

    def apply(self, event: Event) -> HeldState:
        """Move along one edge of the machine; returns the state left."""
        left = self.state
        self.state = next_state(left, event)
        return left

    def wrote(self, lease: Lease, sent: float) -> None:
        """A counter-changing write of ours, sent at ``sent``, went through."""
        self.lease, self.renewed_at = lease, sent

    def handed_away(self, current: Lease, now: float) -> None:
        """The table names a new owner that asked for the lease: go OUTGOING."""
        self.apply(Event.HANDOFF_AWAY)
        self.lease, self.since = current, now

    def renewal_done(
        self, renewed: Lease, *, sent: float, verdict: Verdict | None, delivered: int
    ) -> None:
        """A renewal sent at ``sent`` ended with ``renewed`` in the table (``verdict`` None:
        accepted at once, carrying the throughput of ``delivered`` bytes; else what
        ``explain_failed_write`` found)."""
        self.lease = renewed
        if verdict is None:  # our renewal (and its throughput) went through
            self.bytes_delivered -= delivered
            self.throughput_since = sent
        # After a reconciled failure the write that counted was sent before ``sent``
        # (found by the simulation: 50 workers x 500 shards, seed 7).
        if credits_renewal(verdict, FailedWrite.renewal()):
            self.renewed_at = sent


# -- failed conditional writes ----------------------------------------------------------------


class WriteKind(enum.Enum):
    RENEWAL = "renewal"
    CHECKPOINT = "checkpoint"
    CHILD_SHARD_IDS = "child_shard_ids"


@attrs.frozen
class FailedWrite:
    """A conditional write the table refused, and what it would have written."""

    kind: WriteKind
    #: CHECKPOINT: the checkpoint (and pending checkpoint) the lease holds if the write went
    #: through.
    checkpoint: Checkpoint | None = None
    pending: Checkpoint | None = None
    #: CHILD_SHARD_IDS: the ids written.
    child_shard_ids: frozenset[str] | None = None

    @classmethod
    def renewal(cls) -> FailedWrite:
        return cls(WriteKind.RENEWAL)

    @classmethod
    def of_checkpoint(
        cls, held: Lease, checkpoint: Checkpoint, pending: Checkpoint | None
    ) -> FailedWrite:
        # A pending (two-phase) write leaves the checkpoint as it was.
        return cls(
            WriteKind.CHECKPOINT,
            checkpoint=held.checkpoint if pending else checkpoint,
            pending=pending,
        )

    @classmethod
    def of_child_shard_ids(cls, ids: frozenset[str]) -> FailedWrite:
        return cls(WriteKind.CHILD_SHARD_IDS, child_shard_ids=ids)


class Verdict(enum.Enum):
    OURS = "ours"  # our own earlier attempt went through: adopt the read lease
    RETRY = "retry"  # another write of ours went through first: write again on the read lease
    HANDOFF_PROGRESS = "handoff_progress"  # INCOMING: the old owner moved on; adopt the read lease
    PASS_ON = "pass_on"  # INCOMING, handed on again before we started: finish that handoff
    HANDOFF_STARTED = "handoff_started"  # another worker asks for the lease: go OUTGOING
    LOST = "lost"  # someone else changed the lease


def _holds_what_we_wrote(current: Lease, write: FailedWrite) -> bool:
    if write.kind is WriteKind.CHECKPOINT:
        return (
            current.checkpoint == write.checkpoint and current.pending_checkpoint == write.pending
        )
    if write.kind is WriteKind.CHILD_SHARD_IDS:
        return current.child_shard_ids == write.child_shard_ids
    return True


def _as_held(held: Lease, kind: WriteKind) -> FailedWrite:
    """The write that would leave ``held``'s fields as they are (nothing of ours changed)."""
    return FailedWrite(
        kind,
        checkpoint=held.checkpoint,
        pending=held.pending_checkpoint,
        child_shard_ids=held.child_shard_ids,
    )


def explain_failed_write(
    *, me: str, state: HeldState, held: Lease, current: Lease | None, write: FailedWrite
) -> Verdict:
    """Was this refused write our own retried write, or did someone else change the lease?"""
    if current is None:
        return Verdict.LOST
    ours = current.owner == me
    if ours and current.counter == held.counter + 1 and _holds_what_we_wrote(current, write):
        return Verdict.OURS
    if (
        ours
        and current.counter == held.counter + 1
        and write.kind is not WriteKind.RENEWAL
        and _holds_what_we_wrote(current, _as_held(held, write.kind))
    ):
        return Verdict.RETRY
    asked_away = current.checkpoint_owner == me and not ours
    if write.kind is WriteKind.RENEWAL and state is HeldState.INCOMING:
        if asked_away:
            return Verdict.PASS_ON
        if ours and current.checkpoint_owner in (None, held.checkpoint_owner):
            return Verdict.HANDOFF_PROGRESS
    if asked_away and (
        write.kind is WriteKind.CHECKPOINT
        or (write.kind is WriteKind.RENEWAL and state is HeldState.ACTIVE)
    ):
        return Verdict.HANDOFF_STARTED
    return Verdict.LOST


def check_accepted_write(*, me: str, state: HeldState, written: Lease) -> Verdict | None:
    """An ACTIVE lease's write the table accepted: does the item it returned still name this
    worker as the owner? None when it does.

    On DynamoDB the returned item is the one the condition was checked on, plus this write, so
    it always does. A store whose conditional writes are not atomic (moto's server answers each
    request in a thread and applies an UpdateItem in steps) can return an item that already
    holds a concurrent handoff: adopting it would leave this worker renewing, and checkpointing
    in handoff mode, a lease the table gives to another worker, which waits for the handoff
    timeout. Whatever the store, the item shows the table's state, so it is acted on as a
    refused write would be: a handoff to start (HANDOFF_STARTED), or a lease lost."""
    if state is not HeldState.ACTIVE or written.owner == me:
        return None
    if written.checkpoint_owner == me:
        return Verdict.HANDOFF_STARTED
    return Verdict.LOST


def credits_renewal(verdict: Verdict | None, write: FailedWrite) -> bool:
    """Whether the write just sent renews the lease as of its send time.

    ``verdict`` None: the write was accepted at once. A reconciled renewal does not credit:
    the write that counted was an earlier attempt, sent before, and crediting the later send
    time would let this worker outlive the expiry other workers compute. Checkpoints and
    childShardIds writes credit their send time either way (they are retried within one call).
    """
    return verdict is None or write.kind is not WriteKind.RENEWAL


# -- deadlines --------------------------------------------------------------------------------


def is_stale(renewed_at: float, now: float, failover_time: float) -> bool:
    """A lease unrenewed for longer than the failover time may be another worker's by now."""
    return now - renewed_at > failover_time


def outgoing_timed_out(since: float, now: float, handoff_timeout: float) -> bool:
    """OUTGOING: after the handoff timeout the new owner may force the transfer; stop writing."""
    return now - since > handoff_timeout


class IncomingStep(enum.Enum):
    WAIT = "wait"
    ACTIVATE = "activate"  # the old owner finished the handoff
    FORCE = "force"  # take the lease over without the old owner's final checkpoint


def incoming_step(
    lease: Lease,
    *,
    since: float,
    now: float,
    handoff_timeout: float,
    old_owner_live: bool,
    worker_failover: float,
) -> IncomingStep:
    """INCOMING, after a renewal: start, keep waiting, or force the handoff.

    The old owner that stopped heartbeating will never finish: do not wait for the timeout."""
    if lease.checkpoint_owner is None:
        return IncomingStep.ACTIVATE
    waited = now - since
    if waited > handoff_timeout or (not old_owner_live and waited > worker_failover):
        return IncomingStep.FORCE
    return IncomingStep.WAIT


def release_reason(lease: Lease, me: str) -> str | None:
    """Why an ACTIVE lease must be drained and released because of its Sticky value (or None)."""
    if lease.sticky_mode is StickyMode.RELEASE:
        return "Sticky=20"
    if lease.sticky_mode is StickyMode.PINNED and lease.sticky_worker not in (None, me):
        return f"pinned to {lease.sticky_worker}"
    return None
