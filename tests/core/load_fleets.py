"""Fleet snapshots for the load planner's tests, written as ``{worker: (capacity, [rates])}``:
each worker's leases at those throughputs, and its CPU what they cost at its capacity."""

from __future__ import annotations

from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, WorkerLoad


def fleet_of(spec: dict[str, tuple[float, list[float]]]) -> FleetSnapshot:
    leases: list[LeaseLoad] = []
    workers: list[WorkerLoad] = []
    for wid, (capacity, rates) in spec.items():
        mine = [LeaseLoad(f"{wid}-{i}", wid, rate) for i, rate in enumerate(rates)]
        leases += mine
        cpu = sum(rates) * 100 / capacity
        workers.append(WorkerLoad(wid, cpu_percent=cpu, capacity_kbps=capacity))
    return FleetSnapshot(tuple(leases), tuple(workers))
