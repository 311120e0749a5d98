"""The DynamoDB bill of each lease taker, from the fleet simulation's call counts.

    uv run python benchmarks/dynamodb_cost.py [--fleets 10x100,100x1000] [--takers kcl2,...]
        [--warmup 180] [--window 300] [--crash-at 60] [--wall-limit 600]
        [--json out.json] [--plot docs/dynamodb_cost.png]

Each point is one fleet (workers x shards) with one taker (``kcl2``, ``balanced``, ``kcl3``,
``load``; ``kcl2-noef`` and ``balanced-noef``: with ``early_failover=False``), run in virtual time
by ``kclasync._simulation`` (the real runtime and core over the in-memory lease table,
coordinator-state items and worker registry, whose adapters count every call): the workers join
over the first failover period, a producer writes 2 records per shard per minute, and after
``--warmup`` virtual seconds (the initial assignment) the counts are taken over ``--window``
seconds, during which one worker (the middle one of the live workers that hold a lease) is crashed
at ``--crash-at`` and replaced 0.5-2 failover times later, as the simulation's crash fault does. No
other fault is injected.

From the counts: calls, items and request units by table and operation (``dynamodb_units``:
consistency as the adapters send it, item sizes from the real codecs, the owner index's writes
from every change of ``leaseOwner`` the table applied), per lease-hour and for the fleet per
month (730 h), at on-demand list prices; the failover times of the crashed worker's leases
(median and p99 in units of the failover time) and the leases that changed owner in the window.

``--wall-limit``: a point whose run takes longer (wall time) is reported as not finished, with
what it did until then: the worker registry's reads per worker and virtual second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from collections import Counter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from dynamodb_cost_report import plot, table
from dynamodb_units import (
    HOURS_PER_MONTH,
    dollars,
    index_item_size,
    item_size,
    read_units,
    write_units,
)

from kclasync._adapters.lease_codec import lease_to_item
from kclasync._core.leases.lease import Lease
from kclasync._core.leases.position import Checkpoint
from kclasync._core.lineage.shard import HashRange
from kclasync._core.workers.worker_metrics import WorkerMetrics
from kclasync._core.workers.worker_metrics_item import encode_item
from kclasync._simulation.clock import WallTimeExceeded, run_virtual
from kclasync._simulation.harness import Simulation
from kclasync._simulation.settings import SimulationSettings
from kclasync._simulation.worker import now

TAKERS = ("kcl2", "balanced", "kcl3", "load")


class WriteObserver:
    """Wraps the checker's ``lease_written``: owner changes (index writes, moves) and item sizes."""

    def __init__(self, sim: Simulation) -> None:
        self.gsi_writes = 0
        self.moves = 0
        self.sizes: list[int] = []
        self.max_size = 0
        self._n = 0
        self._inner = sim.checker.lease_written
        sim.checker.lease_written = self  # type: ignore[method-assign]

    def __call__(
        self,
        old: Lease | None,
        new: Lease,
        *,
        op: str,
        writer: str,
        now: float,
        writer_sent: float | None,
    ) -> None:
        before = old.owner if old is not None else None
        if before != new.owner:
            self.gsi_writes += 2 if before is not None and new.owner is not None else 1
            if new.owner is not None:
                self.moves += 1
        self._n += 1
        if self._n % 25 == 1:
            size = item_size(lease_to_item(new))
            self.sizes.append(size)
            self.max_size = max(self.max_size, size)
        self._inner(old, new, op=op, writer=writer, now=now, writer_sent=writer_sent)


def typical_sizes() -> tuple[int, int]:
    """Bytes of a production-like lease item and worker-registry entry, from the real codecs.

    The simulation's ids and sequence numbers are short (``w0001``, small sequence numbers) and
    its workers report no CPU samples; a real worker id is a host name and a UUID, a real
    checkpoint a 56-digit sequence number, and a real entry holds ten CPU samples.
    """
    worker = "ip-10-0-12-34.ec2.internal-0f8c2b4e-6d1a-4c3b-9a57-3e2d1c0b9a87"
    lease = Lease(
        key="shardId-000000001234",
        counter=123456,
        owner=worker,
        checkpoint=Checkpoint("49655834598291939583610592932437463041208116049221926914", 0),
        hash_range=HashRange(0, 2**127 - 1),
        throughput_kbps=12.5,
    )
    entry = WorkerMetrics(
        worker_id=worker,
        last_update=1_790_000_000,
        metric_stats={"C": tuple(37.5 + i for i in range(10))},
        operating_range={"C": (100,)},
        capacity_kbps=4096.0,
        implementation="kclasync",
        heartbeat=1_790_000_000_123,
        heartbeat_interval=0.5,
    )
    return item_size(lease_to_item(lease)), item_size(encode_item(entry))


