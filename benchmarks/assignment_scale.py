"""The load planner's cost per assignment run as the fleet grows: the largest shape of the tuning
sweep (benchmarks/assignment_shapes.py: 12 workers, 404 shards) against 10x its workers and
shards (each alone, then both), in the same process (ratios; the machine is shared, so absolute
times are noisy).

Two snapshots per size: "unbalanced" (every lease placed at random on the first half of the
workers, the other half just joined; Zipf skew 0.8, the hottest lease at most 80 % of the
largest worker) and "balanced" (the planner's own result fed back: the run a settled fleet pays
every interval). Since the unmovable peak (``peak_floor``) the hottest lease sets the band on
the larger shapes and the plan moves few leases there. Capacities known, as in a fleet past its
first minute.

    flock /tmp/heavy.lock uv run python benchmarks/assignment_scale.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import time

from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, WorkerLoad
from kclasync._core.assignment.load_balancer import plan_load_aware

CAPACITIES = (1000.0, 1400.0, 2000.0, 3000.0, 4000.0)


def snapshot(workers: int, shards: int, seed: int) -> FleetSnapshot:
    rng = random.Random(seed)
    caps = {f"w{i:04d}": rng.choice(CAPACITIES) for i in range(workers)}
    raw = [1.0 / (rank + 1) ** 0.8 for rank in range(shards)]
    rng.shuffle(raw)
    scale = 0.35 * sum(caps.values()) / sum(raw)
    scale = min(scale, 0.8 * max(caps.values()) / max(raw))
    ids = sorted(caps)
    leases = tuple(
        LeaseLoad(f"shard-{i:05d}", rng.choice(ids[: max(1, workers // 2)]), rate * scale)
        for i, rate in enumerate(raw)
    )
    load = dict.fromkeys(ids, 0.0)
    for lease in leases:
        load[lease.owner or ""] += lease.throughput_kbps or 0.0
    return FleetSnapshot(
        leases,
        tuple(
            WorkerLoad(w, cpu_percent=100 * load[w] / caps[w], capacity_kbps=caps[w]) for w in ids
        ),
    )


def settled(snap: FleetSnapshot) -> FleetSnapshot:
    plan = plan_load_aware(snap)
    owner = {m.lease_key: m.to_worker for m in plan.all}
    leases = tuple(
        LeaseLoad(lease.key, owner.get(lease.key, lease.owner), lease.throughput_kbps)
        for lease in snap.leases
    )
    return FleetSnapshot(leases, snap.workers)


def timed(snap: FleetSnapshot, repeat: int) -> tuple[float, int]:
    best = float("inf")
    moves = 0
    for _ in range(repeat):
        started = time.perf_counter()
        plan = plan_load_aware(snap)
        best = min(best, time.perf_counter() - started)
        moves = len(plan.moves)
    return best, moves


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    # 10x the shards alone, 10x the workers alone, both, and the largest.
    sizes = [(12, 404), (20, 500), (12, 4040), (120, 404), (120, 4040), (200, 5000)]
    base: dict[str, float] = {}
    print("| workers x shards | snapshot | plan time (best) | x the 12 x 404 time | moves |")
    print("|---|---|---|---|---|")
    for workers, shards in sizes:
        unbalanced = snapshot(workers, shards, seed=1)
        for name, snap in (("unbalanced", unbalanced), ("balanced", settled(unbalanced))):
            seconds, moves = timed(snap, args.repeat)
            base.setdefault(name, seconds)
            print(
                f"| {workers} x {shards} | {name} | {seconds * 1000:.1f} ms | "
                f"{seconds / base[name]:.1f} | {moves} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
