"""The leader lock: one heartbeat item that at most one worker holds at a time.

Owns: the decision of what a worker does with the lock item it just read (wait, create it, take
it over, heartbeat it) and whether it may act as leader now. The rules, as in the DynamoDB lock
client the KCL 3.x uses for its ``Leader`` item:

* The item names an owner, a lease duration and a record version number (RVN). Every write by
  the holder (a heartbeat) replaces the RVN; every write is conditional on the RVN read before.
* Expiry is judged on the reader's own clock, like lease expiry (``core.expiry``): a reader
  stamps the item with "now" whenever it sees the RVN change; the lock is expired once the same
  RVN has been seen for longer than the item's lease duration. Clocks are never compared.
* First writer wins: a missing item is created with ``attribute_not_exists``; an expired or
  released item is replaced conditionally on the RVN that was observed; only one such write can
  succeed.
* The holder counts as leader only while its last successful write was *sent* less than the lease
  duration ago. Since every other worker waits at least that long after *seeing* that write, the
  holder stops leading before anyone else can take the lock.
* A graceful release deletes the item (conditional on the holder's RVN and owner name), which
  is what the KCL 3.x leader does; the next reader then finds no item and creates it. An item
  that carries the lock client's ``isReleased`` marker is released whatever the marker's value
  (the lock client only tests for its presence), except the boolean ``false`` that earlier
  kclasync versions wrote on every held lock (``is_released_marker``).

Must not: do I/O, read clocks (``now`` is always passed in), or draw randomness.
"""

from __future__ import annotations

import enum

import attrs

LEADER_LOCK_KEY = "Leader"

#: The value the DynamoDB lock client stores in ``isReleased`` when it releases without deleting.
RELEASED_MARKER = "1"


def is_released_marker(value: object) -> bool:
    """Whether a lock item's decoded ``isReleased`` attribute means "released".

    ``None`` (absent): held. Any string (the lock client writes ``"1"``) or ``True``: released.
    ``False``: held; earlier kclasync versions wrote ``isReleased = false`` on every held lock.
    """
    return value is not None and value is not False


@attrs.frozen
class LockItem:
    """The lock item as read from the coordinator-state table."""

    owner: str | None
    record_version: str
    #: Seconds; how long readers wait after the last change before taking the lock over.
    lease_duration: float
    released: bool = False
    #: The workers the holder named to watch the lock at the short term's pace
    #: (``core.lock_term.successors``; None: the item names none, as a Java KCL's item).
    successors: tuple[str, ...] | None = None


class LockAction(enum.Enum):
    WAIT = "wait"  # someone else holds an unexpired lock
    CREATE = "create"  # no item: create it (conditional on it not existing)
    TAKE = "take"  # expired, released or ours from an earlier life: replace on the RVN read
    HEARTBEAT = "heartbeat"  # we hold it: replace the RVN (conditional on ours)


@attrs.frozen
class LockDecision:
    action: LockAction
    #: The RVN the conditional write must find (TAKE, HEARTBEAT).
    expected_version: str | None = None


@attrs.define
class LeaderLockState:
    """One worker's view of the lock: what it last saw, and whether it holds it."""

    worker_id: str
    _seen_version: str | None = attrs.field(default=None, init=False)
    #: The owner named by the lock item last read (None: no item, or a released one).
    seen_owner: str | None = attrs.field(default=None, init=False)
    #: The lease duration of the lock item last read (None: no item).
    seen_duration: float | None = attrs.field(default=None, init=False)
    #: The successors the lock item last read named (None: no item, or it names none).
    seen_successors: tuple[str, ...] | None = attrs.field(default=None, init=False)
    _seen_at: float = attrs.field(default=0.0, init=False)
    _held_version: str | None = attrs.field(default=None, init=False)
    _held_sent_at: float = attrs.field(default=0.0, init=False)
    _held_duration: float = attrs.field(default=0.0, init=False)

    def observe(self, item: LockItem | None, now: float) -> None:
        """Record a read of the lock item made at ``now``."""
        if item is None:
            self._seen_version = None
            self._held_version = None
            self.seen_owner = None
            self.seen_duration = None
            self.seen_successors = None
            return
        self.seen_owner = None if item.released else item.owner
        self.seen_duration = item.lease_duration
        self.seen_successors = item.successors
        if item.record_version != self._seen_version:
            self._seen_version = item.record_version
            self._seen_at = now
        if self._held_version is not None and item.record_version != self._held_version:
            self._held_version = None  # someone replaced our version: we lost it

    def is_expired(self, item: LockItem, now: float) -> bool:
        """Released, or the same RVN seen for longer than the lease duration (local clock)."""
        if item.released:
            return True
        if item.record_version != self._seen_version:
            return False  # not observed yet: a full lease duration starts now
        return now - self._seen_at > item.lease_duration

    def decide(self, item: LockItem | None, now: float) -> LockDecision:
        """What to do after observing ``item`` at ``now``."""
        if item is None:
            return LockDecision(LockAction.CREATE)
        if self._held_version is not None and item.record_version == self._held_version:
            return LockDecision(LockAction.HEARTBEAT, item.record_version)
        if item.owner == self.worker_id and not item.released:
            # Ours from an earlier life of this worker id (a restart): nobody else runs it.
            return LockDecision(LockAction.TAKE, item.record_version)
        if self.is_expired(item, now):
            return LockDecision(LockAction.TAKE, item.record_version)
        return LockDecision(LockAction.WAIT)

    def written(self, item: LockItem, sent_at: float) -> None:
        """Our conditional write (create, take or heartbeat) succeeded; it was sent at
        ``sent_at``."""
        self._held_version = item.record_version
        self._held_sent_at = sent_at
        self._held_duration = item.lease_duration
        self._seen_version = item.record_version
        self._seen_at = sent_at
        self.seen_successors = item.successors

    def lost(self) -> None:
        """A write of ours was rejected, or we released the lock."""
        self._held_version = None

    @property
    def held_version(self) -> str | None:
        return self._held_version

    @property
    def held_duration(self) -> float | None:
        """The lease duration of the item we hold (None: we hold none)."""
        return self._held_duration if self._held_version is not None else None

    def is_leader(self, now: float) -> bool:
        """True while our last successful write was sent less than the lease duration ago."""
        return self._held_version is not None and now - self._held_sent_at < self._held_duration
