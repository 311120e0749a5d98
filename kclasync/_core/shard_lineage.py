"""Shard lineage: which leases to create, and when a lease may start.

Owns: the planning half of shard sync, i.e. given the stream's shard graph, the current lease table
and the initial position, which leases to create and at which checkpoint; the child leases to
create when a parent's shard has been read to its end (before its SHARD_END checkpoint); the
parent-before-child gate that decides whether a lease may start processing; and the hash-key
hole finder the lease auditor uses.
Must not: do I/O, read clocks, or mutate its inputs. It returns new ``Lease`` values; the runtime
writes them with ``LeaseStore.create_lease`` (conditional on the key not existing), so running a
plan twice, or on two workers at once, is harmless.

Vocabulary used below (the KCL's, from ``HierarchicalShardSyncer``):

* A shard's *parents* are ``parent_shard_id`` and ``adjacent_parent_shard_id`` (two after a merge).
  Only parents present in the shard list count for the walk; a parent trimmed from the stream has
  no records left, so its child behaves like a root.
* A shard is *covered* (the KCL says "a descendant") when it has a lease, or when one of its parents
  is covered, or, for initial positions that read history (TRIM_HORIZON, AT_TIMESTAMP), when it has
  any parent at all: that parent will be read from its beginning, so the child waits for it.
* A covered shard without a lease gets nothing now: its lease is created when a parent has been
  read to its end (``child_leases_at_shard_end``). Walking up from it through covered, unleased
  shards, the first uncovered shards met are the *frontier*: they get leases, and processing
  them leads back to the covered child.
"""

from __future__ import annotations

import graphlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Final, Protocol

import attrs

from kclasync._core.lease import Lease
from kclasync._core.position import (
    AT_TIMESTAMP,
    LATEST,
    TRIM_HORIZON,
    Checkpoint,
    InitialPosition,
    InitialPositionKind,
)
from kclasync._core.shard import MAX_HASH_KEY, HashRange, Shard

