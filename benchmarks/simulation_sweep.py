"""Seed sweeps of the deterministic simulation.

Two modes:

* ``--seeds N --jobs J`` (the reliability sweep): one small fleet with all faults over N seeds
  in J processes, pooled: seeds with violations or runtime errors, the failover distribution
  (median, p99, max), duplicates by cause, CPU seconds. ``--no-throttle`` leaves DynamoDB
  throttling out, for the comparison in docs/simulation.md. 10,000 seeds::

      uv run python benchmarks/simulation_sweep.py --seeds 10000 --jobs 8

* ``--matrix [--quick]``: many fleet sizes, takers and fault mixes, a few seeds each; one line
  per run.

Exits 1 if any run violated an invariant (or, in the reliability sweep, logged a runtime
error). Every failing seed can be replayed with ``kclasync simulate --seed N`` and the same
settings.
"""

from __future__ import annotations

import argparse
import itertools
import sys

from kclasync._simulation import SimulationSettings, run_simulation
from kclasync._simulation.faults import ALL_FAULTS, parse_faults
from kclasync._simulation.sweep import sweep

FLEETS = [(4, 8), (8, 32), (20, 100), (50, 500)]
FAULT_MIXES = ["all", "crash,pause", "throttle,errors,delay", "reshard,stop,slow"]
TAKERS = ["kcl2", "balanced"]


def reliability(args: argparse.Namespace) -> int:
    faults = ALL_FAULTS - {"throttle"} if args.no_throttle else ALL_FAULTS
    base = SimulationSettings(
        workers=args.workers,
        shards=args.shards,
        hours=args.hours,
        seed=args.first_seed,
        faults=faults,
        fault_rate=args.fault_rate,
        taker=args.taker,
    )
    summary = sweep(base, args.seeds, jobs=args.jobs, wall_limit=600)
    print(summary.format(), flush=True)
    return 1 if summary.failed_seeds else 0


def matrix(args: argparse.Namespace) -> int:
    fleets = FLEETS[:2] if args.quick else FLEETS
    seeds = range(3 if args.quick else 10)
    failed = 0
    for (workers, shards), mix, taker, seed in itertools.product(
        fleets, FAULT_MIXES, TAKERS, seeds
    ):
        faults = parse_faults(mix) if mix != "all" else ALL_FAULTS
        settings = SimulationSettings(
            workers=workers,
            shards=shards,
            hours=0.5,
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


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--matrix", action="store_true", help="the fleet x faults x taker matrix")
    p.add_argument("--quick", action="store_true", help="matrix: small fleets and 3 seeds only")
    p.add_argument("--seeds", type=int, default=200)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--first-seed", type=int, default=30_000)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--hours", type=float, default=0.05)
    p.add_argument("--fault-rate", type=float, default=6.0)
    p.add_argument("--taker", choices=TAKERS, default="kcl2")
    p.add_argument("--no-throttle", action="store_true", help="all faults but throttling")
    args = p.parse_args()
    return matrix(args) if args.matrix else reliability(args)


if __name__ == "__main__":
    sys.exit(main())
