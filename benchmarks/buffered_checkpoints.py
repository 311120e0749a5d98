"""Checkpoint writes saved by buffered checkpoints, in the simulation (virtual time).

The same fleet and seed run twice: processors that write a checkpoint after every batch, and
processors that record it in memory after every batch (``checkpoint(persist=False)``) while the
runtime writes the newest one every ``checkpoint_interval``. Prints the lease-table writes per
lease-hour of both (renewals included, so the difference is the checkpoint writes saved), and the
most a crash may replay on top: ``checkpoint_interval`` seconds of a shard's records.

    uv run python benchmarks/buffered_checkpoints.py [--interval 10] [--rate 600] [--hours 0.1]
"""

from __future__ import annotations

import argparse

from kclasync._simulation.harness import run_simulation
from kclasync._simulation.settings import SimulationSettings


def main(args: argparse.Namespace) -> None:
    base = {
        "workers": args.workers,
        "shards": args.shards,
        "hours": args.hours,
        "seed": args.seed,
        "faults": frozenset(args.faults.split(",")) if args.faults else frozenset(),
        "records_per_shard_per_minute": args.rate,
    }
    every = run_simulation(SimulationSettings(**base, checkpoint_interval=1e-3))
    buffered = run_simulation(
        SimulationSettings(**base, checkpoint_interval=args.interval, buffered_checkpoints=True)
    )
    for name, report in (("after every batch", every), ("buffered", buffered)):
        print(
            f"{name:<20} lease-table writes per lease-hour "
            f"{report.lease_writes_per_lease_hour:8.1f}   invariants "
            f"{'hold' if not report.violations else report.violations}"
        )
    saved = every.lease_writes_per_lease_hour - buffered.lease_writes_per_lease_hour
    print(
        f"checkpoint writes saved per lease-hour: {saved:.1f}; a crash replays at most "
        f"{args.interval:g} s of a shard's records more (~{args.rate * args.interval / 60:.0f} "
        f"records at {args.rate:g} records per shard-minute)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=600.0, help="records per shard-minute")
    parser.add_argument("--hours", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--faults", default="", help="comma-separated fault kinds (default none)")
    main(parser.parse_args())
