"""The in-memory stream: routing, iterators, resharding, ShardFilter."""

from __future__ import annotations

import itertools
from datetime import timedelta

import pytest

from kclasync._adapters.memory import (
    DEFAULT_EPOCH,
    MemoryStream,
    MemoryStreamClient,
    partition_key_hash,
)
from kclasync._adapters.protocols import (
    ExpiredIteratorError,
    IteratorType,
    ShardFilter,
    ShardFilterType,
    ShardNotFoundError,
    StartingPosition,
)
from kclasync._core.lineage.shard import MAX_HASH_KEY, HashRange, Shard
from kclasync.errors import StreamNotFoundError
from tests.adapters.memory_helpers import KEY, LATEST_POS, TRIM, FakeClock

# ---------------------------------------------------------------------------------------------
# Streams: layout and routing


def test_initial_shards_cover_the_hash_space() -> None:
    stream = MemoryStream("s", 4)
    shards = stream.shards
    assert [s.shard_id for s in shards] == [f"shardId-00000000000{i}" for i in range(4)]
    assert shards[0].hash_range.start == 0
    assert shards[-1].hash_range.end == MAX_HASH_KEY
    for left, right in itertools.pairwise(shards):
        assert left.hash_range.end + 1 == right.hash_range.start
    assert all(s.is_open and s.parent_ids == () for s in shards)


async def test_put_record_routes_by_md5(clock: FakeClock) -> None:
    client = MemoryStreamClient()
    stream = client.create_stream("s", 4)
    sequences: list[int] = []
    for i in range(40):
        key = f"pk-{i}"
        shard_id, seq = client.put_record("s", key, b"x")
        h = partition_key_hash(key)
        rng = stream.shard(shard_id).hash_range
        assert rng.start <= h <= rng.end
        sequences.append(int(seq))
    assert sequences == sorted(sequences)
    assert len(set(sequences)) == 40
    record = stream.records(shard_id)[-1]
    assert record.approximate_arrival == DEFAULT_EPOCH + timedelta(seconds=clock.now)
    assert record.stream == "s" and record.shard_id == shard_id


async def test_explicit_hash_key(clock: FakeClock) -> None:
    client = MemoryStreamClient()
    client.create_stream("s", 2)
    assert client.put_record("s", "a", b"", explicit_hash_key=0)[0] == "shardId-000000000000"
    assert (
        client.put_record("s", "a", b"", explicit_hash_key=str(MAX_HASH_KEY))[0]
        == "shardId-000000000001"
    )
    with pytest.raises(ValueError):
        client.put_record("s", "a", b"", explicit_hash_key=MAX_HASH_KEY + 1)


# ---------------------------------------------------------------------------------------------
# Streams: iterators


async def read_all(
    client: MemoryStreamClient, shard_id: str, iterator: str, limit: int
) -> list[str]:
    seen: list[str] = []
    for _ in range(100):
        result = await client.get_records("s", shard_id, iterator, limit)
        seen.extend(r.sequence_number for r in result.records)
        if result.next_iterator is None or not result.records:
            return seen
        iterator = result.next_iterator
    raise AssertionError("did not finish")


async def one_shard(clock: FakeClock, count: int) -> tuple[MemoryStreamClient, list[str]]:
    client = MemoryStreamClient()
    client.create_stream("s", 1)
    seqs = [client.put_record("s", f"k{i}", bytes([i]))[1] for i in range(count)]
    return client, seqs


async def test_iterator_chaining(clock: FakeClock) -> None:
    client, seqs = await one_shard(clock, 7)
    it = await client.get_shard_iterator("s", KEY, TRIM)
    assert await read_all(client, KEY, it, 3) == seqs
    assert client.records_returned == 7


async def test_open_shard_keeps_returning_iterators(clock: FakeClock) -> None:
    client, seqs = await one_shard(clock, 2)
    it = await client.get_shard_iterator("s", KEY, TRIM)
    result = await client.get_records("s", KEY, it, 10)
    assert [r.sequence_number for r in result.records] == seqs
    assert result.next_iterator is not None and not result.shard_ended
    empty = await client.get_records("s", KEY, result.next_iterator, 10)
    assert empty.records == [] and empty.next_iterator is not None
    new_seq = client.put_record("s", "late", b"z")[1]
    later = await client.get_records("s", KEY, empty.next_iterator, 10)
    assert [r.sequence_number for r in later.records] == [new_seq]


