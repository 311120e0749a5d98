"""Kinesis Data Streams (aiobotocore) behind ``StreamClient``.

Owns: ListShards paging and filters, GetShardIterator, GetRecords (and the checking of its
responses: ``records_result``), and the mapping of AWS errors. Every call is the client's own
(botocore's request path, retries and exceptions).
Must not: retry or back off (the runtime decides), or decide anything about leases.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from kclasync._adapters.call_counts import CallCounts
from kclasync._adapters.protocols import (
    ChildShard,
    ExpiredIteratorError,
    GetRecordsResult,
    ShardFilter,
    ShardFilterType,
    ShardNotFoundError,
    StartingPosition,
)
from kclasync._core.lineage.shard import HashRange, Shard
from kclasync._core.lineage.streams import StreamIdentity
from kclasync._records import Record
from kclasync.errors import StreamNotFoundError, ThrottledError, TransientError

#: Kinesis error codes for a throttled call (polling and fan-out alike).
THROTTLING_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "LimitExceededException",
        "ThrottlingException",
        "KMSThrottlingException",
    }
)
#: Kinesis error codes for a server-side failure worth retrying (polling and fan-out alike).
TRANSIENT_CODES = frozenset(
    {
        "InternalFailure",
        "InternalFailureException",
        "ServiceUnavailable",
        "InternalServerError",
    }
)


@contextlib.asynccontextmanager
async def _mapped_errors(
    operation: str, stream: str, shard_id: str | None = None
) -> AsyncIterator[None]:
    where = f"{stream}/{shard_id}" if shard_id else stream
    try:
        yield
    except ClientError as exc:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in THROTTLING_CODES:
            raise ThrottledError(f"Kinesis {operation} on {where} throttled: {code}") from exc
        if code == "ExpiredIteratorException":
            raise ExpiredIteratorError(f"iterator for {where} expired") from exc
        if code == "ResourceNotFoundException":
            if shard_id is None:
                raise StreamNotFoundError(stream) from exc
            raise ShardNotFoundError(f"{where} not found") from exc
        if code in TRANSIENT_CODES:
            raise TransientError(f"Kinesis {operation} on {where} failed: {code}") from exc
        raise
    except (TimeoutError, BotoCoreError, OSError) as exc:
        raise TransientError(f"Kinesis {operation} on {where} failed: {exc}") from exc


def _shard(raw: dict[str, Any]) -> Shard:
    hk = raw["HashKeyRange"]
    seq = raw.get("SequenceNumberRange", {})
    return Shard(
        shard_id=raw["ShardId"],
        parent_shard_id=raw.get("ParentShardId"),
        adjacent_parent_shard_id=raw.get("AdjacentParentShardId"),
        hash_range=HashRange.parse(hk["StartingHashKey"], hk["EndingHashKey"]),
        starting_sequence=seq.get("StartingSequenceNumber", "0"),
        ending_sequence=seq.get("EndingSequenceNumber"),
    )


class MalformedResponseError(TransientError):
    """Kinesis answered GetRecords with a response that does not match its API (a missing or
    mistyped field). The call is retried like any transient failure, from the same iterator, so
    no record is skipped; the message names the field, the shard and the record."""


def _field(raw: Any, name: str, kinds: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(raw, dict):
        raise MalformedResponseError(f"GetRecords on {where}: expected an object, got {raw!r:.60}")
    value = raw.get(name)
    if not isinstance(value, kinds) or isinstance(value, bool):
        raise MalformedResponseError(
            f"GetRecords on {where}: field {name} is missing or mistyped: {value!r:.60}"
        )
    return value


def records_result(resp: Any, stream: str, shard_id: str) -> GetRecordsResult:
    """Map a GetRecords response to ``GetRecordsResult``. Raises ``MalformedResponseError``,
    naming the field, for anything that does not match the API (nothing is dropped)."""
    where = f"{stream}/{shard_id}"
    if not isinstance(resp, dict):
        raise MalformedResponseError(f"GetRecords on {where}: the response is not an object")
    raw_records = resp.get("Records") or []
    if not isinstance(raw_records, list):
        raise MalformedResponseError(f"GetRecords on {where}: field Records is not a list")
    records: list[Record] = []
    for index, raw in enumerate(raw_records):
        at = f"{where} record {index}"
        sequence = _field(raw, "SequenceNumber", str, at)
        if not (sequence.isascii() and sequence.isdigit()):
            raise MalformedResponseError(f"GetRecords on {at}: bad SequenceNumber {sequence!r:.60}")
        arrival = raw.get("ApproximateArrivalTimestamp")
        if arrival is not None and not isinstance(arrival, datetime):
            raise MalformedResponseError(
                f"GetRecords on {at}: ApproximateArrivalTimestamp is mistyped: {arrival!r:.60}"
            )
        records.append(
            Record(
                data=bytes(_field(raw, "Data", (bytes, bytearray, memoryview), at)),
                partition_key=_field(raw, "PartitionKey", str, at),
                sequence_number=sequence,
                shard_id=shard_id,
                approximate_arrival=arrival,
                stream=stream,
            )
        )
    next_iterator = resp.get("NextShardIterator")
    if next_iterator is not None and not isinstance(next_iterator, str):
        raise MalformedResponseError(f"GetRecords on {where}: field NextShardIterator is mistyped")
    behind = resp.get("MillisBehindLatest")
    if behind is not None and (isinstance(behind, bool) or not isinstance(behind, int)):
        raise MalformedResponseError(f"GetRecords on {where}: field MillisBehindLatest is mistyped")
    raw_children = resp.get("ChildShards") or []
    if not isinstance(raw_children, list):
        raise MalformedResponseError(f"GetRecords on {where}: field ChildShards is not a list")
    children = []
    for index, ch in enumerate(raw_children):
        at = f"{where} child shard {index}"
        child_id = _field(ch, "ShardId", str, at)
        parents = _field(ch, "ParentShards", list, at) if "ParentShards" in ch else []
        if not all(isinstance(p, str) for p in parents):
            raise MalformedResponseError(f"GetRecords on {at}: field ParentShards is mistyped")
        hash_range = None
        if "HashKeyRange" in ch:
            keys = _field(ch, "HashKeyRange", dict, at)
            try:
                hash_range = HashRange.parse(
                    _field(keys, "StartingHashKey", str, at), _field(keys, "EndingHashKey", str, at)
                )
            except ValueError:
                raise MalformedResponseError(f"GetRecords on {at}: bad HashKeyRange") from None
        children.append(
            ChildShard(
                shard_id=child_id,
                parent_shard_ids=tuple(parents),
                hash_range=hash_range,
            )
        )
    return GetRecordsResult(
        records=records,
        next_iterator=next_iterator,
        millis_behind_latest=behind,
        child_shards=tuple(children),
    )


class KinesisStreamClient(CallCounts):
    """``StreamClient`` over a low-level aiobotocore Kinesis client."""

    def __init__(self, client: Any) -> None:
        super().__init__()
        self._client = client

    async def describe_stream(self, stream: str) -> StreamIdentity:
        async with _mapped_errors("DescribeStreamSummary", stream):
            self._count("describe_stream_summary")
            resp = await self._client.describe_stream_summary(StreamName=stream)
        summary = resp["StreamDescriptionSummary"]
        # arn:aws:kinesis:<region>:<account>:stream/<name>
        account = str(summary["StreamARN"]).split(":")[4]
        created = summary["StreamCreationTimestamp"]
        return StreamIdentity(account, str(summary["StreamName"]), int(created.timestamp()))

    async def list_shards(
        self, stream: str, shard_filter: ShardFilter | None = None
    ) -> list[Shard]:
        shards: list[Shard] = []
        kwargs: dict[str, Any] = {"StreamName": stream}
        if shard_filter is not None:
            f: dict[str, Any] = {"Type": shard_filter.type.value}
            if shard_filter.type is ShardFilterType.AT_TIMESTAMP:
                f["Timestamp"] = shard_filter.timestamp
            kwargs["ShardFilter"] = f
        while True:
            async with _mapped_errors("ListShards", stream):
                self._count("list_shards")
                resp = await self._client.list_shards(**kwargs)
            shards.extend(_shard(raw) for raw in resp.get("Shards", []))
            token = resp.get("NextToken")
            if not token:
                return shards
            # With a NextToken, ListShards takes neither the stream name nor a filter.
            kwargs = {"NextToken": token}

    async def get_shard_iterator(
        self, stream: str, shard_id: str, position: StartingPosition
    ) -> str:
        kwargs: dict[str, Any] = {
            "StreamName": stream,
            "ShardId": shard_id,
            "ShardIteratorType": position.type.value,
        }
        if position.sequence_number is not None:
            kwargs["StartingSequenceNumber"] = position.sequence_number
        if position.timestamp is not None:
            kwargs["Timestamp"] = position.timestamp
        async with _mapped_errors("GetShardIterator", stream, shard_id):
            self._count("get_shard_iterator")
            resp = await self._client.get_shard_iterator(**kwargs)
        return str(resp["ShardIterator"])

    async def get_records(
        self, stream: str, shard_id: str, iterator: str, limit: int
    ) -> GetRecordsResult:
        async with _mapped_errors("GetRecords", stream, shard_id):
            self._count("get_records")
            resp = await self._client.get_records(ShardIterator=iterator, Limit=limit)
        return records_result(resp, stream, shard_id)

    # -- producing (demo, tests and tools; not part of StreamClient) -------------------------

    async def create_stream(self, stream: str, shard_count: int, timeout: float = 30.0) -> None:
        async with _mapped_errors("CreateStream", stream):
            await self._client.create_stream(StreamName=stream, ShardCount=shard_count)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            async with _mapped_errors("DescribeStreamSummary", stream):
                resp = await self._client.describe_stream_summary(StreamName=stream)
            if resp["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                return
            if loop.time() > deadline:
                raise TransientError(f"stream {stream} not ACTIVE after {timeout}s")
            await asyncio.sleep(0.1)

    async def put_records(
        self, stream: str, records: Sequence[tuple[str, bytes]]
    ) -> list[tuple[str, str] | None]:
        """Put (partition key, data) pairs; returns (shard id, sequence) or None per record that
        failed (the caller retries those)."""
        async with _mapped_errors("PutRecords", stream):
            resp = await self._client.put_records(
                StreamName=stream,
                Records=[{"PartitionKey": pk, "Data": data} for pk, data in records],
            )
        out: list[tuple[str, str] | None] = []
        for entry in resp["Records"]:
            if "SequenceNumber" in entry and not entry.get("ErrorCode"):
                out.append((entry["ShardId"], entry["SequenceNumber"]))
            else:
                out.append(None)
        return out
