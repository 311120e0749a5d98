"""Cause 18 (traced, not fixed): a plan that gives the hot lease to a newcomer priced from a
guess is still judged against the pessimistic unmovable peak that priced that newcomer 1.5x
smaller, not against what the lease costs where it now is.

Held-out-4 small seed 403's join: a 1400 and a 2000 KB/s worker, 526 KB/s on the 2000 one,
and a newcomer of 3000 KB/s (5 CPUs, no capacity yet). ``peak_floor`` prices the newcomer 1.5x
smaller (``GUESS_ERROR``), so the "unmovable" peak was the hot lease on the 2000 KB/s worker
(26.4 %); the plan moved the hot lease to the newcomer and stopped with the 1400 KB/s worker at
20.5 % against a level of 19.1 %: within the band over that peak, 1.11x the optimum in truth.
Once the newcomer's estimate came in, the peak was 0.09 points inside the trigger band, and the
fleet stayed there for eight runs."""

from __future__ import annotations

import pytest

from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, Plan, WorkerLoad
from kclasync._core.assignment.load_balancer import plan_load_aware

_HELD = {
    "a": (1414.0, 2.0, [205.0, 118.1, 79.9, 37.3, 31.1, 23.0]),
    "b": (1992.0, 4.0, [526.1, 59.0, 46.0, 26.5, 20.2, 17.9]),
}
#: What each worker can really do (the newcomer's capacity is unknown to the planner).
_TRUE = {"a": 1400.0, "b": 2000.0, "new": 3000.0}


def _join() -> FleetSnapshot:
    leases: list[LeaseLoad] = []
    workers: list[WorkerLoad] = []
    for wid, (capacity, cores, rates) in _HELD.items():
        leases += [LeaseLoad(f"{wid}-{i}", wid, rate) for i, rate in enumerate(rates)]
        cpu = sum(rates) * 100 / _TRUE[wid]
        workers.append(WorkerLoad(wid, cpu_percent=cpu, capacity_kbps=capacity, cores=cores))
    workers.append(WorkerLoad("new", cpu_percent=0.0, cores=5.0))
    return FleetSnapshot(tuple(leases), tuple(workers))


def _max_over_level(snapshot: FleetSnapshot, plan: Plan) -> float:
    owner = {lease.key: lease.owner for lease in snapshot.leases}
    owner.update({m.lease_key: m.to_worker for m in plan.all})
    util = dict.fromkeys(_TRUE, 0.0)
    for lease in snapshot.leases:
        util[owner[lease.key]] += (lease.throughput_kbps or 0.0) * 100 / _TRUE[owner[lease.key]]
    level = sum(lease.throughput_kbps or 0.0 for lease in snapshot.leases) * 100
    return max(util.values()) / (level / sum(_TRUE.values()))


@pytest.mark.xfail(
    strict=True,
    reason="cause 18 is traced, not fixed: the fixes measured (carrying on against the hot "
    "lease's price on the guessed worker, always or only once that lease sets no peak) settled "
    "this join in 1 run but left held-out-4's mean x of optimum higher, at 1.022x where the "
    "build without them ends at 1.006x (docs/assignment.md, cause 18)",
)
def test_a_hot_lease_given_to_a_guessed_newcomer_no_longer_sets_the_band() -> None:
    snapshot = _join()
    plan = plan_load_aware(snapshot)
    assert ("b-0", "new") in [(m.lease_key, m.to_worker) for m in plan.moves]
    # The optimum here is 1.001x the level; the band the plan aims at is 5 % over it.
    assert _max_over_level(snapshot, plan) <= 1.05, plan
    assert len(plan.moves) <= 4, plan  # the fewest to within 1.05x of the optimum are 3
