"""The two small interfaces the runtime does its I/O through.

Owns: ``LeaseStore`` (the lease table, with conditional writes) and ``StreamClient`` (shard listing
and record fetching), the values they exchange, and the errors they raise. Implementations:
``adapters.dynamodb`` / ``adapters.kinesis`` (AWS), and in-memory stand-ins for simulation.
Must not: contain protocol decisions; those live in ``kclasync._core``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

import attrs

from kclasync._core.leases.client_version import MigrationState
from kclasync._core.leases.leader_lock import LockItem
from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._core.lineage.shard import HashRange, Shard
from kclasync._core.lineage.streams import StreamIdentity
from kclasync._records import Record
from kclasync.errors import AdapterError
from kclasync.errors import ThrottledError as ThrottledError  # re-exported for older imports
from kclasync.errors import TransientError as TransientError  # re-exported for older imports

# ---------------------------------------------------------------------------------------------
# Errors (``AdapterError``, ``ThrottledError`` and ``TransientError`` live in ``kclasync.errors``)


class ExpiredIteratorError(AdapterError):
    """A shard iterator is older than five minutes and must be replaced."""


class ShardNotFoundError(AdapterError):
    """The shard (or its stream) no longer exists."""


# ---------------------------------------------------------------------------------------------
# Lease store


@attrs.frozen
class LeaseScan:
    """A full read of the lease table: parseable leases and items that are not. The table
    holds leases only (the worker registry is ``<app>-WorkerMetricStats``)."""

    leases: tuple[Lease, ...]
    corrupt: tuple[CorruptLeaseError, ...] = ()


class LeaseStore(Protocol):
    """The lease table. Every owner write is conditional (fenced) as the KCL's are.

    Conditional methods return the lease as written, or None when the condition failed.
    """

    async def ensure_table(self) -> None:
        """Create the table (and its owner index) if missing and wait until it is usable."""

    async def is_empty(self) -> bool: ...

    async def list_leases(self) -> LeaseScan: ...

    async def get_lease(self, key: str) -> Lease | None:
        """Read one lease strongly; raises CorruptLeaseError for an unreadable item."""

    async def lease_keys_of(self, owner: str) -> tuple[str, ...]:
        """The keys of the leases whose ``leaseOwner`` is ``owner``, from the owner index
        (``LeaseOwnerToLeaseKeyIndex``: eventually consistent, keys only), sorted."""

    async def create_lease(self, lease: Lease) -> bool:
        """Write a new lease if no item has its key. False when one already exists."""

    async def renew_lease(self, lease: Lease, throughput_kbps: float | None = None) -> Lease | None:
        """counter+1, conditional on counter and owner being as in ``lease``."""

    async def take_lease(self, lease: Lease, owner: str) -> Lease | None:
        """Become owner: counter+1, ownerSwitches+1, checkpointOwner removed; on counter."""

    async def release_lease(self, lease: Lease) -> Lease | None:
        """Remove the owner (counter+1), conditional on ``lease.owner`` still owning it."""

    async def checkpoint(
        self, lease: Lease, checkpoint: Checkpoint, pending: Checkpoint | None = None
    ) -> Lease | None:
        """Write the checkpoint, clear the pending one and reset ownerSwitches.

        Normal mode (``lease.checkpoint_owner`` is None): conditional on counter and owner as in
        ``lease`` and on no handoff being under way; counter+1.
        Handoff mode (``lease.checkpoint_owner`` set, the caller being that old owner):
        conditional only on ``checkpointOwner`` still naming it; the counter is not changed,
        because the new owner renews the lease meanwhile.
        With ``pending`` given, only the pending checkpoint is written (``checkpoint`` ignored).
        """

    async def start_handoff(self, lease: Lease, new_owner: str) -> Lease | None:
        """A planned move: leaseOwner = ``new_owner``, checkpointOwner = the old owner; counter
        unchanged. Conditional on ``lease.owner`` still owning it and no handoff under way."""

    async def finish_handoff(self, lease: Lease) -> Lease | None:
        """The old owner is done: remove checkpointOwner, counter+1. Conditional on owner and
        checkpointOwner being as in ``lease``."""

    async def delete_lease(self, lease: Lease) -> bool:
        """Delete, conditional on the counter being unchanged."""

    async def update_child_shard_ids(
        self, lease: Lease, child_shard_ids: frozenset[str]
    ) -> Lease | None:
        """Write ``childShardIds`` (at SHARD_END), counter+1; conditional on counter and owner
        being as in ``lease`` (an owner of None: the item has no owner), like a checkpoint."""


# ---------------------------------------------------------------------------------------------
# Coordinator state (the leader lock)


class CoordinatorStateStore(Protocol):
    """The ``<app>-CoordinatorState`` table: lock items keyed by name (the leader's is
    ``"Leader"``). Every write is conditional; ``version`` is the new record version number.
    Conditional methods return the item as written, or None when the condition failed."""

    async def ensure_table(self) -> None: ...

    async def get_lock(self, key: str) -> LockItem | None:
        """Read strongly; None when there is no item."""

    async def get_migration_state(self) -> MigrationState | None:
        """The Java KCL's ``Migration3.0`` item (read only); None when absent."""

    async def create_lock(
        self,
        key: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None = None,
    ) -> LockItem | None:
        """Create the item, conditional on it not existing. ``successors``: the workers the
        item names to watch it fast (``core.lock_term.successors``; None: none, no attribute)."""

    async def replace_lock(
        self,
        key: str,
        expected_version: str,
        owner: str,
        lease_duration: float,
        version: str,
        successors: tuple[str, ...] | None = None,
    ) -> LockItem | None:
        """Take over or heartbeat: write owner, duration, ``version`` and ``successors`` (not
        released), conditional on the record version being ``expected_version``."""

    async def release_lock(self, key: str, expected_version: str, owner: str, version: str) -> bool:
        """Mark released, conditional on ``expected_version`` and ``owner``."""