def snapshot(sim: Simulation, observer: WriteObserver) -> dict[str, Any]:
    t = sim.table
    return {
        "time": now(),
        "lease_reads": dict(t.reads),
        "lease_writes": dict(t.writes),
        "condition_failures": dict(t.condition_failures),
        "lease_items": dict(t.items_read),
        "registry": dict(t.worker_metrics.totals),
        "coordinator": dict(sim.fleet.locks.totals),
        "gsi_writes": observer.gsi_writes,
        "moves": observer.moves,
        "failovers": len(sim.checker.failover_times),
    }


def diff(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in after.items():
        if isinstance(value, dict):
            out[key] = dict(Counter(value) - Counter(before.get(key, {})))
        else:
            out[key] = value - before.get(key, 0)
    return out


async def drive(sim: Simulation, args: argparse.Namespace, state: dict[str, Any]) -> None:
    s = sim.settings
    observer = WriteObserver(sim)
    sim.producing = True
    producer = asyncio.create_task(sim._produce())
    for _ in range(s.workers):
        sim.fleet.later(sim.rng_workers.uniform(0, s.failover_time), sim.fleet.start_worker)

    async def progress() -> None:
        while True:
            state["progress"] = snapshot(sim, observer)
            await asyncio.sleep(5.0)

    sampler = asyncio.create_task(progress())
    await asyncio.sleep(args.warmup)
    state["before"] = snapshot(sim, observer)
    await asyncio.sleep(args.crash_at)
    # The middle one of the live workers that hold a lease (a leader-based plan can leave a
    # worker with none; crashing it would measure no failover).
    live = [w for w in sim.fleet.live_workers() if sim.fleet.owned_by(w.name)]
    live = live or sim.fleet.live_workers()
    victim = live[len(live) // 2]
    state["crashed"] = victim.name
    sim.fleet.crash(victim)
    await asyncio.sleep(args.window - args.crash_at)
    state["after"] = snapshot(sim, observer)
    state["failover_samples"] = [
        x / s.failover_time for x in sim.checker.failover_times[state["before"]["failovers"] :]
    ]
    # Unit counts use the larger of the simulated and the production-like item sizes.
    typical_lease, typical_entry = typical_sizes()
    simulated = statistics.fmean(observer.sizes) if observer.sizes else 0.0
    state["sim_lease_bytes"] = simulated
    state["lease_bytes"] = max(simulated, typical_lease)
    state["lease_bytes_max"] = max(observer.max_size, typical_lease)
    items = list(sim.table.worker_metrics.items.values())
    entries = statistics.fmean(item_size(i) for i in items) if items else 0.0
    state["sim_registry_bytes"] = entries
    state["registry_bytes"] = max(entries, typical_entry)
    state["leases"] = len(sim.table.leases)
    state["violations"] = len(sim.checker.violations)
    sampler.cancel()
    sim.producing = False
    await producer
    await sim.fleet.cancel_all()


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def units(d: dict[str, Any], state: dict[str, Any], workers: int) -> dict[str, Any]:
    """Request units over the window, by table and operation."""
    reads, writes = d["lease_reads"], d["lease_writes"]
    lb = state["lease_bytes"]
    rb = state["registry_bytes"]
    items = d["lease_items"]
    out: dict[str, float] = {}
    scans = reads.get("list_leases", 0)
    if scans:
        out["lease scan R"] = scans * read_units(
            items.get("list_leases", 0) / scans, lb, consistent=True
        )
    queries = reads.get("lease_keys_of", 0)
    if queries:
        index_bytes = index_item_size("shardId-000000000000", "w0000")
        out["owner-index query R"] = queries * read_units(
            items.get("lease_keys_of", 0) / queries, index_bytes, consistent=False
        )
    out["lease get R"] = float(reads.get("get_lease", 0) + reads.get("is_empty", 0))
    lease_wu = write_units(max(state["lease_bytes_max"], lb))
    checkpoints = writes.get("checkpoint", 0)
    out["renew W"] = float(writes.get("renew_lease", 0) * lease_wu)
    out["take/handoff/release W"] = float(
        sum(v for k, v in writes.items() if k not in ("renew_lease", "checkpoint")) * lease_wu
    )
    out["owner-index W"] = float(d["gsi_writes"])
    out["checkpoint W"] = float(checkpoints * lease_wu)
    reg = d["registry"]
    lists = reg.get("list_workers", 0)
    if lists:
        out["registry scan R"] = lists * read_units(
            reg.get("items_read", 0) / lists, rb, consistent=True
        )
    # The leader's entry read alone by the others (early failover's silence digest).
    out["registry get R"] = float(reg.get("get", 0) * read_units(1, rb, consistent=True))
    out["registry W"] = float((reg.get("report", 0) + reg.get("remove", 0)) * write_units(rb))
    co = d["coordinator"]
    out["coordinator R"] = float(co.get("get_lock", 0) + co.get("get_migration_state", 0))
    out["coordinator W"] = float(
        co.get("create_lock", 0) + co.get("replace_lock", 0) + co.get("release_lock", 0)
    )
    return out


def label(settings: SimulationSettings) -> str:
    return settings.taker + ("" if settings.early_failover else "-noef")


def summarise(settings: SimulationSettings, state: dict[str, Any], wall: float) -> dict[str, Any]:
    d = diff(state["after"], state["before"])
    hours = d["time"] / 3600.0
    leases = max(1, state["leases"])
    u = units(d, state, settings.workers)
    w_protocol = sum(v for k, v in u.items() if k.endswith("W") and k != "checkpoint W")
    r_total = sum(v for k, v in u.items() if k.endswith("R"))
    month = HOURS_PER_MONTH / hours
    reg = d["registry"]
    samples = state["failover_samples"]
    return {
        "taker": label(settings),
        "workers": settings.workers,
        "shards": settings.shards,
        "finished": True,
        "wall_seconds": round(wall, 1),
        "window_seconds": d["time"],
        "leases": leases,
        "lease_item_bytes": round(state["lease_bytes"]),
        "registry_item_bytes": round(state["registry_bytes"]),
        "calls": {k: d[k] for k in ("lease_reads", "lease_writes", "registry", "coordinator")},
        "items_read": d["lease_items"],
        "gsi_writes": d["gsi_writes"],
        "units_per_lease_hour": {k: v / leases / hours for k, v in u.items()},
        "write_units_per_lease_hour": w_protocol / leases / hours,
        "read_units_per_lease_hour": r_total / leases / hours,
        "checkpoint_units_per_lease_hour": u["checkpoint W"] / leases / hours,
        "fleet_month_write_units": w_protocol * month,
        "fleet_month_read_units": r_total * month,
        "fleet_month_dollars": dollars(w_protocol * month, r_total * month),
        "fleet_month_read_dollars": dollars(0, r_total * month),
        "registry_reads_per_worker_second": reg.get("list_workers", 0)
        / settings.workers
        / d["time"],
        # Scans' entries plus the single entries read alone (the leader's, by the others).
        "registry_items_per_worker_second": (reg.get("items_read", 0) + reg.get("get", 0))
        / settings.workers
        / d["time"],
        "failover_median": pct(samples, 0.5),
        "failover_p99": pct(samples, 0.99),
        "failovers": len(samples),
        "leases_moved": d["moves"],
        "violations": state["violations"],
    }


def unfinished(settings: SimulationSettings, state: dict[str, Any], wall: float) -> dict[str, Any]:
    p = state.get("progress") or {"time": 0.0, "registry": {}}
    t = max(p["time"], 1e-9)
    reg = p["registry"]
    return {
        "taker": label(settings),
        "workers": settings.workers,
        "shards": settings.shards,
        "finished": False,
        "wall_seconds": round(wall, 1),
        "virtual_seconds_reached": p["time"],
        "registry_reads_per_worker_second": reg.get("list_workers", 0) / settings.workers / t,
        "registry_items_per_worker_second": reg.get("items_read", 0) / settings.workers / t,
        "lease_reads": p.get("lease_reads", {}),
    }


def run_point(taker: str, workers: int, shards: int, args: argparse.Namespace) -> dict[str, Any]:
    # ``kcl2-noef``: a taker with ``early_failover=False`` (no registry heartbeat; the taker
    # scans every failover + epsilon instead of every 2 x).
    name, _, variant = taker.partition("-")
    settings = SimulationSettings(
        workers=workers,
        shards=shards,
        taker=name,
        faults=frozenset(),
        seed=args.seed,
        early_failover=variant != "noef",
    )
    state: dict[str, Any] = {}
    start = time.perf_counter()
    try:
        run_virtual(lambda: drive(Simulation(settings), args, state), wall_limit=args.wall_limit)
    except WallTimeExceeded:
        return unfinished(settings, state, time.perf_counter() - start)
    return summarise(settings, state, time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fleets", default="10x100,100x1000")
    ap.add_argument("--takers", default=",".join(TAKERS))
    ap.add_argument("--warmup", type=float, default=180.0)
    ap.add_argument("--window", type=float, default=300.0)
    ap.add_argument("--crash-at", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--wall-limit", type=float, default=600.0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--merge", default=None, help="points of an earlier --json to add")
    ap.add_argument("--plot", default=None)
    args = ap.parse_args()
    points: list[dict[str, Any]] = []
    if args.merge:
        with open(args.merge, encoding="utf-8") as f:
            points.extend(json.load(f))
    for fleet in args.fleets.split(","):
        if not fleet:
            continue
        workers, shards = (int(x) for x in fleet.split("x"))
        for taker in args.takers.split(","):
            point = run_point(taker, workers, shards, args)
            print(json.dumps(point), flush=True)
            points.append(point)
            if args.json:
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump(points, f, indent=1)
    print(table(points))
    if args.plot:
        plot(points, args.plot)


if __name__ == "__main__":
    main()
