"""The Spark source's offsets and batch planning, without Spark or I/O.

Owns: the JSON offset Spark keeps in its checkpoint (one position per shard), what one executor
recorded for one shard in one batch (``ShardProgress``), the state after a batch, which shards may
be read (the lineage rules of ``_core.lineage.shard_lineage`` and ``shard_end``: a child only
after all its parents reached SHARD_END), and how a batch's read limit is shared between shards.
Must not: import pyspark, do I/O or read clocks (callers pass the time in).

How a batch is pinned down. Kinesis cannot tell where a shard ends without reading it, so the
driver does not read records: offset ``N`` holds where batch ``N`` *starts* in every shard and how
many records each shard may give (its quota). The executor that reads a shard records where it
stopped (``ShardProgress``) in a progress store *before* it hands any row to Spark, with a
create-if-absent write; a replay of batch ``N`` (a failed task, a restarted query) finds that
record and reads exactly the same records again. Batch ``N + 1`` starts where batch ``N``'s
records say it ended.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import attrs

from kclasync._adapters.protocols import ChildShard
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint, InitialPosition, Sentinel
from kclasync._core.lineage.shard import Shard
from kclasync._core.lineage.shard_end import child_leases_at_shard_end, parents_finished
from kclasync._core.lineage.shard_lineage import plan_new_leases
from kclasync._records import Record

__all__ = [
    "OFFSET_VERSION",
    "ShardPosition",
    "ShardProgress",
    "SourceOffset",
    "add_new_shards",
    "allocate_quotas",
    "checkpoint_of",
    "format_position",
    "initial_positions",
    "parse_position",
    "readable_shards",
    "state_after",
]

OFFSET_VERSION: Final = 1

TRIM_HORIZON: Final = Sentinel.TRIM_HORIZON.value
AT_TIMESTAMP: Final = Sentinel.AT_TIMESTAMP.value
SHARD_END: Final = Sentinel.SHARD_END.value


def _position_of(checkpoint: Checkpoint) -> str:
    # LATEST never reaches an offset: it is pinned to the query's start time (AT_TIMESTAMP), so
    # a batch that read nothing still starts at the same place when it is replayed.
    if checkpoint.sentinel is Sentinel.LATEST:
        return AT_TIMESTAMP
    return checkpoint.value


def parse_position(position: str) -> tuple[str, int]:
    """``<seq>`` or ``<seq>/<sub>`` (after user record ``sub`` of record ``seq``) as a pair."""
    seq, _, sub = position.partition("/")
    if not seq.isdigit() or (sub and not sub.isdigit()):
        raise ValueError(f"not a shard position: {position!r}")
    return seq, int(sub or 0)


def format_position(record: Record) -> str:
    """The position after ``record`` (a lease checkpoint's text form)."""
    if record.sub_sequence_number:
        return f"{record.sequence_number}/{record.sub_sequence_number}"
    return record.sequence_number


def checkpoint_of(position: str) -> Checkpoint:
    """A position as a lease checkpoint (sentinels stay sentinels)."""
    if position.split("/")[0].isdigit():
        seq, sub = parse_position(position)
        return Checkpoint(seq, sub)
    return Checkpoint(position)


@attrs.frozen
class ShardPosition:
    """One shard in an offset: where the batch starts and how many records it may read."""

    position: str  # a sequence number, TRIM_HORIZON, AT_TIMESTAMP or SHARD_END
    parents: tuple[str, ...] = ()
    quota: int = 0

    @property
    def ended(self) -> bool:
        return self.position == SHARD_END

    def to_json(self) -> dict[str, Any]:
        return {"pos": self.position, "parents": list(self.parents), "quota": self.quota}

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ShardPosition:
        return cls(str(raw["pos"]), tuple(raw.get("parents", ())), int(raw.get("quota", 0)))


@attrs.frozen
class SourceOffset:
    """Spark's offset for the Kinesis source.

    ``run`` identifies the query (made once by ``initialOffset`` and kept in Spark's checkpoint),
    ``batch`` numbers the batches of the run (-1 for the initial offset), ``timestamp`` is the
    ISO-8601 time AT_TIMESTAMP positions refer to, and ``until`` (Trigger.AvailableNow) the
    arrival time after which nothing is read in this run.
    """

    run: str
    batch: int
    shards: Mapping[str, ShardPosition]
    timestamp: str | None = None
    until: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "v": OFFSET_VERSION,
            "run": self.run,
            "batch": self.batch,
            "shards": {sid: self.shards[sid].to_json() for sid in sorted(self.shards)},
        }
        if self.timestamp is not None:
            out["timestamp"] = self.timestamp
        if self.until is not None:
            out["until"] = self.until
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> SourceOffset:
        version = raw.get("v")
        if version != OFFSET_VERSION:
            raise ValueError(f"unsupported kinesis source offset version {version!r}: {raw!r}")
        return cls(
            run=str(raw["run"]),
            batch=int(raw["batch"]),
            shards={
                str(sid): ShardPosition.from_json(pos) for sid, pos in dict(raw["shards"]).items()
            },
            timestamp=raw.get("timestamp"),
            until=raw.get("until"),
        )


