"""Shard lifecycle through splits and merges, against kinesis-local (Kinesis) and moto (DynamoDB).

A producer writes with a fixed set of partition keys while shards are split and merged. For
every key, every record written to a parent shard must be processed before any record written
to its children; nothing may be lost; duplicates only where the README says they can happen (a
crashed worker's unCheckpointed batches).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from typing import Any

import orjson
import pytest
from prometheus_client import CollectorRegistry

from kclasync import Consumer
from kclasync._core.leases.lease import Lease
from kclasync._core.lineage.shard import Shard
from kclasync._core.lineage.streams import parse_multi_stream_key
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.support import Aws, aws_for, fast_config, stop_all, wait_until

pytestmark = pytest.mark.asyncio
log = logging.getLogger("tests.resharding")

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


async def test_split_and_merge_under_load(kinesis: LocalAws, unique_name: str) -> None:
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(2)
        ledger = Ledger()
        infos: list[ShardInfo] = []
        producer = Producer(aws, ledger, aws.name)
        await producer.write(300)
        workers = [consumer(aws, ledger, f"w{i}", infos) for i in range(3)]
        loop = asyncio.get_running_loop()
        async with running(workers):
            producer.start(rate=300)
            await wait_until(lambda: len(ledger.written) >= 600, 20, "the producer")
            s0, s1 = sorted(await aws.stream.list_shards(aws.name), key=lambda s: s.shard_id)
            # 1. split shard 0 while records flow
            await split(aws, aws.name, s0)
            split_at = loop.time()
            shards = await aws.stream.list_shards(aws.name)
            low, high = children_of(shards, s0.shard_id)
            await wait_until(lambda: {low, high} <= set(ledger.first_read), 30, "children read")
            child_latency = min(ledger.first_read[low], ledger.first_read[high]) - split_at
            # 2. merge the two children back, 3. split shard 1
            await merge(aws, aws.name, low, high)
            await split(aws, aws.name, s1)
            shards = await aws.stream.list_shards(aws.name)
            (merged,) = children_of(shards, low)
            grand = children_of(shards, s1.shard_id)
            await wait_until(
                lambda: {merged, *grand} <= set(ledger.first_read), 30, "merged child read"
            )
            await wait_until(lambda: len(ledger.written) >= 2000, 30, "more records")
            await producer.stop()
            await wait_until(lambda: set(ledger.written) <= ledger.delivered, 30, "every record")
            open_shards = {s.shard_id for s in shards if s.is_open}
            # Finished leases go once their children have started: only open shards remain.
            await wait_until(
                lambda: lease_keys_are(aws, open_shards), 20, "finished leases to be deleted"
            )
            leaders = [w.worker_id for w in workers if w.is_leader]
            deleted = sum(w._counters["leases_deleted"] for w in workers)
        shards = await aws.stream.list_shards(aws.name)
        assert ledger.order_violations(shards) == []
        assert set(ledger.written) == ledger.delivered
        assert ledger.duplicates() == []  # no crash, no steal of a busy lease: no duplicates
        assert len(leaders) == 1
        assert deleted == 4  # shard 0, its two children (merged since) and shard 1
        # Every child lease started at TRIM_HORIZON after its parents were finished.
        children = [i for i in infos if i.parent_shard_ids]
        assert {i.shard_id for i in children} == {low, high, merged, *grand}
        assert all(i.starting_checkpoint.value == "TRIM_HORIZON" for i in children)
        report(
            "split+merge",
            records=len(ledger.written),
            deliveries=len(ledger.deliveries),
            reshard_operations=3,
            duplicates=len(ledger.duplicates()),
            split_to_children_read_s=f"{child_latency:.2f}",
            leases_deleted=deleted,
        )


async def lease_keys_are(aws: Aws, expected: set[str]) -> bool:
    return {lease.key for lease in (await aws.store.list_leases()).leases} == expected


async def test_leader_killed_during_reshard(kinesis: LocalAws, unique_name: str) -> None:
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(3)
        ledger = Ledger()
        infos: list[ShardInfo] = []
        producer = Producer(aws, ledger, aws.name)
        await producer.write(300)
        workers = {f"w{i}": consumer(aws, ledger, f"w{i}", infos) for i in range(3)}
        tasks = {name: asyncio.create_task(c.run()) for name, c in workers.items()}
        loop = asyncio.get_running_loop()
        try:
            await wait_until(lambda: any(c.is_leader for c in workers.values()), 20, "a leader")
            await wait_until(lambda: set(ledger.written) <= ledger.delivered, 30, "the backlog")
            (leader,) = [name for name, c in workers.items() if c.is_leader]
            producer.start(rate=300)
            shards = sorted(await aws.stream.list_shards(aws.name), key=lambda s: s.shard_id)
            await split(aws, aws.name, shards[0])
            await merge(aws, aws.name, shards[1].shard_id, shards[2].shard_id)
            # Kill the leader mid-reshard: abrupt, nothing released (neither leases nor lock).
            tasks[leader].cancel()
            await asyncio.gather(tasks[leader], return_exceptions=True)
            killed_at = loop.time()
            killed_delivered = len(ledger.deliveries)
            survivors = {n: c for n, c in workers.items() if n != leader}
            took = await wait_until(
                lambda: any(c.is_leader for c in survivors.values()), 15, "a new leader"
            )
            (new_leader,) = [c for c in survivors.values() if c.is_leader]
            await wait_until(
                lambda: new_leader._counters["leader_shard_syncs"] >= 1, 10, "its shard sync"
            )
            await wait_until(lambda: len(ledger.written) >= 1800, 30, "more records")
            await producer.stop()
            await wait_until(lambda: set(ledger.written) <= ledger.delivered, 40, "every record")
            all_shards = await aws.stream.list_shards(aws.name)
            open_shards = {s.shard_id for s in all_shards if s.is_open}
            await wait_until(lambda: lease_keys_are(aws, open_shards), 20, "convergence")
            converged = loop.time()
        finally:
            for name, c in workers.items():
                if name != leader:
                    await c.stop()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert ledger.order_violations(all_shards) == []
        assert set(ledger.written) == ledger.delivered
        # Duplicates only from the crash: records the killed leader had processed (and may not
        # have checkpointed) are read again by the worker that takes its lease over.
        dups = ledger.duplicates()
        killed_ids = {rid for rid, _, w in ledger.deliveries[:killed_delivered] if w == leader}
        assert set(dups) <= killed_ids
        assert took <= 3.0 + 0.5 + 2.0  # lock duration + heartbeat + slack
        report(
            "leader killed",
            records=len(ledger.written),
            reshard_operations=2,
            duplicates=len(dups),
            new_leader_after_s=f"{took:.2f}",
            converged_after_kill_s=f"{converged - killed_at:.2f}",
        )


async def children_named(aws: Aws, parents: Sequence[str]) -> bool:
    leases = {lease.key: lease for lease in (await aws.store.list_leases()).leases}
    return all(leases[p].child_shard_ids for p in parents)


async def test_restart_all_workers_mid_reshard(kinesis: LocalAws, unique_name: str) -> None:
    async with aws_for(kinesis, unique_name) as aws:
        await aws.create_stream(2)
        ledger = Ledger()
        infos: list[ShardInfo] = []
        producer = Producer(aws, ledger, aws.name)
        await producer.write(400)
        no_cleanup = {"cleanup_leases_upon_shard_completion": False}
        first = [consumer(aws, ledger, f"w{i}", infos, **no_cleanup) for i in range(2)]
        tasks = [asyncio.create_task(c.run()) for c in first]
        await wait_until(lambda: len(ledger.deliveries) >= 100, 20, "the first records")
        producer.start(rate=300)
        s0, s1 = sorted(await aws.stream.list_shards(aws.name), key=lambda s: s.shard_id)
        await split(aws, aws.name, s0)
        shards = await aws.stream.list_shards(aws.name)
        _low, high = children_of(shards, s0.shard_id)
        await merge(aws, aws.name, high, s1.shard_id)
        # Every worker dies at once, mid-reshard (abrupt: leases left to expire).
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        second = [consumer(aws, ledger, f"w{i}", infos, **no_cleanup) for i in range(2)]
        async with running(second):
            await wait_until(lambda: len(ledger.written) >= 1500, 30, "more records")
            await producer.stop()
            await wait_until(lambda: set(ledger.written) <= ledger.delivered, 40, "every record")
            shards = await aws.stream.list_shards(aws.name)
            # With cleanup off, every finished lease comes to name its children: written at
            # SHARD_END by its worker, or by the leader's sync for a worker killed before that.
            await wait_until(
                lambda: children_named(aws, [s0.shard_id, high, s1.shard_id]),
                10,
                "childShardIds on every finished lease",
            )
        assert ledger.order_violations(shards) == []
        assert set(ledger.written) == ledger.delivered
        leases = {lease.key: lease for lease in (await aws.store.list_leases()).leases}
        for parent in (s0.shard_id, high, s1.shard_id):
            assert leases[parent].checkpoint.value == "SHARD_END"
            assert leases[parent].child_shard_ids == frozenset(children_of(shards, parent))
        (merged,) = children_of(shards, s1.shard_id)
        assert leases[merged].parent_shard_ids == {high, s1.shard_id}
        report(
            "restart all mid-reshard",
            records=len(ledger.written),
            reshard_operations=2,
            duplicates=len(ledger.duplicates()),
        )


async def test_multi_stream_keys_and_removed_stream(kinesis: LocalAws, unique_name: str) -> None:
    names = [f"{unique_name}-a", f"{unique_name}-b"]
    current = list(names)

    async def streams() -> list[str]:
        return list(current)

    async with aws_for(kinesis, unique_name) as aws:
        for name in names:
            await aws.stream.create_stream(name, 2)
        ledger = Ledger()
        infos: list[ShardInfo] = []
        producers = [Producer(aws, ledger, name) for name in names]
        producers[1].next_id = 100_000
        for p in producers:
            await p.write(200)
        seen_streams: set[tuple[str, str | None]] = set()

        async def handle(records: Sequence[Record]) -> None:
            ledger.add("m", records)
            seen_streams.update((r.shard_id, r.stream) for r in records)

        class Info(LedgerProcessor):
            async def process_records(
                self, records: Sequence[Record], checkpointer: Checkpointer, behind: int | None
            ) -> None:
                await handle(records)
                await checkpointer.checkpoint()

        c = Consumer(
            streams=streams,
            application_name=unique_name,
            processor=lambda: Info(ledger, "m", infos),
            config=fast_config(**{**LIFECYCLE, "removed_stream_grace": 0.5}),
            client_options=aws.local.client_options(),
            registry=CollectorRegistry(),
        )
        async with running([c]):
            await wait_until(lambda: set(ledger.written) <= ledger.delivered, 30, "both streams")
            keys = sorted(lease.key for lease in (await aws.store.list_leases()).leases)
            parsed = [parse_multi_stream_key(k) for k in keys]
            assert all(p is not None for p in parsed)
            assert sorted({p[0].name for p in parsed if p}) == names
            assert all(p[0].account_id == "000000000000" for p in parsed if p)
            assert {(i.stream, i.lease_key) for i in infos} == {
                (p[0].name, k) for p, k in zip(parsed, keys, strict=True) if p
            }
            assert {stream for _, stream in seen_streams} == set(names)
            # Stream b leaves the list: its leases are dropped after the grace period.
            current.remove(names[1])
            await wait_until(
                lambda: _only_stream(aws, names[0]), 15, "stream b's leases to be dropped"
            )
            await producers[0].write(100)
            await wait_until(lambda: set(ledger.written) <= ledger.delivered, 20, "stream a")
        assert c._counters["stream_leases_dropped"] == 2


async def _only_stream(aws: Aws, name: str) -> bool:
    leases: tuple[Lease, ...] = (await aws.store.list_leases()).leases
    parsed = [parse_multi_stream_key(lease.key) for lease in leases]
    return bool(parsed) and all(p is not None and p[0].name == name for p in parsed)
