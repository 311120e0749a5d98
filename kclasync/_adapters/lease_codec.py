"""Lease <-> DynamoDB item, with the Java KCL's attribute names and types.

Owns: the table schema (attribute names, DynamoDB types): the one place of the lease item's
attribute names. Which stored attributes hold each ``Lease`` field (``FIELD_ATTRIBUTES``), how a
field's value is stored (``field_item``, used for whole items and for the values of the writes'
compiled expressions), and the parsing of items, including the precise error for an item that is
not a valid lease.
Must not: do I/O.
"""

from __future__ import annotations

import math
from typing import Any

from kclasync._core.leases.lease import CorruptLeaseError, Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._core.lineage.shard import HashRange

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


#: The stored attributes of each ``Lease`` field, by field name (a checkpoint is two).
FIELD_ATTRIBUTES: dict[str, tuple[str, ...]] = {
    "key": (LEASE_KEY,),
    "counter": (LEASE_COUNTER,),
    "owner": (LEASE_OWNER,),
    "checkpoint": (CHECKPOINT, CHECKPOINT_SUBSEQ),
    "pending_checkpoint": (PENDING_CHECKPOINT, PENDING_CHECKPOINT_SUBSEQ),
    "owner_switches_since_checkpoint": (OWNER_SWITCHES,),
    "parent_shard_ids": (PARENT_SHARD_ID,),
    "child_shard_ids": (CHILD_SHARD_IDS,),
    "hash_range": (STARTING_HASH_KEY, ENDING_HASH_KEY),
    "throughput_kbps": (THROUGHPUT_KBPS,),
    "checkpoint_owner": (CHECKPOINT_OWNER,),
    "sticky": (STICKY,),
    "sticky_worker": (STICKY_WORKER,),
}

_NUMBERS = {"counter", "owner_switches_since_checkpoint", "sticky"}
_STRINGS = {"key", "owner", "checkpoint_owner", "sticky_worker"}
_SETS = {"parent_shard_ids", "child_shard_ids"}


def field_item(field: str, value: Any) -> Item:
    """The stored attributes (name -> typed value) of one ``Lease`` field's value. Raises
    ``ValueError`` for a value the schema cannot store (a malformed ``Sticky`` description)."""
    names = FIELD_ATTRIBUTES[field]
    if field in _STRINGS and isinstance(value, str):
        return {names[0]: {"S": value}}
    if field in _NUMBERS and isinstance(value, int) and not isinstance(value, bool):
        return {names[0]: {"N": str(value)}}
    if field in _SETS and isinstance(value, frozenset | set):
        return {names[0]: {"SS": sorted(value)}}
    if field in ("checkpoint", "pending_checkpoint") and isinstance(value, Checkpoint):
        return {names[0]: {"S": value.value}, names[1]: {"N": str(value.sub_sequence)}}
    if field == "hash_range" and isinstance(value, HashRange):
        return {names[0]: {"S": str(value.start)}, names[1]: {"S": str(value.end)}}
    if field == "throughput_kbps" and isinstance(value, int | float):
        return {names[0]: {"N": repr(float(value))}}
    raise ValueError(f"lease field {field} cannot store {value!r}")


#: The fields every stored lease has.
_ALWAYS = ("key", "counter", "checkpoint", "owner_switches_since_checkpoint")
#: The fields stored only when set (None, an empty set or a malformed Sticky are left out).
_OPTIONAL = (
    "owner",
    "pending_checkpoint",
    "parent_shard_ids",
    "child_shard_ids",
    "hash_range",
    "throughput_kbps",
    "checkpoint_owner",
    "sticky",
    "sticky_worker",
)


def lease_to_item(lease: Lease) -> Item:
    """The full item for a new lease (``create``)."""
    item: Item = {}
    for field in _ALWAYS:
        item |= field_item(field, getattr(lease, field))
    for field in _OPTIONAL:
        value = getattr(lease, field)
        if value is None or value == frozenset() or (field == "sticky" and isinstance(value, str)):
            continue
        item |= field_item(field, value)
    return item
