"""A Kinesis stand-in for the scale benchmark: one stream of N shards, answered from memory with
the service's JSON wire format (the client path above it, botocore's parser included, runs as
against AWS), in a process of its own so its CPU is not the worker's.

    python benchmarks/fake_kinesis.py PORT STREAM SHARDS RATE

Each shard carries RATE records per second from the moment the server starts (0: an idle
stream): a record's sequence number is its index in the shard, so GetRecords hands out, from an
iterator's position, every record that has "arrived" by now (at most ``Limit``), and reports
``MillisBehindLatest`` 0. Answers DescribeStreamSummary, ListShards, GetShardIterator (every
type: TRIM_HORIZON, LATEST, AT/AFTER_SEQUENCE_NUMBER, AT_TIMESTAMP as TRIM_HORIZON) and
GetRecords; anything else is a 400 with the service's error shape. Made for measuring, not for
correctness tests: the emulators serve those.
"""

from __future__ import annotations

import base64
import sys
import time
from typing import Any

import orjson
from aiohttp import web

HASH_SPACE = 2**128


class Stream:
    def __init__(self, name: str, shards: int, rate: float) -> None:
        self.name = name
        self.rate = rate
        self.start = time.time()
        self.arn = f"arn:aws:kinesis:us-east-1:123456789012:stream/{name}"
        step = HASH_SPACE // shards
        self.shards = [
            {
                "ShardId": f"shardId-{i:012d}",
                "HashKeyRange": {
                    "StartingHashKey": str(i * step),
                    "EndingHashKey": str(HASH_SPACE - 1 if i == shards - 1 else (i + 1) * step - 1),
                },
                "SequenceNumberRange": {"StartingSequenceNumber": "1"},
            }
            for i in range(shards)
        ]
        self.index = {s["ShardId"]: i for i, s in enumerate(self.shards)}
        self.payload = base64.b64encode(b'{"n": 0}').decode()

    def arrived(self, now: float) -> int:
        """Records each shard holds by ``now`` (sequence numbers 1..n)."""
        return int(self.rate * (now - self.start))


def _error(kind: str, message: str, status: int = 400) -> web.Response:
    body = orjson.dumps({"__type": kind, "message": message})
    return web.Response(body=body, status=status, content_type="application/x-amz-json-1.1")


def _ok(payload: dict[str, Any]) -> web.Response:
    return web.Response(body=orjson.dumps(payload), content_type="application/x-amz-json-1.1")


def make_app(stream: Stream) -> web.Application:
    async def handle(request: web.Request) -> web.Response:
        op = request.headers.get("X-Amz-Target", "").rpartition(".")[2]
        body = orjson.loads(await request.read() or b"{}")
        if op == "DescribeStreamSummary":
            return _ok(
                {
                    "StreamDescriptionSummary": {
                        "StreamName": stream.name,
                        "StreamARN": stream.arn,
                        "StreamStatus": "ACTIVE",
                        "RetentionPeriodHours": 24,
                        "StreamCreationTimestamp": stream.start,
                        "EnhancedMonitoring": [],
                        "OpenShardCount": len(stream.shards),
                        "ConsumerCount": 0,
                    }
                }
            )
        if op == "ListShards":
            return _ok({"Shards": stream.shards})
        if op == "GetShardIterator":
            shard = body.get("ShardId", "")
            if shard not in stream.index:
                return _error("ResourceNotFoundException", f"shard {shard} not found")
            kind = body.get("ShardIteratorType")
            if kind == "LATEST":
                position = stream.arrived(time.time())
            elif kind == "AT_SEQUENCE_NUMBER":
                position = int(body["StartingSequenceNumber"]) - 1
            elif kind == "AFTER_SEQUENCE_NUMBER":
                position = int(body["StartingSequenceNumber"])
            else:
                position = 0
            return _ok({"ShardIterator": f"{shard}/{position}"})
        if op == "GetRecords":
            shard, _, position_text = str(body.get("ShardIterator", "")).partition("/")
            if shard not in stream.index:
                return _error("InvalidArgumentException", "bad iterator")
            position = int(position_text)
            now = time.time()
            end = min(stream.arrived(now), position + int(body.get("Limit", 10_000)))
            records = [
                {
                    "SequenceNumber": str(seq),
                    "ApproximateArrivalTimestamp": stream.start + (seq - 1) / stream.rate,
                    "Data": stream.payload,
                    "PartitionKey": str(seq),
                }
                for seq in range(position + 1, end + 1)
            ]
            return _ok(
                {
                    "Records": records,
                    "NextShardIterator": f"{shard}/{max(end, position)}",
                    "MillisBehindLatest": 0,
                }
            )
        return _error("UnknownOperationException", f"{op} is not served here")

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/", handle)
    return app


def main() -> None:
    port, name, shards, rate = sys.argv[1:5]
    stream = Stream(name, int(shards), float(rate))
    web.run_app(make_app(stream), host="127.0.0.1", port=int(port), print=None, access_log=None)


if __name__ == "__main__":
    main()
