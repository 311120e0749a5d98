"""In-memory stand-ins for the lease table and the stream, for tests and deterministic simulation.

Owns: ``MemoryLeaseTable`` (the shared "DynamoDB table" state and its call counters),
``MemoryLeaseStore`` (a ``LeaseStore`` with exactly the conditional-write rules of the KCL lease
protocol, plus the graceful-handoff writes), ``MemoryStream`` / ``MemoryStreamClient`` (a
``StreamClient`` over streams whose shards can be split and merged), and ``FaultPlan`` (latency,
throttling and transient errors, including errors raised after a write was applied).

Must not: read any clock other than the running event loop's (``loop.time()``), draw randomness
from anything but an injected ``random.Random``, or make protocol decisions (those live in
``kclasync._core``). Same seed plus same call order must give the same run.
"""

from __future__ import annotations

import asyncio
import bisect
import hashlib
import random
from collections import Counter
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

import attrs

from kclasync._adapters.protocols import (
    ChildShard,
    CoordinatorStateStore,
    ExpiredIteratorError,
    GetRecordsResult,
    IteratorType,
    LeaseScan,
    LeaseStore,
    ShardFilter,
    ShardFilterType,
    ShardNotFoundError,
    StartingPosition,
    StreamClient,
    ThrottledError,
    TransientError,
    WorkerHeartbeat,
)
from kclasync._core.leader_lock import LockItem
from kclasync._core.lease import CorruptLeaseError, Lease
from kclasync._core.position import Checkpoint
from kclasync._core.shard import MAX_HASH_KEY, HashRange, Shard
from kclasync._core.streams import StreamIdentity
from kclasync._records import Record
from kclasync.errors import StreamNotFoundError

_T = TypeVar("_T")

# ---------------------------------------------------------------------------------------------
# Fault injection

#: Seconds to wait, or a function of the plan's random generator returning them.
Latency = float | Callable[[random.Random], float]


