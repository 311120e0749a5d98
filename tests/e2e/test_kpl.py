"""KPL-aggregated records end to end against moto: de-aggregation, sub-sequence checkpoints,
resuming inside an aggregated record, and a malformed aggregate delivered as it is."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kclasync._core.records.kpl import MAGIC, UserRecord, aggregate
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.support import aws_for, wait_until

pytestmark = pytest.mark.asyncio


class Collect:
    """Records (data, seq, subseq) and checkpoints each; after ``stop_at`` records it stops
    doing anything, like a worker that crashed there."""

    def __init__(self, seen: list[tuple[bytes, str, int]], stop_at: int | None = None) -> None:
        self.seen = seen
        self.stop_at = stop_at

    async def initialize(self, shard: ShardInfo) -> None:
        return None

    async def process_records(
        self, records: Sequence[Record], checkpointer: Checkpointer, behind: int | None
    ) -> None:
        for r in records:
            if self.stop_at is not None and len(self.seen) == self.stop_at:
                return  # pretend to crash here: nothing after this record is done
            self.seen.append((r.data, r.sequence_number, r.sub_sequence_number))
            await checkpointer.checkpoint(r.sequence_number, r.sub_sequence_number)

    async def lease_lost(self) -> None:
        return None

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        return None


async def test_aggregated_records_are_split_and_resumed_inside(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        first = [UserRecord(f"pk{i}", f"a{i}".encode()) for i in range(5)]
        later = [UserRecord(f"pk{i}", f"b{i}".encode()) for i in range(3)]
        malformed = MAGIC + b"\x1a\x05\x08" + b"\x00" * 16  # magic bytes, bad digest
        await aws.stream.put_records(aws.name, [("agg1", aggregate(first))])
        await aws.stream.put_records(aws.name, [("plain", b"p0")])
        await aws.stream.put_records(aws.name, [("bad", malformed)])
        await aws.stream.put_records(aws.name, [("agg2", aggregate(later))])
        expected = [u.data for u in first] + [b"p0", malformed] + [u.data for u in later]

        first_run: list[tuple[bytes, str, int]] = []
        # Three user records of the first aggregate, then nothing more is done.
        async with aws.consumer(lambda: Collect(first_run, stop_at=3), worker_id="one"):
            await wait_until(lambda: len(first_run) == 3, 20, "three user records")
        assert [sub for _, _, sub in first_run] == [0, 1, 2]
        assert len({seq for _, seq, _ in first_run}) == 1  # one Kinesis record
        (lease,) = (await aws.store.list_leases()).leases
        assert lease.checkpoint.sub_sequence == 2

        second: list[tuple[bytes, str, int]] = []
        registry = CollectorRegistry()
        async with aws.consumer(
            lambda: Collect(second), worker_id="two", registry=registry
        ) as second_run:
            await wait_until(lambda: len(second) == len(expected) - 3, 20, "the rest")
        # Resumed inside the aggregate (sub-records 3 and 4), nothing twice, nothing skipped.
        assert [d for d, _, _ in first_run + second] == expected
        labels = {
            "application": aws.name,
            "worker": second_run.worker_id,
            "stream": aws.name,
            "shard": lease.key,
        }
        assert registry.get_sample_value("kclasync_malformed_aggregated_records_total", labels) == 1
