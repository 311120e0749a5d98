"""Fleet snapshots for the load planner's tests, written as ``{worker: (capacity, [rates])}``:
each worker's leases at those throughputs, and its CPU what they cost at its capacity."""

from __future__ import annotations

from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, Move, WorkerLoad


def fleet_of(spec: dict[str, tuple[float, list[float]]]) -> FleetSnapshot:
    leases: list[LeaseLoad] = []
    workers: list[WorkerLoad] = []
    for wid, (capacity, rates) in spec.items():
        mine = [LeaseLoad(f"{wid}-{i}", wid, rate) for i, rate in enumerate(rates)]
        leases += mine
        cpu = sum(rates) * 100 / capacity
        workers.append(WorkerLoad(wid, cpu_percent=cpu, capacity_kbps=capacity))
    return FleetSnapshot(tuple(leases), tuple(workers))


def utilisation_after(
    spec: dict[str, tuple[float, list[float]]], moves: tuple[Move, ...]
) -> dict[str, float]:
    """Each worker's utilisation (%) in ``fleet_of(spec)`` after ``moves``."""
    rates = {f"{wid}-{i}": rate for wid, (_, own) in spec.items() for i, rate in enumerate(own)}
    owner = {key: key.rsplit("-", 1)[0] for key in rates}
    owner.update({m.lease_key: m.to_worker for m in moves})
    util = dict.fromkeys(spec, 0.0)
    for key, rate in rates.items():
        util[owner[key]] += 100 * rate / spec[owner[key]][0]
    return util


#: Tuning medium seed 0's traffic change: w1 carries a 2049 KB/s lease, 68 % of its 3000 KB/s,
#: which only a 4000 KB/s worker can take within the band (``fleet_of``'s input).
MEDIUM_0_TRAFFIC: dict[str, tuple[float, list[float]]] = {
    "w0": (1000.0, [229.0, 64.0, 58.0, 47.0, 26.0, 21.0, 11.0]),
    "w1": (3000.0, [2049.0, 39.0, 32.0, 24.0, 16.0, 11.0, 10.0, 10.0]),
    "w2": (4000.0, [380.0, 161.0, 95.0, 41.0, 16.0, 15.0]),
    "w3": (4000.0, [110.0, 29.0, 21.0, 19.0, 18.0, 13.0]),
    "w4": (1000.0, [685.0, 121.0, 77.0, 17.0, 13.0]),
}


#: Fresh-24 medium seed 2401's traffic change, 20 s after it: a 1603 KB/s lease sits on the
#: 986 KB/s worker (w3), which only w4 (3963) and w5 (3005) can carry within the band.
MEDIUM_2401_TRAFFIC: dict[str, tuple[float, list[float]]] = {
    "w0": (2042.0, [105.0, 69.0, 56.0, 47.0, 27.0, 21.0, 20.0, 15.0, 13.0, 10.0, 10.0, 10.0]),
    "w1": (1381.0, [91.0, 79.0, 37.0, 22.0, 22.0, 18.0, 15.0, 14.0, 9.0]),
    "w2": (1972.0, [381.0, 195.0, 154.0, 64.0, 43.0, 18.0, 14.0, 12.0, 11.0]),
    "w3": (986.0, [1603.0, 261.0, 51.0, 40.0, 29.0, 16.0, 14.0, 13.0]),
    "w4": (3963.0, [36.0, 32.0, 27.0, 25.0, 17.0]),
    "w5": (3005.0, [657.0, 126.0, 34.0, 31.0, 25.0, 21.0, 11.0, 11.0, 10.0]),
}
