"""Tests for _core.lineage.shard_lineage and kclasync._core.lineage.shard_end, driven by random
split/merge histories: a model stream and consumer read parents before children, recover the
open shards from any lease table, plan idempotently, and find exactly the removed ranges.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import attrs
from hypothesis import given, settings
from hypothesis import strategies as st

from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import (
    SHARD_END,
    TRIM_HORIZON,
    Checkpoint,
    InitialPosition,
    InitialPositionKind,
)
from kclasync._core.lineage.shard import MAX_HASH_KEY, HashRange, Shard
from kclasync._core.lineage.shard_end import (
    ChildLeasePlan,
    child_leases_at_shard_end,
    parents_finished,
)
from kclasync._core.lineage.shard_lineage import hash_range_holes, plan_new_leases
from tests.core.graph_a import (
    POSITIONS,
    lease_for,
    sid,
)


@attrs.define
class Stream:
    """A resharding stream, as far as lineage is concerned."""

    shards: dict[str, Shard]
    next_number: int
    clock: int = 1

    @classmethod
    def fresh(cls, count: int) -> Stream:
        width = (MAX_HASH_KEY + 1) // count
        shards = {}
        for i in range(count):
            end = MAX_HASH_KEY if i == count - 1 else (i + 1) * width - 1
            shards[sid(i)] = Shard(sid(i), hash_range=HashRange(i * width, end))
        return cls(shards, count)

    def open_shards(self) -> list[Shard]:
        return sorted(
            (shard for shard in self.shards.values() if shard.is_open),
            key=lambda shard: shard.hash_range.start,
        )

    def apply(self, kind: str, pick: int, key_fraction: int) -> None:
        """Split an open shard at a hash key, or merge two adjacent open shards."""
        open_shards = self.open_shards()
        if kind == "split":
            shard = open_shards[pick % len(open_shards)]
            low, high = shard.hash_range.start, shard.hash_range.end
            if low == high:
                return
            split_at = low + 1 + ((key_fraction * (high - low)) >> 64)  # in (low, high]
            self._close(shard)
            self._add(shard.shard_id, None, HashRange(low, split_at - 1))
            self._add(shard.shard_id, None, HashRange(split_at, high))
        else:
            if len(open_shards) < 2:
                return
            index = pick % (len(open_shards) - 1)
            left, right = open_shards[index], open_shards[index + 1]
            self._close(left)
            self._close(right)
            self._add(
                left.shard_id,
                right.shard_id,
                HashRange(left.hash_range.start, right.hash_range.end),
            )
        self.clock += 1

    def _close(self, shard: Shard) -> None:
        self.shards[shard.shard_id] = attrs.evolve(shard, ending_sequence=str(self.clock * 100))

    def _add(self, parent: str, adjacent: str | None, hash_range: HashRange) -> None:
        shard_id = sid(self.next_number)
        self.next_number += 1
        self.shards[shard_id] = Shard(
            shard_id, parent, adjacent, hash_range, starting_sequence=str(self.clock * 100 + 1)
        )

    def ancestors(self, shard_id: str) -> set[str]:
        found: set[str] = set()
        stack = [shard_id]
        while stack:
            for parent in self.shards[stack.pop()].parent_ids:
                if parent in self.shards and parent not in found:
                    found.add(parent)
                    stack.append(parent)
        return found


@attrs.define
class Consumer:
    """A whole consumer fleet seen as one: shard sync, processing, child creation, cleanup.

    With ``check_lineage`` it asserts property (b) at every creation and every processed shard:
    each ancestor is settled, i.e. has a lease at SHARD_END, or was finished and deleted, or (under
    LATEST) was already closed when the consumer first synced, so LATEST skips it by design.
    """

    initial: InitialPosition
    check_lineage: bool = True
    table: dict[str, Lease] = attrs.Factory(dict)
    deleted: set[str] = attrs.Factory(set)
    skipped: set[str] = attrs.Factory(set)
    synced: bool = False

    def sync(self, stream: Stream) -> bool:
        shards = list(stream.shards.values())
        plan = plan_new_leases(shards, list(self.table.values()), self.initial)
        if not self.synced and self.initial.kind is InitialPositionKind.LATEST:
            self.skipped = {shard.shard_id for shard in shards if not shard.is_open}
        self.synced = True
        for lease in plan:
            assert lease.key not in self.table
            self._assert_settled_ancestors(stream, lease.shard_id, "created")
            self.table[lease.key] = lease
        # (c) applying the plan and planning again creates nothing.
        assert plan_new_leases(shards, list(self.table.values()), self.initial) == []
        return bool(plan)

    def process(self, stream: Stream) -> bool:
        changed = False
        shards = list(stream.shards.values())
        # Every lease whose shard is closed and whose parents are done reads to its end.
        # Newest first, so a child is always looked at before its parents in the same pass.
        for key in sorted(self.table, reverse=True):
            lease = self.table[key]
            if lease.is_finished or stream.shards[lease.shard_id].is_open:
                continue
            if parents_finished(lease, self.table):
                # The gate, checked against the table directly.
                for parent in stream.shards[lease.shard_id].parent_ids:
                    assert parent not in self.table or self.table[parent].is_finished
                self._assert_settled_ancestors(stream, lease.shard_id, "processed")
                # The SHARD_END task: children first, the checkpoint only once none waits.
                plan = child_leases_at_shard_end(lease, shards, list(self.table.values()))
                changed |= self._create_children(stream, plan.create)
                if plan.complete:
                    self.table[key] = attrs.evolve(lease, checkpoint=SHARD_END)
                    changed = True
        # Shard sync's repair: children of finished leases. From an empty table there is never
        # anything to repair, because every SHARD_END checkpoint came after its children.
        for key in sorted(self.table):
            lease = self.table[key]
            if not lease.is_finished:
                continue
            plan = child_leases_at_shard_end(lease, shards, list(self.table.values()))
            if self.check_lineage:
                assert plan == ChildLeasePlan(create=()), f"{key} finished without children"
            changed |= self._create_children(stream, plan.create)
        # Cleanup: a finished lease goes once all its children have leases that may start.
        doomed = []
        for key, lease in self.table.items():
            children = [s.shard_id for s in stream.shards.values() if key in s.parent_ids]
            if (
                lease.is_finished
                and children
                and all(
                    child in self.table and parents_finished(self.table[child], self.table)
                    for child in children
                )
            ):
                doomed.append(key)
        for key in doomed:
            del self.table[key]
            self.deleted.add(key)
        return changed or bool(doomed)

    def _create_children(self, stream: Stream, children: Iterable[Lease]) -> bool:
        created = False
        for child in children:
            assert child.key not in self.table
            assert child.checkpoint == TRIM_HORIZON
            # A child lease may exist before its parents finished (the gate keeps it unread),
            # but never before a parent's lease: the gate counts a missing lease as finished.
            if self.check_lineage:
                for parent in stream.shards[child.shard_id].parent_ids:
                    assert parent in self.table or self.settled(parent), (
                        f"created {child.shard_id} before a lease of its parent {parent}"
                    )
            self.table[child.key] = child
            created = True
        return created

    def round(self, stream: Stream) -> bool:
        created = self.sync(stream)
        return self.process(stream) or created

    def run_to_completion(self, stream: Stream) -> None:
        for _ in range(10 * len(stream.shards) + 10):
            if not self.round(stream):
                return
        raise AssertionError("the consumer never settled")

    def settled(self, shard_id: str) -> bool:
        lease = self.table.get(shard_id)
        if lease is not None:
            return lease.is_finished
        return shard_id in self.deleted or shard_id in self.skipped

    def _assert_settled_ancestors(self, stream: Stream, shard_id: str, event: str) -> None:
        if not self.check_lineage:
            return
        unsettled = sorted(a for a in stream.ancestors(shard_id) if not self.settled(a))
        assert not unsettled, f"{event} {shard_id} while ancestors {unsettled} are not done"


def assert_open_shards_exactly_covered(consumer: Consumer, stream: Stream) -> None:
    """(a) the unfinished leases are the open shards', tiling the hash space once."""
    unfinished = [lease for lease in consumer.table.values() if not lease.is_finished]
    assert sorted(lease.shard_id for lease in unfinished) == sorted(
        shard.shard_id for shard in stream.open_shards()
    )
    assert hash_range_holes(unfinished) == []
    ranges = [lease.hash_range for lease in unfinished]
    assert all(r is not None for r in ranges)
    assert sum(r.end - r.start + 1 for r in ranges if r is not None) == MAX_HASH_KEY + 1
    # ... and every one of them may start.
    assert all(parents_finished(lease, consumer.table) for lease in unfinished)