async def test_iterator_positions(clock: FakeClock) -> None:
    client, seqs = await one_shard(clock, 5)
    latest = await client.get_shard_iterator("s", KEY, LATEST_POS)
    at = await client.get_shard_iterator(
        "s", KEY, StartingPosition(IteratorType.AT_SEQUENCE_NUMBER, seqs[2])
    )
    after = await client.get_shard_iterator(
        "s", KEY, StartingPosition(IteratorType.AFTER_SEQUENCE_NUMBER, seqs[2])
    )
    new_seq = client.put_record("s", "new", b"")[1]
    assert await read_all(client, KEY, latest, 10) == [new_seq]
    assert await read_all(client, KEY, at, 10) == [*seqs[2:], new_seq]
    assert await read_all(client, KEY, after, 10) == [*seqs[3:], new_seq]


async def test_at_timestamp(clock: FakeClock) -> None:
    client = MemoryStreamClient()
    stream = client.create_stream("s", 1)
    early = client.put_record("s", "a", b"")[1]
    clock.advance(10)
    mark = stream.to_datetime(clock.now)
    late = client.put_record("s", "b", b"")[1]
    it = await client.get_shard_iterator(
        "s", KEY, StartingPosition(IteratorType.AT_TIMESTAMP, timestamp=mark)
    )
    future = await client.get_shard_iterator(
        "s",
        KEY,
        StartingPosition(IteratorType.AT_TIMESTAMP, timestamp=mark + timedelta(seconds=5)),
    )
    clock.advance(1)
    too_early = client.put_record("s", "c", b"")[1]
    clock.advance(10)
    in_future = client.put_record("s", "d", b"")[1]
    assert early not in await read_all(client, KEY, it, 10)
    assert await read_all(client, KEY, it, 10) == [late, too_early, in_future]
    assert await read_all(client, KEY, future, 10) == [in_future]


async def test_millis_behind_latest(clock: FakeClock) -> None:
    client, _ = await one_shard(clock, 3)
    clock.advance(5)
    it = await client.get_shard_iterator("s", KEY, TRIM)
    first = await client.get_records("s", KEY, it, 1)
    assert first.millis_behind_latest == 5000
    assert first.next_iterator is not None
    rest = await client.get_records("s", KEY, first.next_iterator, 10)
    assert len(rest.records) == 2
    assert rest.millis_behind_latest == 0


async def test_iterators_expire(clock: FakeClock) -> None:
    client, _ = await one_shard(clock, 2)
    it = await client.get_shard_iterator("s", KEY, TRIM)
    clock.advance(299)
    result = await client.get_records("s", KEY, it, 1)
    assert result.next_iterator is not None
    clock.advance(2)
    with pytest.raises(ExpiredIteratorError):
        await client.get_records("s", KEY, it, 1)  # 301 s old
    assert (await client.get_records("s", KEY, result.next_iterator, 1)).records  # 2 s old


async def test_iterator_ttl_is_configurable(clock: FakeClock) -> None:
    client = MemoryStreamClient([MemoryStream("s")], iterator_ttl=10)
    it = await client.get_shard_iterator("s", KEY, TRIM)
    clock.advance(10.5)
    with pytest.raises(ExpiredIteratorError):
        await client.get_records("s", KEY, it, 1)


async def test_bad_iterators_and_arguments(clock: FakeClock) -> None:
    client = MemoryStreamClient()
    client.create_stream("s", 2)
    it = await client.get_shard_iterator("s", KEY, TRIM)
    with pytest.raises(ValueError):
        await client.get_records("s", "shardId-000000000001", it, 1)
    with pytest.raises(ValueError):
        await client.get_records("s", KEY, "garbage", 1)
    with pytest.raises(ValueError):
        await client.get_records("s", KEY, it, 0)
    with pytest.raises(ValueError):
        await client.get_records("s", KEY, it, 10_001)
    with pytest.raises(ShardNotFoundError):
        await client.get_shard_iterator("s", "shardId-000000000099", TRIM)
    with pytest.raises(ShardNotFoundError):
        await client.get_shard_iterator("nope", KEY, TRIM)
    with pytest.raises(StreamNotFoundError):
        await client.list_shards("nope")


