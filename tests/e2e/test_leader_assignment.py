"""Leader-based assignment (``lease_taker="load"``) end to end against moto's server: the leader
assigns, the others find their leases through the owner index, and moves are graceful."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections import Counter

import orjson
import pytest

from kclasync._adapters.coordinator_state import coordinator_table_name
from kclasync._cli import main
from kclasync._core.lineage.shard import Shard
from kclasync.testing.emulators import LocalAws
from tests.e2e.test_balancing import no_handoffs, owners, producing, running
from tests.support import Tally, aws_for, wait_until

pytestmark = pytest.mark.asyncio

LOAD = {
    "lease_taker": "load",
    "assignment_interval": 1.0,
    "leader_heartbeat_interval": 1.0,
    # The workers share one process, so each would read the process's CPU (saturated on a busy
    # machine) as its own: they report a configured capacity and the leader predicts from it.
    "worker_capacity_kbps": 2000.0,
}


async def test_leader_spreads_leases_by_index_discovery_and_graceful_moves(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(6)
        first = await aws.produce(300)
        tally = Tally()
        # Six shards of equal traffic at a fraction of a KB/s each: the measured throughputs are
        # mostly noise, so a wide band keeps the leader from chasing it (this test is about
        # discovery and graceful moves, not balance).
        even = {**LOAD, "rebalance_threshold_percent": 60.0, "rebalance_target_percent": 30.0}
        w1 = aws.consumer(tally.handler("w1"), worker_id="w1", **even)
        new = [aws.consumer(tally.handler(f"w{i}"), worker_id=f"w{i}", **even) for i in (2, 3)]
        async with running(w1):
            await wait_until(lambda: len(w1.held_leases) == 6, 30, "the leader to hold all 6")
            await wait_until(lambda: tally.seen(first), 30, "the backlog")
            async with producing(aws) as produced, running(*new):
                # The leader balances the leases' throughput (roughly equal here, but measured:
                # the split need not be exactly 2/2/2); every worker gets some.
                await wait_until(
                    lambda: all(c.held_leases for c in [w1, *new]),
                    30,
                    "a lease on every worker",
                )
                await wait_until(lambda: no_handoffs(aws), 20, "every handoff to finish")
                counts = await owners(aws)
                assert set(counts) == {"w1", "w2", "w3"} and sum(counts.values()) == 6, counts
                mark = len(produced)
                await wait_until(lambda: len(produced) > mark + 200, 20, "more records")
            await wait_until(lambda: tally.seen(produced), 30, "everything produced")
        # Planned moves are graceful: nothing was processed twice.
        assert tally.duplicates == 0
        # Only the leader scanned the table; the others queried the owner index.
        for c in new:
            calls = c._store.calls if c._store is not None else {}  # type: ignore[attr-defined]
            assert calls.get("query", 0) > 0
            assert calls.get("scan", 0) <= 2, calls  # the start-up shard sync only


def _keys_by_shard(shards: list[Shard], per_shard: int) -> dict[str, list[str]]:
    """Partition keys that land on each shard (Kinesis: MD5 of the key as a 128-bit number)."""
    out: dict[str, list[str]] = {s.shard_id: [] for s in shards}
    i = 0
    while any(len(keys) < per_shard for keys in out.values()):
        key = f"pk-{i}"
        i += 1
        point = int.from_bytes(hashlib.md5(key.encode()).digest(), "big")
        for s in shards:
            if s.hash_range.start <= point <= s.hash_range.end and len(out[s.shard_id]) < per_shard:
                out[s.shard_id].append(key)
    return out


async def test_the_leader_moves_load_off_the_hot_shards_worker(
    moto: LocalAws,
    unique_name: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six shards, one with 5x the traffic of each other, three workers with the real CPU reader
    and equal configured capacities: count balancing would give every worker two shards; the
    load-aware leader leaves the hot shard's worker with fewer shards than each of the others.
    (The hot shard alone is above the fleet's level, so it sets the peak the others are judged
    against: a second shard must put its worker clearly above that peak to be moved, hence 2
    records per other shard, not 1.)"""
    config = {
        **LOAD,
        "rebalance_threshold_percent": 15.0,
        "rebalance_target_percent": 10.0,
    }
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(6)
        shards = sorted(await aws.stream.list_shards(aws.name), key=lambda s: s.shard_id)
        hot = shards[0].shard_id
        keys = _keys_by_shard(shards, 2)
        pad = "x" * 1000
        produced: list[int] = []
        stop = asyncio.Event()

        async def produce() -> None:
            # Every 0.2 s: 10 records of ~1 KB to the hot shard, 2 to each of the others.
            while not stop.is_set():
                batch = []
                for shard_id, shard_keys in keys.items():
                    for n in range(10 if shard_id == hot else 2):
                        rid = aws.next_id
                        aws.next_id += 1
                        data = orjson.dumps({"id": rid, "pad": pad})
                        batch.append((rid, shard_keys[n % len(shard_keys)], data))
                pending = batch
                while pending:
                    results = await aws.stream.put_records(
                        aws.name, [(k, d) for _, k, d in pending]
                    )
                    produced.extend(
                        r for (r, _, _), res in zip(pending, results, strict=True) if res
                    )
                    pending = [p for p, res in zip(pending, results, strict=True) if res is None]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 0.2)

        tally = Tally()
        workers = [
            aws.consumer(tally.handler(f"w{i}"), worker_id=f"w{i}", **config) for i in (1, 2, 3)
        ]
        cpu_sources = []
        producer = asyncio.create_task(produce())
        try:
            async with running(*workers):
                await wait_until(
                    lambda: sum(len(c.held_leases) for c in workers) == 6, 30, "all 6 held"
                )

                async def hot_worker_lighter() -> bool:
                    scan = (await aws.store.list_leases()).leases
                    if any(lease.checkpoint_owner for lease in scan):
                        return False
                    count = Counter(lease.owner for lease in scan)
                    owner = next(lease.owner for lease in scan if lease.key == hot)
                    others = [n for w, n in count.items() if w != owner]
                    return (
                        None not in count
                        and len(count) == 3
                        and all(count[owner] < n for n in others)
                    )

                took = await wait_until(hot_worker_lighter, 45, "the hot shard's worker to shed")
                for c in workers:
                    coordinator = c._coordinator
                    assert coordinator is not None
                    cpu_sources.append(coordinator.presence.cpu)
                capsys.readouterr()
                monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
                monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
                args = ["workers", "-a", unique_name, "--endpoint-url", moto.endpoint_url]
                code = await asyncio.to_thread(main, [*args, "--region", "us-east-1"])
                out = capsys.readouterr().out
            stop.set()
            await producer
        finally:
            stop.set()
            await producer
        # The real CPU reader sampled each worker (a cgroup or /proc/stat here).
        assert all(src is not None for src in cpu_sources)
        # Planned moves are graceful: nothing was processed twice.
        assert tally.duplicates == 0
        assert len(tally.deliveries) > 0
    # Each worker: its lease count, the throughput of its leases, its latest CPU sample and
    # operating range, and its configured capacity.
    assert code == 0, (out, capsys.readouterr().err)
    rows = re.findall(r"^(w[123])\s+(\d+)\s+([\d.]+)\s+([\d.]+)/100\s+2000\.0\s+\d+$", out, re.M)
    assert sorted(row[0] for row in rows) == ["w1", "w2", "w3"], out
    assert sum(int(row[1]) for row in rows) == 6, out
    # The worker with the fewest leases carries the most throughput: the hot shard.
    lightest = min(rows, key=lambda row: int(row[1]))
    assert float(lightest[2]) == max(float(row[2]) for row in rows), out
    print(f"\nhot shard shed after {took:.1f}s\n{out}")


