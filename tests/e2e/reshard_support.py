"""What the resharding stories share: the ledger of written and delivered records, the
processor that fills it, a producer with a fixed set of partition keys, and the split, merge
and consumer helpers (kinesis-local for Kinesis, moto for DynamoDB)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
from prometheus_client import CollectorRegistry

from kclasync import Consumer
from kclasync._core.lineage.shard import Shard
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from tests.support import Aws, fast_config, stop_all, wait_until

KEYS = [f"pk-{i}" for i in range(24)]
LIFECYCLE = {
    "failover_time": 2.0,
    "shard_sync_interval": 1.0,
    "lease_cleanup_interval": 0.5,
    "lease_cleanup_delay": 0.5,
    "lease_audit_interval": 1.0,
    "leader_lock_duration": 3.0,
    "leader_heartbeat_interval": 0.5,
    "parent_shard_poll_interval": 0.1,
    "idle_time_between_reads": 0.1,
}


class Ledger:
    """What was written (id -> key, shard) and every delivery, in processing order."""

    def __init__(self) -> None:
        self.written: dict[int, tuple[str, str]] = {}
        self.deliveries: list[tuple[int, str, str]] = []  # (id, shard, worker)
        self.first_read: dict[str, float] = {}  # shard -> loop time of its first delivery

    def add(self, worker: str, records: Sequence[Record]) -> None:
        now = asyncio.get_running_loop().time()
        for r in records:
            self.deliveries.append((int(orjson.loads(r.data)["id"]), r.shard_id, worker))
            self.first_read.setdefault(r.shard_id, now)

    @property
    def delivered(self) -> set[int]:
        return {d[0] for d in self.deliveries}

    def duplicates(self) -> list[int]:
        seen: set[int] = set()
        dups = []
        for rid, _, _ in self.deliveries:
            if rid in seen:
                dups.append(rid)
            seen.add(rid)
        return dups

    def order_violations(self, shards: Sequence[Shard]) -> list[str]:
        """(key, ancestor, child) where some record of the child was processed before the
        last processing of a record of the ancestor with the same key."""
        parents = {s.shard_id: s.parent_ids for s in shards}

        def ancestors(shard_id: str) -> set[str]:
            out: set[str] = set()
            stack = list(parents.get(shard_id, ()))
            while stack:
                p = stack.pop()
                if p not in out:
                    out.add(p)
                    stack.extend(parents.get(p, ()))
            return out

        first: dict[tuple[str, str], int] = {}
        last: dict[tuple[str, str], int] = {}
        for index, (rid, shard, _) in enumerate(self.deliveries):
            key = self.written[rid][0]
            first.setdefault((key, shard), index)
            last[(key, shard)] = index
        problems = []
        for (key, shard), begin in first.items():
            for ancestor in ancestors(shard):
                end = last.get((key, ancestor))
                if end is not None and end > begin:
                    problems.append(f"{key}: {ancestor} processed after child {shard} started")
        return problems


class LedgerProcessor:
    """Full processor contract; checkpoints after every batch and at shard end."""

    def __init__(self, ledger: Ledger, worker: str, infos: list[ShardInfo]) -> None:
        self.ledger = ledger
        self.worker = worker
        self.infos = infos

    async def initialize(self, shard: ShardInfo) -> None:
        self.infos.append(shard)

    async def process_records(
        self, records: Sequence[Record], checkpointer: Checkpointer, behind: int | None
    ) -> None:
        self.ledger.add(self.worker, records)
        await checkpointer.checkpoint()

    async def lease_lost(self) -> None:
        return None

    async def shard_ended(self, checkpointer: Checkpointer) -> None:
        await checkpointer.checkpoint_shard_end()

    async def shutdown_requested(self, checkpointer: Checkpointer) -> None:
        if checkpointer.last_delivered not in (None, checkpointer.last_checkpoint):
            await checkpointer.checkpoint()


class Producer:
    """Writes records with the fixed keys, one PutRecords at a time, until stopped."""

    def __init__(self, aws: Aws, ledger: Ledger, stream: str, batch: int = 25) -> None:
        self.aws = aws
        self.ledger = ledger
        self.stream = stream
        self.batch = batch
        self.next_id = 0
        self._stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def write(self, count: int) -> None:
        while count > 0:
            n = min(count, 500)
            ids = list(range(self.next_id, self.next_id + n))
            self.next_id += n
            pending = [(i, KEYS[i % len(KEYS)]) for i in ids]
            while pending:
                results = await self.aws.stream.put_records(
                    self.stream, [(k, orjson.dumps({"id": i})) for i, k in pending]
                )
                retry = []
                for (i, k), result in zip(pending, results, strict=True):
                    if result is None:
                        retry.append((i, k))
                    else:
                        self.ledger.written[i] = (k, result[0])
                pending = retry
            count -= n

    async def _run(self, rate: float) -> None:
        while not self._stop.is_set():
            await self.write(self.batch)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.batch / rate)

    def start(self, rate: float) -> None:
        self.task = asyncio.create_task(self._run(rate))

    async def stop(self) -> None:
        self._stop.set()
        if self.task is not None:
            await self.task


async def wait_active(aws: Aws, stream: str) -> None:
    async def active() -> bool:
        resp = await aws.stream._client.describe_stream_summary(StreamName=stream)
        return bool(resp["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE")

    await wait_until(active, 10, f"{stream} to be ACTIVE")


async def split(aws: Aws, stream: str, shard: Shard) -> None:
    middle = (shard.hash_range.start + shard.hash_range.end) // 2 + 1
    await aws.stream._client.split_shard(
        StreamName=stream, ShardToSplit=shard.shard_id, NewStartingHashKey=str(middle)
    )
    await wait_active(aws, stream)


async def merge(aws: Aws, stream: str, low: str, high: str) -> None:
    await aws.stream._client.merge_shards(
        StreamName=stream, ShardToMerge=low, AdjacentShardToMerge=high
    )
    await wait_active(aws, stream)


def children_of(shards: Sequence[Shard], parent: str) -> list[str]:
    return sorted(s.shard_id for s in shards if parent in s.parent_ids)


def consumer(aws: Aws, ledger: Ledger, worker: str, infos: list[ShardInfo], **cfg: Any) -> Consumer:
    return Consumer(
        stream_name=aws.name,
        application_name=aws.name,
        processor=lambda: LedgerProcessor(ledger, worker, infos),
        config=fast_config(worker_id=worker, **{**LIFECYCLE, **cfg}),
        client_options=aws.local.client_options(),
        registry=CollectorRegistry(),
    )


@contextlib.asynccontextmanager
async def running(consumers: Sequence[Consumer]) -> AsyncIterator[list[asyncio.Task[None]]]:
    tasks = [asyncio.create_task(c.run()) for c in consumers]
    try:
        yield tasks
    finally:
        await stop_all(consumers, tasks)


def report(name: str, **figures: object) -> None:
    text = " ".join(f"{k}={v}" for k, v in figures.items())
    print(f"\n[resharding] {name}: {text}")