__all__ = [
    "ChildLeasePlan",
    "ChildShardInfo",
    "LeaseKeyFn",
    "child_leases_at_shard_end",
    "hash_range_holes",
    "parents_finished",
    "plan_new_leases",
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


# ---------------------------------------------------------------------------------------------
# The rule table: how each initial position shapes lease creation.


def _open_now(shard: Shard, shards_by_id: Mapping[str, Shard]) -> bool:
    """ListShards' AT_LATEST filter: the shards that are open now."""
    return shard.is_open


def _open_at_trim_horizon(shard: Shard, shards_by_id: Mapping[str, Shard]) -> bool:
    """ListShards' AT_TRIM_HORIZON filter: the oldest shards, whose parents are all gone."""
    return not any(parent in shards_by_id for parent in shard.parent_ids)


@attrs.frozen
class _PositionRule:
    # Empty lease table: the shards ListShards would return with this position's ShardFilter.
    # AT_TIMESTAMP's filter needs shard timestamps we do not have; from the graph alone, the
    # shards open at an arbitrary past instant are the oldest ones, as for TRIM_HORIZON.
    empty_table_filter: Callable[[Shard, Mapping[str, Shard]], bool]
    # Non-empty table: whether an unleased parent is still to be read from its beginning. If so,
    # every shard with a parent is covered and the walk reaches back to the oldest shards.
    reads_history: bool
    # Checkpoint of an uncovered open shard, and of every lease made on an empty table.
    start: Checkpoint
    # Checkpoint of a frontier ancestor, created because a covered descendant needs it. Under
    # TRIM_HORIZON / AT_TIMESTAMP that is TRIM_HORIZON / AT_TIMESTAMP. Under LATEST the KCL
    # starts it at LATEST, not TRIM_HORIZON (its tests expect shardId-6 at LATEST for graph A
    # with leases 4,5,7, and shardIds 2 and 6 at LATEST with leases 3,4,5): a closed shard read
    # from LATEST reaches SHARD_END at once, so the gap is skipped as a LATEST consumer skips
    # history, and the covered child is unblocked. Change this cell to read the gap instead.
    ancestor_start: Checkpoint


_RULES: Final[Mapping[InitialPositionKind, _PositionRule]] = {
    InitialPositionKind.LATEST: _PositionRule(
        empty_table_filter=_open_now,
        reads_history=False,
        start=LATEST,
        ancestor_start=LATEST,
    ),
    InitialPositionKind.TRIM_HORIZON: _PositionRule(
        empty_table_filter=_open_at_trim_horizon,
        reads_history=True,
        start=TRIM_HORIZON,
        ancestor_start=TRIM_HORIZON,
    ),
    InitialPositionKind.AT_TIMESTAMP: _PositionRule(
        empty_table_filter=_open_at_trim_horizon,
        reads_history=True,
        start=AT_TIMESTAMP,
        ancestor_start=AT_TIMESTAMP,
    ),
}

CHILD_START: Final = TRIM_HORIZON
"""Where a child lease starts: the beginning, so nothing between the parents' end and it is lost."""


# ---------------------------------------------------------------------------------------------
# Planning new leases (shard sync)


def _same_key(shard_id: str) -> str:
    return shard_id


def _new_lease(shard: Shard, key: str, checkpoint: Checkpoint) -> Lease:
    return Lease(
        key=key,
        checkpoint=checkpoint,
        parent_shard_ids=frozenset(shard.parent_ids),
        hash_range=shard.hash_range,
    )


def plan_new_leases(
    shards: Sequence[Shard],
    leases: Sequence[Lease],
    initial: InitialPosition,
    *,
    lease_key: LeaseKeyFn = _same_key,
) -> list[Lease]:
    """The leases a shard sync should create, sorted by shard id.

    ``shards`` is the stream's full shard list (ListShards without a filter); ``leases`` are the
    current leases of this stream; a shard has a lease when some lease's key is
    ``lease_key(shard_id)``. Existing leases count whatever their checkpoint, SHARD_END included.

    Empty table (``leases`` is empty): one lease per shard that ListShards' ShardFilter for the
    initial position returns (LATEST: the open shards; TRIM_HORIZON and AT_TIMESTAMP: the oldest
    shards, those with no parent in the list), each at the initial position.

    Non-empty table, for each open shard without a lease:

    * not covered (no ancestor has a lease, and under LATEST nothing older is wanted): it gets a
      lease at the initial position;
    * covered: it gets nothing now. Walking up through its covered, unleased ancestors, each
      uncovered parent met (the frontier) gets a lease at the rule table's ``ancestor_start``.
      Under TRIM_HORIZON / AT_TIMESTAMP the frontier is the oldest shards; under LATEST it is
      the uncovered shards next to the leased part of the lineage.

    Every new lease carries the shard's parents (all of them, present or not) and hash range.
    Raises ``graphlib.CycleError`` (a ``ValueError``) if parent links form a cycle.
    """
    rule = _RULES[initial.kind]
    shards_by_id = {shard.shard_id: shard for shard in shards}

    if not leases:
        return [
            _new_lease(shard, lease_key(shard_id), rule.start)
            for shard_id, shard in sorted(shards_by_id.items())
            if rule.empty_table_filter(shard, shards_by_id)
        ]

    lease_keys = {lease.key for lease in leases}
    leased = {shard_id for shard_id in shards_by_id if lease_key(shard_id) in lease_keys}
    covered = _covered_shards(shards_by_id, leased, reads_history=rule.reads_history)

    planned: dict[str, Checkpoint] = {}
    for shard_id, shard in sorted(shards_by_id.items()):
        if not shard.is_open or shard_id in leased:
            continue
        if shard_id not in covered:
            planned[shard_id] = rule.start
            continue
        for ancestor_id in _frontier(shard_id, shards_by_id, leased, covered):
            planned.setdefault(ancestor_id, rule.ancestor_start)

    return [
        _new_lease(shards_by_id[shard_id], lease_key(shard_id), checkpoint)
        for shard_id, checkpoint in sorted(planned.items())
    ]


def _present_parents(shard: Shard, shards_by_id: Mapping[str, Shard]) -> tuple[str, ...]:
    return tuple(parent for parent in shard.parent_ids if parent in shards_by_id)


def _covered_shards(
    shards_by_id: Mapping[str, Shard], leased: set[str], *, reads_history: bool
) -> set[str]:
    """The covered shards (KCL: "descendants"), computed parents-first."""
    graph = {
        shard_id: _present_parents(shard, shards_by_id) for shard_id, shard in shards_by_id.items()
    }
    covered: set[str] = set()
    for shard_id in graphlib.TopologicalSorter(graph).static_order():
        parents = graph[shard_id]
        if (
            shard_id in leased
            or (reads_history and parents)
            or any(parent in covered for parent in parents)
        ):
            covered.add(shard_id)
    return covered


def _frontier(
    start: str, shards_by_id: Mapping[str, Shard], leased: set[str], covered: set[str]
) -> set[str]:
    """The uncovered ancestors met first when walking up from ``start`` through covered shards
    that have no lease. Leased ancestors stop the walk: their lineage is already in hand."""
    frontier: set[str] = set()
    seen: set[str] = set()
    stack = [start]
    while stack:
        shard_id = stack.pop()
        for parent in _present_parents(shards_by_id[shard_id], shards_by_id):
            if parent in leased or parent in seen:
                continue
            if parent in covered:
                seen.add(parent)
                stack.append(parent)
            else:
                frontier.add(parent)
    return frontier


# ---------------------------------------------------------------------------------------------
# Children at SHARD_END, and the parent-before-child gate


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


# ---------------------------------------------------------------------------------------------
# Auditing


def hash_range_holes(leases: Iterable[Lease]) -> list[HashRange]:
    """The gaps in [0, 2^128-1] that no unfinished lease's hash range covers, in key order.

    Leases at SHARD_END are skipped (their shard takes no more records; until their children's
    leases exist, their range is a hole), and so are leases without a hash range: callers backfill
    those from the shard list first, or they would show up as holes. Overlaps are allowed.
    """
    ranges = sorted(
        (lease.hash_range.start, lease.hash_range.end)
        for lease in leases
        if lease.hash_range is not None and not lease.is_finished
    )
    holes: list[HashRange] = []
    first_uncovered = 0
    for start, end in ranges:
        if start > first_uncovered:
            holes.append(HashRange(first_uncovered, start - 1))
        first_uncovered = max(first_uncovered, end + 1)
    if first_uncovered <= MAX_HASH_KEY:
        holes.append(HashRange(first_uncovered, MAX_HASH_KEY))
    return holes
