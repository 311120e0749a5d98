"""Cause 19: a newcomer priced from a guess learns its capacity only from a lease heavy enough
to read, so one that holds too little is given a learning lease when its guess would lower
the unmovable peak.

A worker estimates its capacity only from CPU readings of at least 5 % (a lighter reading is
mostly noise). Held-out-9 medium seed 900's leave: the 4000 KB/s newcomer (7 CPUs, guessed
3267 KB/s) took the leaving worker's three leases, 41 KB/s, 1 % of its CPU; it was then no
longer idle, so no learning lease followed, and its guess, priced 1.5x smaller for the
unmovable peak, kept the 1948 KB/s lease's floor on a 3000 KB/s worker: the fleet looked in
band at 1.38x the optimum for the whole window, before this was fixed."""

from __future__ import annotations

import dataclasses

from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, WorkerLoad
from kclasync._core.assignment.load_balancer import plan_load_aware
from tests.core.load_fleets import fleet_of


def test_a_newcomer_holding_too_little_to_read_its_capacity_is_given_a_learning_lease() -> None:
    # "hot" (3000 KB/s) holds a 1948 KB/s lease, 66 %: the unmovable peak among the workers
    # whose capacity is known, so the fleet is within its band. The newcomer reports 7 CPUs
    # (3111 KB/s at the fleet's capacity per CPU: the lease would be 62.6 % there, if the
    # guess holds) and carries 41 KB/s at 0.4 % CPU: it will never read a capacity from that.
    # One lease for it to learn from (the heaviest within what brings the smallest known
    # worker to the level), and nothing else before its capacity is known.
    spec = {
        "hot": (3000.0, [1948.0, 22.0, 12.0]),
        "b": (2000.0, [457.0, 312.0, 125.0, 107.0, 73.0, 50.0, 40.0, 33.0]),
        "c": (3000.0, [233.0, 149.0, 82.0, 66.0]),
    }
    cores = {"hot": 5.0, "b": 5.0, "c": 8.0}
    snapshot = fleet_of(spec)
    workers = tuple(dataclasses.replace(w, cores=cores[w.worker_id]) for w in snapshot.workers)
    crumbs = tuple(LeaseLoad(f"new-{i}", "new", rate) for i, rate in enumerate((15.5, 14.5, 11.4)))
    new = WorkerLoad("new", cpu_percent=0.4, cores=7.0)
    plan = plan_load_aware(FleetSnapshot((*snapshot.leases, *crumbs), (*workers, new)))
    assert [m.to_worker for m in plan.moves] == ["new"], plan
