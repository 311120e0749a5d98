"""The in-memory lease store and stream: conditional-write rules, faults, iterators, resharding."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import attrs
import pytest

from kclasync._adapters.memory import (
    DEFAULT_EPOCH,
    FaultPlan,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStream,
    MemoryStreamClient,
    OpFaults,
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
from kclasync._core.lease import CorruptLeaseError, Lease
from kclasync._core.position import SHARD_END, TRIM_HORIZON, Checkpoint
from kclasync._core.shard import MAX_HASH_KEY, HashRange, Shard
from kclasync.errors import StreamNotFoundError, ThrottledError, TransientError

KEY = "shardId-000000000000"


class FakeClock:
    """Replaces the running loop's clock so tests can move time by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def time(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
async def clock(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[FakeClock]:
    fake = FakeClock()
    monkeypatch.setattr(asyncio.get_running_loop(), "time", fake.time)
    yield fake


@pytest.fixture
def table() -> MemoryLeaseTable:
    return MemoryLeaseTable()


@pytest.fixture
def store(table: MemoryLeaseTable) -> MemoryLeaseStore:
    return MemoryLeaseStore(table)


async def owned(store: MemoryLeaseStore, owner: str = "w1", key: str = KEY) -> Lease:
    assert await store.create_lease(Lease(key))
    taken = await store.take_lease(Lease(key), owner)
    assert taken is not None
    return taken


TRIM = StartingPosition(IteratorType.TRIM_HORIZON)
LATEST_POS = StartingPosition(IteratorType.LATEST)


# ---------------------------------------------------------------------------------------------
# Lease store: reads and create


async def test_create_only_when_absent(store: MemoryLeaseStore) -> None:
    assert await store.is_empty()
    assert await store.create_lease(Lease(KEY, checkpoint=TRIM_HORIZON))
    assert not await store.create_lease(Lease(KEY, counter=7, owner="x"))
    stored = await store.get_lease(KEY)
    assert stored == Lease(KEY, checkpoint=TRIM_HORIZON)
    assert not await store.is_empty()


async def test_get_missing_and_list_sorted(store: MemoryLeaseStore) -> None:
    assert await store.get_lease("nope") is None
    for key in ("b", "a", "c"):
        await store.create_lease(Lease(key))
    scan = await store.list_leases()
    assert [lease.key for lease in scan.leases] == ["a", "b", "c"]
    assert scan.corrupt == ()


async def test_corrupt_items(store: MemoryLeaseStore, table: MemoryLeaseTable) -> None:
    await store.create_lease(Lease("good"))
    store.put_corrupt("bad", "leaseCounter", "is missing")
    assert not await store.is_empty()
    scan = await store.list_leases()
    assert [lease.key for lease in scan.leases] == ["good"]
    assert [(e.lease_key, e.attribute) for e in scan.corrupt] == [("bad", "leaseCounter")]
    with pytest.raises(CorruptLeaseError):
        await store.get_lease("bad")
    assert not await store.create_lease(Lease("bad"))
    with pytest.raises(CorruptLeaseError):
        await store.take_lease(Lease("bad"), "w1")
    store.put_raw("bad", Lease("bad"))
    assert await store.get_lease("bad") == Lease("bad")
    assert table.items_scanned == 2  # one scan of two items


async def test_ensure_table(store: MemoryLeaseStore, table: MemoryLeaseTable) -> None:
    await store.ensure_table()
    await store.ensure_table()
    assert table.exists


# ---------------------------------------------------------------------------------------------
# renew


async def test_renew_increments_counter_and_writes_throughput(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    renewed = await store.renew_lease(lease, throughput_kbps=12.5)
    assert renewed is not None
    assert renewed.counter == lease.counter + 1
    assert renewed.throughput_kbps == 12.5
    again = await store.renew_lease(renewed)
    assert again is not None
    assert again.counter == lease.counter + 2
    assert again.throughput_kbps == 12.5  # not given: left as it was
    assert await store.get_lease(KEY) == again


async def test_renew_fails_on_stale_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    assert await store.renew_lease(lease) is not None
    assert await store.renew_lease(lease) is None  # local counter is now stale


async def test_renew_fails_for_other_owner(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    assert await store.renew_lease(attrs.evolve(lease, owner="w2")) is None
    stored = await store.get_lease(KEY)
    assert stored == lease  # nothing written


async def test_renew_fails_when_unowned_or_missing(store: MemoryLeaseStore) -> None:
    await store.create_lease(Lease(KEY))
    assert await store.renew_lease(Lease(KEY)) is None
    assert await store.renew_lease(Lease("missing", owner="w1")) is None


# ---------------------------------------------------------------------------------------------
# take


async def test_take_sets_owner_and_clears_checkpoint_owner(store: MemoryLeaseStore) -> None:
    store.put_raw(
        KEY,
        Lease(KEY, counter=4, owner="old", owner_switches_since_checkpoint=2, checkpoint_owner="x"),
    )
    local = await store.get_lease(KEY)
    assert local is not None
    taken = await store.take_lease(local, "me")
    assert taken == attrs.evolve(
        local, counter=5, owner="me", owner_switches_since_checkpoint=3, checkpoint_owner=None
    )


async def test_take_fails_on_stale_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    assert await store.renew_lease(lease) is not None
    assert await store.take_lease(lease, "w2") is None
    stored = await store.get_lease(KEY)
    assert stored is not None and stored.owner == "w1"
    assert await store.take_lease(Lease("missing"), "w2") is None


async def test_steal_fences_the_old_owner(table: MemoryLeaseTable) -> None:
    a, b = MemoryLeaseStore(table), MemoryLeaseStore(table)
    mine = await owned(a, "a")
    seen_by_b = await b.get_lease(KEY)
    assert seen_by_b is not None
    assert await b.take_lease(seen_by_b, "b") is not None
    assert await a.renew_lease(mine) is None
    assert await a.checkpoint(mine, Checkpoint("5")) is None
    assert await a.release_lease(mine) is None


# ---------------------------------------------------------------------------------------------
# release


async def test_release_removes_owner_regardless_of_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    renewed = await store.renew_lease(lease)
    assert renewed is not None
    released = await store.release_lease(lease)  # stale counter: release only checks the owner
    assert released is not None
    assert released.owner is None
    assert released.counter == renewed.counter + 1


async def test_release_fails_for_other_owner_or_unowned(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    assert await store.release_lease(attrs.evolve(lease, owner="w2")) is None
    assert await store.release_lease(attrs.evolve(lease, owner=None)) is None
    assert await store.release_lease(Lease("missing", owner="w1")) is None
    assert await store.get_lease(KEY) == lease


# ---------------------------------------------------------------------------------------------
# checkpoint


async def test_checkpoint_writes_and_resets(store: MemoryLeaseStore) -> None:
    store.put_raw(
        KEY,
        Lease(
            KEY,
            counter=3,
            owner="w1",
            pending_checkpoint=Checkpoint("9"),
            owner_switches_since_checkpoint=2,
        ),
    )
    local = await store.get_lease(KEY)
    assert local is not None
    done = await store.checkpoint(local, Checkpoint("10", 2))
    assert done is not None
    assert done.checkpoint == Checkpoint("10", 2)
    assert done.pending_checkpoint is None
    assert done.owner_switches_since_checkpoint == 0
    assert done.counter == 4
    assert done.owner == "w1"


async def test_checkpoint_fails_on_stale_counter_or_other_owner(
    store: MemoryLeaseStore,
) -> None:
    lease = await owned(store, "w1")
    assert await store.checkpoint(attrs.evolve(lease, owner="w2"), Checkpoint("1")) is None
    assert await store.checkpoint(attrs.evolve(lease, counter=0), Checkpoint("1")) is None
    assert await store.checkpoint(attrs.evolve(lease, owner=None), Checkpoint("1")) is None
    assert await store.get_lease(KEY) == lease


async def test_prepare_checkpoint_writes_only_pending(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "w1")
    prepared = await store.checkpoint(lease, Checkpoint("77"), pending=Checkpoint("42", 1))
    assert prepared == attrs.evolve(
        lease, counter=lease.counter + 1, pending_checkpoint=Checkpoint("42", 1)
    )
    assert prepared.owner_switches_since_checkpoint == 1  # not reset by a prepare
    assert await store.checkpoint(lease, TRIM_HORIZON, pending=Checkpoint("43")) is None


# ---------------------------------------------------------------------------------------------
# delete


async def test_delete_conditional_on_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    renewed = await store.renew_lease(lease)
    assert renewed is not None
    assert not await store.delete_lease(lease)
    assert await store.get_lease(KEY) is not None
    assert await store.delete_lease(renewed)
    assert await store.get_lease(KEY) is None
    assert not await store.delete_lease(renewed)


# ---------------------------------------------------------------------------------------------
# graceful handoff


async def test_handoff_round_trip(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "old")
    started = await store.start_handoff(lease, "new")
    assert started == attrs.evolve(lease, owner="new", checkpoint_owner="old")  # counter unchanged
    # The new owner may not checkpoint yet (a normal-mode write during a handoff is refused).
    assert (
        await store.checkpoint(attrs.evolve(started, checkpoint_owner=None), Checkpoint("5"))
        is None
    )
    # The old owner checkpoints in handoff mode, fenced by checkpointOwner; counter untouched.
    old_cp = await store.checkpoint(started, Checkpoint("5"))
    assert old_cp is not None
    assert old_cp.checkpoint == Checkpoint("5")
    assert old_cp.counter == started.counter
    assert old_cp.owner == "new" and old_cp.checkpoint_owner == "old"
    # Another worker cannot pose as the checkpoint owner.
    assert (
        await store.checkpoint(attrs.evolve(started, checkpoint_owner="x"), Checkpoint("5")) is None
    )
    # The old owner can no longer renew or release.
    assert await store.renew_lease(attrs.evolve(old_cp, owner="old")) is None
    assert await store.release_lease(lease) is None
    finished = await store.finish_handoff(started)  # stale counter is fine: not conditioned on it
    assert finished is not None
    assert finished.counter == old_cp.counter + 1
    assert finished.owner == "new" and finished.checkpoint_owner is None
    assert await store.checkpoint(started, Checkpoint("6")) is None  # the handoff is over
    assert await store.checkpoint(finished, Checkpoint("6")) is not None


async def test_start_handoff_conditions(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "old")
    assert await store.start_handoff(attrs.evolve(lease, owner="other"), "new") is None
    started = await store.start_handoff(lease, "new")
    assert started is not None
    assert await store.start_handoff(started, "third") is None  # a handoff is under way
    assert await store.start_handoff(Lease("missing", owner="old"), "new") is None


async def test_finish_handoff_conditions(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "old")
    assert await store.finish_handoff(lease) is None  # no handoff under way
    started = await store.start_handoff(lease, "new")
    assert started is not None
    assert await store.finish_handoff(attrs.evolve(started, checkpoint_owner="x")) is None
    assert await store.finish_handoff(attrs.evolve(started, owner="x")) is None
    assert await store.get_lease(KEY) == started


async def test_take_during_handoff_cancels_it(store: MemoryLeaseStore) -> None:
    lease = await owned(store, "old")
    started = await store.start_handoff(lease, "new")
    assert started is not None
    taken = await store.take_lease(started, "thief")
    assert taken is not None and taken.checkpoint_owner is None
    assert await store.finish_handoff(started) is None


# ---------------------------------------------------------------------------------------------
# helpers and counters


async def test_set_sticky_does_not_touch_counter(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    store.set_sticky(KEY, 10)
    stored = await store.get_lease(KEY)
    assert stored == attrs.evolve(lease, sticky=10)
    assert await store.renew_lease(lease) is not None  # still renewable with the same counter
    store.set_sticky(KEY, None)
    assert (await store.get_lease(KEY)) is not None
    with pytest.raises(KeyError):
        store.set_sticky("missing", 20)


async def test_put_raw_uses_the_given_key(store: MemoryLeaseStore) -> None:
    store.put_raw("k2", Lease("k1", counter=3))
    assert await store.get_lease("k2") == Lease("k2", counter=3)
    assert await store.get_lease("k1") is None


async def test_counters(table: MemoryLeaseTable) -> None:
    a, b = MemoryLeaseStore(table), MemoryLeaseStore(table)
    lease = await owned(a)
    await a.renew_lease(lease)
    await b.renew_lease(lease)  # fails
    await b.list_leases()
    await b.get_lease(KEY)
    assert table.writes == {"create_lease": 1, "take_lease": 1, "renew_lease": 2}
    assert table.reads == {"list_leases": 1, "get_lease": 1}
    assert table.condition_failures == {"renew_lease": 1}
    assert a.calls == {"create_lease": 1, "take_lease": 1, "renew_lease": 1}
    assert b.calls == {"renew_lease": 1, "list_leases": 1, "get_lease": 1}


# ---------------------------------------------------------------------------------------------
# Fault injection on the lease store


def plan(seed: int = 1, **ops: OpFaults) -> FaultPlan:
    return FaultPlan(random.Random(seed), operations=dict(ops))


async def test_throttle_is_not_applied(table: MemoryLeaseTable) -> None:
    setup = MemoryLeaseStore(table)
    lease = await owned(setup)
    faulty = MemoryLeaseStore(table, faults=plan(renew_lease=OpFaults(throttle=1.0)))
    with pytest.raises(ThrottledError):
        await faulty.renew_lease(lease)
    assert table.get(KEY) == lease
    assert faulty.faults is not None
    assert faulty.faults.injected == {"renew_lease:throttled": 1}
    assert await faulty.get_lease(KEY) == lease  # other operations unaffected


async def test_transient_before_write_is_not_applied(table: MemoryLeaseTable) -> None:
    lease = await owned(MemoryLeaseStore(table))
    faulty = MemoryLeaseStore(table, faults=plan(renew_lease=OpFaults(transient=1.0)))
    with pytest.raises(TransientError):
        await faulty.renew_lease(lease)
    assert table.get(KEY) == lease
    assert table.writes["renew_lease"] == 0


async def test_transient_after_write_leaves_the_write_applied(table: MemoryLeaseTable) -> None:
    lease = await owned(MemoryLeaseStore(table))
    faulty = MemoryLeaseStore(
        table, faults=plan(renew_lease=OpFaults(transient=1.0, transient_after_write=1.0))
    )
    with pytest.raises(TransientError):
        await faulty.renew_lease(lease, throughput_kbps=3.0)
    stored = await faulty.get_lease(KEY)
    assert stored == attrs.evolve(lease, counter=lease.counter + 1, throughput_kbps=3.0)
    # A retry of the same request now fails its condition; the re-read shows our increment.
    faulty.faults = None
    assert await faulty.renew_lease(lease) is None
    assert stored is not None and stored.counter == lease.counter + 1 and stored.owner == "w1"


@pytest.mark.parametrize(
    ("op", "call"),
    [
        ("take_lease", lambda s, lease: s.take_lease(lease, "w2")),
        ("checkpoint", lambda s, lease: s.checkpoint(lease, Checkpoint("9"))),
        ("release_lease", lambda s, lease: s.release_lease(lease)),
        ("delete_lease", lambda s, lease: s.delete_lease(lease)),
    ],
)
async def test_unknown_outcome_applies_every_write(
    table: MemoryLeaseTable, op: str, call: Callable[[MemoryLeaseStore, Lease], Awaitable[object]]
) -> None:
    lease = await owned(MemoryLeaseStore(table))
    writes_before = table.writes[op]
    faulty = MemoryLeaseStore(
        table,
        faults=FaultPlan(
            random.Random(1),
            operations={op: OpFaults(transient=1.0, transient_after_write=1.0)},
        ),
    )
    with pytest.raises(TransientError):
        await call(faulty, lease)
    assert table.get(KEY) != lease
    assert table.writes[op] == writes_before + 1
    assert table.condition_failures[op] == 0


async def test_fixed_and_callable_latency(table: MemoryLeaseTable, clock: FakeClock) -> None:
    drawn: list[float] = []

    def latency(rng: random.Random) -> float:
        value = rng.uniform(0.0, 1.0)
        drawn.append(value)
        return value

    faults = FaultPlan(
        random.Random(3),
        default=OpFaults(latency=0.5),
        operations={"get_lease": OpFaults(latency=latency)},
    )
    store = MemoryLeaseStore(table, faults=faults)
    sleeps: list[float] = []

    async def fake_sleep(delay: float) -> None:
        sleeps.append(delay)
        clock.advance(delay)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(asyncio, "sleep", fake_sleep)
        await store.create_lease(Lease(KEY))
        await store.get_lease(KEY)
    assert sleeps == [0.5, drawn[0]]


async def test_latency_delays_the_write() -> None:
    table = MemoryLeaseTable()
    store = MemoryLeaseStore(table, faults=FaultPlan(random.Random(0), OpFaults(latency=0.05)))
    task = asyncio.create_task(store.create_lease(Lease(KEY)))
    await asyncio.sleep(0)
    assert table.get(KEY) is None  # still "in flight"
    assert await task
    assert table.get(KEY) == Lease(KEY)


async def outcomes(seed: int) -> list[str]:
    table = MemoryLeaseTable()
    faults = FaultPlan(
        random.Random(seed),
        default=OpFaults(throttle=0.2, transient=0.3, transient_after_write=0.5),
    )
    store = MemoryLeaseStore(table, faults=faults)
    results: list[str] = []
    for i in range(60):
        try:
            created = await store.create_lease(Lease(f"k{i}"))
            results.append(f"ok:{created}")
        except ThrottledError:
            results.append("throttled")
        except TransientError:
            results.append("transient")
    results.append(f"stored:{sorted(table.leases)}")
    return results


async def test_faults_reproducible_from_seed() -> None:
    first = await outcomes(42)
    assert first == await outcomes(42)
    assert first != await outcomes(43)
    assert {"ok:True", "throttled", "transient"} <= set(first)


def test_fault_probabilities_validated() -> None:
    with pytest.raises(ValueError):
        OpFaults(throttle=1.5)
    with pytest.raises(ValueError):
        OpFaults(transient_after_write=-0.1)


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


# ---------------------------------------------------------------------------------------------
# Streams: faults and counters


async def test_stream_throttling_and_counters(clock: FakeClock) -> None:
    faults = plan(get_records=OpFaults(throttle=1.0))
    client = MemoryStreamClient(faults=faults)
    client.create_stream("s", 1)
    client.put_record("s", "k", b"")
    it = await client.get_shard_iterator("s", KEY, TRIM)
    with pytest.raises(ThrottledError):
        await client.get_records("s", KEY, it, 1)
    faults.operations["get_records"] = OpFaults(transient=1.0)
    with pytest.raises(TransientError):
        await client.get_records("s", KEY, it, 1)
    del faults.operations["get_records"]
    assert len((await client.get_records("s", KEY, it, 1)).records) == 1
    await client.list_shards("s")
    assert client.reads == {"get_shard_iterator": 1, "get_records": 3, "list_shards": 1}
    assert client.writes == {"create_stream": 1, "put_record": 1}
    assert faults.injected == {"get_records:throttled": 1, "get_records:transient_before": 1}


async def stream_outcomes(seed: int) -> list[str]:
    faults = FaultPlan(random.Random(seed), default=OpFaults(throttle=0.5))
    client = MemoryStreamClient([MemoryStream("s")], faults=faults)
    results: list[str] = []
    for _ in range(30):
        try:
            await client.list_shards("s")
            results.append("ok")
        except ThrottledError:
            results.append("throttled")
    return results


async def test_stream_faults_reproducible() -> None:
    assert await stream_outcomes(7) == await stream_outcomes(7)
    assert await stream_outcomes(7) != await stream_outcomes(8)


async def test_shard_end_checkpoint_round_trip(store: MemoryLeaseStore) -> None:
    lease = await owned(store)
    done = await store.checkpoint(lease, SHARD_END)
    assert done is not None and done.is_finished
