"""One in-memory Kinesis stream: shards, their records, splits and merges.

Owns: ``MemoryStream`` (sequence numbers, arrival times on the loop clock, hash-key routing,
resharding, retention) and ``partition_key_hash``.
Must not: fault, count calls or speak the ``StreamClient`` interface (``stream_client`` does).
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

import attrs

from kclasync._adapters.protocols import (
    ChildShard,
    IteratorType,
    ShardFilter,
    ShardFilterType,
    ShardNotFoundError,
    StartingPosition,
)
from kclasync._core.lineage.shard import MAX_HASH_KEY, HashRange, Shard
from kclasync._records import Record

DEFAULT_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
_FIRST_SEQUENCE = 10**20  # 21-digit sequence numbers: string order matches numeric order


def _shard_name(number: int) -> str:
    return f"shardId-{number:012d}"


def _shard_number(shard_id: str) -> int | None:
    head, _, digits = shard_id.partition("-")
    return int(digits) if head == "shardId" and digits.isdigit() else None


def partition_key_hash(partition_key: str) -> int:
    """The 128-bit hash key Kinesis derives from a partition key (MD5, as an integer)."""
    return int(hashlib.md5(partition_key.encode("utf-8")).hexdigest(), 16)


def loop_time() -> float:
    return asyncio.get_running_loop().time()


@attrs.define
class _ShardState:
    shard: Shard
    #: Loop times; None for "since the stream began" / "still open".
    opened_at: float | None = None
    closed_at: float | None = None
    records: list[Record] = attrs.field(factory=list)
    sequences: list[int] = attrs.field(factory=list)
    arrivals: list[float] = attrs.field(factory=list)


class MemoryStream:
    """One stream: shards, their records, resharding.

    Sequence numbers are decimal strings increasing across the whole stream. Arrival times are
    ``epoch + loop.time()`` seconds. A closed shard's ``ending_sequence`` is a number allocated at
    closing (larger than every record it holds); its children start after it.
    """

    def __init__(self, name: str, shard_count: int = 1, *, epoch: datetime = DEFAULT_EPOCH) -> None:
        if shard_count < 1:
            raise ValueError("a stream needs at least one shard")
        self.name = name
        self.epoch = aware(epoch)
        self._shards: dict[str, _ShardState] = {}
        self._next_sequence = _FIRST_SEQUENCE
        self._next_shard_number = 0
        self._open_cache: tuple[list[int], list[_ShardState]] | None = None
        width = (MAX_HASH_KEY + 1) // shard_count
        for i in range(shard_count):
            end = MAX_HASH_KEY if i == shard_count - 1 else (i + 1) * width - 1
            self._add_shard(HashRange(i * width, end), (), None)

    @classmethod
    def from_shards(
        cls, name: str, shards: Iterable[Shard], *, epoch: datetime = DEFAULT_EPOCH
    ) -> MemoryStream:
        """A stream with exactly these shards (e.g. a lineage graph for shard-sync tests).

        Closed shards hold no records and count as closed at ``epoch``; shards with parents as
        opened then. New sequence numbers and shard ids continue above those given.
        """
        stream = cls.__new__(cls)
        stream.name = name
        stream.epoch = aware(epoch)
        stream._shards = {}
        stream._open_cache = None
        top_sequence = _FIRST_SEQUENCE - 1
        top_number = -1
        for shard in shards:
            if shard.shard_id in stream._shards:
                raise ValueError(f"duplicate shard {shard.shard_id}")
            stream._shards[shard.shard_id] = _ShardState(
                shard,
                opened_at=0.0 if shard.parent_ids else None,
                closed_at=None if shard.is_open else 0.0,
            )
            for seq in (shard.starting_sequence, shard.ending_sequence):
                if seq is not None:
                    top_sequence = max(top_sequence, int(seq))
            number = _shard_number(shard.shard_id)
            if number is not None:
                top_number = max(top_number, number)
        if not stream._shards:
            raise ValueError("a stream needs at least one shard")
        stream._next_sequence = top_sequence + 1
        stream._next_shard_number = top_number + 1
        return stream

    # -- views -----------------------------------------------------------------------------

    @property
    def shards(self) -> list[Shard]:
        """Every shard, in creation order."""
        return [s.shard for s in self._shards.values()]

    def shard(self, shard_id: str) -> Shard:
        return self._state(shard_id).shard

    def record_count(self, shard_id: str) -> int:
        return len(self._state(shard_id).records)

    def record_index(self, shard_id: str, sequence_number: str) -> int:
        """The position of a record in its shard (0 = first), found by sequence number."""
        state = self._state(shard_id)
        index = bisect.bisect_left(state.sequences, int(sequence_number))
        if index == len(state.sequences) or state.sequences[index] != int(sequence_number):
            raise KeyError(f"shard {shard_id} has no record {sequence_number}")
        return index

    def _open_shard_for(self, hash_key: int) -> _ShardState:
        """The open shard whose hash range holds ``hash_key`` (bisect over a cached index)."""
        if self._open_cache is None:
            ordered = sorted(
                (s for s in self._shards.values() if s.shard.is_open),
                key=lambda s: s.shard.hash_range.start,
            )
            self._open_cache = ([s.shard.hash_range.start for s in ordered], ordered)
        starts, states = self._open_cache
        index = bisect.bisect_right(starts, hash_key) - 1
        if index >= 0 and hash_key <= states[index].shard.hash_range.end:
            return states[index]
        raise ValueError(f"no open shard of {self.name!r} covers hash key {hash_key}")

    def records(self, shard_id: str) -> list[Record]:
        """Every record stored in a shard (for assertions)."""
        return list(self._state(shard_id).records)

    def children(self, shard_id: str) -> tuple[ChildShard, ...]:
        return tuple(
            ChildShard(s.shard.shard_id, s.shard.parent_ids, s.shard.hash_range)
            for s in self._shards.values()
            if shard_id in s.shard.parent_ids
        )

    def to_datetime(self, loop_time: float) -> datetime:
        return self.epoch + timedelta(seconds=loop_time)

    def to_loop_time(self, when: datetime) -> float:
        return (aware(when) - self.epoch).total_seconds()

    def _state(self, shard_id: str) -> _ShardState:
        state = self._shards.get(shard_id)
        if state is None:
            raise ShardNotFoundError(f"stream {self.name!r} has no shard {shard_id!r}")
        return state

    def _open_state(self, shard_id: str) -> _ShardState:
        state = self._state(shard_id)
        if not state.shard.is_open:
            raise ValueError(f"shard {shard_id} of stream {self.name!r} is closed")
        return state

    def _add_shard(
        self, hash_range: HashRange, parents: tuple[str, ...], opened_at: float | None
    ) -> str:
        shard_id = _shard_name(self._next_shard_number)
        self._next_shard_number += 1
        self._open_cache = None
        shard = Shard(
            shard_id,
            parent_shard_id=parents[0] if parents else None,
            adjacent_parent_shard_id=parents[1] if len(parents) > 1 else None,
            hash_range=hash_range,
            starting_sequence=str(self._next_sequence),
        )
        self._shards[shard_id] = _ShardState(shard, opened_at=opened_at)
        return shard_id

    def _close(self, states: Iterable[_ShardState], now: float) -> None:
        ending = str(self._next_sequence)
        self._next_sequence += 1
        self._open_cache = None
        for state in states:
            state.shard = attrs.evolve(state.shard, ending_sequence=ending)
            state.closed_at = now

    # -- writes ----------------------------------------------------------------------------

    def put_record(
        self, partition_key: str, data: bytes, explicit_hash_key: int | str | None = None
    ) -> tuple[str, str]:
        """Append a record to the open shard owning its hash key; (shard id, sequence number)."""
        if explicit_hash_key is None:
            hash_key = partition_key_hash(partition_key)
        else:
            hash_key = int(explicit_hash_key)
            if not 0 <= hash_key <= MAX_HASH_KEY:
                raise ValueError(f"explicit hash key {explicit_hash_key} is out of range")
        state = self._open_shard_for(hash_key)
        now = loop_time()
        sequence = self._next_sequence
        self._next_sequence += 1
        record = Record(
            data=bytes(data),
            partition_key=partition_key,
            sequence_number=str(sequence),
            shard_id=state.shard.shard_id,
            approximate_arrival=self.to_datetime(now),
            stream=self.name,
        )
        state.records.append(record)
        state.sequences.append(sequence)
        state.arrivals.append(now)
        return state.shard.shard_id, record.sequence_number

    def split_shard(self, shard_id: str, new_starting_hash_key: int | str) -> tuple[str, str]:
        """Close ``shard_id`` and open two children split at the key; returns their ids."""
        state = self._open_state(shard_id)
        key = int(new_starting_hash_key)
        rng = state.shard.hash_range
        if not rng.start < key <= rng.end:
            raise ValueError(
                f"new starting hash key {key} must lie in ({rng.start}, {rng.end}] of {shard_id}"
            )
        now = loop_time()
        self._close([state], now)
        low = self._add_shard(HashRange(rng.start, key - 1), (shard_id,), now)
        high = self._add_shard(HashRange(key, rng.end), (shard_id,), now)
        return low, high

    def merge_shards(self, shard_id: str, adjacent_shard_id: str) -> str:
        """Close two open shards with adjacent hash ranges and open their merged child."""
        if shard_id == adjacent_shard_id:
            raise ValueError("cannot merge a shard with itself")
        first = self._open_state(shard_id)
        second = self._open_state(adjacent_shard_id)
        a, b = first.shard.hash_range, second.shard.hash_range
        if a.end + 1 != b.start and b.end + 1 != a.start:
            raise ValueError(f"shards {shard_id} and {adjacent_shard_id} are not adjacent")
        now = loop_time()
        self._close([first, second], now)
        merged = HashRange(min(a.start, b.start), max(a.end, b.end))
        return self._add_shard(merged, (shard_id, adjacent_shard_id), now)

    def expire_shard(self, shard_id: str) -> None:
        """Drop a closed shard as retention would: it is no longer listed or readable."""
        state = self._state(shard_id)
        if state.shard.is_open:
            raise ValueError(f"shard {shard_id} is open; only closed shards expire")
        del self._shards[shard_id]

    # -- reads -----------------------------------------------------------------------------

    def list_shards(self, shard_filter: ShardFilter | None = None) -> list[Shard]:
        states = list(self._shards.values())
        if shard_filter is None or shard_filter.type is ShardFilterType.AT_TRIM_HORIZON:
            return [s.shard for s in states]
        if shard_filter.type is ShardFilterType.AT_LATEST:
            return [s.shard for s in states if s.shard.is_open]
        if shard_filter.timestamp is None:
            raise ValueError("ShardFilter AT_TIMESTAMP needs a timestamp")
        at = self.to_loop_time(shard_filter.timestamp)
        # As ListShards: shards open at that time (started at or before it, not ended before it).
        return [
            s.shard
            for s in states
            if (s.opened_at is None or s.opened_at <= at)
            and (s.closed_at is None or s.closed_at >= at)
        ]

    def _iterator_start(self, position: StartingPosition) -> int:
        kind = position.type
        if kind is IteratorType.TRIM_HORIZON or kind is IteratorType.AT_TIMESTAMP:
            return 0
        if kind is IteratorType.LATEST:
            return self._next_sequence
        assert position.sequence_number is not None  # StartingPosition guarantees it
        if not position.sequence_number.isdigit():
            raise ValueError(f"not a sequence number: {position.sequence_number!r}")
        sequence = int(position.sequence_number)
        return sequence if kind is IteratorType.AT_SEQUENCE_NUMBER else sequence + 1


def aware(when: datetime) -> datetime:
    """Naive datetimes are taken as UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)
