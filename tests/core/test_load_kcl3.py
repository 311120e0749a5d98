"""The KCL 3.x variance decider on hand-computed cases (seed 003's example and its rules)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kclasync._core.assignment.kcl3_decider import Kcl3Settings, is_balancing_run, plan_kcl3
from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, WorkerLoad


def fleet(cpu_a: float, cpu_b: float, *, b_leases: int = 5) -> FleetSnapshot:
    leases = tuple(LeaseLoad(f"a{i}", "A", 100.0) for i in range(10)) + tuple(
        LeaseLoad(f"b{i}", "B", 100.0) for i in range(b_leases)
    )
    return FleetSnapshot(leases, (WorkerLoad("A", cpu_a), WorkerLoad("B", cpu_b)))


def test_seed_example_moves_the_dampened_share_of_the_excess() -> None:
    # avg 55; A gives 1000 KB/s * (70 - 55) / 70 * 60 % = 128.6 KB/s: one lease of 100.
    plan = plan_kcl3(fleet(70.0, 40.0), balance=True)
    assert [(m.from_worker, m.to_worker) for m in plan.moves] == [("A", "B")]
    assert plan.assignments == ()


def test_higher_dampening_moves_more() -> None:
    # 100 % dampening: 214 KB/s, two leases (the running total stays positive).
    plan = plan_kcl3(fleet(70.0, 40.0), balance=True, settings=Kcl3Settings(dampening_percent=100))
    assert len(plan.moves) == 2


def test_no_rebalance_inside_the_band_or_on_non_balancing_runs() -> None:
    assert plan_kcl3(fleet(58.0, 52.0), balance=True).moves == ()
    assert plan_kcl3(fleet(70.0, 40.0), balance=False).moves == ()
    assert [run for run in range(1, 10) if is_balancing_run(run)] == [3, 6, 9]


def test_receiver_is_not_pushed_above_the_average() -> None:
    snapshot = FleetSnapshot(
        (
            *(LeaseLoad(f"a{i}", "A", 300.0) for i in range(4)),
            LeaseLoad("b0", "B", 300.0),
            LeaseLoad("c0", "C", 300.0),
        ),
        (WorkerLoad("A", 90.0), WorkerLoad("B", 45.0), WorkerLoad("C", 45.0)),
    )
    # avg 60, target throughput 600: a lease adds 300 * 60 / 600 = 30 points, 45 + 30 > 60.
    assert plan_kcl3(snapshot, balance=True).moves == ()


def test_unassigned_leases_go_to_the_worker_furthest_below_the_average() -> None:
    snapshot = FleetSnapshot(
        (LeaseLoad("x", "A", 100.0), LeaseLoad("new", None, None)),
        (WorkerLoad("A", 80.0), WorkerLoad("B", 20.0)),
    )
    plan = plan_kcl3(snapshot, balance=False)
    assert [(m.lease_key, m.from_worker, m.to_worker) for m in plan.assignments] == [
        ("new", None, "B")
    ]


def test_without_cpu_it_balances_assigned_throughput() -> None:
    snapshot = FleetSnapshot(
        tuple(LeaseLoad(f"a{i}", "A", 100.0) for i in range(8)),
        (WorkerLoad("A"), WorkerLoad("B")),
    )
    # metric = throughput: A 800, B 0, avg 400; A gives 800 * 0.5 * 0.6 = 240 -> two leases.
    plan = plan_kcl3(snapshot, balance=True)
    assert [(m.from_worker, m.to_worker) for m in plan.moves] == [("A", "B"), ("A", "B")]


@st.composite
def owned_fleets(draw: st.DrawFn) -> FleetSnapshot:
    ids = [f"w{i}" for i in range(draw(st.integers(2, 5)))]
    workers = tuple(WorkerLoad(wid, cpu_percent=draw(st.floats(0, 100))) for wid in ids)
    leases = tuple(
        LeaseLoad(
            f"s{i:03d}",
            draw(st.sampled_from(ids)),
            draw(st.one_of(st.none(), st.floats(0, 2000))),
            sticky=draw(st.booleans()),
        )
        for i in range(draw(st.integers(1, 24)))
    )
    return FleetSnapshot(leases, workers)


@settings(max_examples=80, deadline=None)
@given(owned_fleets(), st.integers(0, 100))
def test_balancing_never_lifts_a_receiver_above_the_fleet_average(
    snapshot: FleetSnapshot, seed: int
) -> None:
    plan = plan_kcl3(snapshot, balance=True, seed=seed)
    assert plan.assignments == ()
    cpu = {w.worker_id: w.cpu_percent or 0.0 for w in snapshot.workers}
    avg = sum(cpu.values()) / len(cpu)
    known = [
        lease.throughput_kbps for lease in snapshot.leases if lease.throughput_kbps is not None
    ]
    fill = sum(known) / len(known) if known else 0.0
    tp = {
        lease.key: fill if lease.throughput_kbps is None else lease.throughput_kbps
        for lease in snapshot.leases
    }
    target = sum(tp.values()) / len(cpu)
    per_lease = max(len(snapshot.leases) // len(cpu), 1)
    sticky = {lease.key for lease in snapshot.leases if lease.sticky}
    for move in plan.moves:
        assert move.lease_key not in sticky
        added = tp[move.lease_key] * avg / target if target > 0 else avg / per_lease
        cpu[move.to_worker] += added
        assert cpu[move.to_worker] <= avg + 1e-6, (move, cpu, avg)
