"""``kclasync simulate``: run the deterministic fleet simulation and print its report.

Owns: the command's arguments and exit code (0 when no run had an invariant violation, 1
otherwise; with ``--jobs``, also 1 when a run logged a runtime error).
Must not: contain simulation logic (``harness``) or formatting (``report``).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import attrs

from kclasync._simulation.faults import ALL_FAULTS, parse_faults
from kclasync._simulation.settings import TAKERS


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "simulate",
        help="run real workers against in-memory AWS in virtual time, with faults",
        description=(
            "Run a fleet of real kclasync workers on in-memory adapters in virtual time, "
            "inject faults, check the invariants while it runs and print a report. "
            "Exit code 1 if any invariant was violated."
        ),
    )
    p.add_argument("--workers", type=int, default=20, help="workers in the fleet (20)")
    p.add_argument("--shards", type=int, default=100, help="shards at the start (100)")
    p.add_argument("--hours", type=float, default=0.5, help="virtual hours of faults (0.5)")
    p.add_argument("--seed", type=int, default=0, help="random seed (0)")
    p.add_argument("--seeds", type=int, default=1, help="run this many seeds from --seed (1)")
    p.add_argument(
        "--faults",
        default="all",
        help=f"comma-separated from {','.join(sorted(ALL_FAULTS))}, or all / none (all)",
    )
    p.add_argument("--fault-rate", type=float, default=1.0, help="multiplies fault rates (1)")
    p.add_argument("--failover", type=float, default=10.0, help="failover time, seconds (10)")
    p.add_argument("--taker", choices=TAKERS, default="balanced", help="lease taker (balanced)")
    p.add_argument(
        "--rate", type=float, default=2.0, help="records per shard per minute produced (2)"
    )
    p.add_argument(
        "--idle-time", type=float, default=2.0, help="idle_time_between_reads, seconds (2)"
    )
    p.add_argument(
        "--max-idle-time",
        type=float,
        default=None,
        help="max_idle_time_between_reads, seconds (default: the idle time, no growth)",
    )
    p.add_argument(
        "--shard-sync", type=float, default=60.0, help="shard_sync_interval, seconds (60)"
    )
    p.add_argument(
        "--wall-limit", type=float, default=None, help="abort a run after this many real seconds"
    )
    p.add_argument("--json", action="store_true", help="print each report as one JSON line")
    p.add_argument(
        "--record",
        metavar="FILE",
        help="write the run's ownership changes and per-worker rates to FILE (one seed), "
        "for `kclasync dashboard --replay FILE`",
    )
    p.add_argument(
        "--load-scenario",
        type=float,
        default=None,
        metavar="SECONDS",
        help=(
            "instead of faults: skewed shards, unequal workers, a join, a leave and a leader "
            "crash every SECONDS, run for the balanced, kcl3 and load policies; prints a table"
        ),
    )
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help=(
            "run the seeds in this many processes and print one pooled summary (failover "
            "median/p99/max, duplicates by cause); exit 1 on any violation or runtime error (1)"
        ),
    )


def run(args: argparse.Namespace) -> int:
    from kclasync._simulation.harness import run_simulation
    from kclasync._simulation.report import format_report
    from kclasync._simulation.settings import SimulationSettings

    try:
        faults = parse_faults(args.faults)
        base = SimulationSettings(
            workers=args.workers,
            shards=args.shards,
            hours=args.hours,
            seed=args.seed,
            faults=faults,
            fault_rate=args.fault_rate,
            failover_time=args.failover,
            taker=args.taker,
            records_per_shard_per_minute=args.rate,
            idle_time_between_reads=args.idle_time,
            max_idle_time_between_reads=args.max_idle_time,
            shard_sync_interval=args.shard_sync,
        )
    except ValueError as exc:
        print(f"kclasync simulate: {exc}", file=sys.stderr)
        return 2
    if args.record and (args.seeds > 1 or args.jobs > 1 or args.load_scenario is not None):
        print(
            "kclasync simulate: --record records one run: not with --seeds, --jobs or "
            "--load-scenario",
            file=sys.stderr,
        )
        return 2
    if args.load_scenario is not None:
        from kclasync._simulation.load_scenario import compare_policies
        from kclasync._simulation.load_table import format_comparison

        results = compare_policies(
            workers=args.workers,
            shards=args.shards,
            seed=args.seed,
            change_every=args.load_scenario,
        )
        print(format_comparison(results), flush=True)
        bad = [r for r in results if r.report.violation_count]
        for r in bad:
            print(format_report(r.report), flush=True)
        return 1 if bad else 0
    if args.jobs > 1:
        from kclasync._simulation.sweep import sweep

        summary = sweep(base, max(1, args.seeds), jobs=args.jobs, wall_limit=args.wall_limit)
        print(summary.format(), flush=True)
        return 1 if summary.failed_seeds else 0
    failed = 0
    for offset in range(max(1, args.seeds)):
        settings = attrs.evolve(base, seed=base.seed + offset)
        writer = None
        if args.record:
            from kclasync._observations import RecordingWriter
            from kclasync._simulation.settings import APPLICATION

            try:
                writer = RecordingWriter(args.record, APPLICATION, "simulation")
            except OSError as exc:
                print(f"kclasync simulate: error: {exc}", file=sys.stderr)
                return 1
        report = run_simulation(settings, wall_limit=args.wall_limit, record=writer)
        if args.record:
            print(
                f"recorded to {args.record}: kclasync dashboard --replay {args.record}",
                file=sys.stderr,
            )
        if report.violation_count:
            failed += 1
        if args.json:
            data: dict[str, Any] = attrs.asdict(report)
            print(json.dumps(data, sort_keys=True), flush=True)
        else:
            if offset:
                print()
            print(format_report(report), flush=True)
    if args.seeds > 1 and not args.json:
        print(f"\n{args.seeds - failed}/{args.seeds} seeds without invariant violations")
    return 1 if failed else 0


__all__ = ["add_parser", "run"]