def _probability(_inst: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{attribute.name} must be a probability in [0, 1], not {value}")


@attrs.frozen
class OpFaults:
    """Faults for one operation.

    ``latency`` is awaited (``asyncio.sleep``) before the call takes effect; None means the call
    completes without yielding to the event loop. ``throttle`` and ``transient`` are per-call
    probabilities of ThrottledError and TransientError. ``transient_after_write`` is the share of
    those transient errors raised *after* the call was applied (an unknown outcome, as with a
    timeout): the write happened but the caller does not hear back.
    """

    latency: Latency | None = None
    throttle: float = attrs.field(default=0.0, validator=_probability)
    transient: float = attrs.field(default=0.0, validator=_probability)
    transient_after_write: float = attrs.field(default=0.0, validator=_probability)


NO_FAULTS = OpFaults()


@attrs.define
class FaultPlan:
    """Faults by operation name (the adapter method's name, e.g. ``renew_lease``, ``get_records``).

    Every call draws three numbers from ``rng`` when it starts (plus whatever a latency function
    draws), whatever the outcome, so a run is reproducible from the seed and the call order.
    ``operations`` may be changed while a simulation runs (e.g. to start or end an outage).
    """

    rng: random.Random
    default: OpFaults = NO_FAULTS
    operations: dict[str, OpFaults] = attrs.field(factory=dict)
    #: Faults injected, keyed ``"<operation>:<kind>"`` with kind throttled, transient_before
    #: or transient_after.
    injected: Counter[str] = attrs.field(factory=Counter)

    def for_operation(self, operation: str) -> OpFaults:
        return self.operations.get(operation, self.default)

    async def enter(self, operation: str) -> bool:
        """Apply latency and raise the faults that happen before the call takes effect.

        Returns True when the call must take effect and then raise TransientError.
        """
        faults = self.for_operation(operation)
        delay: float | None
        if faults.latency is None:
            delay = None
        elif callable(faults.latency):
            delay = max(0.0, float(faults.latency(self.rng)))
        else:
            delay = max(0.0, float(faults.latency))
        throttle_draw = self.rng.random()
        transient_draw = self.rng.random()
        after_draw = self.rng.random()
        if delay is not None:
            await asyncio.sleep(delay)
        if throttle_draw < faults.throttle:
            self.injected[f"{operation}:throttled"] += 1
            raise ThrottledError(f"injected throttling of {operation}")
        if transient_draw < faults.transient:
            if after_draw < faults.transient_after_write:
                self.injected[f"{operation}:transient_after"] += 1
                return True
            self.injected[f"{operation}:transient_before"] += 1
            raise TransientError(f"injected transient failure of {operation} (not applied)")
        return False


async def _with_faults(plan: FaultPlan | None, operation: str, apply: Callable[[], _T]) -> _T:
    if plan is None:
        return apply()
    fail_after = await plan.enter(operation)
    result = apply()
    if fail_after:
        raise TransientError(f"injected transient failure of {operation} (outcome unknown)")
    return result


# ---------------------------------------------------------------------------------------------
# Lease table


class MemoryLeaseTable:
    """The shared lease-table state: leases by key, unreadable items, and call counters.

    Several ``MemoryLeaseStore`` instances (one per simulated worker) share one table. Counters
    count calls that reached the table (not those failed by injected faults before the write);
    a conditional write whose condition failed still counts as a write, as it costs a write in
    DynamoDB, and is also counted in ``condition_failures``.
    """

    def __init__(self) -> None:
        self.leases: dict[str, Lease] = {}
        self.corrupt: dict[str, CorruptLeaseError] = {}
        self.exists = False
        self.reads: Counter[str] = Counter()
        self.writes: Counter[str] = Counter()
        self.condition_failures: Counter[str] = Counter()
        #: Items returned by full scans (a scan costs capacity per item).
        self.items_scanned = 0
        #: Worker registry: worker id -> heartbeat counter.
        self.workers: dict[str, int] = {}

    def get(self, key: str) -> Lease | None:
        """The stored lease (no counting, no faults): for assertions and reports."""
        return self.leases.get(key)

    def snapshot(self) -> dict[str, Lease]:
        return dict(self.leases)


class MemoryLeaseStore:
    """``LeaseStore`` over a ``MemoryLeaseTable``, with the KCL's fenced conditional writes.

    Each call is atomic: the condition is checked and the write applied without yielding to the
    event loop. Injected latency is awaited before that point.
    """

    def __init__(self, table: MemoryLeaseTable, *, faults: FaultPlan | None = None) -> None:
        self.table = table
        self.faults = faults
        #: Calls made through this store, by operation (per worker, like DynamoLeaseStore.calls).
        self.calls: Counter[str] = Counter()

    async def _read(self, op: str, apply: Callable[[], _T]) -> _T:
        self.calls[op] += 1

        def counted() -> _T:
            self.table.reads[op] += 1
            return apply()

        return await _with_faults(self.faults, op, counted)

    async def _write(self, op: str, apply: Callable[[], _T]) -> _T:
        self.calls[op] += 1

        def counted() -> _T:
            self.table.writes[op] += 1
            result = apply()
            if result is None or result is False:
                self.table.condition_failures[op] += 1
            return result

        return await _with_faults(self.faults, op, counted)

    def _stored(self, key: str) -> Lease | None:
        """The stored lease for a conditional write; an unreadable item raises, unchanged."""
        bad = self.table.corrupt.get(key)
        if bad is not None:
            raise bad
        return self.table.leases.get(key)

    def _store(self, lease: Lease) -> Lease:
        self.table.leases[lease.key] = lease
        return lease

    # -- table and reads -------------------------------------------------------------------

    async def ensure_table(self) -> None:
        def apply() -> None:
            self.table.exists = True

        await self._read("ensure_table", apply)

    async def is_empty(self) -> bool:
        return await self._read(
            "is_empty", lambda: not self.table.leases and not self.table.corrupt
        )

    async def list_leases(self) -> LeaseScan:
        def apply() -> LeaseScan:
            leases = tuple(self.table.leases[k] for k in sorted(self.table.leases))
            corrupt = tuple(self.table.corrupt[k] for k in sorted(self.table.corrupt))
            workers = tuple(
                WorkerHeartbeat(w, beat) for w, beat in sorted(self.table.workers.items())
            )
            self.table.items_scanned += len(leases) + len(corrupt) + len(workers)
            return LeaseScan(leases, corrupt, workers)

        return await self._read("list_leases", apply)

    async def get_lease(self, key: str) -> Lease | None:
        return await self._read("get_lease", lambda: self._stored(key))

    # -- conditional writes ----------------------------------------------------------------

    async def create_lease(self, lease: Lease) -> bool:
        def apply() -> bool:
            if lease.key in self.table.leases or lease.key in self.table.corrupt:
                return False
            self._store(lease)
            return True

        return await self._write("create_lease", apply)

    async def renew_lease(self, lease: Lease, throughput_kbps: float | None = None) -> Lease | None:
        def apply() -> Lease | None:
            stored = self._stored(lease.key)
            if (
                stored is None
                or stored.counter != lease.counter
                or lease.owner is None
                or stored.owner != lease.owner
            ):
                return None
            throughput = stored.throughput_kbps if throughput_kbps is None else throughput_kbps
            return self._store(
                attrs.evolve(stored, counter=stored.counter + 1, throughput_kbps=throughput)
            )

        return await self._write("renew_lease", apply)

    async def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        def apply() -> Lease | None:
            stored = self._stored(lease.key)
            if stored is None or stored.counter != lease.counter:
                return None
            return self._store(
                attrs.evolve(
                    stored,
                    counter=stored.counter + 1,
                    owner=owner,
                    owner_switches_since_checkpoint=stored.owner_switches_since_checkpoint + 1,
                    checkpoint_owner=None,
                )
            )

        return await self._write("take_lease", apply)

    async def release_lease(self, lease: Lease) -> Lease | None:
        def apply() -> Lease | None:
            stored = self._stored(lease.key)
            if stored is None or lease.owner is None or stored.owner != lease.owner:
                return None
            return self._store(attrs.evolve(stored, owner=None, counter=stored.counter + 1))

        return await self._write("release_lease", apply)

    async def checkpoint(
        self, lease: Lease, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease | None:
        """Fenced checkpoint write; see ``LeaseStore.checkpoint`` for the two modes.

        Normal: counter and owner as in ``lease`` and no handoff under way; counter+1.
        Handoff (``lease.checkpoint_owner`` set): only that old owner may write, conditional on
        it still being the checkpoint owner; the counter is left alone (the new owner renews).
        With ``pending`` set only the pending checkpoint is written."""

        def apply() -> Lease | None:
            stored = self._stored(lease.key)
            if stored is None:
                return None
            if lease.checkpoint_owner is not None:
                if stored.checkpoint_owner != lease.checkpoint_owner:
                    return None
                counter = stored.counter
            else:
                if (
                    lease.owner is None
                    or stored.counter != lease.counter
                    or stored.owner != lease.owner
                    or stored.checkpoint_owner is not None
                ):
                    return None
                counter = stored.counter + 1
            if pending is not None:
                updated = attrs.evolve(stored, counter=counter, pending_checkpoint=pending)
            else:
                updated = attrs.evolve(
                    stored,
                    counter=counter,
                    checkpoint=checkpoint,
                    pending_checkpoint=None,
                    owner_switches_since_checkpoint=0,
                )
            return self._store(updated)

        return await self._write("checkpoint", apply)

    async def delete_lease(self, lease: Lease) -> bool:
        def apply() -> bool:
            stored = self._stored(lease.key)
            if stored is None or stored.counter != lease.counter:
                return False
            del self.table.leases[lease.key]
            return True

        return await self._write("delete_lease", apply)

    async def update_child_shard_ids(
        self, lease: Lease, child_shard_ids: frozenset[str]
    ) -> Lease | None:
        """Conditional on counter and owner (None: no owner), as ``DynamoLeaseStore``'s."""
        if not child_shard_ids:
            raise ValueError("childShardIds must not be empty (DynamoDB has no empty sets)")

        def apply() -> Lease | None:
            stored = self._stored(lease.key)
            if stored is None or stored.counter != lease.counter or stored.owner != lease.owner:
                return None
            return self._store(
                attrs.evolve(
                    stored, counter=stored.counter + 1, child_shard_ids=frozenset(child_shard_ids)
                )
            )

        return await self._write("update_child_shard_ids", apply)

    # -- worker registry ---------------------------------------------------------------------

    async def heartbeat_worker(self, worker_id: str) -> None:
        def apply() -> None:
            self.table.workers[worker_id] = self.table.workers.get(worker_id, 0) + 1

        await self._write("heartbeat_worker", apply)

    async def remove_worker(self, worker_id: str) -> None:
        def apply() -> None:
            self.table.workers.pop(worker_id, None)

        await self._write("remove_worker", apply)

    # -- graceful handoff (KCL 3.x) ----------------------------------------------------------

    async def start_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        """Owner becomes ``new_owner`` and ``checkpoint_owner`` the old owner; counter unchanged.

        Conditional on ``lease.owner`` still owning the lease and no handoff being under way.
        """

        def apply() -> Lease | None:
            stored = self._stored(lease.key)
            if (
                stored is None
                or lease.owner is None
                or stored.owner != lease.owner
                or stored.checkpoint_owner is not None
            ):
                return None
            return self._store(attrs.evolve(stored, owner=new_owner, checkpoint_owner=lease.owner))

        return await self._write("start_handoff", apply)

    async def finish_handoff(self, lease: Lease) -> Lease | None:
        """counter+1 and ``checkpoint_owner`` removed; conditional on owner and checkpoint owner
        being ``lease.owner`` (the new owner) and ``lease.checkpoint_owner`` (the old one)."""

        def apply() -> Lease | None:
            stored = self._stored(lease.key)
            if (
                stored is None
                or lease.owner is None
                or lease.checkpoint_owner is None
                or stored.owner != lease.owner
                or stored.checkpoint_owner != lease.checkpoint_owner
            ):
                return None
            return self._store(
                attrs.evolve(stored, counter=stored.counter + 1, checkpoint_owner=None)
            )

        return await self._write("finish_handoff", apply)

    # -- test helpers (no faults, not counted as worker calls) ------------------------------

    def put_raw(self, key: str, lease: Lease) -> None:
        """Store ``lease`` under ``key`` unconditionally (replacing any item)."""
        self.table.corrupt.pop(key, None)
        self.table.leases[key] = lease if lease.key == key else attrs.evolve(lease, key=key)

    def put_corrupt(self, key: str, attribute: str, problem: str) -> None:
        """Store an item that does not parse as a lease."""
        self.table.leases.pop(key, None)
        self.table.corrupt[key] = CorruptLeaseError(key, attribute, problem)

    def set_sticky(self, key: str, value: int | str | None) -> None:
        """Set (or with None remove) the externally managed ``Sticky`` attribute."""
        stored = self.table.leases.get(key)
        if stored is None:
            raise KeyError(f"no lease {key!r}")
        self.table.writes["set_sticky"] += 1
        self.table.leases[key] = attrs.evolve(stored, sticky=value)


# ---------------------------------------------------------------------------------------------
# Streams

DEFAULT_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
#: The account id in-memory streams report (``describe_stream``), as kinesis-local's default.
MEMORY_ACCOUNT_ID = "000000000000"
DEFAULT_ITERATOR_TTL = 300.0
MAX_GET_RECORDS_LIMIT = 10_000
_FIRST_SEQUENCE = 10**20  # 21-digit sequence numbers: string order matches numeric order
_ITERATOR_PREFIX = "memit"


def _shard_name(number: int) -> str:
    return f"shardId-{number:012d}"


def _shard_number(shard_id: str) -> int | None:
    head, _, digits = shard_id.partition("-")
    return int(digits) if head == "shardId" and digits.isdigit() else None


def partition_key_hash(partition_key: str) -> int:
    """The 128-bit hash key Kinesis derives from a partition key (MD5, as an integer)."""
    return int(hashlib.md5(partition_key.encode("utf-8")).hexdigest(), 16)


def _loop_time() -> float:
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
        self.epoch = _aware(epoch)
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
        stream.epoch = _aware(epoch)
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
        return (_aware(when) - self.epoch).total_seconds()

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
        now = _loop_time()
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
        now = _loop_time()
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
        now = _loop_time()
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
        return "|".join(
            (
                _ITERATOR_PREFIX,
                self.stream,
                self.shard_id,
                str(self.start),
                min_arrival,
                repr(self.created),
            )
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

        return await _with_faults(self.faults, "describe_stream", apply)

    async def list_shards(
        self, stream: str, shard_filter: ShardFilter | None = None
    ) -> list[Shard]:
        self.reads["list_shards"] += 1
        return await _with_faults(
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
            return _Iterator(stream, shard_id, start, min_arrival, _loop_time()).encode()

        return await _with_faults(self.faults, "get_shard_iterator", apply)

    async def get_records(
        self, stream: str, shard_id: str, iterator: str, limit: int
    ) -> GetRecordsResult:
        self.reads["get_records"] += 1
        if not 1 <= limit <= MAX_GET_RECORDS_LIMIT:
            raise ValueError(f"limit must be in 1..{MAX_GET_RECORDS_LIMIT}, not {limit}")

        def apply() -> GetRecordsResult:
            it = _Iterator.decode(iterator)
            if it.stream != stream or it.shard_id != shard_id:
                raise ValueError(
                    f"iterator is for {it.stream}/{it.shard_id}, not {stream}/{shard_id}"
                )
            found = self._shard_stream(stream, shard_id)
            state = found._state(shard_id)
            now = _loop_time()
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
            next_it = _Iterator(stream, shard_id, start, it.min_arrival, now).encode()
            return GetRecordsResult(batch, next_it, behind)

        return await _with_faults(self.faults, "get_records", apply)


# ---------------------------------------------------------------------------------------------
# Coordinator state (leader lock)


class MemoryCoordinatorState:
    """``CoordinatorStateStore`` over a dict shared by the simulated workers; conditional writes
    as ``DynamoCoordinatorState``'s. Each call is atomic; faults as for ``MemoryLeaseStore``
    (operation names ``get_lock``, ``create_lock``, ``replace_lock``, ``release_lock``)."""

    def __init__(
        self, items: dict[str, LockItem] | None = None, *, faults: FaultPlan | None = None
    ) -> None:
        self.items: dict[str, LockItem] = items if items is not None else {}
        self.faults = faults
        self.calls: Counter[str] = Counter()

    def shared(self, *, faults: FaultPlan | None = None) -> MemoryCoordinatorState:
        """Another worker's view of the same items."""
        return MemoryCoordinatorState(self.items, faults=faults)

    async def _call(self, op: str, apply: Callable[[], _T]) -> _T:
        self.calls[op] += 1
        return await _with_faults(self.faults, op, apply)

    async def ensure_table(self) -> None:
        await self._call("ensure_table", lambda: None)

    async def get_lock(self, key: str) -> LockItem | None:
        return await self._call("get_lock", lambda: self.items.get(key))

    async def create_lock(
        self, key: str, owner: str, lease_duration: float, version: str
    ) -> LockItem | None:
        def apply() -> LockItem | None:
            if key in self.items:
                return None
            self.items[key] = LockItem(owner, version, lease_duration)
            return self.items[key]

        return await self._call("create_lock", apply)

    async def replace_lock(
        self, key: str, expected_version: str, owner: str, lease_duration: float, version: str
    ) -> LockItem | None:
        def apply() -> LockItem | None:
            stored = self.items.get(key)
            if stored is None or stored.record_version != expected_version:
                return None
            self.items[key] = LockItem(owner, version, lease_duration)
            return self.items[key]

        return await self._call("replace_lock", apply)

    async def release_lock(self, key: str, expected_version: str, owner: str, version: str) -> bool:
        def apply() -> bool:
            stored = self.items.get(key)
            if stored is None or stored.record_version != expected_version:
                return False
            if stored.owner != owner:
                return False
            del self.items[key]  # as DynamoCoordinatorState (and the KCL 3.x): delete on release
            return True

        return await self._call("release_lock", apply)


def _aware(when: datetime) -> datetime:
    """Naive datetimes are taken as UTC."""
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


if TYPE_CHECKING:

    def _conforms(
        table: MemoryLeaseTable, client: MemoryStreamClient
    ) -> tuple[LeaseStore, StreamClient]:
        return MemoryLeaseStore(table), client

    def _conforms_lock(state: MemoryCoordinatorState) -> CoordinatorStateStore:
        return state


__all__ = [
    "DEFAULT_EPOCH",
    "DEFAULT_ITERATOR_TTL",
    "MEMORY_ACCOUNT_ID",
    "NO_FAULTS",
    "FaultPlan",
    "Latency",
    "MemoryCoordinatorState",
    "MemoryLeaseStore",
    "MemoryLeaseTable",
    "MemoryStream",
    "MemoryStreamClient",
    "OpFaults",
    "partition_key_hash",
]
