"""How an I/O call that was throttled or failed transiently is retried: the policy table.

Owns: the one backoff formula of the package (``Backoff``: after failed attempt n, the
ceiling ``min(cap, base * 2**(n-1))``, spread by a ``Jitter``), used by every retry loop (the
adapter wrapper, the shard reader, the processor and child-lease retries, the start-up steps,
fan-out resubscription, and the Spark package's puts and progress pruning); the operation
classes (``OpClass``), which adapter method belongs to which (``OP_CLASS``), the budget of each
class (``policy_table``), and the two decisions of the adapter wrapper's retry loop: how long to
wait before the next attempt (full jitter, ``next_delay``) and whether to give up
(``give_up``); and the few retries of a worker's start-up steps (``START_ATTEMPTS``,
``start_delay``).
Must not: sleep, read a clock or draw random numbers itself: the caller passes the attempt
number, the elapsed time and a uniform draw in [0, 1) from its own injected ``random.Random``.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping

import attrs


class OpClass(enum.Enum):
    """Calls that share a retry budget."""

    #: Lease renewals and the worker heartbeat: must finish well inside the renewal period,
    #: or the next renewal round is late and the lease ages towards expiry.
    RENEW = "renew"
    #: Full scans of the lease table / worker registry (the taker's and the leader's). The
    #: next round scans again anyway, so a scan backs off little: a long backoff here would
    #: delay failover (the taker finds expired leases only by scanning).
    SCAN = "scan"
    #: Strong single-item reads (``get_lease``: a renewal or checkpoint being reconciled, a
    #: child waiting for its parents).
    READ = "read"
    #: Conditional lease writes (take, handoff, release, create, delete, childShardIds).
    #: Retrying is safe: each is fenced by a condition, so a write that was applied before
    #: its error makes the retry fail the condition, which the caller reconciles.
    WRITE = "write"
    #: The taker's writes (take_lease, start_handoff): each failed one waits a whole taker
    #: round, so they get more attempts with short waits (failover time under throttling).
    TAKE = "take"
    #: Checkpoints: the one write a processor waits for (it may retry a failed one itself).
    CHECKPOINT = "checkpoint"
    #: The leader lock's reads and writes: bounded by the heartbeat interval.
    LOCK = "lock"
    #: Stream metadata (DescribeStreamSummary, ListShards).
    STREAM_META = "stream_meta"
    #: GetShardIterator / GetRecords: ``ShardCursor`` retries these itself, forever or up to
    #: its ``attempts``, so the wrapper makes one attempt.
    READ_RECORDS = "read_records"
    #: Table creation at start-up: the worker's start-up step retries it.
    SETUP = "setup"


class Jitter(enum.Enum):
    """How a backoff's ceiling is spread by the caller's uniform draw in [0, 1)."""

    #: The ceiling itself: loops of one caller with nothing to spread out.
    NONE = "none"
    #: Uniform in [0, ceiling): many callers retrying the same service (the adapter wrapper).
    FULL = "full"
    #: Uniform in [ceiling/2, ceiling): spread out, but never shorter than half the ceiling
    #: (fan-out resubscription, the Spark puts).
    HALF = "half"


#: Doublings after which the ceiling stops growing (2**60 times ``base``): no overflow however
#: long a loop retries.
_MAX_DOUBLINGS = 60


@attrs.frozen
class Backoff:
    """Bounded exponential backoff: the ceiling after failed attempt ``n`` (from 1) is
    ``min(cap, base * 2**(n-1))``, spread by ``jitter``. ``cap`` may be ``math.inf``
    (a loop bounded by its attempts instead). A ``base`` above ``cap`` waits ``cap`` from the
    first attempt on."""

    base: float
    cap: float = math.inf
    jitter: Jitter = Jitter.NONE

    def __attrs_post_init__(self) -> None:
        if self.base < 0 or self.cap < 0:
            raise ValueError("backoff base and cap cannot be negative")

    def ceiling(self, attempt: int) -> float:
        """The longest wait after failed attempt ``attempt`` (1-based; below 1 counts as 1)."""
        doublings = min(max(attempt - 1, 0), _MAX_DOUBLINGS)
        return min(self.cap, self.base * 2.0**doublings)

    def delay(self, attempt: int, draw: float = 0.0) -> float:
        """The wait after failed attempt ``attempt``; ``draw`` is uniform in [0, 1) (unused
        without jitter)."""
        ceiling = self.ceiling(attempt)
        if self.jitter is Jitter.FULL:
            return draw * ceiling
        if self.jitter is Jitter.HALF:
            return ceiling * (0.5 + 0.5 * draw)
        return ceiling


@attrs.frozen
class RetryPolicy:
    """At most ``attempts`` calls; the wait before attempt n+1 is uniform in
    [0, min(cap, base * 2**(n-1))] (full jitter); no wait that would end after ``budget``
    seconds from the first attempt is started."""

    attempts: int
    base: float
    cap: float
    budget: float

    def __attrs_post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("attempts must be at least 1")
        if self.base <= 0 or self.cap < self.base or self.budget < 0:
            raise ValueError("need 0 < base <= cap and budget >= 0")

    @property
    def backoff(self) -> Backoff:
        return Backoff(self.base, self.cap, Jitter.FULL)


#: Attempts of a start-up step (creating a table, the first shard sync) that keeps failing with
#: a throttling or transient error, before the worker's ``run()`` fails with it.
START_ATTEMPTS = 5


def start_delay(attempt: int, *, first: float, cap: float) -> float:
    """The wait after failed start-up attempt ``attempt`` (from 1): ``first``, doubled with
    each further attempt, at most ``cap``. No jitter: a worker starts once, and its steps are
    few and mostly its own tables."""
    return Backoff(first, cap).delay(attempt)


def next_delay(policy: RetryPolicy, attempt: int, draw: float) -> float:
    """The wait after failed attempt ``attempt`` (1-based); ``draw`` is uniform in [0, 1)."""
    return policy.backoff.delay(attempt, draw)


def give_up(policy: RetryPolicy, attempt: int, elapsed: float, delay: float) -> bool:
    """True when failed attempt ``attempt`` is the last: attempts used up, or waiting
    ``delay`` more seconds would go past the budget (``elapsed`` since the first attempt)."""
    return attempt >= policy.attempts or elapsed + delay > policy.budget


def policy_table(
    *,
    failover_time: float,
    renewer_interval: float,
    throttle_backoff: float,
    max_backoff: float,
    leader_heartbeat_interval: float,
) -> Mapping[OpClass, RetryPolicy]:
    """The budgets of a worker with this configuration.

    Renewals, checkpoints, single-item reads and lease writes can run while a lease's lock is
    held (a checkpoint, the re-read that reconciles a refused write, a forced handoff), which
    blocks that lease's renewals: so each is done, or given up, within half a renewal period
    (takes, run mostly by the taker, within three quarters), and a lease is still renewed at
    least once per failover time under throttling. Scans back
    off least (a quarter of a write's waits): the taker finds expired leases only by scanning,
    so a long wait there is failover time lost, and the next round scans again anyway.
    """
    half_period = renewer_interval / 2
    renew_cap = max(renewer_interval / 8, 0.001)
    write_cap = max(renewer_interval / 4, 0.001)
    renew = RetryPolicy(
        attempts=4, base=min(throttle_backoff, renew_cap) / 2, cap=renew_cap, budget=half_period
    )
    write_base = min(throttle_backoff, write_cap) / 2
    lock_cap = max(leader_heartbeat_interval / 4, 0.001)
    return {
        OpClass.RENEW: renew,
        OpClass.READ: renew,
        OpClass.SCAN: RetryPolicy(
            attempts=4, base=write_base / 4, cap=write_cap / 4, budget=half_period
        ),
        OpClass.WRITE: RetryPolicy(attempts=4, base=write_base, cap=write_cap, budget=half_period),
        OpClass.TAKE: RetryPolicy(
            attempts=6,
            base=write_base / 2,
            cap=write_cap / 2,
            budget=min(failover_time / 4, renewer_interval * 3 / 4),
        ),
        OpClass.CHECKPOINT: RetryPolicy(
            attempts=5, base=write_base, cap=write_cap, budget=half_period
        ),
        OpClass.LOCK: RetryPolicy(
            attempts=3,
            base=min(throttle_backoff, lock_cap) / 2,
            cap=lock_cap,
            budget=leader_heartbeat_interval / 2,
        ),
        OpClass.STREAM_META: RetryPolicy(
            attempts=5, base=throttle_backoff, cap=max_backoff, budget=2 * failover_time
        ),
        OpClass.READ_RECORDS: RetryPolicy(
            attempts=1, base=throttle_backoff, cap=max_backoff, budget=0.0
        ),
        OpClass.SETUP: RetryPolicy(attempts=1, base=throttle_backoff, cap=max_backoff, budget=0.0),
    }


#: The class of every adapter method (lease store, coordinator state, stream client, worker
#: registry). A method missing here is a bug the wrapper refuses at construction.
OP_CLASS: Mapping[str, OpClass] = {
    # LeaseStore
    "ensure_table": OpClass.SETUP,
    "is_empty": OpClass.SCAN,
    "list_leases": OpClass.SCAN,
    "get_lease": OpClass.READ,
    "create_lease": OpClass.WRITE,
    "renew_lease": OpClass.RENEW,
    "take_lease": OpClass.TAKE,
    "release_lease": OpClass.WRITE,
    "checkpoint": OpClass.CHECKPOINT,
    "start_handoff": OpClass.TAKE,
    "finish_handoff": OpClass.WRITE,
    "lease_keys_of": OpClass.SCAN,
    "delete_lease": OpClass.WRITE,
    "update_child_shard_ids": OpClass.WRITE,
    # CoordinatorStateStore
    "get_lock": OpClass.LOCK,
    "create_lock": OpClass.LOCK,
    "replace_lock": OpClass.LOCK,
    "release_lock": OpClass.LOCK,
    "get_migration_state": OpClass.LOCK,
    # StreamClient
    "describe_stream": OpClass.STREAM_META,
    "list_shards": OpClass.STREAM_META,
    "get_shard_iterator": OpClass.READ_RECORDS,
    "get_records": OpClass.READ_RECORDS,
    # WorkerRegistry
    "report": OpClass.RENEW,
    "list_workers": OpClass.SCAN,
    "get": OpClass.READ,
    "remove": OpClass.WRITE,
}


__all__ = [
    "OP_CLASS",
    "START_ATTEMPTS",
    "Backoff",
    "Jitter",
    "OpClass",
    "RetryPolicy",
    "give_up",
    "next_delay",
    "policy_table",
    "start_delay",
]