# ---------------------------------------------------------------------------------------------
# Stream client


class IteratorType(str, enum.Enum):
    TRIM_HORIZON = "TRIM_HORIZON"
    LATEST = "LATEST"
    AT_SEQUENCE_NUMBER = "AT_SEQUENCE_NUMBER"
    AFTER_SEQUENCE_NUMBER = "AFTER_SEQUENCE_NUMBER"
    AT_TIMESTAMP = "AT_TIMESTAMP"


@attrs.frozen
class StartingPosition:
    type: IteratorType
    sequence_number: str | None = None
    timestamp: datetime | None = None

    def __attrs_post_init__(self) -> None:
        needs_seq = self.type in (
            IteratorType.AT_SEQUENCE_NUMBER,
            IteratorType.AFTER_SEQUENCE_NUMBER,
        )
        if needs_seq != (self.sequence_number is not None):
            raise ValueError(f"{self.type.value} and sequence_number go together")
        if (self.type is IteratorType.AT_TIMESTAMP) != (self.timestamp is not None):
            raise ValueError("AT_TIMESTAMP and timestamp go together")


@attrs.frozen
class ChildShard:
    shard_id: str
    parent_shard_ids: tuple[str, ...]
    hash_range: HashRange | None = None


@attrs.frozen
class GetRecordsResult:
    records: Sequence[Record]
    next_iterator: str | None
    millis_behind_latest: int | None = None
    child_shards: tuple[ChildShard, ...] = ()

    @property
    def shard_ended(self) -> bool:
        return self.next_iterator is None


class ShardFilterType(str, enum.Enum):
    AT_LATEST = "AT_LATEST"
    AT_TRIM_HORIZON = "AT_TRIM_HORIZON"
    AT_TIMESTAMP = "AT_TIMESTAMP"


@attrs.frozen
class ShardFilter:
    type: ShardFilterType
    timestamp: datetime | None = None


class StreamClient(Protocol):
    async def describe_stream(self, stream: str) -> StreamIdentity:
        """Account, name and creation epoch (DescribeStreamSummary); for multi-stream keys."""

    async def list_shards(
        self, stream: str, shard_filter: ShardFilter | None = None
    ) -> list[Shard]:
        """Every shard (following NextToken), optionally filtered as ListShards does."""

    async def get_shard_iterator(
        self, stream: str, shard_id: str, position: StartingPosition
    ) -> str: ...

    async def get_records(
        self, stream: str, shard_id: str, iterator: str, limit: int
    ) -> GetRecordsResult:
        """One GetRecords call. Raises ThrottledError, ExpiredIteratorError, ShardNotFoundError."""