async def test_a_crashed_leaders_leases_are_assigned_within_3x_failover(
    moto: LocalAws, unique_name: str
) -> None:
    """Three kclasync workers and the default lock (120 s, read every 30 s): the leader writes
    the short term of a kclasync-only fleet (one failover time); cancelled without releasing
    anything, it is replaced and its leases assigned within 3 x failover, not after 120 s."""
    failover = 10.0  # the KCL's: renewals may run late on a loaded machine
    config = {**LOAD, "failover_time": failover, "leader_heartbeat_interval": 30.0}
    loop = asyncio.get_running_loop()
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(6)
        tally = Tally()
        workers = {
            f"w{i}": aws.consumer(tally.handler(f"w{i}"), worker_id=f"w{i}", **config)
            for i in (1, 2, 3)
        }
        async with running(*workers.values()) as tasks:
            await wait_until(
                lambda: all(c.held_leases for c in workers.values()), 60, "a lease on each"
            )
            await wait_until(lambda: no_handoffs(aws), 30, "every handoff to finish")
            leader = next(name for name, c in workers.items() if c.is_leader)
            held = (await owners(aws))[leader]
            assert held > 0
            lock = await aws.dynamodb.get_item(
                TableName=coordinator_table_name(aws.name),
                Key={"key": {"S": "Leader"}},
                ConsistentRead=True,
            )
            assert lock["Item"]["leaseDuration"] == {"S": str(round(failover * 1000))}
            task = tasks[list(workers).index(leader)]
            task.cancel()  # a crash: nothing released, the lock left to expire
            killed = loop.time()
            await asyncio.gather(task, return_exceptions=True)
            others = [c for name, c in workers.items() if name != leader]
            await wait_until(lambda: any(c.is_leader for c in others), 3 * failover, "a new leader")

            async def leader_has_none() -> bool:
                return leader not in await owners(aws)

            await wait_until(leader_has_none, 3 * failover, "the crashed leader's leases moved")
            took = loop.time() - killed
            assert took < 3 * failover, took
            # The new owners find them through the owner index at their next discovery.
            await wait_until(
                lambda: sum(len(c.held_leases) for c in others) == 6, 2 * failover, "all held"
            )
