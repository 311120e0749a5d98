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

Owns: the checks, and the bookkeeping of processor calls and pauses they need; who owned which
lease when (from the table's writes) is ``ownership``'s, read here. Must not: read clocks (times
are passed in) or touch the runtime.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import attrs

from kclasync._core.leases.lease import Lease
from kclasync._simulation.ownership import OwnershipLedger, Tenure

ALLOWED_EPSILON = 1e-6


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
        #: Who owned each lease when (tenures, fresh writes, failovers).
        self.ownership = OwnershipLedger(lease_of)
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
        # A write that left the checkpoint alone (a renewal) keeps the very same value.
        if old is not None and new.checkpoint is not old.checkpoint:
            if new.checkpoint.key() < old.checkpoint.key():
                self.violate(
                    "checkpoint_backwards",
                    now,
                    f"{key}: checkpoint {old.checkpoint} -> {new.checkpoint}",
                )
            if new.checkpoint != old.checkpoint:
                self.checkpoint_writes += 1
        self.ownership.lease_written(
            old, new, op=op, writer=writer, now=now, writer_sent=writer_sent
        )

    def lease_deleted(self, key: str, now: float) -> None:
        self.ownership.lease_deleted(key, now)

    def worker_failed(
        self, worker: str, keys: list[str], now: float, *, leader: bool = False
    ) -> None:
        """A crash or a pause began: each lease it owned should be taken by another worker
        (``leader``: the worker led when it crashed)."""
        self.ownership.worker_failed(worker, keys, now, leader=leader)

    def worker_back(self, worker: str) -> None:
        """A paused worker resumed: leases it still owns need no failover."""
        self.ownership.worker_back(worker)

    def unique_processed(self) -> int:
        return sum(book.processed for book in self._books.values())

    @property
    def failover_times(self) -> list[float]:
        return self.ownership.failover_times

    @property
    def failovers_pending(self) -> int:
        return self.ownership.failovers_pending

    def failover_summary(self) -> tuple[float | None, float | None]:
        return self.ownership.failover_summary()

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
        fresh = self.ownership.fresh(worker, shard)
        call = Call(worker, shard, first, last, now, self.ownership.tenure_of(worker, shard), fresh)
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
        before = self.ownership.tenures[previous]
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


__all__ = ["Call", "InvariantChecker", "Tenure", "Violation"]
