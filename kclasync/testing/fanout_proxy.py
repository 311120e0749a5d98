"""A relay in front of kinesis-local: its SubscribeToShard answers completed as the service's.

kinesis-local (0.6.2) streams SubscribeToShardEvent events but sends no ``initial-response``
event first (aiobotocore then refuses the stream: "First event was not of type
initial-response"), and at the end of a closed shard it never sends ChildShards: it keeps sending
empty events forever. This relay forwards every request unchanged, and on a SubscribeToShard
event stream (1) writes an ``initial-response`` event before kinesis-local's first byte and (2)
on each empty event checks with GetShardIterator(AFTER_SEQUENCE_NUMBER continuation) and
GetRecords whether the shard has ended; if so it sends the service's last event instead (no
continuation, the ChildShards that GetRecords reported) and ends the stream.

Owns: only this emulator workaround, for tests and benchmarks. Nothing in the library's normal
path uses it or knows about it.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from aiobotocore.session import get_session
from aiohttp import web
from botocore.eventstream import EventStreamBuffer, EventStreamMessage

from kclasync.testing.eventstream import INITIAL_RESPONSE, encode_message, event_message
from kclasync.testing.relay import HttpRelay, relayed_headers


class KinesisLocalFanOutRelay(HttpRelay):
    """``async with KinesisLocalFanOutRelay(upstream) as url:`` Kinesis calls to ``url`` reach
    kinesis-local at ``upstream``; fan-out answers are completed as the service sends them."""

    # A subscriber that closes its connection ends its subscription at once, as with the
    # service; otherwise the relay would hold kinesis-local's stream open until its next
    # write, and a new subscription to the shard would meet ResourceInUse meanwhile.
    cancel_on_disconnect = True

    def __init__(self, upstream: str, region: str = "us-east-1") -> None:
        super().__init__()
        self.upstream = upstream.rstrip("/")
        self.region = region
        self.shard_ends_sent = 0
        #: Requests relayed, by operation (the X-Amz-Target's last part).
        self.operations: Counter[str] = Counter()
        self._kinesis: Any = None

    async def _started(self, stack: contextlib.AsyncExitStack) -> None:
        self._kinesis = await stack.enter_async_context(
            get_session().create_client(
                "kinesis",
                endpoint_url=self.upstream,
                region_name=self.region,
                aws_access_key_id="relay",
                aws_secret_access_key="relay",
            )
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.operations[request.headers.get("X-Amz-Target", "").rpartition(".")[2]] += 1
        upstream = await self.forward(request, body, self.upstream)
        is_stream = "eventstream" in upstream.headers.get("Content-Type", "")
        try:
            out_headers = relayed_headers(upstream.headers)
            if not is_stream:
                return web.Response(
                    status=upstream.status, headers=out_headers, body=await upstream.read()
                )
            resp = web.StreamResponse(status=upstream.status, headers=out_headers)
            resp.enable_chunked_encoding()
            await resp.prepare(request)
            await resp.write(INITIAL_RESPONSE)
            request_doc = orjson.loads(body)
            try:
                async for frame in self._relayed(upstream, request_doc):
                    await resp.write(frame)
                await resp.write_eof()
            except ConnectionError:
                pass  # the subscriber went away
            except aiohttp.ClientError:
                if request.transport is not None:  # kinesis-local cut the stream: cut it too
                    request.transport.abort()
            return resp
        finally:
            if is_stream:
                upstream.close()  # not reused: kinesis-local sees the subscription end
            else:
                upstream.release()

    async def _relayed(
        self, upstream: aiohttp.ClientResponse, request_doc: dict[str, Any]
    ) -> AsyncIterator[bytes]:
        buffer = EventStreamBuffer()
        async for chunk in upstream.content.iter_any():
            buffer.add_data(chunk)
            for message in buffer:
                final = await self._shard_end(message, request_doc)
                if final is not None:
                    self.shard_ends_sent += 1
                    yield final
                    return
                yield _encode(message)

    async def _shard_end(
        self, message: EventStreamMessage, request_doc: dict[str, Any]
    ) -> bytes | None:
        headers: dict[str, Any] = message.headers  # type: ignore[assignment]
        if headers.get(":event-type") != "SubscribeToShardEvent":
            return None
        event = orjson.loads(message.payload)
        if event.get("Records") or event.get("ChildShards"):
            return None
        stream = str(request_doc["ConsumerARN"]).split(":stream/")[1].split("/")[0]
        shard = str(request_doc["ShardId"])
        position = request_doc.get("StartingPosition", {})
        continuation = event.get("ContinuationSequenceNumber")
        kwargs: dict[str, Any] = {"StreamName": stream, "ShardId": shard}
        if continuation:
            kwargs.update(ShardIteratorType="AFTER_SEQUENCE_NUMBER")
            kwargs.update(StartingSequenceNumber=continuation)
        else:
            kwargs["ShardIteratorType"] = position.get("Type", "TRIM_HORIZON")
            if "SequenceNumber" in position:
                kwargs["StartingSequenceNumber"] = position["SequenceNumber"]
        try:
            iterator = (await self._kinesis.get_shard_iterator(**kwargs))["ShardIterator"]
            result = await self._kinesis.get_records(ShardIterator=iterator, Limit=1)
        except Exception:
            return None  # cannot tell: relay the event as it is
        if result.get("Records") or result.get("NextShardIterator"):
            return None
        children = [
            {k: v for k, v in child.items() if k in ("ShardId", "ParentShards", "HashKeyRange")}
            for child in result.get("ChildShards") or ()
        ]
        return event_message(
            "SubscribeToShardEvent",
            {
                "Records": [],
                "ContinuationSequenceNumber": None,
                "MillisBehindLatest": 0,
                "ChildShards": children,
            },
        )


def _encode(message: EventStreamMessage) -> bytes:
    """The message's bytes again (kinesis-local's headers are all strings)."""
    headers: dict[str, Any] = message.headers  # type: ignore[assignment]
    return encode_message({k: str(v) for k, v in headers.items()}, message.payload)
