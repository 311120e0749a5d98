"""The outcome of one simulation run, and its text rendering.

Owns: ``SimulationReport`` (numbers only, comparable between runs of the same seed),
``format_report``, and ``FinishedRun`` (what a report is built from, which the harness's
``Simulation`` provides). Must not: run anything or import the harness.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sized
from typing import Protocol

import attrs

from kclasync._adapters.memory import FaultPlan, MemoryLeaseTable, MemoryStream
from kclasync._simulation.invariants import InvariantChecker
from kclasync._simulation.settings import SimulationSettings


class FinishedRun(Protocol):
    """The state of a finished simulation that its report is built from."""

    @property
    def settings(self) -> SimulationSettings: ...
    @property
    def checker(self) -> InvariantChecker: ...
    @property
    def table(self) -> MemoryLeaseTable: ...
    @property
    def stream(self) -> MemoryStream: ...
    @property
    def store_plan(self) -> FaultPlan: ...
    @property
    def stream_plan(self) -> FaultPlan: ...
    @property
    def workers(self) -> Sized: ...
    @property
    def events(self) -> Mapping[str, int]: ...
    @property
    def produced(self) -> int: ...
    @property
    def lease_samples(self) -> list[int]: ...
    @property
    def balanced_at(self) -> float | None: ...
    @property
    def faults_end(self) -> float: ...
    @property
    def taker_interval(self) -> float: ...


@attrs.frozen
class SimulationReport:
    workers: int
    shards: int
    seed: int
    faults: tuple[str, ...]
    taker: str
    failover_time: float
    fault_hours: float
    virtual_seconds: float
    wall_seconds: float = attrs.field(eq=False)
    #: Violations by kind, and the first few descriptions.
    violations: Mapping[str, int]
    violation_examples: tuple[str, ...]
    records_produced: int
    records_processed: int
    processor_calls: int
    interrupted_calls: int
    duplicates: int
    duplicate_kinds: Mapping[str, int]
    overlaps_allowed: int
    #: In units of ``failover_time``.
    failover_median: float | None
    failover_max: float | None
    failovers: int
    failovers_pending: int
    rounds_to_balance: int | None
    lease_reads_per_lease_hour: float
    lease_items_scanned_per_lease_hour: float
    lease_writes_per_lease_hour: float
    lease_table_ops: Mapping[str, int]
    events: Mapping[str, int]
    injected: Mapping[str, int]
    shards_at_end: int
    workers_started: int
    runtime_errors: Mapping[str, int]
    #: Every failover time measured, in units of ``failover_time`` (for sweeps to pool).
    failover_samples: tuple[float, ...] = ()
    #: Lease items read per lease-hour: items of full scans and of the owner index, and
    #: single-lease reads (the capacity a table pays for).
    lease_items_read_per_lease_hour: float = 0.0
    #: Worker-registry calls of the whole fleet (``report``, ``list_workers``, ``get``,
    #: ``remove``; ``items_read``: the entries the scans returned).
    registry_calls: Mapping[str, int] = attrs.field(factory=dict)
    registry_reads_per_lease_hour: float = 0.0
    registry_writes_per_lease_hour: float = 0.0
    #: The 99th percentile of the failover times (nearest rank), in failover times.
    failover_p99: float | None = None
    #: The leases of workers that led when they crashed (the ``leader`` fault, or a ``crash``
    #: that hit the leader): how many were taken over, and their median, p99 and max.
    leader_failovers: int = 0
    leader_failover_median: float | None = None
    leader_failover_p99: float | None = None
    leader_failover_max: float | None = None

    @property
    def violation_count(self) -> int:
        return sum(self.violations.values())

    @classmethod
    def build(
        cls,
        sim: FinishedRun,
        *,
        start: float,
        end: float,
        wall_seconds: float,
        errors: Mapping[str, int],
    ) -> SimulationReport:
        s = sim.settings
        checker = sim.checker
        f = s.failover_time
        violations = Counter(v.kind for v in checker.violations)
        examples = tuple(f"[{v.kind} @ {v.time:.1f}s] {v.detail}" for v in checker.violations[:10])
        median, worst = checker.failover_summary()
        leader_times = checker.ownership.leader_failover_times
        leader_median, leader_p99, leader_max = _spread(leader_times, f)
        hours = max(end - start, 1e-9) / 3600.0
        samples = sim.lease_samples or [len(sim.table.leases)]
        mean_leases = max(1.0, sum(samples) / len(samples))
        table = sim.table
        registry = Counter(table.worker_metrics.totals)
        rounds: int | None = None
        if sim.balanced_at is not None:
            rounds = max(0, math.ceil((sim.balanced_at - sim.faults_end) / sim.taker_interval))
        ops: Counter[str] = Counter()
        ops.update({f"read:{k}": v for k, v in table.reads.items()})
        ops.update({f"write:{k}": v for k, v in table.writes.items()})
        injected: Counter[str] = Counter()
        injected.update(sim.store_plan.injected)
        injected.update({f"stream:{k}": v for k, v in sim.stream_plan.injected.items()})
        return cls(
            workers=s.workers,
            shards=s.shards,
            seed=s.seed,
            faults=tuple(sorted(s.faults)),
            taker=s.taker,
            failover_time=f,
            fault_hours=s.hours,
            virtual_seconds=end - start,
            wall_seconds=wall_seconds,
            violations=dict(sorted(violations.items())),
            violation_examples=examples,
            records_produced=sim.produced,
            records_processed=checker.records_processed,
            processor_calls=checker.calls,
            interrupted_calls=checker.interrupted_calls,
            duplicates=checker.duplicates,
            duplicate_kinds=dict(sorted(checker.duplicate_kinds.items())),
            overlaps_allowed=checker.overlaps_allowed,
            failover_median=None if median is None else median / f,
            failover_max=None if worst is None else worst / f,
            failovers=len(checker.failover_times),
            failovers_pending=checker.failovers_pending,
            rounds_to_balance=rounds,
            lease_reads_per_lease_hour=sum(table.reads.values()) / mean_leases / hours,
            lease_items_scanned_per_lease_hour=table.items_scanned / mean_leases / hours,
            lease_writes_per_lease_hour=sum(table.writes.values()) / mean_leases / hours,
            lease_table_ops=dict(sorted(ops.items())),
            events=dict(sorted(sim.events.items())),
            injected=dict(sorted(injected.items())),
            shards_at_end=len(sim.stream.shards),
            workers_started=len(sim.workers),
            runtime_errors=dict(sorted(errors.items())),
            failover_samples=tuple(t / f for t in checker.failover_times),
            lease_items_read_per_lease_hour=(table.items_scanned + table.reads["get_lease"])
            / mean_leases
            / hours,
            registry_calls=dict(sorted(registry.items())),
            registry_reads_per_lease_hour=(registry["list_workers"] + registry["get"])
            / mean_leases
            / hours,
            registry_writes_per_lease_hour=(registry["report"] + registry["remove"])
            / mean_leases
            / hours,
            failover_p99=_spread(checker.failover_times, f)[1],
            leader_failovers=len(leader_times),
            leader_failover_median=leader_median,
            leader_failover_p99=leader_p99,
            leader_failover_max=leader_max,
        )


def _spread(times: list[float], unit: float) -> tuple[float | None, float | None, float | None]:
    """Median, 99th percentile (nearest rank) and max of ``times``, in ``unit``s."""
    if not times:
        return None, None, None
    ordered = sorted(t / unit for t in times)
    p99 = ordered[max(0, math.ceil(0.99 * len(ordered)) - 1)]
    return statistics.median(ordered), p99, ordered[-1]


def _num(value: float | None, unit: str = "") -> str:
    return "n/a" if value is None else f"{value:.2f}{unit}"


def format_report(report: SimulationReport) -> str:
    r = report
    lines = [
        f"kclasync simulate: {r.workers} workers x {r.shards} shards, seed {r.seed}, "
        f"taker {r.taker}, failover {r.failover_time:g}s",
        f"  faults: {','.join(r.faults) or 'none'} for {r.fault_hours:g} h; "
        f"virtual time {r.virtual_seconds / 3600:.2f} h; wall time {r.wall_seconds:.1f} s",
        f"invariant violations: {r.violation_count}",
    ]
    for kind, count in r.violations.items():
        lines.append(f"  {kind}: {count}")
    lines += [f"    {example}" for example in r.violation_examples]
    dup_kinds = ", ".join(f"{k} {v}" for k, v in r.duplicate_kinds.items()) or "none"
    lines += [
        f"records: produced {r.records_produced}, processed {r.records_processed} "
        f"in {r.processor_calls} batches ({r.interrupted_calls} interrupted)",
        f"duplicates: {r.duplicates} ({dup_kinds})",
        f"overlaps in the allowed window (unplanned moves): {r.overlaps_allowed}",
        f"failover (x failover time): median {_num(r.failover_median)}, "
        f"max {_num(r.failover_max)} over {r.failovers} leases"
        + (f"; {r.failovers_pending} never taken over" if r.failovers_pending else ""),
        f"  p99 {_num(r.failover_p99)}; of crashed leaders: median "
        f"{_num(r.leader_failover_median)}, p99 {_num(r.leader_failover_p99)}, "
        f"max {_num(r.leader_failover_max)} over {r.leader_failovers} leases",
        "rounds to balance after faults stopped: "
        + ("not reached" if r.rounds_to_balance is None else str(r.rounds_to_balance)),
        f"lease table per lease per hour: {r.lease_reads_per_lease_hour:.1f} read calls "
        f"({r.lease_items_scanned_per_lease_hour:.0f} items scanned), "
        f"{r.lease_writes_per_lease_hour:.1f} writes",
        "  " + ", ".join(f"{k} {v}" for k, v in r.lease_table_ops.items()),
        f"worker registry per lease per hour: {r.registry_reads_per_lease_hour:.1f} read calls, "
        f"{r.registry_writes_per_lease_hour:.1f} writes",
        "  " + ", ".join(f"{k} {v}" for k, v in r.registry_calls.items()),
        "events: " + (", ".join(f"{k} {v}" for k, v in r.events.items()) or "none"),
        "injected errors: " + (", ".join(f"{k} {v}" for k, v in r.injected.items()) or "none"),
        f"workers started {r.workers_started}; shards at the end {r.shards_at_end}",
    ]
    if r.runtime_errors:
        lines.append("errors logged by the runtime:")
        lines += [f"  {count} x {msg}" for msg, count in r.runtime_errors.items()]
    return "\n".join(lines)


__all__ = ["FinishedRun", "SimulationReport", "format_report"]
