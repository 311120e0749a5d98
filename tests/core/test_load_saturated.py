"""Cause 27: a saturated worker priced from its censored CPU.

A worker whose CPU reads 100 % does less than its leases ask, and its backlog grows. Without a
capacity estimate of its own (the estimator drops saturated readings, so it never gets one while
saturated), the planner priced it from its CPU over its throughput: as large as its backlog made
it look. At the sweep's large starts, a 1000 KB/s worker holding 3290 KB/s read as a 3290 KB/s
one and a 2000 KB/s one as 5089: each plan moved off what looked like enough, the worker was
still saturated, and the start took 4-6 runs (once never) to come within 1.10x of the optimum.
A saturated worker now costs at least its guess (the fleet's capacity per CPU times its CPUs),
and its load is predicted from its leases."""

from __future__ import annotations

from kclasync._core.assignment.load_assignment import (
    FleetSnapshot,
    LeaseLoad,
    LoadModel,
    WorkerLoad,
    lease_throughputs,
)
from kclasync._core.assignment.load_balancer import plan_load_aware

#: What each worker can really do; "sat" reports no capacity (2 CPUs, 500 KB/s per CPU).
_TRUE = {"sat": 1000.0, "a": 4000.0, "b": 4000.0, "c": 4000.0, "d": 4000.0}


def _fleet(sat_cpu: float) -> FleetSnapshot:
    leases = [LeaseLoad(f"sat-{i}", "sat", 400.0) for i in range(8)]
    workers = [WorkerLoad("sat", cpu_percent=sat_cpu, cores=2.0)]
    for wid in "abcd":
        leases += [LeaseLoad(f"{wid}-{i}", wid, 400.0) for i in range(2)]
        workers.append(WorkerLoad(wid, cpu_percent=20.0, capacity_kbps=4000.0, cores=8.0))
    return FleetSnapshot(tuple(leases), tuple(workers))


def test_a_saturated_worker_costs_at_least_its_guess_and_its_load_follows_its_leases() -> None:
    snapshot = _fleet(100.0)
    model = LoadModel(snapshot, lease_throughputs(snapshot.leases))
    # 3200 KB/s at a censored 100 % would price it as a 3200 KB/s worker.
    assert model.cost("sat", 1000.0) == 100.0
    assert model.load["sat"] == 320.0
    assert "sat" not in model.measured


def test_a_worker_below_saturation_is_still_priced_from_its_own_cpu() -> None:
    snapshot = _fleet(90.0)
    model = LoadModel(snapshot, lease_throughputs(snapshot.leases))
    assert model.load["sat"] == 90.0
    assert abs(model.cost("sat", 3200.0) - 90.0) < 1e-9


def test_a_saturated_worker_is_relieved_in_one_plan() -> None:
    snapshot = _fleet(100.0)
    plan = plan_load_aware(snapshot)
    owner = {lease.key: lease.owner for lease in snapshot.leases}
    owner.update({m.lease_key: m.to_worker for m in plan.moves})
    rates = {lease.key: lease.throughput_kbps or 0.0 for lease in snapshot.leases}
    kept = sum(rate for key, rate in rates.items() if owner[key] == "sat")
    level = 100 * sum(rates.values()) / sum(_TRUE.values())
    # The level is 37.6 %; one 400 KB/s lease is 40 % of "sat". Priced at 3200 KB/s, the plan
    # left it three leases (in truth 120 %, still saturated).
    assert kept * 100 / _TRUE["sat"] <= 1.10 * level, plan
