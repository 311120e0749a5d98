"""Every lease-table write, and the leader lock's conditions, written once as data.

Owns: each write of the lease table (create, renew, take or steal, release, checkpoint in its two
fencing modes, handoff start and accept, delete, childShardIds, the administrative Sticky write)
as a ``Write``: the condition it carries and the update it applies; the choice of checkpoint
fencing mode; and the conditions of the leader lock's writes (create, replace, release).
A condition is a small expression tree over an item's attributes: ``Equals``, ``Exists``,
``Missing``, and ``All`` of several. An update is a tuple of actions: ``Set`` (a value),
``Remove`` (the attribute), ``Add`` (a number; a missing attribute counts as 0). The DynamoDB
adapters compile both into a ConditionExpression and an UpdateExpression
(``_adapters.dynamo_conditions``); the in-memory adapters evaluate the same condition against
their stored item and apply the same update to it, so both do exactly what is written here.

Must not: do I/O, read clocks, or know DynamoDB's attribute names or expression syntax (an
``Attr`` names a ``Lease`` field; the adapters map it to their own storage).

The rules (``lease`` is the caller's last view of the lease):

    write                 condition                                   update
    create                key missing                                 (the whole item)
    renew                 counter = lease.counter AND owner =         counter = lease.counter+1
                          lease.owner                                 [, throughput]
    take (also a steal)   counter = lease.counter                     counter = lease.counter+1,
                                                                      owner = new, switches + 1,
                                                                      remove checkpointOwner
    release               owner = lease.owner                         counter + 1, remove owner
    checkpoint, normal    counter = lease.counter AND owner =         counter = lease.counter+1,
                          lease.owner AND checkpointOwner missing     then as below
    checkpoint, handoff   checkpointOwner = lease.checkpoint_owner    (counter unchanged)
                          either mode: checkpoint, switches = 0, remove pending; or with a
                          pending checkpoint only pending = it
    start handoff         owner = lease.owner AND checkpointOwner     owner = new,
                          missing                                     checkpointOwner = old
    accept handoff        owner = lease.owner AND checkpointOwner =   counter + 1,
                          lease.checkpoint_owner                      remove checkpointOwner
    delete                counter = lease.counter                     (the item goes)
    childShardIds         counter = lease.counter AND (owner =        counter = lease.counter+1,
                          lease.owner, or owner missing when          childShardIds = ids
                          lease.owner is None)
    delete registry item  counter missing (not a lease)               (the item goes)
    set Sticky (admin)    key exists                                  Sticky, stickyWorker set
                                                                      or removed
    lock create           key missing                                 (the whole item)
    lock replace          key exists AND version = expected           (the whole item)
    lock release          key exists AND version = expected AND       (the item goes)
                          owner = holder

A lease with no owner compares its owner as ``""``, a value no stored owner has, so a write that
names the owner fails for a lease nobody holds.
"""

from __future__ import annotations

import enum

import attrs

from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint


class Attr(enum.Enum):
    """The lease-item attributes writes read and write, by their ``Lease`` field."""

    KEY = "key"
    COUNTER = "counter"
    OWNER = "owner"
    CHECKPOINT_OWNER = "checkpoint_owner"
    OWNER_SWITCHES = "owner_switches_since_checkpoint"
    CHECKPOINT = "checkpoint"
    PENDING_CHECKPOINT = "pending_checkpoint"
    CHILD_SHARD_IDS = "child_shard_ids"
    THROUGHPUT = "throughput_kbps"
    STICKY = "sticky"
    STICKY_WORKER = "sticky_worker"


class LockAttr(enum.Enum):
    """The leader-lock item's attributes its conditions read, by their ``LockItem`` meaning."""

    KEY = "key"
    OWNER = "owner"
    RECORD_VERSION = "record_version"


AnyAttr = Attr | LockAttr

#: What a condition compares with (a counter, an owner, a record version).
Value = int | str

#: What an update writes into a lease field.
FieldValue = int | float | str | Checkpoint | frozenset[str]


