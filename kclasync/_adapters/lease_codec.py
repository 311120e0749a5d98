"""Lease <-> DynamoDB item, with the Java KCL's attribute names and types.

Owns: the table schema (attribute names, DynamoDB types) and the parsing of items, including the
precise error for an item that is not a valid lease.
Must not: do I/O.
"""

from __future__ import annotations

import math
from typing import Any

from kclasync._core.lease import CorruptLeaseError, Lease
from kclasync._core.position import Checkpoint
from kclasync._core.shard import HashRange

Item = dict[str, dict[str, Any]]

LEASE_KEY = "leaseKey"
LEASE_OWNER = "leaseOwner"
LEASE_COUNTER = "leaseCounter"
OWNER_SWITCHES = "ownerSwitchesSinceCheckpoint"
CHECKPOINT = "checkpoint"
CHECKPOINT_SUBSEQ = "checkpointSubSequenceNumber"
PENDING_CHECKPOINT = "pendingCheckpoint"
PENDING_CHECKPOINT_SUBSEQ = "pendingCheckpointSubSequenceNumber"
PARENT_SHARD_ID = "parentShardId"
CHILD_SHARD_IDS = "childShardIds"
STARTING_HASH_KEY = "startingHashKey"
ENDING_HASH_KEY = "endingHashKey"
THROUGHPUT_KBPS = "throughputKBps"
CHECKPOINT_OWNER = "checkpointOwner"
STICKY = "Sticky"
STICKY_WORKER = "stickyWorker"

OWNER_INDEX = "LeaseOwnerToLeaseKeyIndex"

# Items carrying this attribute are typed entities, not leases; a scan skips them. kclasync
# writes none (its worker registry is ``<app>-WorkerMetricStats``); the registry items earlier
# versions kept here are removed on start (``worker_metrics_table.remove_legacy_registry_items``).
ENTITY_TYPE = "entityType"


def is_lease_item(item: Item) -> bool:
    return ENTITY_TYPE not in item


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _get(item: Item, key: str, name: str, dtype: str, *, required: bool = False) -> Any:
    """The value of a typed attribute: a ``str`` for S and N, a list of ``str`` for SS."""
    attr = item.get(name)
    if attr is None:
        if required:
            raise CorruptLeaseError(key, name, "is missing")
        return None
    if not isinstance(attr, dict) or dtype not in attr:
        got = next(iter(attr), "?") if isinstance(attr, dict) else type(attr).__name__
        raise CorruptLeaseError(key, name, f"has type {got}, expected {dtype}")
    value = attr[dtype]
    if dtype == "SS":
        if not isinstance(value, list | tuple | set | frozenset) or not all(
            isinstance(v, str) for v in value
        ):
            raise CorruptLeaseError(key, name, f"is not a set of strings: {_short(value)}")
        return list(value)
    if dtype == "N" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise CorruptLeaseError(key, name, f"has a {dtype} value that is not text: {_short(value)}")
    return value


