"""Kinesis enhanced fan-out (aiobotocore): stream consumers and SubscribeToShard event streams.

Owns: registering a stream consumer or reusing the one that exists and waiting (bounded, on the
event loop's clock) until it is ACTIVE; deregistering it; one SubscribeToShard call as an async
iterator of ``SubscriptionEvent`` (records as ``Record`` objects, the continuation sequence
number, MillisBehindLatest, ChildShards); and the mapping of every way a subscription fails
(ResourceInUse, LimitExceeded, throttling, ResourceNotFound, exception events, a dropped
connection, a damaged frame) onto kclasync's adapter errors. A subscription that simply ends (the
service closes it after five minutes) ends the iteration with ``completed`` set.
Must not: retry, back off or decide where to resubscribe from (``kclasync._core.fanout_session``
decides; the runtime acts), or read any clock but the event loop's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import aiohttp
import attrs
from botocore.eventstream import ParserError
from botocore.exceptions import BotoCoreError, ClientError
from botocore.parsers import ResponseParserError

from kclasync._adapters.protocols import (
    ChildShard,
    ShardNotFoundError,
    StartingPosition,
)
from kclasync._core.shard import HashRange
from kclasync._records import Record
from kclasync.errors import AdapterError, StreamNotFoundError, ThrottledError, TransientError

_THROTTLING = {
    "ProvisionedThroughputExceededException",
    "LimitExceededException",
    "ThrottlingException",
    "KMSThrottlingException",
}
_TRANSIENT = {
    "InternalFailure",
    "InternalFailureException",
    "ServiceUnavailable",
    "InternalServerError",
}

# ---------------------------------------------------------------------------------------------
# Errors (subclasses of the adapter errors, so code written for polling handles them too)


class SubscriptionInUseError(TransientError):
    """Another subscription of this consumer to this shard is still active (ResourceInUse):
    it ends within seconds; subscribe again after a pause."""


class SubscriptionDroppedError(TransientError):
    """The event stream broke off: the connection dropped, timed out, or a frame was damaged."""


class ConsumerNotFoundError(AdapterError):
    """The stream consumer (fan-out registration) no longer exists."""

    def __init__(self, consumer_arn: str) -> None:
        self.consumer_arn = consumer_arn
        super().__init__(f"stream consumer {consumer_arn} does not exist")


class ConsumerNotActiveError(TransientError):
    """A stream consumer did not become ACTIVE within the allowed time."""


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _mapped(exc: BaseException, what: str) -> BaseException | None:
    """The kclasync error for ``exc`` (None: not ours to map)."""
    if isinstance(exc, ClientError):
        code = _code(exc)
        if code == "ResourceInUseException":
            return SubscriptionInUseError(f"{what}: another subscription is active")
        if code in _THROTTLING:
            return ThrottledError(f"{what} throttled: {code}")
        if code in _TRANSIENT:
            return TransientError(f"{what} failed: {code}")
        return None
    if isinstance(exc, (ParserError, ResponseParserError)):
        return SubscriptionDroppedError(f"{what}: unreadable event stream: {exc}")
    if isinstance(exc, (TimeoutError, aiohttp.ClientError, OSError, BotoCoreError)):
        return SubscriptionDroppedError(f"{what}: connection failed: {exc!r}")
    return None


# ---------------------------------------------------------------------------------------------
# Values


@attrs.frozen
class StreamConsumer:
    """A registered stream consumer."""

    name: str
    arn: str
    stream_arn: str
    status: str


@attrs.frozen
class SubscriptionEvent:
    """One SubscribeToShardEvent.

    ``continuation_sequence`` is where a new subscription resumes (AFTER_SEQUENCE_NUMBER); None
    together with ``child_shards`` means the shard ended and this subscription is over.
    """

    records: Sequence[Record]
    continuation_sequence: str | None
    millis_behind_latest: int | None = None
    child_shards: tuple[ChildShard, ...] = ()

    @property
    def shard_ended(self) -> bool:
        return self.continuation_sequence is None


def _child(raw: dict[str, Any]) -> ChildShard:
    hk = raw.get("HashKeyRange")
    return ChildShard(
        shard_id=raw["ShardId"],
        parent_shard_ids=tuple(raw.get("ParentShards", ())),
        hash_range=HashRange.parse(hk["StartingHashKey"], hk["EndingHashKey"]) if hk else None,
    )


def _utc(value: datetime | None) -> datetime | None:
    # The same instant as botocore parses it, in UTC like the polling path's fast parser.
    return value.astimezone(UTC) if value is not None else None


def _event(raw: dict[str, Any], stream: str, shard_id: str) -> SubscriptionEvent:
    records = [
        Record(
            data=bytes(r["Data"]),
            partition_key=r["PartitionKey"],
            sequence_number=r["SequenceNumber"],
            shard_id=shard_id,
            approximate_arrival=_utc(r.get("ApproximateArrivalTimestamp")),
            stream=stream,
        )
        for r in raw.get("Records") or ()
    ]
    return SubscriptionEvent(
        records=records,
        continuation_sequence=raw.get("ContinuationSequenceNumber"),
        millis_behind_latest=raw.get("MillisBehindLatest"),
        child_shards=tuple(_child(c) for c in raw.get("ChildShards") or ()),
    )


def _starting_position(position: StartingPosition) -> dict[str, Any]:
    out: dict[str, Any] = {"Type": position.type.value}
    if position.sequence_number is not None:
        out["SequenceNumber"] = position.sequence_number
    if position.timestamp is not None:
        out["Timestamp"] = position.timestamp
    return out


# ---------------------------------------------------------------------------------------------
# Subscription


class Subscription:
    """One SubscribeToShard call, read as an async iterator of ``SubscriptionEvent``.

    Use as ``async with fanout.subscribe(...) as sub: async for event in sub: ...``. Events are
    read from the connection only as they are asked for, so a slow reader slows the stream down
    (TCP flow control) instead of buffering it. After the iteration ends without an error,
    ``completed`` is True (the service closed the subscription; resubscribe from the last
    continuation) unless the last event ended the shard.
    """

    def __init__(
        self,
        client: Any,
        consumer_arn: str,
        stream: str,
        shard_id: str,
        position: StartingPosition,
    ) -> None:
        self._client = client
        self.consumer_arn = consumer_arn
        self.stream = stream
        self.shard_id = shard_id
        self.position = position
        self.completed = False
        self.events_received = 0
        self._stream: Any = None
        self._events: AsyncIterator[dict[str, Any]] | None = None
        self._where = f"SubscribeToShard on {stream}/{shard_id}"

    async def open(self) -> None:
        try:
            resp = await self._client.subscribe_to_shard(
                ConsumerARN=self.consumer_arn,
                ShardId=self.shard_id,
                StartingPosition=_starting_position(self.position),
            )
        except Exception as exc:
            await self._raise_mapped(exc)
            raise
        self._stream = resp["EventStream"]
        self._events = aiter(self._stream)

    async def _raise_mapped(self, exc: BaseException) -> None:
        if isinstance(exc, ClientError) and _code(exc) == "ResourceNotFoundException":
            raise await self._not_found() from exc
        mapped = _mapped(exc, self._where)
        if mapped is not None:
            raise mapped from exc

    async def _not_found(self) -> AdapterError:
        """ResourceNotFound names neither the consumer nor the shard: ask which is gone."""
        try:
            await self._client.describe_stream_consumer(ConsumerARN=self.consumer_arn)
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                return ConsumerNotFoundError(self.consumer_arn)
            return TransientError(f"{self._where}: resource not found, and {exc}")
        except (TimeoutError, aiohttp.ClientError, OSError, BotoCoreError) as exc:
            return TransientError(f"{self._where}: resource not found, and {exc!r}")
        return ShardNotFoundError(f"{self.stream}/{self.shard_id} not found")

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> SubscriptionEvent:
        if self._events is None:
            raise RuntimeError("the subscription is not open")
        while True:
            try:
                raw = await anext(self._events)
            except StopAsyncIteration:
                self.completed = True
                raise
            except Exception as exc:
                await self._raise_mapped(exc)
                raise
            body = raw.get("SubscribeToShardEvent")
            if body is None:
                continue  # an event type this client does not know: skip it
            self.events_received += 1
            return _event(body, self.stream, self.shard_id)

    async def close(self) -> None:
        events, self._events = self._events, None
        if events is not None and hasattr(events, "aclose"):
            with contextlib.suppress(Exception):
                await events.aclose()
        if self._stream is not None:
            with contextlib.suppress(Exception):
                self._stream.close()
            self._stream = None

    async def __aenter__(self) -> Subscription:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


# ---------------------------------------------------------------------------------------------
# Consumer registration


class FanOutClient:
    """Enhanced fan-out over a low-level aiobotocore Kinesis client."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self.calls: dict[str, int] = {}

    def _count(self, op: str) -> None:
        self.calls[op] = self.calls.get(op, 0) + 1

    async def _call(self, op: str, what: str, **kwargs: Any) -> dict[str, Any]:
        self._count(op)
        try:
            resp: dict[str, Any] = await getattr(self._client, op)(**kwargs)
        except Exception as exc:
            mapped = _mapped(exc, what)
            if isinstance(mapped, SubscriptionDroppedError):
                mapped = TransientError(str(mapped))
            if mapped is not None and not isinstance(mapped, SubscriptionInUseError):
                raise mapped from exc
            raise
        return resp

    async def stream_arn(self, stream: str) -> str:
        try:
            resp = await self._call(
                "describe_stream_summary", f"DescribeStreamSummary on {stream}", StreamName=stream
            )
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                raise StreamNotFoundError(stream) from exc
            raise
        return str(resp["StreamDescriptionSummary"]["StreamARN"])

    async def describe_consumer(self, stream_arn: str, name: str) -> StreamConsumer | None:
        """The consumer ``name`` of the stream, or None when there is none."""
        try:
            resp = await self._call(
                "describe_stream_consumer",
                f"DescribeStreamConsumer {name}",
                StreamARN=stream_arn,
                ConsumerName=name,
            )
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                return None
            raise
        d = resp["ConsumerDescription"]
        return StreamConsumer(
            name=d["ConsumerName"],
            arn=d["ConsumerARN"],
            stream_arn=d.get("StreamARN", stream_arn),
            status=d["ConsumerStatus"],
        )

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
        try:
            resp = await self._call(
                "register_stream_consumer",
                f"RegisterStreamConsumer {name}",
                StreamARN=stream_arn,
                ConsumerName=name,
            )
        except ClientError as exc:
            # Registered meanwhile by another worker, or the old one is still being deleted.
            if _code(exc) == "ResourceInUseException":
                return None
            raise
        c = resp["Consumer"]
        return StreamConsumer(
            name=c["ConsumerName"],
            arn=c["ConsumerARN"],
            stream_arn=stream_arn,
            status=c["ConsumerStatus"],
        )

    async def deregister_consumer(self, consumer_arn: str) -> bool:
        """Deregister; False when it did not exist (any more)."""
        try:
            await self._call(
                "deregister_stream_consumer",
                f"DeregisterStreamConsumer {consumer_arn}",
                ConsumerARN=consumer_arn,
            )
        except ClientError as exc:
            if _code(exc) == "ResourceNotFoundException":
                return False
            raise
        return True

    def subscribe(
        self, consumer_arn: str, stream: str, shard_id: str, position: StartingPosition
    ) -> Subscription:
        """One SubscribeToShard call (opened by ``async with`` or ``open()``)."""
        self._count("subscribe_to_shard")
        return Subscription(self._client, consumer_arn, stream, shard_id, position)