@attrs.frozen
class Equals:
    """The attribute exists and equals ``value``."""

    attr: AnyAttr
    value: Value


@attrs.frozen
class Exists:
    attr: AnyAttr


@attrs.frozen
class Missing:
    attr: AnyAttr


@attrs.frozen
class All:
    """Every one of ``terms`` holds."""

    terms: tuple[Condition, ...]


Condition = Equals | Exists | Missing | All


@attrs.frozen
class Set:
    """Write ``value`` into the attribute."""

    attr: Attr
    value: FieldValue


@attrs.frozen
class Remove:
    """Remove the attribute (the ``Lease`` field goes back to its default)."""

    attr: Attr


@attrs.frozen
class Add:
    """Add ``amount`` to a number attribute; a missing attribute counts as 0."""

    attr: Attr
    amount: int


Action = Set | Remove | Add


@attrs.frozen
class Write:
    """One conditional write: its condition and the update it applies (empty for a create,
    which puts a whole item, and a delete)."""

    condition: Condition
    update: tuple[Action, ...] = ()


def _owner(owner: str | None) -> Equals:
    return Equals(Attr.OWNER, owner if owner is not None else "")


def create() -> Write:
    return Write(Missing(Attr.KEY))


def renew(lease: Lease, throughput_kbps: float | None = None) -> Write:
    update: tuple[Action, ...] = (Set(Attr.COUNTER, lease.counter + 1),)
    if throughput_kbps is not None:
        update += (Set(Attr.THROUGHPUT, float(throughput_kbps)),)
    return Write(All((Equals(Attr.COUNTER, lease.counter), _owner(lease.owner))), update)


def take(lease: Lease, owner: str) -> Write:
    """Taking an expired lease and stealing a held one are the same write."""
    return Write(
        Equals(Attr.COUNTER, lease.counter),
        (
            Set(Attr.COUNTER, lease.counter + 1),
            Set(Attr.OWNER, owner),
            Add(Attr.OWNER_SWITCHES, 1),
            Remove(Attr.CHECKPOINT_OWNER),
        ),
    )


def release(lease: Lease) -> Write:
    return Write(_owner(lease.owner), (Add(Attr.COUNTER, 1), Remove(Attr.OWNER)))


class CheckpointMode(enum.Enum):
    #: The owner checkpoints: fenced on counter and owner, no handoff under way; counter + 1.
    NORMAL = "normal"
    #: The old owner of a lease in handoff checkpoints: fenced on checkpointOwner only; the
    #: counter is left to the new owner, who renews meanwhile.
    HANDOFF = "handoff"


@attrs.frozen
class CheckpointRule(Write):
    mode: CheckpointMode = CheckpointMode.NORMAL

    @property
    def increments_counter(self) -> bool:
        return self.mode is CheckpointMode.NORMAL


def checkpoint(
    lease: Lease, position: Checkpoint, pending: Checkpoint | None = None
) -> CheckpointRule:
    """A checkpoint write: handoff mode when ``lease`` names a checkpoint owner. With
    ``pending`` only the pending checkpoint is written (the first of a two-phase checkpoint)."""
    written: tuple[Action, ...]
    if pending is not None:
        written = (Set(Attr.PENDING_CHECKPOINT, pending),)
    else:
        written = (
            Set(Attr.CHECKPOINT, position),
            Set(Attr.OWNER_SWITCHES, 0),
            Remove(Attr.PENDING_CHECKPOINT),
        )
    if lease.checkpoint_owner is not None:
        return CheckpointRule(
            Equals(Attr.CHECKPOINT_OWNER, lease.checkpoint_owner), written, CheckpointMode.HANDOFF
        )
    return CheckpointRule(
        All(
            (
                Equals(Attr.COUNTER, lease.counter),
                _owner(lease.owner),
                Missing(Attr.CHECKPOINT_OWNER),
            )
        ),
        (Set(Attr.COUNTER, lease.counter + 1), *written),
        CheckpointMode.NORMAL,
    )


