"""The Kinesis limits production hits, enforced by the fault proxy on the emulators.

Per shard (``Limits``, the service's documented defaults):

* GetRecords: 5 calls per second, and 2 MB per second of record data read; a call that reads
  more than the shard's allowance leaves it in debt, and the calls that follow are throttled
  until it is paid back (the service: "if a call returns 10 MB, subsequent calls made within
  the next 5 seconds throw ProvisionedThroughputExceededException");
* PutRecords / PutRecord: 1,000 records and 1 MB (data plus partition key) per second. A
  PutRecords entry over the limit fails on its own (``ErrorCode``
  ProvisionedThroughputExceededException, counted in ``FailedRecordCount``) and the others are
  written; PutRecord over the limit is a 400 answer;
* a shard iterator expires ``iterator_lifetime`` seconds after it was issued (300 s; a test can
  make it a few seconds): GetRecords on it is answered ExpiredIteratorException;
* SubscribeToShard, per consumer and shard: within ``subscribe_interval`` (5 s) of the last
  successful call, ResourceInUseException; a call less than a second after the last call,
  LimitExceededException (the service's documented answers).

Each allowance is a token bucket holding one second's worth, refilled continuously. Iterators
are followed by reading the GetShardIterator and GetRecords answers (which shard each iterator
belongs to, and when it was issued); an iterator issued before the proxy saw it is not limited.
A record's shard is found as the service does: the MD5 of its partition key (or its explicit
hash key) in the hash-key ranges of the stream's open shards (``ListShards`` through
``lister``, cached for a second).

Owns: the limits and the answers they give. Must not: be used by the library's normal path.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import orjson

from kclasync.testing.aws_errors import KINESIS, error_answer

Answer = tuple[int, dict[str, str], bytes]
#: (shard id, first hash key, last hash key) of each open shard of a stream.
ShardRanges = list[tuple[str, int, int]]
MB = 1024 * 1024
_SHARDS_TTL = 1.0
_LIMITED = frozenset(
    {"GetRecords", "GetShardIterator", "PutRecords", "PutRecord", "SubscribeToShard"}
)


@attrs.frozen
class Limits:
    get_records_per_second: float = 5.0
    read_bytes_per_second: float = 2 * MB
    put_records_per_second: float = 1000.0
    put_bytes_per_second: float = 1 * MB
    iterator_lifetime: float = 300.0
    subscribe_interval: float = 5.0


class _Bucket:
    def __init__(self, rate: float, now: float) -> None:
        self.rate = rate
        self.level = rate  # one second's worth
        self.at = now

    def refill(self, now: float) -> float:
        self.level = min(self.rate, self.level + (now - self.at) * self.rate)
        self.at = now
        return self.level


@attrs.frozen
class Decision:
    """What ``before`` decided: an ``answer`` to send instead of forwarding, or forward (with
    ``body`` in place of the request's when set); what ``after`` needs to finish (for
    SubscribeToShard, ``stream`` and ``shard`` hold the consumer ARN and the shard)."""

    operation: str
    answer: Answer | None = None
    body: bytes | None = None
    stream: str = ""
    shard: str | None = None
    #: PutRecords: (index in the request, error message) of the entries refused here.
    refused: tuple[tuple[int, str], ...] = ()
    total: int = 0


def _stream_name(doc: dict[str, Any]) -> str:
    if "StreamName" in doc:
        return str(doc["StreamName"])
    arn = str(doc.get("StreamARN") or doc.get("ConsumerARN") or "")
    return arn.split(":stream/")[-1].split("/")[0]


def _data_size(encoded: object) -> int:
    return len(base64.b64decode(encoded)) if isinstance(encoded, str) else 0


def _hash_key(entry: dict[str, Any]) -> int:
    if entry.get("ExplicitHashKey"):
        return int(entry["ExplicitHashKey"])
    return int(hashlib.md5(str(entry["PartitionKey"]).encode()).hexdigest(), 16)


class ServiceLimits:
    """The limits' state (buckets, iterators, subscriptions) and what they answered."""

    def __init__(
        self, limits: Limits | None = None, clock: Callable[[], float] | None = None
    ) -> None:
        self.limits = limits or Limits()
        #: Where the limits read the time: the running loop's clock unless a test gives its
        #: own (a clock the test moves makes the buckets' answers independent of how fast
        #: the machine sends the requests).
        self._clock = clock
        #: Limit answers given, by limit: get_records_rate, get_records_bytes, put_records
        #: (entries refused), put_record, expired_iterator, subscribe_in_use, subscribe_rate.
        self.answers: Counter[str] = Counter()
        #: (loop time, limit, count) of every limit answer.
        self.timeline: list[tuple[float, str, int]] = []
        #: Requests seen, by operation; ``untracked``: GetRecords on an unknown iterator.
        self.calls: Counter[str] = Counter()
        #: Lists a stream's open shards (set by the proxy that enforces these limits).
        self.lister: Callable[[str], Awaitable[ShardRanges]] | None = None
        self._iterators: dict[str, tuple[str, str, float]] = {}
        self._buckets: dict[tuple[str, str, str], _Bucket] = {}
        self._subscribed: dict[tuple[str, str], float] = {}
        self._subscribe_attempts: dict[tuple[str, str], float] = {}
        self._shards: dict[str, tuple[float, ShardRanges]] = {}

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    def _note(self, kind: str, now: float, count: int = 1) -> None:
        self.answers[kind] += count
        self.timeline.append((now, kind, count))

    def throttled_since(self, since: float) -> Counter[str]:
        """Limit answers given from loop time ``since`` on, by limit."""
        out: Counter[str] = Counter()
        for at, kind, count in self.timeline:
            if at >= since:
                out[kind] += count
        return out

    @property
    def throttled(self) -> int:
        """Throttling answers given (entries refused included); expired iterators aside."""
        return sum(n for k, n in self.answers.items() if k != "expired_iterator")

    def _bucket(self, kind: str, stream: str, shard: str, now: float) -> _Bucket:
        key = (kind, stream, shard)
        bucket = self._buckets.get(key)
        if bucket is None:
            rate = {
                "reads": self.limits.get_records_per_second,
                "read_bytes": self.limits.read_bytes_per_second,
                "puts": self.limits.put_records_per_second,
                "put_bytes": self.limits.put_bytes_per_second,
            }[kind]
            bucket = self._buckets[key] = _Bucket(rate, now)
        bucket.refill(now)
        return bucket

    async def before(self, operation: str, body: bytes) -> Decision:
        self.calls[operation] += 1
        now = self._now()
        if operation not in _LIMITED:
            return Decision(operation)
        doc = orjson.loads(body)
        if operation == "GetShardIterator":
            return Decision(operation, stream=_stream_name(doc), shard=str(doc.get("ShardId")))
        if operation == "GetRecords":
            return self._get_records(doc, now)
        if operation == "SubscribeToShard":
            return self._subscribe(doc, now)
        stream = _stream_name(doc)
        ranges = await self._ranges(stream, now)
        if operation == "PutRecord":
            shard = self._shard_of(doc, ranges)
            if shard is not None and not self._admit_put(stream, shard, doc, now):
                self._note("put_record", now)
                return Decision(operation, answer=_throttled(stream, shard))
            return Decision(operation)
        entries = list(doc.get("Records") or ())
        kept, refused = [], []
        for index, entry in enumerate(entries):
            shard = self._shard_of(entry, ranges)
            if shard is None or self._admit_put(stream, shard, entry, now):
                kept.append(entry)
            else:
                refused.append((index, _message(stream, shard)))
        if not refused:
            return Decision(operation)
        self._note("put_records", now, len(refused))
        if not kept:
            answer = _put_records_answer([], tuple(refused), len(entries))
            return Decision(operation, answer=(200, _JSON, answer))
        new_body = orjson.dumps({**doc, "Records": kept})
        return Decision(
            operation, body=new_body, stream=stream, refused=tuple(refused), total=len(entries)
        )

    def _get_records(self, doc: dict[str, Any], now: float) -> Decision:
        known = self._iterators.get(str(doc.get("ShardIterator")))
        if known is None:
            self.calls["untracked"] += 1
            return Decision("GetRecords")
        stream, shard, issued = known
        if now - issued > self.limits.iterator_lifetime:
            self._note("expired_iterator", now)
            wall = time.time()
            answer = error_answer(
                KINESIS,
                "ExpiredIteratorException",
                created=time.ctime(wall - (now - issued)),
                now=time.ctime(wall),
                tolerated=str(round(self.limits.iterator_lifetime * 1000)),
            )
            return Decision("GetRecords", answer=answer)
        reads = self._bucket("reads", stream, shard, now)
        if reads.level < 1:
            self._note("get_records_rate", now)
            return Decision("GetRecords", answer=_throttled(stream, shard))
        if self._bucket("read_bytes", stream, shard, now).level < 0:
            self._note("get_records_bytes", now)
            return Decision("GetRecords", answer=_throttled(stream, shard))
        reads.level -= 1
        return Decision("GetRecords", stream=stream, shard=shard)

    def _subscribe(self, doc: dict[str, Any], now: float) -> Decision:
        key = (str(doc.get("ConsumerARN")), str(doc.get("ShardId")))
        stream = _stream_name(doc)
        attempted = self._subscribe_attempts.get(key)
        self._subscribe_attempts[key] = now
        if attempted is not None and now - attempted < 1.0:
            self._note("subscribe_rate", now)
            answer = error_answer(KINESIS, "LimitExceededException", stream=stream)
            return Decision("SubscribeToShard", answer=answer)
        last = self._subscribed.get(key)
        if last is not None and now - last < self.limits.subscribe_interval:
            self._note("subscribe_in_use", now)
            answer = error_answer(KINESIS, "ResourceInUseException", consumer=key[0], shard=key[1])
            return Decision("SubscribeToShard", answer=answer)
        return Decision("SubscribeToShard", stream=key[0], shard=key[1])

    def _admit_put(self, stream: str, shard: str, entry: dict[str, Any], now: float) -> bool:
        size = _data_size(entry.get("Data")) + len(str(entry.get("PartitionKey", "")).encode())
        puts = self._bucket("puts", stream, shard, now)
        put_bytes = self._bucket("put_bytes", stream, shard, now)
        if puts.level < 1 or put_bytes.level < size:
            return False
        puts.level -= 1
        put_bytes.level -= size
        return True

    async def _ranges(self, stream: str, now: float) -> ShardRanges:
        cached = self._shards.get(stream)
        if cached is not None and now - cached[0] < _SHARDS_TTL:
            return cached[1]
        ranges = await self.lister(stream) if self.lister is not None else []
        self._shards[stream] = (now, ranges)
        return ranges

    @staticmethod
    def _shard_of(entry: dict[str, Any], ranges: ShardRanges) -> str | None:
        key = _hash_key(entry)
        for shard, low, high in ranges:
            if low <= key <= high:
                return shard
        return None

    def after(self, decision: Decision, status: int, body: bytes) -> bytes:
        """Follow iterators and charge bytes read; put the refused PutRecords entries back in
        the answer. Returns the answer to send."""
        if status != 200 or decision.answer is not None:
            return body
        now = self._now()
        op = decision.operation
        if op == "GetShardIterator" and decision.shard is not None:
            iterator = orjson.loads(body).get("ShardIterator")
            if iterator:
                self._follow(iterator, decision.stream, decision.shard, now)
        elif op == "GetRecords" and decision.shard is not None:
            doc = orjson.loads(body)
            read = sum(_data_size(r.get("Data")) for r in doc.get("Records") or ())
            self._bucket("read_bytes", decision.stream, decision.shard, now).level -= read
            following = doc.get("NextShardIterator")
            if following:
                self._follow(following, decision.stream, decision.shard, now)
        elif op == "SubscribeToShard" and decision.shard is not None:
            self._subscribed[(decision.stream, decision.shard)] = now  # the service accepted it
        elif op == "PutRecords" and decision.refused:
            written = list(orjson.loads(body).get("Records") or ())
            return _put_records_answer(written, decision.refused, decision.total)
        return body

    def _follow(self, iterator: str, stream: str, shard: str, now: float) -> None:
        self._iterators[iterator] = (stream, shard, now)
        if len(self._iterators) > 200_000:  # a long soak: forget the oldest half
            for key in list(self._iterators)[:100_000]:
                del self._iterators[key]


_JSON = {"Content-Type": "application/x-amz-json-1.1"}


def _message(stream: str, shard: str | None) -> str:
    return f"Rate exceeded for shard {shard} in stream {stream} under account 123456789012."


def _throttled(stream: str, shard: str) -> Answer:
    return error_answer(
        KINESIS, "ProvisionedThroughputExceededException", stream=stream, shard=shard
    )


def _put_records_answer(
    written: list[Any], refused: tuple[tuple[int, str], ...], total: int
) -> bytes:
    """The PutRecords answer for ``total`` entries: the ``refused`` ones (index, message) at
    their places, the upstream's ``written`` entries, in order, at the others."""
    refused_at = dict(refused)
    upstream = iter(written)
    out: list[dict[str, Any]] = []
    for index in range(total):
        if index in refused_at:
            out.append(
                {
                    "ErrorCode": "ProvisionedThroughputExceededException",
                    "ErrorMessage": refused_at[index],
                }
            )
        else:
            out.append(next(upstream))
    failed = sum(1 for e in out if "ErrorCode" in e)
    return orjson.dumps({"FailedRecordCount": failed, "Records": out})