def _int(key: str, name: str, text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise CorruptLeaseError(key, name, f"is not a whole number: {_short(text)}") from None
    if number < 0:
        raise CorruptLeaseError(key, name, f"is negative: {number}")
    return number


def _checkpoint(key: str, name: str, value: str, sub: int) -> Checkpoint:
    try:
        return Checkpoint(value, sub)
    except ValueError as exc:
        raise CorruptLeaseError(key, name, str(exc)) from None


def item_to_lease(item: Item) -> Lease:
    """Parse an item; raises CorruptLeaseError naming the lease and the bad attribute."""
    raw_key = item.get(LEASE_KEY, {})
    key = raw_key.get("S") if isinstance(raw_key, dict) else None
    if not isinstance(key, str) or not key:
        raise CorruptLeaseError(str(raw_key), LEASE_KEY, "is missing or not a string")

    counter = _int(key, LEASE_COUNTER, _get(item, key, LEASE_COUNTER, "N", required=True))
    owner = _get(item, key, LEASE_OWNER, "S")
    switches_raw = _get(item, key, OWNER_SWITCHES, "N")
    switches = 0 if switches_raw is None else _int(key, OWNER_SWITCHES, switches_raw)
    sub_raw = _get(item, key, CHECKPOINT_SUBSEQ, "N")
    sub = 0 if sub_raw is None else _int(key, CHECKPOINT_SUBSEQ, sub_raw)
    checkpoint = _checkpoint(key, CHECKPOINT, _get(item, key, CHECKPOINT, "S", required=True), sub)

    pending = None
    pending_raw = _get(item, key, PENDING_CHECKPOINT, "S")
    if pending_raw is not None:
        psub_raw = _get(item, key, PENDING_CHECKPOINT_SUBSEQ, "N")
        psub = 0 if psub_raw is None else _int(key, PENDING_CHECKPOINT_SUBSEQ, psub_raw)
        pending = _checkpoint(key, PENDING_CHECKPOINT, pending_raw, psub)

    parents = _get(item, key, PARENT_SHARD_ID, "SS") or []
    children = _get(item, key, CHILD_SHARD_IDS, "SS") or []

    hash_range = None
    start = _get(item, key, STARTING_HASH_KEY, "S")
    end = _get(item, key, ENDING_HASH_KEY, "S")
    if start is not None and end is not None:
        try:
            hash_range = HashRange.parse(start, end)
        except ValueError:
            raise CorruptLeaseError(
                key,
                STARTING_HASH_KEY,
                f"and {ENDING_HASH_KEY} are not a hash range: {start}..{end}",
            ) from None

    throughput = None
    tp_raw = _get(item, key, THROUGHPUT_KBPS, "N")
    if tp_raw is not None:
        try:
            throughput = float(tp_raw)
        except ValueError:
            throughput = math.nan
        if not math.isfinite(throughput) or throughput < 0:
            raise CorruptLeaseError(
                key, THROUGHPUT_KBPS, f"is not a non-negative number: {_short(tp_raw)}"
            )

    # Sticky is managed by people and scripts: a malformed value must not make the lease
    # unusable, so it is kept as a description and treated as "normal" by the planners.
    sticky: int | str | None = None
    sticky_attr = item.get(STICKY)
    if sticky_attr is not None:
        if isinstance(sticky_attr, dict) and "N" in sticky_attr:
            try:
                sticky = int(str(sticky_attr["N"]))
            except ValueError:
                sticky = f"non-integer number {_short(sticky_attr['N'])}"
        else:
            sticky = f"unexpected value {_short(sticky_attr)}"

    return Lease(
        key=key,
        counter=counter,
        owner=owner,
        checkpoint=checkpoint,
        pending_checkpoint=pending,
        owner_switches_since_checkpoint=switches,
        parent_shard_ids=frozenset(parents),
        child_shard_ids=frozenset(children),
        hash_range=hash_range,
        throughput_kbps=throughput,
        checkpoint_owner=_get(item, key, CHECKPOINT_OWNER, "S"),
        sticky=sticky,
        sticky_worker=_sticky_worker(item),
    )


def _sticky_worker(item: Item) -> str | None:
    attr = item.get(STICKY_WORKER)
    if isinstance(attr, dict) and isinstance(attr.get("S"), str) and attr["S"]:
        return str(attr["S"])
    return None  # absent or malformed: no named worker (the pin still holds)


def lease_to_item(lease: Lease) -> Item:
    """The full item for a new lease (``create``)."""
    item: Item = {
        LEASE_KEY: {"S": lease.key},
        LEASE_COUNTER: {"N": str(lease.counter)},
        CHECKPOINT: {"S": lease.checkpoint.value},
        CHECKPOINT_SUBSEQ: {"N": str(lease.checkpoint.sub_sequence)},
        OWNER_SWITCHES: {"N": str(lease.owner_switches_since_checkpoint)},
    }
    if lease.owner is not None:
        item[LEASE_OWNER] = {"S": lease.owner}
    if lease.pending_checkpoint is not None:
        item[PENDING_CHECKPOINT] = {"S": lease.pending_checkpoint.value}
        item[PENDING_CHECKPOINT_SUBSEQ] = {"N": str(lease.pending_checkpoint.sub_sequence)}
    if lease.parent_shard_ids:
        item[PARENT_SHARD_ID] = {"SS": sorted(lease.parent_shard_ids)}
    if lease.child_shard_ids:
        item[CHILD_SHARD_IDS] = {"SS": sorted(lease.child_shard_ids)}
    if lease.hash_range is not None:
        item[STARTING_HASH_KEY] = {"S": str(lease.hash_range.start)}
        item[ENDING_HASH_KEY] = {"S": str(lease.hash_range.end)}
    if lease.throughput_kbps is not None:
        item[THROUGHPUT_KBPS] = {"N": repr(float(lease.throughput_kbps))}
    if lease.checkpoint_owner is not None:
        item[CHECKPOINT_OWNER] = {"S": lease.checkpoint_owner}
    if isinstance(lease.sticky, int):
        item[STICKY] = {"N": str(lease.sticky)}
    if lease.sticky_worker is not None:
        item[STICKY_WORKER] = {"S": lease.sticky_worker}
    return item
