"""Kinesis enhanced fan-out (aiobotocore): stream consumers, and subscriptions opened through them.

Owns: registering a stream consumer or reusing the one that exists and waiting (bounded, on the
event loop's clock) until it is ACTIVE; deregistering it; counting the calls; and handing out
one ``Subscription`` per SubscribeToShard call (read in ``fanout_subscription``; failures mapped
in ``fanout_errors``, whose errors and ``SubscriptionEvent`` are re-exported here).
Must not: retry, back off or decide where to resubscribe from (``_core.records.fanout_session``
decides; the runtime acts), or read any clock but the event loop's.
"""

from __future__ import annotations

import asyncio
from typing import Any

import attrs
from botocore.exceptions import ClientError

from kclasync._adapters.call_counts import CallCounts
from kclasync._adapters.fanout_errors import (
    ConsumerNotActiveError,
    ConsumerNotFoundError,
    SubscriptionDroppedError,
    SubscriptionInUseError,
    error_code,
    mapped_error,
)
from kclasync._adapters.fanout_subscription import Subscription, SubscriptionEvent
from kclasync._adapters.protocols import StartingPosition
from kclasync.errors import StreamNotFoundError, ThrottledError, TransientError

__all__ = [
    "ConsumerNotActiveError",
    "ConsumerNotFoundError",
    "FanOutClient",
    "StreamConsumer",
    "Subscription",
    "SubscriptionDroppedError",
    "SubscriptionEvent",
    "SubscriptionInUseError",
]


@attrs.frozen
class StreamConsumer:
    """A registered stream consumer."""

    name: str
    arn: str
    stream_arn: str
    status: str

    @classmethod
    def from_description(cls, raw: dict[str, Any], stream_arn: str) -> StreamConsumer:
        """From a ConsumerDescription (DescribeStreamConsumer) or a Consumer
        (RegisterStreamConsumer, which names no stream)."""
        return cls(
            name=raw["ConsumerName"],
            arn=raw["ConsumerARN"],
            stream_arn=raw.get("StreamARN", stream_arn),
            status=raw["ConsumerStatus"],
        )


class FanOutClient(CallCounts):
    """Enhanced fan-out over a low-level aiobotocore Kinesis client."""

    def __init__(self, client: Any) -> None:
        super().__init__()
        self._client = client

    async def _call(self, op: str, what: str, **kwargs: Any) -> dict[str, Any]:
        self._count(op)
        try:
            resp: dict[str, Any] = await getattr(self._client, op)(**kwargs)
        except Exception as exc:
            mapped = mapped_error(exc, what)
            if isinstance(mapped, SubscriptionDroppedError):
                mapped = TransientError(str(mapped))
            if mapped is not None and not isinstance(mapped, SubscriptionInUseError):
                raise mapped from exc
            raise
        return resp

    async def _call_unless(
        self, absent: str, op: str, what: str, **kwargs: Any
    ) -> dict[str, Any] | None:
        """``_call``, but None when AWS answers with the error code ``absent`` (the thing
        asked about does not exist, or already does)."""
        try:
            return await self._call(op, what, **kwargs)
        except ClientError as exc:
            if error_code(exc) == absent:
                return None
            raise

    async def stream_arn(self, stream: str) -> str:
        try:
            resp = await self._call(
                "describe_stream_summary", f"DescribeStreamSummary on {stream}", StreamName=stream
            )
        except ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                raise StreamNotFoundError(stream) from exc
            raise
        return str(resp["StreamDescriptionSummary"]["StreamARN"])

    async def describe_consumer(self, stream_arn: str, name: str) -> StreamConsumer | None:
        """The consumer ``name`` of the stream, or None when there is none."""
        resp = await self._call_unless(
            "ResourceNotFoundException",
            "describe_stream_consumer",
            f"DescribeStreamConsumer {name}",
            StreamARN=stream_arn,
            ConsumerName=name,
        )
        if resp is None:
            return None
        return StreamConsumer.from_description(resp["ConsumerDescription"], stream_arn)

    async def ensure_consumer(
        self,
        stream: str,
        name: str,
        *,
        timeout: float = 60.0,
        poll_interval: float = 0.5,
    ) -> StreamConsumer:
        """Register the stream consumer ``name`` (or reuse the one that exists) and wait until it
        is ACTIVE. A consumer being deleted is waited out and registered again. Raises
        ``ConsumerNotActiveError`` after ``timeout`` seconds (on the event loop's clock)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        arn = await self.stream_arn(stream)
        while True:
            try:
                found = await self.describe_consumer(arn, name)
                if found is None:
                    found = await self._register(arn, name)
            except (ThrottledError, TransientError):
                found = None  # DescribeStreamConsumer allows 20 calls/s per stream: wait
            if found is not None and found.status == "ACTIVE":
                return found
            if loop.time() >= deadline:
                status = found.status if found is not None else "unknown"
                raise ConsumerNotActiveError(
                    f"stream consumer {name} on {stream} not ACTIVE after {timeout}s "
                    f"(status {status})"
                )
            await asyncio.sleep(poll_interval)

    async def _register(self, stream_arn: str, name: str) -> StreamConsumer | None:
        # None: registered meanwhile by another worker, or the old one is still being deleted.
        resp = await self._call_unless(
            "ResourceInUseException",
            "register_stream_consumer",
            f"RegisterStreamConsumer {name}",
            StreamARN=stream_arn,
            ConsumerName=name,
        )
        if resp is None:
            return None
        return StreamConsumer.from_description(resp["Consumer"], stream_arn)

    async def deregister_consumer(self, consumer_arn: str) -> bool:
        """Deregister; False when it did not exist (any more)."""
        resp = await self._call_unless(
            "ResourceNotFoundException",
            "deregister_stream_consumer",
            f"DeregisterStreamConsumer {consumer_arn}",
            ConsumerARN=consumer_arn,
        )
        return resp is not None

    def subscribe(
        self, consumer_arn: str, stream: str, shard_id: str, position: StartingPosition
    ) -> Subscription:
        """One SubscribeToShard call (opened by ``async with`` or ``open()``)."""
        self._count("subscribe_to_shard")
        return Subscription(self._client, consumer_arn, stream, shard_id, position)
