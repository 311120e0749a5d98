"""The conditions of every lease-table write, written once as data.

Owns: the condition each conditional write of the lease table carries (create, renew, take or
steal, release, checkpoint in its two fencing modes, handoff start and accept, delete,
childShardIds, the administrative Sticky write), and the choice of checkpoint fencing mode.
A condition is a small expression tree over a lease item's attributes: ``Equals``, ``Exists``,
``Missing``, and ``All`` of several. The DynamoDB adapter compiles a tree into a
ConditionExpression; the in-memory adapter evaluates the same tree against its stored item, so
both enforce exactly the rule written here.

Must not: do I/O, read clocks, know DynamoDB's attribute names or expression syntax (the
adapters map ``Attr`` to their own storage), or describe the updates a write applies.

The rules (``lease`` is the caller's last view of the lease):

    write                 condition
    create                key missing
    renew                 counter = lease.counter AND owner = lease.owner
    take (also a steal)   counter = lease.counter
    release               owner = lease.owner
    checkpoint, normal    counter = lease.counter AND owner = lease.owner
                          AND checkpointOwner missing              (counter + 1)
    checkpoint, handoff   checkpointOwner = lease.checkpoint_owner (counter unchanged)
    start handoff         owner = lease.owner AND checkpointOwner missing
    accept handoff        owner = lease.owner AND checkpointOwner = lease.checkpoint_owner
    delete                counter = lease.counter
    childShardIds         counter = lease.counter AND (owner = lease.owner, or owner missing
                          when lease.owner is None)
    set Sticky (admin)    key exists

A lease with no owner compares its owner as ``""``, a value no stored owner has, so a write that
names the owner fails for a lease nobody holds.
"""

from __future__ import annotations

import enum

import attrs

from kclasync._core.lease import Lease


class Attr(enum.Enum):
    """The lease-item attributes conditions read, by their ``Lease`` field."""

    KEY = "key"
    COUNTER = "counter"
    OWNER = "owner"
    CHECKPOINT_OWNER = "checkpoint_owner"


Value = int | str


@attrs.frozen
class Equals:
    """The attribute exists and equals ``value``."""

    attr: Attr
    value: Value


@attrs.frozen
class Exists:
    attr: Attr


@attrs.frozen
class Missing:
    attr: Attr


@attrs.frozen
class All:
    """Every one of ``terms`` holds."""

    terms: tuple[Condition, ...]


Condition = Equals | Exists | Missing | All


def _owner(owner: str | None) -> Equals:
    return Equals(Attr.OWNER, owner if owner is not None else "")


def create() -> Condition:
    return Missing(Attr.KEY)


def renew(lease: Lease) -> Condition:
    return All((Equals(Attr.COUNTER, lease.counter), _owner(lease.owner)))


def take(lease: Lease) -> Condition:
    """Taking an expired lease and stealing a held one carry the same condition."""
    return Equals(Attr.COUNTER, lease.counter)


def release(lease: Lease) -> Condition:
    return _owner(lease.owner)


class CheckpointMode(enum.Enum):
    #: The owner checkpoints: fenced on counter and owner, no handoff under way; counter + 1.
    NORMAL = "normal"
    #: The old owner of a lease in handoff checkpoints: fenced on checkpointOwner only; the
    #: counter is left to the new owner, who renews meanwhile.
    HANDOFF = "handoff"


@attrs.frozen
class CheckpointRule:
    mode: CheckpointMode
    condition: Condition

    @property
    def increments_counter(self) -> bool:
        return self.mode is CheckpointMode.NORMAL


def checkpoint(lease: Lease) -> CheckpointRule:
    """The fencing of a checkpoint write: handoff mode when ``lease`` names a checkpoint owner."""
    if lease.checkpoint_owner is not None:
        return CheckpointRule(
            CheckpointMode.HANDOFF, Equals(Attr.CHECKPOINT_OWNER, lease.checkpoint_owner)
        )
    return CheckpointRule(
        CheckpointMode.NORMAL,
        All(
            (
                Equals(Attr.COUNTER, lease.counter),
                _owner(lease.owner),
                Missing(Attr.CHECKPOINT_OWNER),
            )
        ),
    )


def start_handoff(lease: Lease) -> Condition:
    return All((_owner(lease.owner), Missing(Attr.CHECKPOINT_OWNER)))


def finish_handoff(lease: Lease) -> Condition:
    return All(
        (
            _owner(lease.owner),
            Equals(Attr.CHECKPOINT_OWNER, lease.checkpoint_owner or ""),
        )
    )


def delete(lease: Lease) -> Condition:
    return Equals(Attr.COUNTER, lease.counter)


def update_child_shard_ids(lease: Lease) -> Condition:
    """As a checkpoint's fencing; a lease with no owner (the leader's backfill of a finished,
    unowned lease) requires the item to have no owner."""
    owner: Condition = Missing(Attr.OWNER) if lease.owner is None else _owner(lease.owner)
    return All((Equals(Attr.COUNTER, lease.counter), owner))


def set_sticky() -> Condition:
    return Exists(Attr.KEY)


def attributes(lease: Lease) -> dict[Attr, Value]:
    """The condition attributes a stored lease has (absent ones are left out)."""
    found: dict[Attr, Value] = {Attr.KEY: lease.key, Attr.COUNTER: lease.counter}
    if lease.owner is not None:
        found[Attr.OWNER] = lease.owner
    if lease.checkpoint_owner is not None:
        found[Attr.CHECKPOINT_OWNER] = lease.checkpoint_owner
    return found


__all__ = [
    "All",
    "Attr",
    "CheckpointMode",
    "CheckpointRule",
    "Condition",
    "Equals",
    "Exists",
    "Missing",
    "Value",
    "attributes",
    "checkpoint",
    "create",
    "delete",
    "finish_handoff",
    "release",
    "renew",
    "set_sticky",
    "start_handoff",
    "take",
    "update_child_shard_ids",
]
