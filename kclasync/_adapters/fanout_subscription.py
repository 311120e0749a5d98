"""One SubscribeToShard call of enhanced fan-out, read as an async iterator of events.

Owns: opening the call from a starting position, reading its event stream one event at a time
as it is asked for (so a slow reader slows the stream through TCP flow control instead of
buffering it), turning each SubscribeToShardEvent into a ``SubscriptionEvent`` (records as
``Record`` objects, the continuation sequence number, MillisBehindLatest, ChildShards), telling
a gone stream consumer from a gone shard, and closing the call. A subscription that simply ends
(the service closes it after five minutes) ends the iteration with ``completed`` set.
Must not: retry, back off or decide where to resubscribe from (``_core.records.fanout_session``
decides; the runtime acts), register stream consumers (``fanout``), or read any clock.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

import attrs
from botocore.exceptions import ClientError

from kclasync._adapters.fanout_errors import (
    CONNECTION_ERRORS,
    ConsumerNotFoundError,
    error_code,
    mapped_error,
)
from kclasync._adapters.protocols import ChildShard, ShardNotFoundError, StartingPosition
from kclasync._core.lineage.shard import HashRange
from kclasync._records import Record
from kclasync.errors import AdapterError, TransientError


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
        if isinstance(exc, ClientError) and error_code(exc) == "ResourceNotFoundException":
            raise await self._not_found() from exc
        mapped = mapped_error(exc, self._where)
        if mapped is not None:
            raise mapped from exc

    async def _not_found(self) -> AdapterError:
        """ResourceNotFound names neither the consumer nor the shard: ask which is gone."""
        try:
            await self._client.describe_stream_consumer(ConsumerARN=self.consumer_arn)
        except ClientError as exc:
            if error_code(exc) == "ResourceNotFoundException":
                return ConsumerNotFoundError(self.consumer_arn)
            return TransientError(f"{self._where}: resource not found, and {exc}")
        except CONNECTION_ERRORS as exc:
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