def start_handoff(lease: Lease, new_owner: str) -> Write:
    """The owner hands the lease to ``new_owner`` and stays its checkpoint owner until the new
    owner accepts; the counter is unchanged."""
    return Write(
        All((_owner(lease.owner), Missing(Attr.CHECKPOINT_OWNER))),
        (Set(Attr.OWNER, new_owner), Set(Attr.CHECKPOINT_OWNER, lease.owner or "")),
    )


def finish_handoff(lease: Lease) -> Write:
    return Write(
        All(
            (
                _owner(lease.owner),
                Equals(Attr.CHECKPOINT_OWNER, lease.checkpoint_owner or ""),
            )
        ),
        (Add(Attr.COUNTER, 1), Remove(Attr.CHECKPOINT_OWNER)),
    )


def delete(lease: Lease) -> Write:
    return Write(Equals(Attr.COUNTER, lease.counter))


def update_child_shard_ids(lease: Lease, child_shard_ids: frozenset[str]) -> Write:
    """Fenced as a checkpoint; a lease with no owner (the leader's backfill of a finished,
    unowned lease) requires the item to have no owner. Raises ``ValueError`` for no ids (the
    DynamoDB set type cannot be empty)."""
    if not child_shard_ids:
        raise ValueError("childShardIds must not be empty (DynamoDB has no empty sets)")
    owner: Condition = Missing(Attr.OWNER) if lease.owner is None else _owner(lease.owner)
    return Write(
        All((Equals(Attr.COUNTER, lease.counter), owner)),
        (
            Set(Attr.COUNTER, lease.counter + 1),
            Set(Attr.CHILD_SHARD_IDS, frozenset(child_shard_ids)),
        ),
    )


def set_sticky(value: int | str | None, worker: str | None = None) -> Write:
    """Set ``Sticky`` (and ``stickyWorker``, removed when None), or remove both (None)."""
    update: tuple[Action, ...]
    if value is None:
        update = (Remove(Attr.STICKY), Remove(Attr.STICKY_WORKER))
    elif worker is None:
        update = (Set(Attr.STICKY, value), Remove(Attr.STICKY_WORKER))
    else:
        update = (Set(Attr.STICKY, value), Set(Attr.STICKY_WORKER, worker))
    return Write(Exists(Attr.KEY), update)


def delete_registry_item() -> Write:
    """Deleting a worker-registry item earlier versions kept in the lease table: only while
    it is still not a lease (no counter)."""
    return Write(Missing(Attr.COUNTER))


def attributes(lease: Lease) -> dict[Attr, FieldValue]:
    """The attributes a stored lease has (absent ones, None or an empty set, are left out)."""
    found: dict[Attr, FieldValue] = {}
    for attr in Attr:
        value = getattr(lease, attr.value)
        if value is not None and value != frozenset():
            found[attr] = value
    return found


# -- the leader lock (its writes put or delete whole items: conditions only) ----------------


def lock_create() -> Condition:
    return Missing(LockAttr.KEY)


def lock_replace(expected_version: str) -> Condition:
    """A take-over or heartbeat: the item still carries the record version read before."""
    return All((Exists(LockAttr.KEY), Equals(LockAttr.RECORD_VERSION, expected_version)))


def lock_release(expected_version: str, owner: str) -> Condition:
    return All(
        (
            Exists(LockAttr.KEY),
            Equals(LockAttr.RECORD_VERSION, expected_version),
            Equals(LockAttr.OWNER, owner),
        )
    )


__all__ = [
    "Action",
    "Add",
    "All",
    "AnyAttr",
    "Attr",
    "CheckpointMode",
    "CheckpointRule",
    "Condition",
    "Equals",
    "Exists",
    "FieldValue",
    "LockAttr",
    "Missing",
    "Remove",
    "Set",
    "Value",
    "Write",
    "attributes",
    "checkpoint",
    "create",
    "delete",
    "delete_registry_item",
    "finish_handoff",
    "lock_create",
    "lock_release",
    "lock_replace",
    "release",
    "renew",
    "set_sticky",
    "start_handoff",
    "take",
    "update_child_shard_ids",
]
