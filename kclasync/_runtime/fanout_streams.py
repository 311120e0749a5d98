"""The stream consumers (fan-out registrations) of one worker: one per stream it reads.

Owns: registering or reusing the stream consumer of each stream on first use (once, even when
many shards ask at the same time; transient failures retried with backoff), registering it again
when it disappears, handing out ``FanOutCursor`` objects for shards, and deregistering the
consumers on stop when configured to.
Must not: decide when to resubscribe (``_core.records.fanout_session``), or read any clock but
the event loop's.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable

from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.protocols import StartingPosition
from kclasync._core.records.fanout_session import ResubscribePolicy, backoff
from kclasync._runtime.fanout_cursor import FanOutCursor
from kclasync.errors import ThrottledError, TransientError

log = logging.getLogger("kclasync.fanout")


class FanOutConsumers:
    """``name`` is the stream consumer's name (the same on every worker of an application, so
    they share one registration per stream)."""

    def __init__(
        self,
        client: FanOutClient,
        name: str,
        *,
        policy: ResubscribePolicy | None = None,
        rng: random.Random | None = None,
        activation_timeout: float = 60.0,
        poll_interval: float = 0.5,
        deregister_on_stop: bool = False,
    ) -> None:
        self.client = client
        self.name = name
        self.policy = policy or ResubscribePolicy()
        self.rng = rng or random.Random()
        self.activation_timeout = activation_timeout
        self.poll_interval = poll_interval
        self.deregister_on_stop = deregister_on_stop
        self._arns: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def consumer_arn(self, stream: str, *, renew: bool = False) -> str:
        """The ARN of this application's consumer of ``stream`` (registered if need be)."""
        lock = self._locks.setdefault(stream, asyncio.Lock())
        async with lock:
            if renew:
                self._arns.pop(stream, None)
            if stream not in self._arns:
                self._arns[stream] = await self._ensure(stream)
            return self._arns[stream]

    async def _ensure(self, stream: str) -> str:
        failures = 0
        while True:
            try:
                consumer = await self.client.ensure_consumer(
                    stream,
                    self.name,
                    timeout=self.activation_timeout,
                    poll_interval=self.poll_interval,
                )
                return consumer.arn
            except (ThrottledError, TransientError) as exc:
                failures += 1
                delay = backoff(
                    failures, self.policy.base_backoff, self.policy.max_backoff, self.rng
                )
                log.info("consumer %s of %s: %s; again in %.2fs", self.name, stream, exc, delay)
                await asyncio.sleep(delay)

    async def cursor(
        self,
        stream: str,
        shard_id: str,
        start: StartingPosition,
        *,
        on_subscribe: Callable[[], None] | None = None,
        on_resubscribe: Callable[[str], None] | None = None,
        on_throttle: Callable[[], None] | None = None,
    ) -> FanOutCursor:
        arn = await self.consumer_arn(stream)

        async def reregister() -> str:
            return await self.consumer_arn(stream, renew=True)

        return FanOutCursor(
            self.client,
            arn,
            stream,
            shard_id,
            start,
            policy=self.policy,
            rng=self.rng,
            reregister=reregister,
            on_subscribe=on_subscribe,
            on_resubscribe=on_resubscribe,
            on_throttle=on_throttle,
        )

    async def close(self) -> None:
        """Deregister the consumers this worker used, when configured to. Other workers of the
        application lose their subscriptions too (and register again if still running)."""
        if not self.deregister_on_stop:
            return
        for stream, arn in list(self._arns.items()):
            try:
                await self.client.deregister_consumer(arn)
            except Exception as exc:  # stopping: report, never raise
                log.warning("deregistering stream consumer of %s failed: %r", stream, exc)
        self._arns.clear()
