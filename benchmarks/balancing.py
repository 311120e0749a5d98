"""Scale-out and crash: the Java KCL 2.x taker against kclasync's balanced taker, side by side.

Scenario (the same for both, in one process): a stream of SHARDS shards, one worker holding every
lease while a producer writes; JOINERS more workers join at once; once the fleet is balanced (or
after a time limit) the busiest worker crashes without releasing anything, and the fleet
rebalances. Both runs use the real runtime on the in-memory adapters, in real time.

Reported per taker: taking rounds and seconds until max - min <= 1 after the join and after the
crash, records processed more than once, and lease-table reads and writes per operation.

    uv run python benchmarks/balancing.py [--shards 64] [--joiners 7] [--failover 1.0]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import time
from collections import Counter
from collections.abc import Sequence

import attrs
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.backends import AdapterBackend
from kclasync._adapters.memory import (
    MemoryCoordinatorState,
    MemoryLeaseStore,
    MemoryLeaseTable,
    MemoryStreamClient,
)
from kclasync._records import Record

STREAM = "bench"


@attrs.define
class Phase:
    seconds: float | None = None
    rounds: int | None = None


@attrs.define
class Result:
    taker: str
    join: Phase = attrs.field(factory=Phase)
    crash: Phase = attrs.field(factory=Phase)
    records: int = 0
    duplicates: int = 0
    lost: int = 0
    reads: int = 0
    writes: int = 0
    by_op: Counter[str] = attrs.field(factory=Counter)
    seconds: float = 0.0


def spread(table: MemoryLeaseTable, live: set[str]) -> list[int]:
    counts = Counter(lease.owner for lease in table.leases.values() if lease.owner in live)
    return sorted(counts.get(w, 0) for w in live)


async def run(taker: str, shards: int, joiners: int, failover: float, limit: float) -> Result:
    table = MemoryLeaseTable()
    client = MemoryStreamClient()
    client.create_stream(STREAM, shards)
    state = MemoryCoordinatorState()
    seen: Counter[str] = Counter()
    produced = 0

    async def handle(records: Sequence[Record]) -> None:
        for r in records:
            seen[r.data.decode()] += 1

    kcl2 = taker == "kcl2"
    config = ConsumerConfig(
        failover_time=failover,
        initial_position="TRIM_HORIZON",
        idle_time_between_reads=0.05,
        min_time_between_reads=0.0,
        lease_taker="kcl2" if kcl2 else "balanced",
        # The KCL's own settings for its taker: one steal per round, a round every 2 x failover.
        max_leases_to_steal=1 if kcl2 else None,
        lease_taker_interval=2 * (failover + 0.025) if kcl2 else None,
        graceful_handoff=not kcl2,
        shard_sync_interval=3600,
    )

    def worker(name: str) -> Consumer:
        return Consumer(
            stream_name=STREAM,
            application_name="bench",
            processor=handle,
            config=attrs.evolve(config, worker_id=name),
            backend=AdapterBackend(MemoryLeaseStore(table), client, locks=state),
            registry=CollectorRegistry(),
            rng=random.Random(name),
        )

    async def produce(stop: asyncio.Event) -> None:
        nonlocal produced
        while not stop.is_set():
            for _ in range(shards):
                client.put_record(STREAM, f"k{produced % 997}", str(produced).encode())
                produced += 1
            await asyncio.sleep(0.05)

    loop = asyncio.get_running_loop()
    began = loop.time()
    result = Result(taker)
    stop_producing = asyncio.Event()
    producer = asyncio.create_task(produce(stop_producing))
    fleet = {"w0": worker("w0")}
    tasks = {"w0": asyncio.create_task(fleet["w0"].run())}

    async def balanced_after(phase: Phase, joined: list[Consumer]) -> None:
        live = set(fleet)
        start = loop.time()
        base = {c.worker_id: c._coordinator.rounds if c._coordinator else 0 for c in joined}
        while loop.time() - start < limit:
            counts = spread(table, live)
            handing = any(lease.checkpoint_owner for lease in table.leases.values())
            if counts and counts[-1] - counts[0] <= 1 and sum(counts) == shards and not handing:
                phase.seconds = loop.time() - start
                phase.rounds = max(
                    (c._coordinator.rounds if c._coordinator else 0) - base[c.worker_id]
                    for c in joined
                )
                return
            await asyncio.sleep(0.02)

    while len(table.leases) < shards or spread(table, {"w0"}) != [shards]:
        await asyncio.sleep(0.05)
    joined = [worker(f"w{i}") for i in range(1, joiners + 1)]
    for c in joined:
        fleet[c.worker_id] = c
        tasks[c.worker_id] = asyncio.create_task(c.run())
    await balanced_after(result.join, joined)

    victim = max(fleet, key=lambda w: (len(fleet[w].held_leases), w))
    tasks.pop(victim).cancel()
    fleet.pop(victim)
    await balanced_after(result.crash, list(fleet.values()))

    stop_producing.set()
    await producer
    deadline = loop.time() + 30
    while len(seen) < produced and loop.time() < deadline:
        await asyncio.sleep(0.05)
    for c in fleet.values():
        await c.stop()
    await asyncio.gather(*tasks.values(), return_exceptions=True)
    result.seconds = loop.time() - began
    result.records = produced
    result.duplicates = sum(seen.values()) - len(seen)
    result.lost = produced - len(seen)
    result.by_op = table.reads + table.writes
    result.reads = sum(table.reads.values())
    result.writes = sum(table.writes.values())
    return result


def fmt(phase: Phase) -> str:
    if phase.seconds is None:
        return "not balanced"
    return f"{phase.rounds} rounds, {phase.seconds:.1f}s"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--joiners", type=int, default=7)
    parser.add_argument("--failover", type=float, default=1.0)
    parser.add_argument("--limit", type=float, default=60.0, help="give up balancing after (s)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    results = []
    for taker in ("kcl2", "balanced"):
        started = time.perf_counter()
        results.append(await run(taker, args.shards, args.joiners, args.failover, args.limit))
        print(f"  ({taker}: {time.perf_counter() - started:.1f}s wall)")
    base = results[0]
    print(
        f"\n1 -> {args.joiners + 1} workers over {args.shards} shards, then a crash "
        f"(failover {args.failover:g}s)\n"
    )
    rows = [
        ("scale-out: to balance", [fmt(r.join) for r in results]),
        ("crash: to balance", [fmt(r.crash) for r in results]),
        ("records produced", [f"{r.records:,}" for r in results]),
        ("records duplicated", [f"{r.duplicates:,}" for r in results]),
        ("records lost", [f"{r.lost:,}" for r in results]),
        ("lease-table reads", [f"{r.reads:,} ({r.reads / r.seconds:.0f}/s)" for r in results]),
        ("lease-table writes", [f"{r.writes:,} ({r.writes / r.seconds:.0f}/s)" for r in results]),
        (
            "  of which not checkpoints",
            [f"{(r.writes - r.by_op['checkpoint']) / r.seconds:.0f}/s" for r in results],
        ),
    ]
    if base.join.seconds and results[1].join.seconds:
        rows.append(
            ("scale-out time ratio", ["1.00", f"{results[1].join.seconds / base.join.seconds:.2f}"])
        )
    print(f"{'':26}{'KCL 2.x taker':>24}{'balanced + handoff':>24}")
    for label, values in rows:
        print(f"{label:26}" + "".join(f"{v:>24}" for v in values))


if __name__ == "__main__":
    asyncio.run(main())