# ---------------------------------------------------------------------------------------------
# Streams: resharding


async def test_split_closes_parent_and_routes_to_children(clock: FakeClock) -> None:
    client = MemoryStreamClient()
    stream = client.create_stream("s", 1)
    before = [client.put_record("s", f"k{i}", b"")[1] for i in range(5)]
    middle = 1 << 127
    low, high = client.split_shard("s", KEY, middle)
    assert (low, high) == ("shardId-000000000001", "shardId-000000000002")
    parent = stream.shard(KEY)
    assert not parent.is_open
    assert parent.ending_sequence is not None
    assert int(parent.ending_sequence) >= max(int(s) for s in before)
    children = [stream.shard(low), stream.shard(high)]
    assert [c.hash_range for c in children] == [
        HashRange(0, middle - 1),
        HashRange(middle, MAX_HASH_KEY),
    ]
    for child in children:
        assert child.parent_shard_id == KEY and child.adjacent_parent_shard_id is None
        assert int(child.starting_sequence) > int(parent.ending_sequence)
    for i in range(30):
        key = f"after-{i}"
        shard_id, seq = client.put_record("s", key, b"")
        expected = low if partition_key_hash(key) < middle else high
        assert shard_id == expected
        assert int(seq) > int(parent.ending_sequence)
    assert [r.sequence_number for r in stream.records(KEY)] == before


async def test_shard_end_returns_none_with_children(clock: FakeClock) -> None:
    client, seqs = await one_shard(clock, 3)
    it = await client.get_shard_iterator("s", KEY, TRIM)
    first = await client.get_records("s", KEY, it, 2)
    low, high = client.split_shard("s", KEY, 1 << 127)
    assert first.next_iterator is not None
    last = await client.get_records("s", KEY, first.next_iterator, 10)
    assert [r.sequence_number for r in last.records] == seqs[2:]
    assert last.next_iterator is None and last.shard_ended
    assert [c.shard_id for c in last.child_shards] == [low, high]
    assert all(c.parent_shard_ids == (KEY,) for c in last.child_shards)
    assert last.child_shards[0].hash_range == HashRange(0, (1 << 127) - 1)
    # Reading past the end again: no records, still ended.
    after = await client.get_shard_iterator(
        "s", KEY, StartingPosition(IteratorType.AFTER_SEQUENCE_NUMBER, seqs[-1])
    )
    again = await client.get_records("s", KEY, after, 10)
    assert again.records == [] and again.next_iterator is None and len(again.child_shards) == 2
    latest = await client.get_shard_iterator("s", KEY, LATEST_POS)
    assert (await client.get_records("s", KEY, latest, 10)).shard_ended


async def test_merge(clock: FakeClock) -> None:
    client = MemoryStreamClient()
    stream = client.create_stream("s", 3)
    a, b, c = (s.shard_id for s in stream.shards)
    with pytest.raises(ValueError):
        client.merge_shards("s", a, c)  # not adjacent
    with pytest.raises(ValueError):
        client.merge_shards("s", a, a)
    child = client.merge_shards("s", b, a)
    assert child == "shardId-000000000003"
    merged = stream.shard(child)
    assert merged.parent_shard_id == b and merged.adjacent_parent_shard_id == a
    assert merged.hash_range == HashRange(0, stream.shard(b).hash_range.end)
    assert not stream.shard(a).is_open and not stream.shard(b).is_open
    with pytest.raises(ValueError):
        client.merge_shards("s", a, c)  # a is closed
    for i in range(30):
        key = f"m-{i}"
        shard_id, _ = client.put_record("s", key, b"")
        assert shard_id == (child if partition_key_hash(key) <= merged.hash_range.end else c)
    it = await client.get_shard_iterator("s", a, TRIM)
    end = await client.get_records("s", a, it, 10)
    assert end.shard_ended
    assert [(x.shard_id, x.parent_shard_ids) for x in end.child_shards] == [(child, (b, a))]


