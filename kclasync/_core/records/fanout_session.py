"""What an enhanced fan-out reader does when a SubscribeToShard subscription ends.

Owns: the resubscription decision. Given where the reader got to (the last continuation sequence
number and the last record handed on), how the subscription ended (the service closed it, the
reader refreshed it before the five-minute limit, ResourceInUse, throttling, a dropped
connection, the shard ended, the shard or the consumer is gone), how old it was and how many
events it delivered, decide: subscribe again now or after a pause (``retry_policy.Backoff``
with half jitter drawn from an injected ``random.Random``) and from where, or hand the matter
back to the caller. Also when to refresh a subscription before the service ends it.
Must not: do I/O, read clocks (ages and times are passed in), use global randomness, or know
about asyncio.
"""

from __future__ import annotations

import enum
import random

import attrs

from kclasync._core.retry_policy import Backoff, Jitter


class Ending(enum.Enum):
    """How one subscription ended."""

    COMPLETED = "completed"  # the service closed the event stream cleanly (its 5-minute lifetime)
    REFRESHED = "refreshed"  # the reader closed it itself, before the lifetime ran out
    IN_USE = "in_use"  # ResourceInUse: another subscription of this consumer to the shard
    THROTTLED = "throttled"  # LimitExceeded and other throttling
    DROPPED = "dropped"  # connection dropped or timed out, damaged frame, 5xx, exception event
    SHARD_ENDED = "shard_ended"  # the last event had no continuation (ChildShards follow)
    SHARD_GONE = "shard_gone"  # ResourceNotFound for the shard or the stream
    CONSUMER_GONE = "consumer_gone"  # the stream consumer was deregistered


class Action(enum.Enum):
    RESUBSCRIBE = "resubscribe"
    GIVE_UP = "give_up"  # back to the caller: shard end, shard gone, consumer gone, too many


@attrs.frozen
class ResubscribePolicy:
    """Timings of resubscription, in seconds.

    ``refresh_after``: a subscription older than this is closed and renewed by the reader (the
    service ends each one after 300 s). ``quick_end``: a subscription that ends cleanly this
    young without delivering an event counts as a failure (so a server that keeps closing at
    once is not called in a tight loop). ``max_failures``: consecutive failed subscriptions
    before giving up (None: never).
    """

    base_backoff: float = 0.2
    max_backoff: float = 5.0
    in_use_backoff: float = 1.0
    refresh_after: float = 285.0
    quick_end: float = 1.0
    max_failures: int | None = None
    #: The service's limits per consumer and shard: a SubscribeToShard within
    #: ``success_interval`` of the last one it accepted is refused (ResourceInUse), and more
    #: than one call per ``call_interval`` is throttled (LimitExceeded). A resubscription waits
    #: for both, counted from the start of the subscription that ended.
    success_interval: float = 5.0
    call_interval: float = 1.0

    def __attrs_post_init__(self) -> None:
        if not 0 < self.base_backoff <= self.max_backoff:
            raise ValueError("need 0 < base_backoff <= max_backoff")
        if self.in_use_backoff < 0 or self.quick_end < 0:
            raise ValueError("in_use_backoff and quick_end cannot be negative")
        if not 0 < self.refresh_after < 300:
            raise ValueError("refresh_after must be within the service's 300 s lifetime")
        if self.max_failures is not None and self.max_failures < 1:
            raise ValueError("max_failures must be at least 1")


@attrs.frozen
class Progress:
    """Where a fan-out reader of one shard got to, across its subscriptions.

    ``continuation``: the continuation sequence number of the last event handed on;
    ``last_delivered``: the sequence number of the last record handed on; ``failures``: failed
    subscriptions in a row (reset by any subscription that delivered an event).
    """

    continuation: str | None = None
    last_delivered: str | None = None
    failures: int = 0

    def after_event(self, continuation: str | None, last_record: str | None) -> Progress:
        """The progress once an event (its continuation, its last record) was handed on."""
        return Progress(
            continuation=continuation if continuation is not None else self.continuation,
            last_delivered=last_record if last_record is not None else self.last_delivered,
            failures=0,
        )


@attrs.frozen
class Decision:
    """``resume_after``: subscribe AFTER_SEQUENCE_NUMBER this; None: from the original start."""

    action: Action
    reason: str
    delay: float = 0.0
    resume_after: str | None = None
    progress: Progress = Progress()


def resume_point(progress: Progress) -> str | None:
    """The sequence number a new subscription starts after: the later of the last continuation
    and the last record handed on (a continuation is never behind its own event's records, but
    a record handed on is never re-read even if an event came without one)."""
    points = [p for p in (progress.continuation, progress.last_delivered) if p is not None]
    return max(points, key=int) if points else None


def should_refresh(age: float, policy: ResubscribePolicy) -> bool:
    """Whether a subscription ``age`` seconds old should be renewed now."""
    return age >= policy.refresh_after


def backoff(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """The pause before attempt ``failures`` + 1: exponential from ``base``, at most ``cap``,
    scaled by a random factor in [0.5, 1) (so readers of many shards spread out)."""
    return Backoff(base, cap, Jitter.HALF).delay(failures, rng.random())


_GIVE_UP = {
    Ending.SHARD_ENDED: "the shard ended",
    Ending.SHARD_GONE: "the shard or its stream no longer exists",
    Ending.CONSUMER_GONE: "the stream consumer no longer exists",
}


def decide(
    progress: Progress,
    ending: Ending,
    *,
    age: float,
    events: int,
    policy: ResubscribePolicy,
    rng: random.Random,
    since_accepted: float | None = None,
) -> Decision:
    """What to do after a subscription ``age`` seconds old that delivered ``events`` events
    ended as ``ending``. ``progress`` already includes every event handed on.
    ``since_accepted``: seconds since the start of the last call the service may have accepted
    (its event stream began, or the connection dropped after the request was sent; None:
    none). The next call waits until ``call_interval`` after this one and ``success_interval``
    after that one."""
    decision = _decide(progress, ending, age=age, events=events, policy=policy, rng=rng)
    if decision.action is not Action.RESUBSCRIBE:
        return decision
    floor = policy.call_interval - age
    if since_accepted is not None:
        floor = max(floor, policy.success_interval - since_accepted)
    if decision.delay >= floor:
        return decision
    return attrs.evolve(decision, delay=floor)


def _decide(
    progress: Progress,
    ending: Ending,
    *,
    age: float,
    events: int,
    policy: ResubscribePolicy,
    rng: random.Random,
) -> Decision:
    if ending in _GIVE_UP:
        return Decision(Action.GIVE_UP, _GIVE_UP[ending], progress=progress)
    resume = resume_point(progress)
    clean = ending in (Ending.COMPLETED, Ending.REFRESHED)
    if clean and (events > 0 or age >= policy.quick_end):
        fresh = attrs.evolve(progress, failures=0)
        return Decision(Action.RESUBSCRIBE, ending.value, 0.0, resume, fresh)
    failures = (0 if events > 0 else progress.failures) + 1
    counted = attrs.evolve(progress, failures=failures)
    if policy.max_failures is not None and failures >= policy.max_failures:
        reason = f"{failures} failed subscriptions in a row (last: {ending.value})"
        return Decision(Action.GIVE_UP, reason, progress=counted)
    base = policy.base_backoff
    if ending is Ending.IN_USE:
        base = max(base, policy.in_use_backoff)
    delay = backoff(failures, base, max(base, policy.max_backoff), rng)
    reason = "ended at once" if clean else ending.value
    return Decision(Action.RESUBSCRIBE, reason, delay, resume, counted)
