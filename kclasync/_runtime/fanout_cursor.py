"""Reading one shard with enhanced fan-out: subscriptions one after the other, as one event flow.

Owns: opening SubscribeToShard subscriptions from a starting position, renewing them before the
service's five-minute limit, and acting on ``_core.records.fanout_session.decide`` when one ends
(resubscribe now or after a pause, from the continuation; or stop and raise), so that the caller
sees one ordered flow of events, nothing lost and nothing twice. Events are read only when the
caller asks for the next one (backpressure reaches the connection).
Must not: decide anything itself (the pure decision does), or read any clock but the event
loop's.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator, Awaitable, Callable

from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.fanout_errors import ConsumerNotFoundError, SubscriptionInUseError
from kclasync._adapters.fanout_subscription import SubscriptionEvent
from kclasync._adapters.protocols import (
    IteratorType,
    ShardNotFoundError,
    StartingPosition,
)
from kclasync._core.records.fanout_session import (
    Action,
    Ending,
    Progress,
    ResubscribePolicy,
    decide,
    resume_point,
    should_refresh,
)
from kclasync.errors import AdapterError, ThrottledError, TransientError

log = logging.getLogger("kclasync.fanout")


def _ending(exc: AdapterError) -> Ending:
    if isinstance(exc, SubscriptionInUseError):
        return Ending.IN_USE
    if isinstance(exc, ThrottledError):
        return Ending.THROTTLED
    if isinstance(exc, ShardNotFoundError):
        return Ending.SHARD_GONE
    if isinstance(exc, ConsumerNotFoundError):
        return Ending.CONSUMER_GONE
    return Ending.DROPPED


class FanOutCursor:
    """The subscriptions of one reader to one shard.

    ``reregister``: called when the stream consumer is gone; returns the ARN of a consumer
    registered again (None: give up with ``ConsumerNotFoundError``). The ``on_*`` callbacks
    count subscriptions, resubscriptions (with the reason) and throttling, for metrics.
    """

    def __init__(
        self,
        fanout: FanOutClient,
        consumer_arn: str,
        stream: str,
        shard_id: str,
        start: StartingPosition,
        *,
        policy: ResubscribePolicy | None = None,
        rng: random.Random | None = None,
        reregister: Callable[[], Awaitable[str]] | None = None,
        on_subscribe: Callable[[], None] | None = None,
        on_resubscribe: Callable[[str], None] | None = None,
        on_throttle: Callable[[], None] | None = None,
    ) -> None:
        self.fanout = fanout
        self.consumer_arn = consumer_arn
        self.stream = stream
        self.shard_id = shard_id
        self.start = start
        self.policy = policy or ResubscribePolicy()
        self.rng = rng or random.Random()
        self.reregister = reregister
        self.on_subscribe = on_subscribe
        self.on_resubscribe = on_resubscribe
        self.on_throttle = on_throttle
        self.progress = Progress()
        self.subscriptions = 0

    def _position(self, resume_after: str | None) -> StartingPosition:
        if resume_after is None:
            return self.start
        return StartingPosition(IteratorType.AFTER_SEQUENCE_NUMBER, resume_after)

    async def events(self) -> AsyncGenerator[SubscriptionEvent, None]:
        """Every event of the shard from ``start``, across subscriptions. The last one yielded
        has ``shard_ended`` set when the shard ends. Raises ``ShardNotFoundError``,
        ``ConsumerNotFoundError``, or the last error once the policy gives up."""
        loop = asyncio.get_running_loop()
        resume_after: str | None = None
        accepted_at: float | None = None
        while True:
            sub = self.fanout.subscribe(
                self.consumer_arn, self.stream, self.shard_id, self._position(resume_after)
            )
            self.subscriptions += 1
            if self.on_subscribe is not None:
                self.on_subscribe()
            began = loop.time()
            error: AdapterError | None = None
            ending = Ending.COMPLETED
            established = False
            try:
                await sub.open()
                established = True
                async for event in sub:
                    yield event
                    last = event.records[-1].sequence_number if event.records else None
                    self.progress = self.progress.after_event(event.continuation_sequence, last)
                    if event.shard_ended:
                        return
                    if should_refresh(loop.time() - began, self.policy):
                        ending = Ending.REFRESHED
                        break
            except AdapterError as exc:
                error, ending = exc, _ending(exc)
            finally:
                await sub.close()
            if ending is Ending.THROTTLED and self.on_throttle is not None:
                self.on_throttle()
            refused = ending is Ending.IN_USE and sub.events_received == 0
            if (established and not refused) or ending is Ending.DROPPED:
                accepted_at = began  # the service may count this call as accepted
            decision = decide(
                self.progress,
                ending,
                age=loop.time() - began,
                events=sub.events_received,
                policy=self.policy,
                rng=self.rng,
                since_accepted=None if accepted_at is None else loop.time() - accepted_at,
            )
            self.progress = decision.progress
            if decision.action is Action.GIVE_UP:
                if ending is Ending.CONSUMER_GONE and self.reregister is not None:
                    log.warning("stream consumer of %s is gone; registering it again", self.stream)
                    self.consumer_arn = await self.reregister()
                    resume_after = resume_point(self.progress)
                    continue
                if error is None:
                    raise TransientError(
                        f"subscriptions to {self.stream}/{self.shard_id}: {decision.reason}"
                    )
                raise error
            if error is not None:
                log.info(
                    "subscription to %s ended (%s); subscribing again in %.2fs",
                    self.shard_id,
                    error,
                    decision.delay,
                )
            if self.on_resubscribe is not None:
                self.on_resubscribe(decision.reason)
            resume_after = decision.resume_after
            if decision.delay > 0:
                await asyncio.sleep(decision.delay)
