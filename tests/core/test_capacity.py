"""A worker's capacity estimate, its reporting in the KCL 3.x entry, and the leader's use of it."""

from __future__ import annotations

import random

import attrs
import pytest

from kclasync._config import ConsumerConfig
from kclasync._core.assignment.assignment_decisions import (
    may_rebalance,
    rebalance_step,
    worker_loads,
)
from kclasync._core.assignment.capacity import CapacityEstimator
from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, WorkerLoad
from kclasync._core.workers import worker_metrics as wm
from kclasync._core.workers import worker_metrics_item as wi
from kclasync._runtime.wiring import balancer_settings, kcl3_settings
from kclasync.errors import ConfigError


def test_nothing_is_reported_before_enough_steady_samples() -> None:
    est = CapacityEstimator(min_samples=3)
    assert est.update(300.0, 10.0) is None  # no previous period: not known to be steady
    assert est.update(300.0, 10.0) is None
    assert est.update(300.0, 10.0) is None
    assert est.update(300.0, 10.0) == pytest.approx(3000.0)


def test_saturated_and_changing_periods_are_skipped_low_ones_kept() -> None:
    est = CapacityEstimator(min_samples=1, min_cpu_percent=0.0)
    est.update(100.0, 10.0)
    assert est.update(100.0, 10.0) == pytest.approx(1000.0)
    assert est.update(100.0, 99.0) == pytest.approx(1000.0)  # saturated
    assert est.update(200.0, 50.0) == pytest.approx(1000.0)  # leases came: not steady
    assert est.samples == 1
    est.update(200.0, 2.0)  # a low reading weighs little, but it is data
    assert est.samples == 2


def _reports(util: float, seed: int, periods: int, capacity: float = 3000.0) -> list[float | None]:
    """A worker processing ``util`` % of its capacity, its CPU read with noise (sd 1.5)."""
    rng = random.Random(seed)
    est = CapacityEstimator()
    processed = capacity * util / 100.0
    return [est.update(processed, util + rng.gauss(0.0, 1.5)) for _ in range(periods)]


