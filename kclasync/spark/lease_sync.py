"""The Spark source's positions in a kclasync (KCL) lease table, so a pipeline can move between
the Spark source and kclasync workers without reading anything twice.

Owns: reading a lease table's checkpoints as the source's starting positions, and writing the
source's committed positions as checkpoints (creating missing leases; taking, checkpointing and
releasing existing ones, all with the lease store's fenced writes).
Must not: import pyspark. Only one side may run at a time: a lease held by a live worker is
refused, never stolen.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from kclasync._adapters.protocols import LeaseStore
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync.errors import KclAsyncError
from kclasync.spark.offsets import AT_TIMESTAMP, ShardPosition, checkpoint_of

__all__ = ["SPARK_OWNER_PREFIX", "LeaseHeldError", "read_positions", "write_positions"]

log = logging.getLogger("kclasync.spark")

#: Leases are taken under ``<prefix>:<run>`` for the moment of a write, then released.
SPARK_OWNER_PREFIX = "kclasync-spark"


class LeaseHeldError(KclAsyncError):
    """A kclasync worker holds a lease the Spark source wanted to checkpoint."""


async def read_positions(store: LeaseStore) -> dict[str, ShardPosition]:
    """The table's single-stream leases as source positions (empty when there are none)."""
    scan = await store.list_leases()
    out = {}
    for lease in scan.leases:
        if ":" in lease.key:
            continue  # a multi-stream key: not written by or for one source
        value = lease.checkpoint.value
        position = AT_TIMESTAMP if value == "LATEST" else str(lease.checkpoint)
        out[lease.key] = ShardPosition(position, tuple(sorted(lease.parent_shard_ids)))
    return out


def _behind(new: Checkpoint, old: Checkpoint) -> bool:
    return new.key() < old.key()


async def write_positions(store: LeaseStore, state: Mapping[str, ShardPosition], owner: str) -> int:
    """Checkpoint every shard of ``state`` in the table; returns how many items were written.

    A missing lease is created unowned at its position; a lease whose checkpoint differs is
    taken (conditional on its counter), checkpointed and released. Leases are never moved
    backwards. Raises ``LeaseHeldError`` when a lease that needs a write has an owner that is
    not a Spark source: stop the kclasync workers first.
    """
    scan = await store.list_leases()
    by_key: dict[str, Lease] = {lease.key: lease for lease in scan.leases}
    written = 0
    for shard_id in sorted(state):
        pos = state[shard_id]
        checkpoint = checkpoint_of(pos.position)
        existing = by_key.get(shard_id)
        if existing is None:
            lease = Lease(
                key=shard_id, checkpoint=checkpoint, parent_shard_ids=frozenset(pos.parents)
            )
            if await store.create_lease(lease):
                written += 1
                continue
            existing = await store.get_lease(shard_id)
            if existing is None:
                continue
        if existing.checkpoint == checkpoint:
            continue
        if existing.is_finished or _behind(checkpoint, existing.checkpoint):
            log.warning(
                "lease %s is at %s, ahead of the Spark source's %s; left alone",
                shard_id,
                existing.checkpoint,
                checkpoint,
            )
            continue
        if existing.owner is not None and not existing.owner.startswith(SPARK_OWNER_PREFIX):
            raise LeaseHeldError(
                f"lease {shard_id!r} is held by worker {existing.owner!r}: stop the kclasync "
                "workers before the Spark source writes this lease table"
            )
        taken = await store.take_lease(existing, owner)
        if taken is None:
            raise LeaseHeldError(f"lease {shard_id!r} changed while the Spark source took it")
        done = await store.checkpoint(taken, checkpoint)
        if done is None:
            raise LeaseHeldError(f"lease {shard_id!r} changed while the Spark source wrote it")
        await store.release_lease(done)
        written += 1
    return written