initial_shard_counts = st.integers(min_value=1, max_value=4)
reshard_ops = st.tuples(
    st.sampled_from(("split", "merge")),
    st.integers(min_value=0, max_value=63),
    st.integers(min_value=0, max_value=(1 << 64) - 1),
    st.integers(min_value=0, max_value=2),  # consumer rounds after the op (lag)
)
histories = st.lists(reshard_ops, max_size=12)
positions = st.sampled_from(list(POSITIONS.values()))
PROPERTY_SETTINGS = settings(max_examples=200, deadline=None)


def build_stream(initial_count: int, ops: Sequence[tuple[str, int, int, int]]) -> Stream:
    stream = Stream.fresh(initial_count)
    for kind, pick, key_fraction, _lag in ops:
        stream.apply(kind, pick, key_fraction)
    return stream


@PROPERTY_SETTINGS
@given(
    initial_count=initial_shard_counts,
    ops=histories,
    first_sync_after=st.integers(min_value=0, max_value=12),
    initial=positions,
)
def test_lifecycle_reads_parents_before_children(
    initial_count: int,
    ops: list[tuple[str, int, int, int]],
    first_sync_after: int,
    initial: InitialPosition,
) -> None:
    """(a) and (b): a consumer that starts on an empty table while the stream reshards, lagging
    behind it, never creates or processes a shard before its ancestors, ends up with the open
    shards exactly covered, and (except what LATEST skips) reads every closed shard."""
    stream = Stream.fresh(initial_count)
    consumer = Consumer(initial)
    for index, (kind, pick, key_fraction, lag) in enumerate(ops):
        if index == first_sync_after:
            consumer.sync(stream)
        stream.apply(kind, pick, key_fraction)
        if consumer.synced:
            for _ in range(lag):
                consumer.round(stream)
    consumer.run_to_completion(stream)

    assert_open_shards_exactly_covered(consumer, stream)
    for shard in stream.shards.values():
        if not shard.is_open:
            assert consumer.settled(shard.shard_id), f"{shard.shard_id} was never read"
    if initial.kind is not InitialPositionKind.LATEST:
        assert not consumer.skipped
        assert set(consumer.deleted) | {
            key for key, lease in consumer.table.items() if lease.is_finished
        } == {shard.shard_id for shard in stream.shards.values() if not shard.is_open}


