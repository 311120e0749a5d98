"""The promises a simulated fleet must keep, checked while it runs.

The harness tells the checker three kinds of facts, each at the virtual time it happens:

* every write the lease table applies (``lease_written``): who owns each lease from when, how an
  ownership ended (taken by another worker, released, handed off), and each worker's last
  *fresh* write per lease: the send time of its last renew, take or checkpoint that the table
  applied. That send time is what the worker's own rule of expiry counts from.
* every processor call (``call_started`` / ``call_ended``): worker, shard, the records' positions
  in the shard, virtual start and end, whether it completed or was cancelled;
* pauses of a worker (``paused`` / ``resumed``).

Checked invariants (each violation is recorded with its kind, time and a description):

``stale_batch``
    A worker started a processor call on a shard more than ``failover_time`` after its last fresh
    write on that lease. The runtime must stop treating such a lease as held (the KCL's rule),
    so it may not start a batch on it.
``overlap``
    Two workers' processor calls on the same shard overlap in virtual time, and the overlap is not
    in the allowed window. The allowed window is the KCL's: when a lease moves *without* its owner
    giving it up (the owner crashed, stalled, or the lease was stolen), the old owner may still be
    inside a batch until it notices the loss. Precisely, for the call ``c`` of the old owner ``w``
    (whose ownership started before the other worker's):

    1. ``w`` had not released or handed off the lease before ``c`` ended (planned moves never
       overlap);
    2. ``c`` started at most ``failover_time`` after ``w``'s last fresh write (``stale_batch``);
    3. ``c`` ended at most ``failover_time + notice_slack`` after ``w``'s last fresh write on the
       lease, where ``notice_slack`` is one renewer period plus three times the longest injected
       lease-table latency (the renewer's next attempt, its reply and the re-read). A call that
       was frozen by a pause of ``w`` is exempt from this bound: the stalled code runs on when
       the stall ends, before the runtime can notice anything (that is what a GC pause does).
``duplicate_after_planned_move``
    A record processed again by the next owner after its previous owner released the lease (a
    graceful stop): planned moves must hand over at the checkpoint.
``duplicate_within_tenure``
    The same ownership of a lease processed a record twice.
``batch_not_contiguous``
    A batch's records are not consecutive in their shard.
``child_before_parent``
    A record of a child shard was processed before every parent shard's records were processed
    and its lease checkpointed at SHARD_END (or deleted).
``checkpoint_backwards``
    The table accepted a checkpoint that moves a lease's checkpoint backwards.
``lost_records``
    At the end, after the drain, a record was never processed by a completed call.
``not_balanced``
    After the faults stopped, the leases never reached balance (every unfinished lease held by a
    live worker, and counts differing by at most one) before the end.

Owns: the bookkeeping and the checks. Must not: read clocks (times are passed in) or touch the
runtime.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable

import attrs

from kclasync._core.lease import Lease

ALLOWED_EPSILON = 1e-6


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


@attrs.define(eq=False)
class Call:
    worker: str
    shard: str
    first: int
    last: int
    start: float
    tenure: Tenure | None
    fresh_at_start: float | None
    end: float | None = None
    completed: bool = False


@attrs.frozen
class Violation:
    kind: str
    time: float
    detail: str


@attrs.define
class _ShardBook:
    #: Per record position: ident of the tenure that last completed processing it (-1: never).
    done_by: list[int] = attrs.field(factory=list)
    processed: int = 0
    active: list[Call] = attrs.field(factory=list)


class InvariantChecker:
    def __init__(
        self,
        *,
        failover_time: float,
        notice_slack: float,
        record_count: Callable[[str], int],
        record_index: Callable[[str, str], int],
        parents_of: Callable[[str], tuple[str, ...]],
        shard_closed: Callable[[str], bool],
        lease_of: Callable[[str], Lease | None],
    ) -> None:
        self.failover_time = failover_time
        self.notice_slack = notice_slack
        self._record_count = record_count
        self._record_index = record_index
        self._parents_of = parents_of
        self._shard_closed = shard_closed
        self._lease_of = lease_of
        self.violations: list[Violation] = []
        self.tenures: list[Tenure] = []
        self._current: dict[str, Tenure] = {}
        self._worker_tenure: dict[tuple[str, str], Tenure] = {}
        self._fresh: dict[tuple[str, str], float] = {}
        self._books: dict[str, _ShardBook] = {}
        self._pairs: list[tuple[Call, Call]] = []
        self._pauses: dict[str, list[list[float]]] = {}
        self.calls = 0
        self.interrupted_calls = 0
        self.records_processed = 0
        self.duplicates = 0
        self.duplicate_kinds: Counter[str] = Counter()
        self.overlaps_allowed = 0
        self.checkpoint_writes = 0
        #: Failovers: lease key -> (fault time, worker) awaiting a take by another worker.
        self._awaiting_failover: dict[str, tuple[float, str]] = {}
        self.failover_times: list[float] = []

    # -- facts -----------------------------------------------------------------------------

    def violate(self, kind: str, time: float, detail: str) -> None:
        self.violations.append(Violation(kind, time, detail))

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
        """Called at the instant the table applies a write: ``op`` is the store method,
        ``writer`` the worker that made it, ``writer_sent`` when it sent the write."""
        key = new.key
        if old is not None and new.checkpoint.key() < old.checkpoint.key():
            self.violate(
                "checkpoint_backwards",
                now,
                f"{key}: checkpoint {old.checkpoint} -> {new.checkpoint}",
            )
        if old is not None and new.checkpoint != old.checkpoint:
            self.checkpoint_writes += 1
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
            del self._awaiting_failover[key]
        return tenure

    def lease_deleted(self, key: str, now: float) -> None:
        current = self._current.pop(key, None)
        if current is not None:
            current.end = now
            current.end_kind = "released"
        self._awaiting_failover.pop(key, None)

    def worker_failed(self, worker: str, keys: list[str], now: float) -> None:
        """A crash or a pause began: each lease it owned should be taken by another worker."""
        for key in keys:
            self._awaiting_failover.setdefault(key, (now, worker))

    def worker_back(self, worker: str) -> None:
        """A paused worker resumed: leases it still owns need no failover."""
        for key, (_, who) in list(self._awaiting_failover.items()):
            if who == worker:
                lease = self._lease_of(key)
                if lease is not None and lease.owner == worker:
                    del self._awaiting_failover[key]

    def unique_processed(self) -> int:
        return sum(book.processed for book in self._books.values())

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

    def paused(self, worker: str, now: float) -> None:
        self._pauses.setdefault(worker, []).append([now, float("inf")])

    def resumed(self, worker: str, now: float) -> None:
        spans = self._pauses.get(worker)
        if spans and spans[-1][1] == float("inf"):
            spans[-1][1] = now

    def _book(self, shard: str) -> _ShardBook:
        book = self._books.get(shard)
        if book is None:
            book = self._books[shard] = _ShardBook()
        return book

    def call_started(
        self,
        worker: str,
        shard: str,
        first_sequence: str,
        last_sequence: str,
        count: int,
        now: float,
    ) -> Call:
        self.calls += 1
        first = self._record_index(shard, first_sequence)
        last = self._record_index(shard, last_sequence)
        if last - first + 1 != count:
            self.violate(
                "batch_not_contiguous",
                now,
                f"{worker} on {shard}: {count} records span positions {first}..{last}",
            )
        fresh = self._fresh.get((worker, shard))
        call = Call(
            worker, shard, first, last, now, self._worker_tenure.get((worker, shard)), fresh
        )
        if fresh is None or now - fresh > self.failover_time + ALLOWED_EPSILON:
            age = "never written" if fresh is None else f"{now - fresh:.3f}s since"
            self.violate(
                "stale_batch",
                now,
                f"{worker} started a batch on {shard} ({age} its last fresh lease write; "
                f"failover {self.failover_time}s)",
            )
        self._check_parents(call)
        book = self._book(shard)
        for other in book.active:
            if other.worker != worker:
                self._pairs.append((other, call))
        book.active.append(call)
        return call

    def call_ended(self, call: Call, now: float, *, completed: bool) -> None:
        call.end = now
        call.completed = completed
        book = self._book(call.shard)
        book.active.remove(call)
        if not completed:
            self.interrupted_calls += 1
            return
        ident = call.tenure.ident if call.tenure is not None else -1
        done = book.done_by
        if len(done) <= call.last:
            done.extend([-1] * (call.last + 1 - len(done)))
        for position in range(call.first, call.last + 1):
            previous = done[position]
            if previous == -1:
                book.processed += 1
            else:
                self.duplicates += 1
                self._classify_duplicate(call, previous, now)
            done[position] = ident
        self.records_processed += call.last - call.first + 1

    def _classify_duplicate(self, call: Call, previous: int, now: float) -> None:
        if previous < 0 or call.tenure is None:
            self.duplicate_kinds["unattributed"] += 1
            return
        before = self.tenures[previous]
        if before is call.tenure:
            self.duplicate_kinds["within_tenure"] += 1
            self.violate(
                "duplicate_within_tenure",
                now,
                f"{call.worker} processed a record of {call.shard} twice in one ownership",
            )
        elif before.planned_end and before.successor is call.tenure:
            self.duplicate_kinds["after_planned_move"] += 1
            self.violate(
                "duplicate_after_planned_move",
                now,
                f"{call.worker} re-processed records of {call.shard} that {before.worker} "
                f"processed before it {before.end_kind} the lease",
            )
        else:
            self.duplicate_kinds["after_unplanned_move"] += 1

    def _check_parents(self, call: Call) -> None:
        for parent in self._parents_of(call.shard):
            lease = self._lease_of(parent)
            finished_lease = lease is None or lease.is_finished
            book = self._books.get(parent)
            processed = book.processed if book is not None else 0
            try:
                total = self._record_count(parent)
            except LookupError:
                total = processed
            closed = self._shard_closed(parent)
            if not (finished_lease and closed and processed >= total):
                self.violate(
                    "child_before_parent",
                    call.start,
                    f"{call.worker} processed {call.shard} while parent {parent} had "
                    f"{processed}/{total} records processed, lease "
                    f"{lease.checkpoint if lease is not None else 'deleted'}",
                )

    # -- end of run ------------------------------------------------------------------------

    def _paused_during(self, worker: str, start: float, end: float) -> bool:
        return any(s <= end and start <= e for s, e in self._pauses.get(worker, ()))

    def _judge_pair(self, a: Call, b: Call, end_of_run: float) -> None:
        # The old owner is the one whose ownership began first.
        ta = a.tenure.start if a.tenure is not None else float("-inf")
        tb = b.tenure.start if b.tenure is not None else float("-inf")
        old, new = (a, b) if ta <= tb else (b, a)
        old_end = old.end if old.end is not None else end_of_run
        new_end = new.end if new.end is not None else end_of_run
        if min(old_end, new_end) <= max(old.start, new.start):
            return  # touching, not overlapping
        where = f"{old.worker} and {new.worker} on {old.shard}"
        tenure = old.tenure
        if (
            tenure is not None
            and tenure.planned_end
            and tenure.end is not None
            and tenure.end < old_end
        ):
            self.violate(
                "overlap",
                new.start,
                f"{where}: the old owner was still processing after it "
                f"{tenure.end_kind} the lease (a planned move)",
            )
            return
        if old.fresh_at_start is None or (
            old.start - old.fresh_at_start > self.failover_time + ALLOWED_EPSILON
        ):
            return  # already reported as stale_batch
        fresh = tenure.last_fresh if tenure is not None else None
        limit = max(fresh or old.start, old.fresh_at_start) + self.failover_time
        limit += self.notice_slack
        if old_end > limit + ALLOWED_EPSILON and not self._paused_during(
            old.worker, old.start, old_end
        ):
            self.violate(
                "overlap",
                new.start,
                f"{where}: the old owner's batch ran until {old_end:.3f}, past "
                f"{limit:.3f} (last fresh write + failover + notice slack)",
            )
            return
        self.overlaps_allowed += 1

    def finish(
        self,
        *,
        now: float,
        shards: list[str],
    ) -> None:
        """Judge overlaps and check that every record was processed."""
        for a, b in self._pairs:
            self._judge_pair(a, b, now)
        self._pairs.clear()
        lost = 0
        example = ""
        for shard in shards:
            total = self._record_count(shard)
            book = self._books.get(shard)
            processed = book.processed if book is not None else 0
            if processed < total:
                lost += total - processed
                example = example or f"{shard}: {processed}/{total}"
        if lost:
            self.violate("lost_records", now, f"{lost} records never processed (e.g. {example})")

    def failover_summary(self) -> tuple[float | None, float | None]:
        if not self.failover_times:
            return None, None
        return statistics.median(self.failover_times), max(self.failover_times)


__all__ = ["Call", "InvariantChecker", "Tenure", "Violation"]
