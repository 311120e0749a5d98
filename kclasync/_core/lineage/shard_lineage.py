"""Shard lineage: which leases to create from the stream's shard graph.

Owns: the planning half of shard sync, i.e. given the stream's shard graph, the current lease table
and the initial position, which leases to create and at which checkpoint; and the hash-key hole
finder the lease auditor uses. The child leases of a shard read to its end, and the
parent-before-child gate, are ``shard_end``'s.
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
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import attrs

from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import (
    AT_TIMESTAMP,
    LATEST,
    TRIM_HORIZON,
    Checkpoint,
    InitialPosition,
    InitialPositionKind,
)
from kclasync._core.lineage.shard import MAX_HASH_KEY, HashRange, Shard
from kclasync._core.lineage.shard_end import LeaseKeyFn

__all__ = [
    "LeaseKeyFn",
    "hash_range_holes",
    "plan_new_leases",
]


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
