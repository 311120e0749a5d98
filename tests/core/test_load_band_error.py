"""Cause 33: a plan stops at the band over an unmovable peak judged at its estimates' errors.

Fresh-30 medium seed 3002's traffic change: the 1367 KB/s lease, alone on the 3011 KB/s worker
(3000 in truth, reported with a 1.5 % standard error), sets the peak at 45.4 %; the target band
over it is 47.7 %, and that worker's six light leases (73 KB/s) put it at 47.8 %, 0.15 points
out, by an estimate whose error is about five times that. The plan moved two leases, and its
polish two more, where the hot lease alone reaches 1.05x the optimum. A plan now stops at the band
over the peak priced one standard error higher (``Round.band_peak``); what sets a plan off
(the trigger band) and the polish below the peak keep the peak as estimated.
"""

from __future__ import annotations

from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, WorkerLoad
from kclasync._core.assignment.load_balancer import plan_load_aware

#: ``{worker: (capacity estimate, its relative standard error, [lease KB/s])}``.
Fleet = dict[str, tuple[float, float | None, list[float]]]

#: Fresh-30 medium seed 3002, 20 s after its traffic change made w3's lease hot.
MEDIUM_3002_TRAFFIC: Fleet = {
    "w0": (1429.0, 0.0089, [91, 59, 42, 28, 19, 11, 9, 7, 6, 6, 6, 5, 5, 4, 4, 3, 3, 3]),
    "w1": (1956.0, 0.0144, [481, 169, 72, 27, 21, 13, 10, 9, 7, 7, 5, 3, 3, 3]),
    "w2": (1367.0, 0.0124, [260, 121, 37, 32, 17, 12, 9, 8, 6, 6, 5, 5, 3]),
    "w3": (1385.0, 0.0040, [1367, 50, 16, 15, 7, 6, 5, 4, 4, 3, 3, 3]),
    "w4": (3011.0, 0.0151, [23, 21, 14, 8, 4, 3]),
}

#: Held-out-5 small seed 501, 40 s after its join: the 1022 KB/s lease alone on the newcomer
#: w3, whose estimate (3941 for 4000) still carries a 2.5 % error, and w2 at 28.4 %, 0.02
#: points inside the trigger band over that peak by the estimates (1.11x the optimum).
SMALL_501_JOIN: Fleet = {
    "w0": (3038.0, 0.0062, [467, 135, 85]),
    "w1": (3013.0, 0.0047, [213, 166, 76, 68]),
    "w2": (2002.0, 0.0051, [295, 113, 97, 62]),
    "w3": (3941.0, 0.0247, [1022]),
}


def _snapshot(fleet: Fleet, *, exact: bool = False) -> FleetSnapshot:
    leases: list[LeaseLoad] = []
    workers: list[WorkerLoad] = []
    for wid, (capacity, error, rates) in fleet.items():
        leases += [LeaseLoad(f"{wid}-{i}", wid, float(rate)) for i, rate in enumerate(rates)]
        workers.append(
            WorkerLoad(
                wid,
                cpu_percent=min(100.0, 100 * sum(rates) / capacity),
                capacity_kbps=capacity,
                capacity_error=None if exact else error,
            )
        )
    return FleetSnapshot(tuple(leases), tuple(workers))


def test_a_peaks_holder_within_its_estimates_error_of_the_band_keeps_its_light_leases() -> None:
    moves = plan_load_aware(_snapshot(MEDIUM_3002_TRAFFIC)).moves
    assert [(m.lease_key, m.from_worker, m.to_worker) for m in moves] == [("w3-0", "w3", "w4")]


def test_a_peaks_holder_priced_exactly_sheds_what_puts_it_over_the_band() -> None:
    # The same fleet with configured capacities (no error): 47.8 % is over the 47.7 % band.
    moves = plan_load_aware(_snapshot(MEDIUM_3002_TRAFFIC, exact=True)).moves
    assert ("w3-0", "w3", "w4") in {(m.lease_key, m.from_worker, m.to_worker) for m in moves}
    assert any(m.from_worker == "w4" for m in moves), moves


def test_the_trigger_band_is_still_judged_at_the_peak_as_estimated() -> None:
    # The newcomer's 2.5 % error would lift the peak enough to leave w2 inside the trigger
    # band; the trigger is judged at the peak as estimated (and each load one error higher,
    # cause 29), so w2 sheds a lease.
    moves = plan_load_aware(_snapshot(SMALL_501_JOIN)).moves
    assert moves and all(m.from_worker == "w2" for m in moves), moves
