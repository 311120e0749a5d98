"""The lease: one row of the lease table, as the protocol sees it.

Owns: the ``Lease`` value, the sticky-attribute interpretation, and the error raised for an item
that does not parse as a lease. Attribute names and types live in the DynamoDB adapter's codec;
this module is storage-agnostic.
Must not: do I/O or read clocks.
"""

from __future__ import annotations

import enum

import attrs

from kclasync._core.leases.position import Checkpoint
from kclasync._core.lineage.shard import HashRange


class StickyMode(enum.Enum):
    """How the externally managed ``Sticky`` attribute constrains a lease."""

    NORMAL = "normal"  # -1, 0, any negative value, or missing
    PINNED = "pinned"  # 10: never stolen; renewable by its owner; assignable when unowned
    RELEASE = "release"  # 20: the owner checkpoints and releases; nobody takes it


STICKY_PINNED = 10
STICKY_RELEASE = 20


def sticky_mode(value: int | None) -> StickyMode | None:
    """Interpret a ``Sticky`` value; None means unknown (callers treat it as normal)."""
    if value is None or value <= 0:
        return StickyMode.NORMAL
    if value == STICKY_PINNED:
        return StickyMode.PINNED
    if value == STICKY_RELEASE:
        return StickyMode.RELEASE
    return None


@attrs.frozen
class Lease:
    """A lease as read from (or about to be written to) the lease table."""

    key: str
    counter: int = 0
    owner: str | None = None
    checkpoint: Checkpoint = attrs.field(factory=lambda: Checkpoint("TRIM_HORIZON"))
    pending_checkpoint: Checkpoint | None = None
    owner_switches_since_checkpoint: int = 0
    parent_shard_ids: frozenset[str] = frozenset()
    child_shard_ids: frozenset[str] = frozenset()
    hash_range: HashRange | None = None
    throughput_kbps: float | None = None
    checkpoint_owner: str | None = None
    # The raw ``Sticky`` number, or a string describing a malformed value.
    sticky: int | str | None = None
    #: With Sticky=10: the worker the lease is pinned to (``stickyWorker``), if any.
    sticky_worker: str | None = None

    @property
    def shard_id(self) -> str:
        """The shard id: the key itself, or its last ``:`` part in multi-stream keys."""
        return self.key.rsplit(":", 1)[-1]

    @property
    def sticky_mode(self) -> StickyMode | None:
        """The sticky mode, or None for an unknown or malformed value."""
        if isinstance(self.sticky, str):
            return None
        return sticky_mode(self.sticky)

    @property
    def is_finished(self) -> bool:
        return self.checkpoint.is_shard_end


class CorruptLeaseError(ValueError):
    """A lease-table item that cannot be read as a lease. Names the lease and the attribute."""

    def __init__(self, lease_key: str, attribute: str, problem: str) -> None:
        self.lease_key = lease_key
        self.attribute = attribute
        self.problem = problem
        super().__init__(f"lease {lease_key!r} is corrupt: attribute {attribute!r} {problem}")