async def test_split_validation(clock: FakeClock) -> None:
    client = MemoryStreamClient()
    client.create_stream("s", 1)
    with pytest.raises(ValueError):
        client.split_shard("s", KEY, 0)  # the low child would be empty
    with pytest.raises(ValueError):
        client.split_shard("s", KEY, MAX_HASH_KEY + 1)
    client.split_shard("s", KEY, 100)
    with pytest.raises(ValueError):
        client.split_shard("s", KEY, 50)  # closed
    with pytest.raises(ShardNotFoundError):
        client.split_shard("s", "shardId-000000000009", 50)


# ---------------------------------------------------------------------------------------------
# Streams: ShardFilter


async def test_shard_filters(clock: FakeClock) -> None:
    client = MemoryStreamClient()
    stream = client.create_stream("s", 2)
    t0 = stream.to_datetime(clock.now)
    clock.advance(60)
    low, high = client.split_shard("s", KEY, 1000)
    t_split = stream.to_datetime(clock.now)
    clock.advance(60)
    t1 = stream.to_datetime(clock.now)
    other = "shardId-000000000001"

    def ids(shards: list[Shard]) -> list[str]:
        return [s.shard_id for s in shards]

    everything = [KEY, other, low, high]
    assert ids(await client.list_shards("s")) == everything
    assert ids(await client.list_shards("s", ShardFilter(ShardFilterType.AT_TRIM_HORIZON))) == (
        everything
    )
    assert ids(await client.list_shards("s", ShardFilter(ShardFilterType.AT_LATEST))) == [
        other,
        low,
        high,
    ]
    at = ShardFilterType.AT_TIMESTAMP
    assert ids(await client.list_shards("s", ShardFilter(at, t0))) == [KEY, other]
    assert ids(await client.list_shards("s", ShardFilter(at, t_split))) == everything
    assert ids(await client.list_shards("s", ShardFilter(at, t1))) == [other, low, high]
    with pytest.raises(ValueError):
        await client.list_shards("s", ShardFilter(at))


async def test_expired_shard_disappears(clock: FakeClock) -> None:
    client, _ = await one_shard(clock, 1)
    it = await client.get_shard_iterator("s", KEY, TRIM)
    stream = client.stream("s")
    with pytest.raises(ValueError):
        stream.expire_shard(KEY)  # open
    client.split_shard("s", KEY, 1 << 64)
    stream.expire_shard(KEY)
    shards = await client.list_shards("s", ShardFilter(ShardFilterType.AT_TRIM_HORIZON))
    assert KEY not in [s.shard_id for s in shards]
    with pytest.raises(ShardNotFoundError):
        await client.get_records("s", KEY, it, 1)


async def test_from_shards_lineage_graph(clock: FakeClock) -> None:
    def rng(a: int, b: int) -> HashRange:
        return HashRange(a, b)

    def sid(n: int) -> str:
        return f"shardId-{n:012d}"

    graph = [
        Shard(sid(0), hash_range=rng(0, 99), starting_sequence="11", ending_sequence="102"),
        Shard(sid(1), hash_range=rng(100, 199), starting_sequence="11", ending_sequence="102"),
        Shard(sid(4), hash_range=rng(200, MAX_HASH_KEY), starting_sequence="11"),
        Shard(
            sid(6),
            parent_shard_id=sid(0),
            adjacent_parent_shard_id=sid(1),
            hash_range=rng(0, 199),
            starting_sequence="103",
        ),
    ]
    client = MemoryStreamClient([MemoryStream.from_shards("s", graph)])
    assert await client.list_shards("s") == graph
    assert [
        s.shard_id for s in await client.list_shards("s", ShardFilter(ShardFilterType.AT_LATEST))
    ] == [sid(4), sid(6)]
    it = await client.get_shard_iterator("s", sid(0), TRIM)
    ended = await client.get_records("s", sid(0), it, 10)
    assert ended.shard_ended
    assert [c.shard_id for c in ended.child_shards] == [sid(6)]
    shard_id, seq = client.put_record("s", "x", b"", explicit_hash_key=5)
    assert shard_id == sid(6) and int(seq) > 103
    assert client.split_shard("s", sid(4), 300) == (sid(7), sid(8))
