"""``StreamClient`` over in-memory streams, with producer and resharding helpers.

Owns: ``MemoryStreamClient`` and its opaque, expiring shard iterators.
Must not: hold stream state (``stream.MemoryStream`` does) or read any clock but the loop's.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import datetime

import attrs

from kclasync._adapters.memory.faults import FaultPlan, with_faults
from kclasync._adapters.memory.stream import DEFAULT_EPOCH, MemoryStream, loop_time
from kclasync._adapters.protocols import (
    ExpiredIteratorError,
    GetRecordsResult,
    IteratorType,
    ShardFilter,
    ShardNotFoundError,
    StartingPosition,
)
from kclasync._core.lineage.shard import Shard
from kclasync._core.lineage.streams import StreamIdentity
from kclasync.errors import StreamNotFoundError

#: The account id in-memory streams report (``describe_stream``), as kinesis-local's default.
MEMORY_ACCOUNT_ID = "000000000000"
DEFAULT_ITERATOR_TTL = 300.0
MAX_GET_RECORDS_LIMIT = 10_000
_ITERATOR_PREFIX = "memit"


@attrs.frozen
class _Iterator:
    stream: str
    shard_id: str
    #: The first sequence number the iterator may return.
    start: int
    #: Records that arrived earlier are skipped (AT_TIMESTAMP); loop time.
    min_arrival: float | None
    created: float

    def encode(self) -> str:
        min_arrival = "" if self.min_arrival is None else repr(self.min_arrival)
        return (
            f"{_ITERATOR_PREFIX}|{self.stream}|{self.shard_id}|{self.start}|{min_arrival}"
            f"|{self.created!r}"
        )

    @classmethod
    def decode(cls, token: str) -> _Iterator:
        head, sep, rest = token.partition("|")
        parts = rest.rsplit("|", 4)
        if head != _ITERATOR_PREFIX or not sep or len(parts) != 5:
            raise ValueError(f"not a shard iterator: {token!r}")
        stream, shard_id, start, min_arrival, created = parts
        try:
            return cls(
                stream,
                shard_id,
                int(start),
                float(min_arrival) if min_arrival else None,
                float(created),
            )
        except ValueError:
            raise ValueError(f"not a shard iterator: {token!r}") from None


class MemoryStreamClient:
    """``StreamClient`` over ``MemoryStream`` values, plus producer and resharding helpers.

    Iterators are opaque strings that expire ``iterator_ttl`` seconds (loop time) after they were
    issued. ``get_records`` returns ``next_iterator=None`` and the child shards in the same call
    that delivers the last records of a closed shard (or, once read, on any later call).
    Faults (operation names ``list_shards``, ``get_shard_iterator``, ``get_records``) come from
    ``faults``; the producer and resharding helpers are synchronous and never fault.
    """

    def __init__(
        self,
        streams: Iterable[MemoryStream] = (),
        *,
        faults: FaultPlan | None = None,
        iterator_ttl: float = DEFAULT_ITERATOR_TTL,
    ) -> None:
        self.streams: dict[str, MemoryStream] = {}
        for stream in streams:
            self.add_stream(stream)
        self.faults = faults
        self.iterator_ttl = iterator_ttl
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.records_returned = 0
        #: (stream, shard) -> the last iterator issued for it, and its token: the next call
        #: almost always brings that token back, which then needs no parsing.
        self._issued: dict[tuple[str, str], tuple[str, _Iterator]] = {}
        #: The loop clock its iterators are stamped and judged by (a subclass that lives in
        #: one loop may bind that loop's ``time``).
        self.now: Callable[[], float] = loop_time

    # -- streams and producers -------------------------------------------------------------

    def add_stream(self, stream: MemoryStream) -> MemoryStream:
        if stream.name in self.streams:
            raise ValueError(f"stream {stream.name!r} already exists")
        self.streams[stream.name] = stream
        return stream

    def create_stream(
        self, name: str, shard_count: int = 1, *, epoch: datetime = DEFAULT_EPOCH
    ) -> MemoryStream:
        self.writes["create_stream"] += 1
        return self.add_stream(MemoryStream(name, shard_count, epoch=epoch))

    def stream(self, name: str) -> MemoryStream:
        found = self.streams.get(name)
        if found is None:
            raise StreamNotFoundError(name)
        return found

    def put_record(
        self,
        stream: str,
        partition_key: str,
        data: bytes,
        explicit_hash_key: int | str | None = None,
    ) -> tuple[str, str]:
        self.writes["put_record"] += 1
        return self.stream(stream).put_record(partition_key, data, explicit_hash_key)

    def split_shard(
        self, stream: str, shard_id: str, new_starting_hash_key: int | str
    ) -> tuple[str, str]:
        self.writes["split_shard"] += 1
        return self.stream(stream).split_shard(shard_id, new_starting_hash_key)

    def merge_shards(self, stream: str, shard_id: str, adjacent_shard_id: str) -> str:
        self.writes["merge_shards"] += 1
        return self.stream(stream).merge_shards(shard_id, adjacent_shard_id)

    # -- StreamClient ----------------------------------------------------------------------

    def _shard_stream(self, stream: str, shard_id: str) -> MemoryStream:
        found = self.streams.get(stream)
        if found is None:
            raise ShardNotFoundError(f"stream {stream!r} does not exist (shard {shard_id})")
        return found

    async def describe_stream(self, stream: str) -> StreamIdentity:
        self.reads["describe_stream"] += 1

        def apply() -> StreamIdentity:
            found = self.stream(stream)
            return StreamIdentity(MEMORY_ACCOUNT_ID, found.name, int(found.epoch.timestamp()))

        return await with_faults(self.faults, "describe_stream", apply)

    async def list_shards(
        self, stream: str, shard_filter: ShardFilter | None = None
    ) -> list[Shard]:
        self.reads["list_shards"] += 1
        return await with_faults(
            self.faults, "list_shards", lambda: self.stream(stream).list_shards(shard_filter)
        )

    async def get_shard_iterator(
        self, stream: str, shard_id: str, position: StartingPosition
    ) -> str:
        self.reads["get_shard_iterator"] += 1

        def apply() -> str:
            found = self._shard_stream(stream, shard_id)
            found._state(shard_id)  # raises ShardNotFoundError
            min_arrival = None
            if position.type is IteratorType.AT_TIMESTAMP:
                assert position.timestamp is not None  # StartingPosition guarantees it
                min_arrival = found.to_loop_time(position.timestamp)
            start = found._iterator_start(position)
            return self._issue(_Iterator(stream, shard_id, start, min_arrival, self.now()))

        return await with_faults(self.faults, "get_shard_iterator", apply)

    async def get_records(
        self, stream: str, shard_id: str, iterator: str, limit: int
    ) -> GetRecordsResult:
        self.reads["get_records"] += 1
        if not 1 <= limit <= MAX_GET_RECORDS_LIMIT:
            raise ValueError(f"limit must be in 1..{MAX_GET_RECORDS_LIMIT}, not {limit}")

        def apply() -> GetRecordsResult:
            it = self._parse(stream, shard_id, iterator)
            if it.stream != stream or it.shard_id != shard_id:
                raise ValueError(
                    f"iterator is for {it.stream}/{it.shard_id}, not {stream}/{shard_id}"
                )
            found = self._shard_stream(stream, shard_id)
            state = found._state(shard_id)
            now = self.now()
            if now - it.created > self.iterator_ttl:
                raise ExpiredIteratorError(
                    f"iterator for {stream}/{shard_id} is {now - it.created:.1f}s old"
                )
            first = bisect.bisect_left(state.sequences, it.start)
            if it.min_arrival is not None:
                first = max(first, bisect.bisect_left(state.arrivals, it.min_arrival))
            last = min(first + limit, len(state.records))
            batch = state.records[first:last]
            self.records_returned += len(batch)
            behind = 0
            if last < len(state.records):
                behind = max(0, int((now - state.arrivals[last]) * 1000))
            if not state.shard.is_open and last == len(state.records):
                return GetRecordsResult(batch, None, behind, found.children(shard_id))
            start = state.sequences[last - 1] + 1 if batch else it.start
            next_it = self._issue(_Iterator(stream, shard_id, start, it.min_arrival, now))
            return GetRecordsResult(batch, next_it, behind)

        return await with_faults(self.faults, "get_records", apply)

    def _issue(self, it: _Iterator) -> str:
        token = it.encode()
        self._issued[(it.stream, it.shard_id)] = (token, it)
        return token

    def _parse(self, stream: str, shard_id: str, token: str) -> _Iterator:
        """The iterator a token stands for (the last one issued for the shard, or parsed)."""
        issued = self._issued.get((stream, shard_id))
        if issued is not None and issued[0] == token:
            return issued[1]
        return _Iterator.decode(token)
