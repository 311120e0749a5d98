"""The AWS event-stream encoding, and a small Kinesis server that speaks it for SubscribeToShard.

Owns: encoding event-stream messages (prelude with total and headers length and its CRC32,
string headers, payload, message CRC32), and ``FanOutServer``: an aiohttp server on 127.0.0.1 (a
free port) that answers the fan-out calls of the Kinesis API (DescribeStreamSummary, Register /
Describe / DeregisterStreamConsumer, ListShards, SubscribeToShard) the way the service does: an
``initial-response`` event first, SubscribeToShardEvent events with records and continuation
sequence numbers, ChildShards at a shard's end, and the end of a subscription after its lifetime.
Faults can be injected per SubscribeToShard call (an error response, an exception event, a
connection dropped mid-frame). Nothing here is used by the library's normal path.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import struct
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import attrs
import orjson
from aiohttp import web

_STRING = 7


def encode_message(headers: Mapping[str, str], payload: bytes) -> bytes:
    """One event-stream message with string-valued ``headers``."""
    encoded = b"".join(
        struct.pack("!B", len(name.encode()))
        + name.encode()
        + struct.pack("!BH", _STRING, len(value.encode()))
        + value.encode()
        for name, value in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack("!II", total, len(encoded))
    prelude += struct.pack("!I", binascii.crc32(prelude))
    body = prelude + encoded + payload
    return body + struct.pack("!I", binascii.crc32(body))


def event_message(event_type: str, payload: Any) -> bytes:
    return encode_message(
        {
            ":event-type": event_type,
            ":content-type": "application/json",
            ":message-type": "event",
        },
        orjson.dumps(payload),
    )


def exception_message(code: str, message: str) -> bytes:
    return encode_message(
        {
            ":exception-type": code,
            ":content-type": "application/json",
            ":message-type": "exception",
        },
        orjson.dumps({"message": message}),
    )


INITIAL_RESPONSE = event_message("initial-response", {})


# ---------------------------------------------------------------------------------------------
# The server's model of a stream


@attrs.define
class _Shard:
    shard_id: str
    parent: str | None = None
    records: list[dict[str, Any]] = attrs.Factory(list)
    children: list[str] = attrs.Factory(list)
    closed: bool = False


@attrs.define
class Fault:
    """What to do to one SubscribeToShard call.

    ``error``: answer with this error code (HTTP 400) instead of subscribing.
    ``exception_after``: send an exception event ``exception_code`` after this many events.
    ``drop_after``: after this many events, send half a frame and cut the connection.
    ``corrupt_after``: after this many events, send a frame whose checksum does not match.
    """

    error: str | None = None
    exception_after: int | None = None
    exception_code: str = "InternalFailureException"
    drop_after: int | None = None
    corrupt_after: int | None = None


@attrs.define
class SubscribeCall:
    """A SubscribeToShard call as the server saw it."""

    shard_id: str
    position: dict[str, Any]
    answered: str = "subscribed"  # or the error code
    events: int = 0


_BASE = 49_600_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000_000
ACCOUNT = "123456789012"


class FanOutServer:
    """A fan-out Kinesis endpoint for one stream, for tests: put records with ``put``, close a
    shard with ``split``, queue faults with ``fault``; ``calls`` records every subscription."""

    def __init__(
        self,
        stream: str = "fanout-stream",
        shards: int = 1,
        *,
        heartbeat: float = 0.2,
        lifetime: float = 300.0,
        batch: int = 100,
    ) -> None:
        self.stream = stream
        self.heartbeat = heartbeat
        self.lifetime = lifetime
        self.batch = batch
        self.shards: dict[str, _Shard] = {}
        for _ in range(shards):
            self._add_shard(None)
        self.consumers: dict[str, str] = {}  # name -> status
        self.calls: list[SubscribeCall] = []
        self.faults: list[Fault] = []
        self.active: set[tuple[str, str]] = set()
        self._seq = 0
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    @property
    def stream_arn(self) -> str:
        return f"arn:aws:kinesis:us-east-1:{ACCOUNT}:stream/{self.stream}"

    def consumer_arn(self, name: str) -> str:
        return f"{self.stream_arn}/consumer/{name}:1700000000"

    def _add_shard(self, parent: str | None) -> str:
        shard_id = f"shardId-{len(self.shards):012d}"
        self.shards[shard_id] = _Shard(shard_id, parent)
        return shard_id

    # -- driving it ---------------------------------------------------------------------------

    async def put(self, shard_id: str, data: bytes, partition_key: str = "pk") -> str:
        shard = self.shards[shard_id]
        if shard.closed:
            raise ValueError(f"{shard_id} is closed")
        self._seq += 1
        seq = str(_BASE + self._seq * 1_000_003)
        shard.records.append(
            {
                "SequenceNumber": seq,
                "Data": base64.b64encode(data).decode(),
                "PartitionKey": partition_key,
                "ApproximateArrivalTimestamp": round(time.time(), 3),
            }
        )
        async with self._changed:
            self._changed.notify_all()
        return seq

    async def split(self, shard_id: str) -> tuple[str, str]:
        """Close ``shard_id`` and open two children."""
        parent = self.shards[shard_id]
        parent.closed = True
        parent.children = [self._add_shard(shard_id), self._add_shard(shard_id)]
        async with self._changed:
            self._changed.notify_all()
        return parent.children[0], parent.children[1]

    def fault(self, fault: Fault) -> None:
        """Apply ``fault`` to the next SubscribeToShard call (in order)."""
        self.faults.append(fault)

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- the API ------------------------------------------------------------------------------

    @staticmethod
    def _error(code: str, message: str, status: int = 400) -> web.Response:
        return web.Response(
            status=status,
            body=orjson.dumps({"__type": code, "message": message}),
            content_type="application/x-amz-json-1.1",
        )

    @staticmethod
    def _json(doc: Any) -> web.Response:
        return web.Response(body=orjson.dumps(doc), content_type="application/x-amz-json-1.1")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        op = request.headers.get("X-Amz-Target", "").rpartition(".")[2]
        body = orjson.loads(await request.read() or b"{}")
        if op == "SubscribeToShard":
            return await self._subscribe(request, body)
        if op == "DescribeStreamSummary":
            return self._json(
                {
                    "StreamDescriptionSummary": {
                        "StreamName": self.stream,
                        "StreamARN": self.stream_arn,
                        "StreamStatus": "ACTIVE",
                        "StreamCreationTimestamp": 1700000000,
                        "RetentionPeriodHours": 24,
                        "OpenShardCount": sum(not s.closed for s in self.shards.values()),
                        "EnhancedMonitoring": [],
                        "ConsumerCount": len(self.consumers),
                    }
                }
            )
        if op in ("DescribeStreamConsumer", "RegisterStreamConsumer", "DeregisterStreamConsumer"):
            return self._consumer_call(op, body)
        if op == "ListShards":
            return self._json({"Shards": [self._shard_doc(s) for s in self.shards.values()]})
        return self._error("UnknownOperationException", op)

    def _shard_doc(self, shard: _Shard) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "ShardId": shard.shard_id,
            "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": str(2**128 - 1)},
            "SequenceNumberRange": {"StartingSequenceNumber": str(_BASE)},
        }
        if shard.parent is not None:
            doc["ParentShardId"] = shard.parent
        return doc

    def _consumer_call(self, op: str, body: dict[str, Any]) -> web.Response:
        name = body.get("ConsumerName") or str(body.get("ConsumerARN", "")).split("/")[-1]
        name = name.split(":")[0]
        if op == "RegisterStreamConsumer":
            if name in self.consumers:
                return self._error("ResourceInUseException", f"consumer {name} exists")
            self.consumers[name] = "CREATING"
            status = "CREATING"
        elif name not in self.consumers:
            return self._error("ResourceNotFoundException", f"consumer {name} not found")
        elif op == "DeregisterStreamConsumer":
            del self.consumers[name]
            return self._json({})
        else:
            # One describe later the consumer is ACTIVE, as the service does after a while.
            status = self.consumers[name]
            self.consumers[name] = "ACTIVE"
        doc = {
            "ConsumerName": name,
            "ConsumerARN": self.consumer_arn(name),
            "ConsumerStatus": status,
            "ConsumerCreationTimestamp": 1700000000,
        }
        if op == "RegisterStreamConsumer":
            return self._json({"Consumer": doc})
        return self._json({"ConsumerDescription": {**doc, "StreamARN": self.stream_arn}})

    def _start_index(self, shard: _Shard, position: dict[str, Any]) -> int:
        kind = position.get("Type")
        if kind == "TRIM_HORIZON":
            return 0
        if kind == "LATEST":
            return len(shard.records)
        if kind == "AT_TIMESTAMP":
            ts = float(position["Timestamp"])
            return next(
                (i for i, r in enumerate(shard.records) if r["ApproximateArrivalTimestamp"] >= ts),
                len(shard.records),
            )
        seq = int(position["SequenceNumber"])
        after = kind == "AFTER_SEQUENCE_NUMBER"
        for i, r in enumerate(shard.records):
            n = int(r["SequenceNumber"])
            if n > seq or (n == seq and not after):
                return i
        return len(shard.records)

    async def _subscribe(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        shard_id = str(body.get("ShardId"))
        consumer = str(body.get("ConsumerARN", "")).split("/")[-1].split(":")[0]
        call = SubscribeCall(shard_id, dict(body.get("StartingPosition", {})))
        self.calls.append(call)
        fault = self.faults.pop(0) if self.faults else Fault()
        error = fault.error
        if error is None and consumer not in self.consumers:
            error = "ResourceNotFoundException"
        if error is None and shard_id not in self.shards:
            error = "ResourceNotFoundException"
        if error is None and (consumer, shard_id) in self.active:
            error = "ResourceInUseException"
        if error is not None:
            call.answered = error
            return self._error(error, f"SubscribeToShard {shard_id}: {error}")
        key = (consumer, shard_id)
        self.active.add(key)
        try:
            return await self._stream(request, self.shards[shard_id], call, fault)
        except ConnectionError:
            return web.Response()  # the subscriber went away; nothing more to send
        finally:
            self.active.discard(key)

    async def _stream(
        self, request: web.Request, shard: _Shard, call: SubscribeCall, fault: Fault
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/vnd.amazon.eventstream"})
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        await resp.write(INITIAL_RESPONSE)
        index = self._start_index(shard, call.position)
        loop = asyncio.get_running_loop()
        ends = loop.time() + self.lifetime
        last_seq: str | None = shard.records[index - 1]["SequenceNumber"] if index else None
        if last_seq is None:
            last_seq = call.position.get("SequenceNumber", str(_BASE))
        async for _ in self._ticks(ends):
            if fault.drop_after is not None and call.events >= fault.drop_after:
                frame = event_message("SubscribeToShardEvent", {"Records": []})
                await resp.write(frame[: len(frame) // 2])
                assert request.transport is not None
                request.transport.abort()
                return resp
            if fault.corrupt_after is not None and call.events >= fault.corrupt_after:
                damaged = bytearray(event_message("SubscribeToShardEvent", {"Records": []}))
                damaged[-6] ^= 0xFF
                await resp.write(bytes(damaged))
                break
            if fault.exception_after is not None and call.events >= fault.exception_after:
                await resp.write(exception_message(fault.exception_code, "injected"))
                break
            records = shard.records[index : index + self.batch]
            index += len(records)
            if records:
                last_seq = records[-1]["SequenceNumber"]
            done = shard.closed and index >= len(shard.records)
            event: dict[str, Any] = {
                "Records": records,
                "ContinuationSequenceNumber": None if done else last_seq,
                "MillisBehindLatest": 0 if index >= len(shard.records) else 1000,
            }
            if done:
                event["ChildShards"] = [
                    {
                        "ShardId": child,
                        "ParentShards": [shard.shard_id],
                        "HashKeyRange": {"StartingHashKey": "0", "EndingHashKey": "1"},
                    }
                    for child in shard.children
                ]
            await resp.write(event_message("SubscribeToShardEvent", event))
            call.events += 1
            if done:
                break
            if index < len(shard.records):
                continue  # more to send right away
            await self._wait_for_change(min(self.heartbeat, max(0.0, ends - loop.time())))
        await resp.write_eof()
        return resp

    async def _ticks(self, ends: float) -> AsyncIterator[None]:
        loop = asyncio.get_running_loop()
        while loop.time() < ends:
            yield None

    async def _wait_for_change(self, timeout: float) -> None:
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):  # not wait_for: on 3.11 it can lose a cancel
                    await self._changed.wait()