@attrs.frozen
class ShardProgress:
    """What the executor that read one shard in one batch recorded, before returning any row.

    ``end`` is the position after the batch (the last record's sequence number, or the start
    position when nothing was read); ``ended`` means the shard reached SHARD_END (``children``
    from GetRecords' ChildShards); ``more`` means the read stopped at its quota or time limit
    rather than because it caught up; ``lost`` is the first record read when the records after
    the start were gone (trimmed) and the read carried on (``failOnDataLoss=false``).
    """

    records: int
    end: str
    ended: bool = False
    more: bool = False
    children: tuple[ChildShard, ...] = ()
    lost: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "records": self.records,
            "end": self.end,
            "ended": self.ended,
            "more": self.more,
            "children": [
                {"shard": c.shard_id, "parents": list(c.parent_shard_ids)} for c in self.children
            ],
            **({"lost": self.lost} if self.lost is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> ShardProgress:
        return cls(
            records=int(raw["records"]),
            end=str(raw["end"]),
            ended=bool(raw.get("ended", False)),
            more=bool(raw.get("more", False)),
            children=tuple(
                ChildShard(str(c["shard"]), tuple(c.get("parents", ())))
                for c in raw.get("children", ())
            ),
            lost=raw.get("lost"),
        )


# ---------------------------------------------------------------------------------------------


def _lease(shard_id: str, pos: ShardPosition) -> Lease:
    return Lease(
        key=shard_id,
        checkpoint=checkpoint_of(pos.position),
        parent_shard_ids=frozenset(pos.parents),
    )


def initial_positions(
    shards: Sequence[Shard], initial: InitialPosition
) -> dict[str, ShardPosition]:
    """A new query's shards: those the lease planner gives an empty lease table."""
    return {
        lease.shard_id: ShardPosition(
            _position_of(lease.checkpoint), tuple(sorted(lease.parent_shard_ids))
        )
        for lease in plan_new_leases(shards, [], initial)
    }


def state_after(
    offset: SourceOffset, progress: Mapping[str, ShardProgress]
) -> tuple[dict[str, ShardPosition], dict[str, ShardProgress]]:
    """Every shard's position once ``offset``'s batch is done (quotas reset to 0), and the
    progress records of the shards that were read. ``progress`` must hold a record for every
    shard with a quota: a batch whose reads were not all recorded did not complete."""
    state: dict[str, ShardPosition] = {}
    read: dict[str, ShardProgress] = {}
    for shard_id, pos in offset.shards.items():
        if pos.quota > 0:
            rec = progress.get(shard_id)
            if rec is None:
                raise LookupError(
                    f"no progress recorded for shard {shard_id} in batch {offset.batch} of run "
                    f"{offset.run}: the progress store (metadataPath) lost it or is not shared "
                    "by the driver and the executors"
                )
            read[shard_id] = rec
            state[shard_id] = attrs.evolve(
                pos, position=SHARD_END if rec.ended else rec.end, quota=0
            )
        else:
            state[shard_id] = attrs.evolve(pos, quota=0)
    return state, read


def add_new_shards(
    state: Mapping[str, ShardPosition],
    initial: InitialPosition,
    *,
    listed: Sequence[Shard] | None = None,
    reported_children: Iterable[ChildShard] = (),
) -> dict[str, ShardPosition]:
    """``state`` plus the shards the lineage rules say to start now.

    From a fresh shard listing, the lease planner's new leases (an open shard whose ancestors
    are not being read); for every shard at SHARD_END, its children (from the listing or from
    GetRecords' ChildShards), a merge child once its other parent is in the state too
    (``readable_shards`` keeps it unread until both parents ended). Children start at
    TRIM_HORIZON.
    """
    out = dict(state)
    leases = [_lease(sid, pos) for sid, pos in out.items()]
    created: list[Lease] = []
    if listed is not None:
        created.extend(plan_new_leases(listed, leases, initial))
    children: list[Shard | ChildShard] = [*reported_children]
    if listed is not None:
        children.extend(listed)
    listed_ids = None if listed is None else {shard.shard_id for shard in listed}
    for lease in leases:
        if lease.is_finished and children:
            plan = child_leases_at_shard_end(
                lease, children, [*leases, *created], listed=listed_ids
            )
            created.extend(plan.create)
    for lease in created:
        out.setdefault(
            lease.shard_id,
            ShardPosition(_position_of(lease.checkpoint), tuple(sorted(lease.parent_shard_ids))),
        )
    return out


def readable_shards(state: Mapping[str, ShardPosition]) -> list[str]:
    """Shards that may be read now: not at SHARD_END, and every parent in the state finished
    (``parents_finished``; a parent that is not in the state was trimmed or never read)."""
    leases = {sid: _lease(sid, pos) for sid, pos in state.items()}
    return sorted(
        sid
        for sid, lease in leases.items()
        if not lease.is_finished and parents_finished(lease, leases)
    )


def drained_shards(offset: SourceOffset, read: Mapping[str, ShardProgress]) -> set[tuple[str, str]]:
    """With Trigger.AvailableNow (``offset.until`` set) and GetRecords reads: the (shard,
    position after the batch) pairs that ``offset``'s batch read to the run's cutoff. A read
    that stopped neither at its quota or time limit (``more``) nor at SHARD_END stopped at the
    first record that arrived after ``until`` or at the shard's tip (a page that is empty, or
    shorter than asked for, with nothing behind), and it ran after ``until``: nothing that
    arrived by ``until`` is left after that position, so the run's next planning need not ask
    the shard again (a record that only becomes readable later is read by the next run)."""
    if offset.until is None:
        return set()
    return {
        (sid, rec.end)
        for sid, rec in read.items()
        if not rec.more and not rec.ended and offset.shards[sid].quota > 0
    }


def allocate_quotas(
    shards: Sequence[str], *, per_shard: int, per_batch: int | None, batch: int
) -> dict[str, int]:
    """Share a batch's record limit between ``shards``: at most ``per_shard`` each, at most
    ``per_batch`` in total. When the batch limit is smaller than the number of shards, the
    shards that get nothing rotate with the batch number, so none starves."""
    if per_shard < 1:
        raise ValueError(f"per_shard must be at least 1, got {per_shard}")
    if not shards:
        return {}
    ordered = sorted(shards)
    if per_batch is None:
        return dict.fromkeys(ordered, per_shard)
    if per_batch < 1:
        raise ValueError(f"per_batch must be at least 1, got {per_batch}")
    shift = batch % len(ordered)
    rotated = ordered[shift:] + ordered[:shift]
    base, extra = divmod(per_batch, len(rotated))
    quotas = {}
    for i, sid in enumerate(rotated):
        quotas[sid] = min(per_shard, base + (1 if i < extra else 0))
    return {sid: q for sid, q in sorted(quotas.items()) if q > 0}
