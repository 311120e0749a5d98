"""Shard lifecycle through splits and merges, against kinesis-local (Kinesis) and moto (DynamoDB).

A producer writes with a fixed set of partition keys while shards are split and merged. For
every key, every record written to a parent shard must be processed before any record written
to its children; nothing may be lost; duplicates only where the README says they can happen (a
crashed worker's unCheckpointed batches).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from prometheus_client import CollectorRegistry

from kclasync import Consumer
from kclasync._core.leases.lease import Lease
from kclasync._core.lineage.streams import parse_multi_stream_key
from kclasync._processor import Checkpointer, ShardInfo
from kclasync._records import Record
from kclasync.testing.emulators import LocalAws
from tests.e2e.reshard_support import (
    LIFECYCLE,
    Ledger,
    LedgerProcessor,
    Producer,
    children_of,
    consumer,
    merge,
    report,
    running,
    split,
)
from tests.support import Aws, aws_for, fast_config, wait_until

pytestmark = pytest.mark.asyncio


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
