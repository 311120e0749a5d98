"""A wide sweep of the deterministic simulation: many seeds, fleet sizes, takers and fault mixes.

Run: ``uv run python benchmarks/simulation_sweep.py [--quick]``. Prints one line per run and
exits 1 if any run violated an invariant. Every failing line names its settings, so it can be
replayed with ``kclasync simulate --workers W --shards S --hours H --seed N --faults F``.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from kclasync._simulation import SimulationSettings, run_simulation
from kclasync._simulation.faults import ALL_FAULTS, parse_faults

FLEETS = [(4, 8), (8, 32), (20, 100), (50, 500)]
FAULT_MIXES = ["all", "crash,pause", "throttle,errors,delay", "reshard,stop,slow"]
TAKERS = ["kcl2", "balanced"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--seeds", type=int, default=10)
    p.add_argument("--hours", type=float, default=0.5)
    p.add_argument("--quick", action="store_true", help="small fleets and 3 seeds only")
    args = p.parse_args()
    fleets = FLEETS[:2] if args.quick else FLEETS
    seeds = range(3 if args.quick else args.seeds)
    failed = 0
    for (workers, shards), mix, taker, seed in itertools.product(
        fleets, FAULT_MIXES, TAKERS, seeds
    ):
        faults = parse_faults(mix) if mix != "all" else ALL_FAULTS
        settings = SimulationSettings(
            workers=workers,
            shards=shards,
            hours=args.hours,
            seed=seed,
            faults=faults,
            taker=taker,
            fault_rate=2.0,
        )
        report = run_simulation(settings, wall_limit=1800)
        failed += bool(report.violation_count)
        print(
            f"{workers:>4}x{shards:<5} {mix:<22} {taker:<8} seed {seed:<3} "
            f"violations {report.violation_count:<3} dup {report.duplicates:<5} "
            f"failover max {report.failover_max or 0:.2f} "
            f"balance rounds {report.rounds_to_balance} wall {report.wall_seconds:.1f}s "
            + (str(dict(report.violations)) if report.violation_count else ""),
            flush=True,
        )
    print(f"{failed} runs with violations")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
