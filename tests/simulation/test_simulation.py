"""Real workers in virtual time with faults: the invariants hold over many seeds.

The regression tests keep the seeds with which the simulation found runtime bugs; each also
shows that the checker still catches the bug when the fix is taken out.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterator

import attrs
import pytest

from kclasync._core.assignment import balanced_taker
from kclasync._core.assignment.lease_taker import TakeView
from kclasync._core.leases.held_lease import HeldLease
from kclasync._core.leases.lease import Lease
from kclasync._runtime.held import HeldLeases
from kclasync._simulation import SimulationSettings, format_report, run_simulation
from kclasync._simulation.faults import ALL_FAULTS
from kclasync.errors import LeaseLostError

MODEST = SimulationSettings(workers=6, shards=20, hours=0.2, fault_rate=4.0, faults=ALL_FAULTS)


@pytest.mark.parametrize("seed", range(16))
def test_invariants_hold_under_all_faults(seed: int) -> None:
    report = run_simulation(attrs.evolve(MODEST, seed=seed), wall_limit=60)
    assert report.violation_count == 0, format_report(report)
    assert report.records_produced > 0
    assert report.records_processed >= report.records_produced
    assert report.rounds_to_balance is not None


def test_faults_are_actually_injected() -> None:
    report = run_simulation(attrs.evolve(MODEST, seed=3, hours=0.5), wall_limit=60)
    assert report.violation_count == 0, format_report(report)
    for event in ("crashes", "pauses", "graceful stops", "throttle windows"):
        assert report.events.get(event, 0) > 0, report.events
    assert report.events.get("splits", 0) + report.events.get("merges", 0) > 0
    assert report.failovers > 0
    assert report.failover_max is not None and report.failover_max < 4
    assert report.shards_at_end > MODEST.shards  # resharding closed and opened shards


def test_same_seed_same_report() -> None:
    settings = attrs.evolve(MODEST, seed=11)
    first = run_simulation(settings, wall_limit=60)
    second = run_simulation(settings, wall_limit=60)
    assert first == second  # wall time is excluded from equality


def test_no_faults_no_duplicates() -> None:
    report = run_simulation(attrs.evolve(MODEST, seed=5, faults=frozenset()), wall_limit=60)
    assert report.violation_count == 0, format_report(report)
    assert report.duplicates == 0
    assert report.failovers == 0


def test_balanced_taker_keeps_the_invariants() -> None:
    report = run_simulation(attrs.evolve(MODEST, seed=2, taker="balanced"), wall_limit=60)
    assert report.violation_count == 0, format_report(report)


# -- regressions -----------------------------------------------------------------------------

#: Found with seed 1: after a pause longer than the failover time, a worker's fetcher handed a
#: batch to the processor before anything re-checked the lease (``stale_batch``).
#: The stall falls within the first 9 virtual minutes (5 stale batches there without the fix).
STALL_SEED = SimulationSettings(workers=8, shards=32, hours=0.15, seed=1, faults=ALL_FAULTS)


@pytest.fixture
def without_delivery_stale_check(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Take out the fix: the staleness check made before each batch is delivered."""
    original = HeldLeases.ensure_held

    def check(self: HeldLeases, held: HeldLease) -> None:
        if sys._getframe(1).f_code.co_name == "_deliver":
            if held.lost:
                raise LeaseLostError(held.key)
            return
        original(self, held)

    monkeypatch.setattr(HeldLeases, "ensure_held", check)
    yield


def test_regression_stale_batch_after_a_stall_seed_1() -> None:
    report = run_simulation(STALL_SEED, wall_limit=120)
    assert report.violation_count == 0, format_report(report)


@pytest.mark.usefixtures("without_delivery_stale_check")
def test_regression_stale_batch_is_detected_without_the_fix() -> None:
    report = run_simulation(STALL_SEED, wall_limit=120)
    assert report.violations.get("stale_batch", 0) > 0, format_report(report)


#: Found with seed 7 at 50 workers x 500 shards (and seed 1 here): a renewal whose write went
#: through but whose reply was lost was reconciled on the next attempt, and the worker credited
#: the lease as renewed at that later attempt, outliving the expiry other workers compute.
RECONCILE_SEED = SimulationSettings(
    workers=6,
    shards=40,
    hours=0.3,
    seed=1,
    faults=frozenset({"errors", "throttle"}),
    fault_rate=4.0,
)


def test_regression_reconciled_renewal_is_not_fresh_seed_1() -> None:
    report = run_simulation(RECONCILE_SEED, wall_limit=120)
    assert report.violation_count == 0, format_report(report)


#: Found by the CI seed sweep (seed 20062, balanced taker, six-fold fault rate): a crashed
#: worker's expired lease waited 8.1 x the failover time, because every plan handed it to a
#: worker the registry still listed but that was not running (the crashed owner itself, or a
#: worker that had crashed holding nothing). Not a violation, a slow failover.
SLOW_FAILOVER_SEED = SimulationSettings(
    workers=3,
    shards=6,
    hours=0.05,
    seed=20062,
    faults=ALL_FAULTS,
    fault_rate=6.0,
    taker="balanced",
)


def test_regression_balanced_failover_waits_for_no_dead_worker_seed_20062() -> None:
    report = run_simulation(SLOW_FAILOVER_SEED, wall_limit=120)
    assert report.violation_count == 0, format_report(report)
    assert report.failovers >= 5 and report.failovers_pending == 0
    # 3.23 x since the scans went back to the KCL's period (20 s): one lease in the middle of a
    # handoff whose new owner crashed is left by the early plans and waits for a periodic round.
    assert report.failover_max is not None and report.failover_max < 3.5, format_report(report)


def test_regression_slow_failover_is_seen_without_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    """Take out the fix (lapsed workers counted live from the registry, no rescue).

    One seed's trajectory moves with every timing change elsewhere, so the bug is judged over
    twenty seeds around the one that found it: the median of the slowest failover per run
    rises by at least half a failover time without the fix (measured: 1.9 -> 2.8).
    """
    # Without early failover, whose view leaves silent workers out and so hides the bug.
    runs = [
        attrs.evolve(SLOW_FAILOVER_SEED, seed=seed, early_failover=False)
        for seed in range(20055, 20075)
    ]
    fixed = [run_simulation(settings, wall_limit=120).failover_max or 0.0 for settings in runs]

    def old_live(view: TakeView, current: list[tuple[str, Lease]], lapsed: list[Lease]) -> set[str]:
        live = {view.worker_id} | {owner for owner, _ in current}
        return live | (view.live_workers or frozenset())

    monkeypatch.setattr(balanced_taker, "_live_workers", old_live)
    monkeypatch.setattr(
        SimulationSettings,
        "lease_taker",
        lambda self: balanced_taker.BalancedLeaseTaker(steal_budget=None, rescue_after=None),
    )
    broken = [run_simulation(settings, wall_limit=120).failover_max or 0.0 for settings in runs]
    assert statistics.median(broken) >= statistics.median(fixed) + 0.5, (fixed, broken)
