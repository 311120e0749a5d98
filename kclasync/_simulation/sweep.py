"""Seed sweeps: one fleet setting run over many seeds, in parallel processes, pooled.

Owns: running a range of seeds (``sweep``) with ``jobs`` processes, and the pooled result
(``SweepSummary``): runs with invariant violations, runtime errors (ERROR records logged by the
workers, which include unexpected exceptions), the failover distribution over every failover
of every seed (median, p90, p99, max), lease items read per lease-hour, duplicates by cause,
and the CPU seconds spent.
Must not: run a simulation itself (``harness``) or decide what passes (its callers do).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor

import attrs

from kclasync._simulation.settings import SimulationSettings


@attrs.frozen
class SeedResult:
    """What a sweep keeps of one seed's report (small, so it pickles cheaply)."""

    seed: int
    violations: Mapping[str, int]
    violation_examples: tuple[str, ...]
    runtime_errors: Mapping[str, int]
    failovers: tuple[float, ...]
    failovers_pending: int
    duplicate_kinds: Mapping[str, int]
    cpu_seconds: float
    lease_items_read_per_lease_hour: float = 0.0


def run_seed(settings: SimulationSettings, wall_limit: float | None = None) -> SeedResult:
    """One seed, in this process."""
    from kclasync._simulation.harness import run_simulation

    cpu = time.process_time()
    report = run_simulation(settings, wall_limit=wall_limit)
    return SeedResult(
        seed=settings.seed,
        violations=dict(report.violations),
        violation_examples=report.violation_examples,
        runtime_errors=dict(report.runtime_errors),
        failovers=report.failover_samples,
        failovers_pending=report.failovers_pending,
        duplicate_kinds=dict(report.duplicate_kinds),
        cpu_seconds=time.process_time() - cpu,
        lease_items_read_per_lease_hour=report.lease_items_read_per_lease_hour,
    )


def _run_one(args: tuple[SimulationSettings, float | None]) -> SeedResult:
    return run_seed(*args)


def percentile(values: list[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0-100) of ``values``; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


@attrs.frozen
class SweepSummary:
    settings: SimulationSettings
    results: tuple[SeedResult, ...]
    wall_seconds: float

    @property
    def seeds(self) -> int:
        return len(self.results)

    @property
    def failed_seeds(self) -> tuple[int, ...]:
        """Seeds with an invariant violation or a runtime error."""
        return tuple(r.seed for r in self.results if r.violations or r.runtime_errors)

    @property
    def violations(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.violations)
        return total

    @property
    def runtime_errors(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.runtime_errors)
        return total

    @property
    def duplicate_kinds(self) -> Counter[str]:
        total: Counter[str] = Counter()
        for r in self.results:
            total.update(r.duplicate_kinds)
        return total

    @property
    def failovers(self) -> list[float]:
        return [f for r in self.results for f in r.failovers]

    @property
    def cpu_seconds(self) -> float:
        return sum(r.cpu_seconds for r in self.results)

    def failover_stats(self) -> tuple[float | None, float | None, float | None]:
        """Median, p99 and max failover time, in units of the failover time."""
        f = self.failovers
        if not f:
            return None, None, None
        return statistics.median(f), percentile(f, 99), max(f)

    def worst(self) -> tuple[int, float] | None:
        """The seed with the longest failover, and that failover."""
        best: tuple[int, float] | None = None
        for r in self.results:
            for f in r.failovers:
                if best is None or f > best[1]:
                    best = (r.seed, f)
        return best

    def format(self) -> str:
        s = self.settings
        med, p99, worst = self.failover_stats()
        p90 = percentile(self.failovers, 90)
        worst_seed = self.worst()
        reads = [r.lease_items_read_per_lease_hour for r in self.results]

        def num(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.2f}"

        lines = [
            f"{self.seeds} seeds from {s.seed}: {s.workers} workers x {s.shards} shards, "
            f"{s.hours:g} h, faults {','.join(sorted(s.faults)) or 'none'} "
            f"x{s.fault_rate:g}, taker {s.taker}, failover {s.failover_time:g}s",
            f"seeds with violations or runtime errors: {len(self.failed_seeds)}"
            + (f" {list(self.failed_seeds)[:20]}" if self.failed_seeds else ""),
            f"violations: {sum(self.violations.values())} {dict(self.violations) or ''}".rstrip(),
            f"runtime errors: {sum(self.runtime_errors.values())}",
            *(f"  {n} x {msg}" for msg, n in self.runtime_errors.most_common(10)),
            f"failover (x failover time) over {len(self.failovers)} failovers: "
            f"median {num(med)}, p90 {num(p90)}, p99 {num(p99)}, max {num(worst)}"
            + (f" (seed {worst_seed[0]})" if worst_seed else ""),
            "lease items read per lease-hour (scans, owner index, single reads), mean over "
            f"seeds: {statistics.fmean(reads) if reads else 0:.0f}",
            f"failovers never completed: {sum(r.failovers_pending for r in self.results)}",
            "duplicates by cause: "
            + (", ".join(f"{k} {v}" for k, v in sorted(self.duplicate_kinds.items())) or "none"),
            f"cpu {self.cpu_seconds:.0f}s ({self.cpu_seconds / max(1, self.seeds):.2f}s a seed), "
            f"wall {self.wall_seconds:.0f}s",
        ]
        return "\n".join(lines)


def sweep(
    base: SimulationSettings,
    seeds: int,
    *,
    jobs: int = 1,
    wall_limit: float | None = None,
    on_result: Callable[[SeedResult], None] | None = None,
) -> SweepSummary:
    """Run seeds ``base.seed`` .. ``base.seed + seeds - 1`` in ``jobs`` processes;
    ``on_result`` sees each seed's result as it comes (in seed order)."""
    started = time.monotonic()
    work = [(attrs.evolve(base, seed=base.seed + i), wall_limit) for i in range(seeds)]
    results: list[SeedResult] = []
    with contextlib.ExitStack() as stack:
        if jobs <= 1:
            done: Iterator[SeedResult] = map(_run_one, work)
        else:
            ctx = multiprocessing.get_context("spawn")
            pool = stack.enter_context(ProcessPoolExecutor(max_workers=jobs, mp_context=ctx))
            done = pool.map(_run_one, work, chunksize=max(1, min(8, seeds // (jobs * 8))))
        for result in done:
            results.append(result)
            if on_result is not None:
                on_result(result)
    return SweepSummary(
        settings=base, results=tuple(results), wall_seconds=time.monotonic() - started
    )


__all__ = ["SeedResult", "SweepSummary", "percentile", "run_seed", "sweep"]
