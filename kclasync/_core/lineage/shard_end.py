"""Shard end: the child leases a finished parent's shard needs, and the parent gate.

Owns: which child leases to create once a parent's shard has been read to its end (before its
SHARD_END checkpoint, as the KCL's shutdown task does; shard sync and the Spark source use the
same rule), and the parent-before-child gate that decides whether a lease may start processing.
Planning leases from the whole shard graph is ``shard_lineage``'s.
Must not: do I/O, read clocks, or mutate its inputs. It returns new ``Lease`` values; the runtime
writes them with ``LeaseStore.create_lease`` (conditional on the key not existing).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Final, Protocol

import attrs

from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import TRIM_HORIZON
from kclasync._core.lineage.shard import HashRange, Shard

CHILD_START: Final = TRIM_HORIZON
"""Where a child lease starts: the beginning, so nothing between the parents' end and it is lost."""

__all__ = [
    "ChildLeasePlan",
    "ChildShardInfo",
    "LeaseKeyFn",
    "child_leases_at_shard_end",
    "children_of_finished_parents",
    "parents_finished",
]

LeaseKeyFn = Callable[[str], str]
"""Maps a shard id to its lease key (the identity in single-stream mode)."""


class ChildShardInfo(Protocol):
    """A child shard as GetRecords reports it; ``adapters.protocols.ChildShard`` fits."""

    @property
    def shard_id(self) -> str: ...

    @property
    def parent_shard_ids(self) -> Sequence[str]: ...

    @property
    def hash_range(self) -> HashRange | None: ...


def _keys_like(lease_key: str) -> LeaseKeyFn:
    """Lease keys that share ``lease_key``'s stream prefix (empty in single-stream mode)."""
    shard_id = lease_key.rsplit(":", 1)[-1]
    prefix = lease_key[: len(lease_key) - len(shard_id)]
    return lambda other_shard_id: prefix + other_shard_id


def _parents_of(child: Shard | ChildShardInfo) -> tuple[str, ...]:
    if isinstance(child, Shard):
        return child.parent_ids
    return tuple(child.parent_shard_ids)


@attrs.frozen
class ChildLeasePlan:
    """What ``child_leases_at_shard_end`` decided for one parent."""

    #: The child leases to create now (conditionally: an existing key is left alone).
    create: tuple[Lease, ...]
    #: Merge children deferred because their other parent has no lease yet, by shard id.
    deferred: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        """Every child has, or is about to get, a lease: the parent may checkpoint SHARD_END."""
        return not self.deferred


def child_leases_at_shard_end(
    parent: Lease,
    children: Iterable[Shard | ChildShardInfo],
    leases: Iterable[Lease],
    *,
    lease_key: LeaseKeyFn | None = None,
    listed: Collection[str] | None = None,
) -> ChildLeasePlan:
    """The child leases to create for ``parent``, whose shard has been read to its end.

    This runs *before* the parent's SHARD_END checkpoint, as the KCL's shutdown task does:
    children first, then the processor's SHARD_END checkpoint. (The KCL writes
    ``childShardIds`` between the two; kclasync writes them after the checkpoint, which loses
    nothing: the children exist, and shard sync backfills a missing ``childShardIds``.) So a
    worker that dies right after its SHARD_END checkpoint leaves no child without a lease, which
    matters when nobody else would create it (a Java KCL fleet on an emulator that sends no
    ``ChildShards`` never does). The runtime checkpoints SHARD_END only once the plan is
    ``complete`` and its leases are written. Shard sync calls this too, for parents already at
    SHARD_END, to repair a table whose writer did not (an older kclasync, or a Java worker that
    got no ``ChildShards`` from GetRecords and so created no children).

    ``children`` may be GetRecords' ``ChildShards`` or the whole shard list: shards that do not
    name ``parent`` as a parent are ignored. ``leases`` is the current lease table (the caller's
    ``parent`` wins over any copy of it there). Lease keys default to ``parent``'s stream prefix.
    ``listed``, when given, holds the stream's current shard ids.

    Rules, in order:

    * a child that already has a lease is left alone;
    * a split child (one parent) is created;
    * a merge child is created as soon as its other parent has a lease, whatever that lease's
      checkpoint: the other parent may still be processing. That is safe because creating is
      not reading: ``parents_finished`` keeps the child unread until both parent leases are at
      SHARD_END or deleted, and an existing lease is exactly what that gate waits on;
    * a merge child whose other parent has no lease is deferred (``ChildLeasePlan.deferred``),
      as the KCL defers it. The missing lease is a hole shard sync has not filled yet (the other
      parent's own parent has not finished, or the table predates it), not a parent that
      finished: a finished parent's lease is only deleted after its children started, and this
      child has no lease. Created now, the child would pass the gate, which counts a missing
      parent lease as finished, and skip the other parent's records. The parent's worker retries
      until the lease appears. Two exceptions, neither created nor deferred: an other parent
      that is not in ``listed`` (trimmed from the stream: no records left), and a merge child
      with a leased descendant in ``children`` (it was read already and its lease deleted once
      its own children started; only a table that lost its lineage, e.g. a lease of an
      already-read shard created again, gets here, and waiting would then never end).

    New child leases start at TRIM_HORIZON and carry all their parents and their hash range
    (None when ``ChildShards`` did not report one). Both tuples are sorted by shard id.
    """
    key_of = lease_key if lease_key is not None else _keys_like(parent.key)
    by_key = {lease.key: lease for lease in leases}
    by_key[parent.key] = parent

    children_list = list(children)
    created: dict[str, Lease] = {}
    deferred: set[str] = set()
    for child in children_list:
        parents = _parents_of(child)
        child_key = key_of(child.shard_id)
        if parent.shard_id not in parents or child_key in by_key:
            continue
        missing = [
            other
            for other in parents
            if other != parent.shard_id
            and key_of(other) not in by_key
            and (listed is None or other in listed)
        ]
        if missing:
            if not _has_leased_descendant(child.shard_id, children_list, by_key, key_of):
                deferred.add(child.shard_id)
            continue
        created[child.shard_id] = Lease(
            key=child_key,
            checkpoint=CHILD_START,
            parent_shard_ids=frozenset(parents),
            hash_range=child.hash_range,
        )
    return ChildLeasePlan(
        create=tuple(created[shard_id] for shard_id in sorted(created)),
        deferred=tuple(sorted(deferred)),
    )