@PROPERTY_SETTINGS
@given(initial_count=initial_shard_counts, ops=histories, initial=positions, data=st.data())
def test_recovery_from_any_lease_table_covers_the_open_shards(
    initial_count: int,
    ops: list[tuple[str, int, int, int]],
    initial: InitialPosition,
    data: st.DataObject,
) -> None:
    """(a) and (c) from any starting table (the conformance rows are such tables): repeatedly
    plan, finish closed shards parent-first and create children; the open shards end up covered
    with no gap and no overlap, and each plan is idempotent."""
    stream = build_stream(initial_count, ops)
    shard_ids = sorted(stream.shards)
    leased = data.draw(st.sets(st.sampled_from(shard_ids)), label="leased")
    closed_leased = sorted(s for s in leased if not stream.shards[s].is_open)
    finished = (
        data.draw(st.sets(st.sampled_from(closed_leased)), label="finished")
        if closed_leased
        else set()
    )
    consumer = Consumer(initial, check_lineage=False)
    for shard_id in leased:
        checkpoint = SHARD_END if shard_id in finished else Checkpoint("42")
        consumer.table[shard_id] = lease_for(stream.shards[shard_id], checkpoint)
    consumer.synced = True

    consumer.run_to_completion(stream)
    assert_open_shards_exactly_covered(consumer, stream)


@PROPERTY_SETTINGS
@given(initial_count=initial_shard_counts, ops=histories, initial=positions, data=st.data())
def test_plan_is_idempotent_and_creates_no_descendants(
    initial_count: int,
    ops: list[tuple[str, int, int, int]],
    initial: InitialPosition,
    data: st.DataObject,
) -> None:
    """(c), and (b) for a single plan on any table: no planned shard descends from a leased
    shard or from another planned shard (descendants wait for their parents' SHARD_END)."""
    stream = build_stream(initial_count, ops)
    shards = list(stream.shards.values())
    leased = data.draw(st.sets(st.sampled_from(sorted(stream.shards))), label="leased")
    leases = [lease_for(stream.shards[s], Checkpoint("42")) for s in sorted(leased)]

    plan = plan_new_leases(shards, leases, initial)

    planned = {lease.shard_id for lease in plan}
    assert [lease.shard_id for lease in plan] == sorted(planned)
    assert not planned & leased
    for shard_id in planned:
        assert not stream.ancestors(shard_id) & (leased | planned)
    assert plan_new_leases(shards, leases + plan, initial) == []
    # Shuffled inputs give the same plan.
    shuffled_shards = data.draw(st.permutations(shards), label="shard order")
    shuffled_leases = data.draw(st.permutations(leases), label="lease order")
    assert plan_new_leases(shuffled_shards, shuffled_leases, initial) == plan


@PROPERTY_SETTINGS
@given(initial_count=initial_shard_counts, ops=histories, data=st.data())
def test_holes_are_exactly_the_removed_ranges(
    initial_count: int, ops: list[tuple[str, int, int, int]], data: st.DataObject
) -> None:
    """(d) start from leases tiling the open shards, delete or finish some: the holes are exactly
    the removed ranges, adjacent ones merged. Finished leases of closed shards change nothing."""
    stream = build_stream(initial_count, ops)
    open_shards = stream.open_shards()
    fates = data.draw(
        st.lists(
            st.sampled_from(("keep", "delete", "finish")),
            min_size=len(open_shards),
            max_size=len(open_shards),
        ),
        label="fates",
    )
    leases = [lease_for(shard, SHARD_END) for shard in stream.shards.values() if not shard.is_open]
    expected: list[HashRange] = []
    for shard, fate in zip(open_shards, fates, strict=True):
        if fate == "keep":
            leases.append(lease_for(shard, Checkpoint("42")))
            # A second lease over part of a kept range (overlap) changes nothing.
            low, high = shard.hash_range.start, shard.hash_range.end
            leases.append(Lease(key=f"extra-{low}", hash_range=HashRange(low, (low + high) // 2)))
            continue
        if fate == "finish":
            leases.append(lease_for(shard, SHARD_END))
        if expected and expected[-1].end + 1 == shard.hash_range.start:
            expected[-1] = HashRange(expected[-1].start, shard.hash_range.end)
        else:
            expected.append(shard.hash_range)

    shuffled = data.draw(st.permutations(leases), label="lease order")
    assert hash_range_holes(shuffled) == expected