def test_a_lightly_loaded_worker_is_not_estimated_low() -> None:
    # At 5 % CPU noise pushes many readings low; dropping them (or averaging ratios) biases
    # the estimate by 10-20 %. The fit on every reading stays within a few percent.
    errors = sorted(abs((_reports(5.0, seed, 300)[-1] or 0.0) / 3000.0 - 1.0) for seed in range(40))
    assert errors[len(errors) // 2] < 0.04
    assert errors[-1] < 0.12


def test_a_joining_worker_reports_a_usable_capacity_after_five_periods() -> None:
    # The leader runs every 20 s, a worker reports every 3.3 s: a capacity that needs more
    # than a handful of periods is not there for the leader's second run after a join.
    fifth = [_reports(12.5, seed, 5)[-1] for seed in range(40)]
    good = [r for r in fifth if r is not None and abs(r / 3000.0 - 1.0) < 0.10]
    assert len(good) >= 28


def test_a_long_running_estimate_is_close_and_still() -> None:
    tails = [_reports(12.5, seed, 400)[150:] for seed in range(20)]
    errors = sorted(abs((r or 0.0) / 3000.0 - 1.0) for tail in tails for r in tail)
    assert errors[int(0.9 * len(errors))] < 0.03
    assert all(len(set(tail)) <= 6 for tail in tails)  # 250 periods: a few steps, no twitching


def test_the_reported_value_moves_only_past_the_dead_band() -> None:
    # Without a least noise per reading: one period's fit (alpha 1) has no error of its own.
    est = CapacityEstimator(min_samples=1, alpha=1.0, dead_band_percent=5.0, cpu_noise_percent=0)
    est.update(100.0, 10.0)
    assert est.update(100.0, 10.0) == pytest.approx(1000.0)
    assert est.update(100.0, 9.7) == pytest.approx(1000.0)  # 1031: inside the band
    assert est.update(100.0, 9.0) == pytest.approx(1111.1, rel=1e-3)  # outside: follows


def test_noisy_cpu_gives_a_stable_report_near_the_true_capacity() -> None:
    rng = random.Random(3)
    est = CapacityEstimator()
    reported = []
    for _ in range(400):
        cpu = 100.0 * 280.0 / 2000.0 + rng.gauss(0.0, 1.5)  # 14 % +- 1.5 points
        reported.append(est.update(280.0, cpu))
    tail = [r for r in reported[100:] if r is not None]
    assert all(abs(r - 2000.0) < 0.08 * 2000.0 for r in tail)
    assert len(set(tail)) <= 4  # the dead band keeps the leader's input still


def test_capacity_is_an_extra_attribute_the_kcl_fields_stay_as_they_are() -> None:
    entry = wm.WorkerMetrics(
        "w1", 100, metric_stats={wm.CPU: (12.5,)}, operating_range={wm.CPU: (80,)}
    )
    plain = wi.encode_item(entry)
    item = wi.encode_item(attrs.evolve(entry, capacity_kbps=2500.0))
    assert item["cap"] == {"N": "2500.0"}
    assert {k: v for k, v in item.items() if k != "cap"} == plain
    assert wi.decode_item(item).capacity_kbps == 2500.0
    assert wi.decode_item(plain).capacity_kbps is None


@pytest.mark.parametrize(
    "bad", [{"N": "-3"}, {"N": "0"}, {"N": "x"}, {"S": "2"}, {"N": "Infinity"}]
)
def test_an_unusable_capacity_reads_as_none_not_as_a_corrupt_entry(bad: dict[str, str]) -> None:
    item = wi.encode_item(wm.WorkerMetrics("w1", 100))
    item["cap"] = bad
    assert wi.decode_item(item).capacity_kbps is None


def test_a_capacitys_standard_error_is_an_extra_attribute_beside_it() -> None:
    entry = wm.WorkerMetrics("w1", 100, capacity_kbps=2500.0, capacity_error=0.04)
    item = wi.encode_item(entry)
    assert item["cer"] == {"N": "0.04"}
    assert wi.decode_item(item).capacity_error == 0.04
    assert (
        wi.decode_item(wi.encode_item(attrs.evolve(entry, capacity_error=0.0))).capacity_error
        == 0.0
    )
    assert "cer" in wi.REPLACED_OR_REMOVED  # a later report without one removes it


@pytest.mark.parametrize("bad", [{"N": "-0.1"}, {"N": "x"}, {"S": "0.1"}, {"N": "NaN"}, {"L": []}])
def test_an_unusable_capacity_error_reads_as_none_not_as_a_corrupt_entry(
    bad: dict[str, object],
) -> None:
    item = wi.encode_item(wm.WorkerMetrics("w1", 100, capacity_kbps=2500.0))
    item["cer"] = bad
    decoded = wi.decode_item(item)
    assert decoded.capacity_error is None and decoded.capacity_kbps == 2500.0


def test_the_leader_takes_a_reported_capacitys_error_but_none_for_a_configured_one() -> None:
    entry = wm.WorkerMetrics(
        "w1", 1, metric_stats={wm.CPU: (20.0,)}, capacity_kbps=700.0, capacity_error=0.05
    )
    loads = worker_loads({"w1", "w2"}, {"w1": entry, "w2": entry}, capacities={"w2": 50.0})
    assert [(w.capacity_kbps, w.capacity_error) for w in loads] == [(700.0, 0.05), (50.0, None)]


def test_the_leader_takes_each_workers_reported_capacity() -> None:
    entry = wm.WorkerMetrics(
        "w1",
        1,
        metric_stats={wm.CPU: (20.0,)},
        operating_range={wm.CPU: (90,)},
        capacity_kbps=700.0,
    )
    loads = worker_loads({"w1", "w2"}, {"w1": entry}, capacities={"w2": 50.0})
    assert [(w.worker_id, w.capacity_kbps) for w in loads] == [("w1", 700.0), ("w2", 50.0)]


def test_with_capacities_every_run_may_move_but_not_before_the_leader_has_watched() -> None:
    busy = (LeaseLoad("a", "w2", checkpoint_owner="w1"),)
    known = FleetSnapshot(
        busy, (WorkerLoad("w1", 5.0, capacity_kbps=1.0), WorkerLoad("w2", 5.0, capacity_kbps=2.0))
    )
    partly = FleetSnapshot(busy, (WorkerLoad("w1", 5.0, capacity_kbps=1.0), WorkerLoad("w2", 5.0)))
    assert may_rebalance(known, moved_last_run=True)
    assert not may_rebalance(partly, moved_last_run=False)
    assert not may_rebalance(known, moved_last_run=False, watched_enough=False)


#: w1 holds 600 KB/s (60 % of its 1000), w2 100 KB/s (10 %).
_FLUX_LEASES = (
    LeaseLoad("a", "w1", 400.0),
    LeaseLoad("b", "w1", 200.0),
    LeaseLoad("c", "w2", 100.0),
)


def _readings(w1_cpu: float, w2_cpu: float) -> tuple[WorkerLoad, ...]:
    """Two 1000 KB/s workers reading these CPUs."""
    return (
        WorkerLoad("w1", w1_cpu, capacity_kbps=1000.0),
        WorkerLoad("w2", w2_cpu, capacity_kbps=1000.0),
    )


def test_one_run_is_held_while_the_throughputs_disagree_with_the_cpu() -> None:
    """Right after a traffic change the leases' throughputs are averages over a period that
    straddles the change: w1 is predicted at 60 % (600 KB/s of 1000) while its CPU already reads
    35, w2 at 10 % while it reads 30. Planning on them moves leases that the next run, with the
    new throughputs in, moves again; so one run only assigns, and the next may move whatever the
    readings (a biased capacity must not block balancing for good)."""
    leases = _FLUX_LEASES
    flux = FleetSnapshot(leases, _readings(35.0, 30.0))
    assert not may_rebalance(flux, moved_last_run=False)
    assert may_rebalance(flux, moved_last_run=False, held_last_run=True)
    # The leader is told which run was held, so it can let the next one move.
    assert rebalance_step(flux, moved_last_run=False) == (False, True)
    assert rebalance_step(flux, moved_last_run=False, held_last_run=True) == (True, False)
    assert rebalance_step(flux, moved_last_run=False, watched_enough=False) == (False, False)
    # Within the noise of a CPU reading (a few points) the throughputs are taken as they are.
    calm = FleetSnapshot(leases, _readings(57.0, 13.0))
    assert may_rebalance(calm, moved_last_run=False)


def test_a_run_is_held_for_throughputs_in_flux_also_beside_a_worker_without_a_capacity() -> None:
    """A worker that joined and holds crumbs (3 % of its CPU) never reports a capacity, and the
    flux check used to be skipped for the whole fleet while one worker had none: the plan four
    seconds after a traffic change (tuning medium seed 0) moved six leases on half-old
    throughputs, and the next run four more, where four in all reach the band. The workers
    with a capacity still tell that the throughputs are in flux; the one without is left out
    of the check, and the fleet's other rule (no run right after one that moved, nor during a
    handoff) still holds."""
    newcomer = WorkerLoad("new", 3.0)
    leases = (*_FLUX_LEASES, LeaseLoad("d", "new", 10.0))
    flux = FleetSnapshot(leases, (*_readings(35.0, 30.0), newcomer))
    assert rebalance_step(flux, moved_last_run=False) == (False, True)
    assert rebalance_step(flux, moved_last_run=False, held_last_run=True) == (True, False)
    assert rebalance_step(flux, moved_last_run=True, held_last_run=True) == (False, False)
    calm = FleetSnapshot(leases, (*_readings(57.0, 13.0), newcomer))
    assert rebalance_step(calm, moved_last_run=False) == (True, False)
    assert rebalance_step(calm, moved_last_run=True) == (False, False)


def test_planner_settings_are_consumer_settings() -> None:
    cfg = ConsumerConfig(
        rebalance_threshold_percent=20,
        rebalance_target_percent=8,
        rebalance_min_gain_percent=2,
        rebalance_noise_floor_percent=0.5,
        max_moves_per_assignment=4,
        dampening_percent=80,
        variance_balancing_frequency=2,
        worker_capacity_kbps=1500,
    )
    b, k = balancer_settings(cfg), kcl3_settings(cfg)
    assert (b.trigger_percent, b.target_percent, b.min_gain_percent, b.max_moves) == (20, 8, 2, 4)
    assert b.noise_floor_percent == 0.5
    assert (k.rebalance_threshold_percent, k.dampening_percent) == (20, 80)
    assert k.variance_balancing_frequency == 2


@pytest.mark.parametrize(
    ("field", "kwargs"),
    [
        ("rebalance_target_percent", {"rebalance_target_percent": 15}),
        ("rebalance_threshold_percent", {"rebalance_threshold_percent": 0}),
        ("rebalance_min_gain_percent", {"rebalance_min_gain_percent": -1}),
        ("rebalance_noise_floor_percent", {"rebalance_noise_floor_percent": -0.5}),
        ("max_moves_per_assignment", {"max_moves_per_assignment": 0}),
        ("dampening_percent", {"dampening_percent": 101}),
        ("variance_balancing_frequency", {"variance_balancing_frequency": 1.5}),
        ("worker_capacity_kbps", {"worker_capacity_kbps": float("inf")}),
    ],
)
def test_bad_planner_settings_name_the_field(field: str, kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError) as err:
        ConsumerConfig(**kwargs)  # type: ignore[arg-type]
    assert err.value.field == field