def children_of_finished_parents(
    leases: Sequence[Lease],
    shards: Sequence[Shard],
    planned: Sequence[Lease] = (),
    *,
    lease_key: LeaseKeyFn | None = None,
) -> list[Lease]:
    """The child leases missing under parents already at SHARD_END, whoever asks.

    A worker that died between its SHARD_END checkpoint and its children (an older kclasync,
    or a Java worker that got no ``ChildShards`` and so created none) leaves finished parents
    whose children nobody will read until someone creates their leases. This is the repair:
    ``child_leases_at_shard_end`` for every finished lease of ``leases`` against the stream's
    whole shard list ``shards``, counting ``planned`` (leases about to be created) and the
    children found for earlier parents as existing. Any worker may apply it, not only the
    leader: creating is conditional on the key not existing and is not reading (the parent
    gate still holds each child back until all its parents are finished). Workers apply it at
    start, so a fleet that takes over a table whose leader died (a Java leader's lock lasts
    120 s) reads the children at once; the leader applies it at every shard sync.
    """
    listed = {shard.shard_id for shard in shards}
    known = [*leases, *planned]
    out: list[Lease] = []
    for parent in leases:
        if parent.is_finished:
            made = child_leases_at_shard_end(
                parent, shards, known, lease_key=lease_key, listed=listed
            ).create
            known += made
            out += made
    return out


def _has_leased_descendant(
    shard_id: str,
    shards: Sequence[Shard | ChildShardInfo],
    by_key: Mapping[str, Lease],
    key_of: LeaseKeyFn,
) -> bool:
    found = {shard_id}
    grew = True
    while grew:
        grew = False
        for shard in shards:
            if shard.shard_id not in found and any(p in found for p in _parents_of(shard)):
                if key_of(shard.shard_id) in by_key:
                    return True
                found.add(shard.shard_id)
                grew = True
    return False


def parents_finished(
    lease: Lease, leases_by_key: Mapping[str, Lease], *, lease_key: LeaseKeyFn | None = None
) -> bool:
    """Whether ``lease`` may start processing: every parent lease is gone or at SHARD_END.

    A parent's lease is looked up by ``lease_key(parent_id)``, by default the child's stream prefix
    plus the parent's shard id. A missing parent lease counts as finished: it was deleted after
    SHARD_END, or its shard was skipped or trimmed. (Child creation is what keeps a missing lease
    from meaning "not created yet": a child lease is only created once each of its parents has
    a lease, or was skipped or trimmed; see ``child_leases_at_shard_end``.)
    """
    key_of = lease_key if lease_key is not None else _keys_like(lease.key)
    for parent_id in lease.parent_shard_ids:
        parent_lease = leases_by_key.get(key_of(parent_id))
        if parent_lease is not None and not parent_lease.is_finished:
            return False
    return True
