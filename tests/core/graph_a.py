"""Graph A of kcl-protocol.md section 7 (the Java KCL's own test graph) and leases on it, shared
by the shard-lineage, shard-end and lineage-history tests.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Literal

from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import (
    SHARD_END,
    Checkpoint,
    InitialPosition,
    InitialPositionKind,
)
from kclasync._core.lineage.shard import MAX_HASH_KEY, HashRange, Shard


def sid(number: int) -> str:
    return f"shardId-{number:012d}"


POSITIONS: Mapping[InitialPositionKind, InitialPosition] = {
    InitialPositionKind.LATEST: InitialPosition.latest(),
    InitialPositionKind.TRIM_HORIZON: InitialPosition.trim_horizon(),
    InitialPositionKind.AT_TIMESTAMP: InitialPosition.at_timestamp(
        datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    ),
}

#   0 1 2 3 4   5      0-3: seq 11..102 (closed); 4: open from 11; 5: 11..205 (closed)
#   \ / \ / |   |
#    6   7  4   5      6=merge(0,1) 0-199, 7=merge(2,3) 200-399: seq 103..205 (closed)
#     \ /   |  / \
#      8    4 9  10    8=merge(6,7) 0-399; 9 and 10 split from 5: 206..open
#
# number, parent, adjacent parent, first hash key, last hash key, first seq, last seq (None: open)
_GRAPH_A_ROWS: list[tuple[int, int | None, int | None, int, int, str, str | None]] = [
    (0, None, None, 0, 99, "11", "102"),
    (1, None, None, 100, 199, "11", "102"),
    (2, None, None, 200, 299, "11", "102"),
    (3, None, None, 300, 399, "11", "102"),
    (4, None, None, 400, 499, "11", None),
    (5, None, None, 500, MAX_HASH_KEY, "11", "205"),
    (6, 0, 1, 0, 199, "103", "205"),
    (7, 2, 3, 200, 399, "103", "205"),
    (8, 6, 7, 0, 399, "206", None),
    (9, 5, None, 500, 799, "206", None),
    (10, 5, None, 800, MAX_HASH_KEY, "206", None),
]

GRAPH_A: list[Shard] = [
    Shard(
        shard_id=sid(number),
        parent_shard_id=None if parent is None else sid(parent),
        adjacent_parent_shard_id=None if adjacent is None else sid(adjacent),
        hash_range=HashRange(first_key, last_key),
        starting_sequence=first_seq,
        ending_sequence=last_seq,
    )
    for number, parent, adjacent, first_key, last_key, first_seq, last_seq in _GRAPH_A_ROWS
]
GRAPH_A_BY_ID = {shard.shard_id: shard for shard in GRAPH_A}


ExistingState = Literal["processing", "finished-if-closed"]


def lease_for(shard: Shard, checkpoint: Checkpoint, key: str | None = None) -> Lease:
    return Lease(
        key=shard.shard_id if key is None else key,
        owner="worker-1",
        counter=7,
        checkpoint=checkpoint,
        parent_shard_ids=frozenset(shard.parent_ids),
        hash_range=shard.hash_range,
    )


def existing_leases(numbers: Iterable[int], state: ExistingState) -> list[Lease]:
    leases = []
    for number in numbers:
        shard = GRAPH_A_BY_ID[sid(number)]
        finished = state == "finished-if-closed" and not shard.is_open
        leases.append(lease_for(shard, SHARD_END if finished else Checkpoint("150")))
    return leases
