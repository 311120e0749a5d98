"""The load planner moves few leases: the fewest that bring the peak into the band, not the
most even pairs.

The causes (found in the sweep's traces, ``benchmarks/assignment_shapes.py``): an idle
newcomer beside a fleet already in its band was given lease after lease up to a share of the
level, where one is enough for it to learn its capacity; and a peak was levelled with the
lightest worker pair by pair, filling that worker with a lease any other could take and then
taking leases back one at a time, where one move to the right receiver brings it into band;
and the first run after a traffic change planned on throughputs still on their way to the new
rates, and the next run moved leases again. And a newcomer priced from a guess (no capacity
reported yet) was given leases where none were needed: lease after lease to learn from while
nothing lowered the peak, the hot lease because its guess looked larger than a known worker,
and a fleet within its trigger band levelled to the target band because it was idle. And a
levelling plan that stopped outside the band was taken over a fewest-moves plan that ended in
it, because it moved fewer leases (cause 21); and where neither plan reached the band and
the next run would trigger again, no single move or exchange off the peak passed, and the
fleet stayed there for good (cause 22)."""

from __future__ import annotations

import dataclasses

from kclasync._core.assignment.assignment_decisions import rebalance_step, throughputs_moving
from kclasync._core.assignment.load_assignment import FleetSnapshot, LeaseLoad, Move, WorkerLoad
from kclasync._core.assignment.load_balancer import plan_load_aware
from tests.core.load_fleets import MEDIUM_0_TRAFFIC, fleet_of


def _max_over_level(snapshot: FleetSnapshot, moves: tuple[Move, ...]) -> float:
    """The most loaded worker after ``moves`` over the fleet's level (capacities as reported:
    ``fleet_of`` reports the true ones)."""
    owner = {lease.key: lease.owner for lease in snapshot.leases}
    owner |= {m.lease_key: m.to_worker for m in moves}
    kbps = {lease.key: lease.throughput_kbps or 0.0 for lease in snapshot.leases}
    caps = {w.worker_id: w.capacity_kbps or 1.0 for w in snapshot.workers}
    loads = dict.fromkeys(caps, 0.0)
    for key, wid in owner.items():
        if wid is not None:
            loads[wid] += kbps[key] * 100 / caps[wid]
    level = 100 * sum(kbps.values()) / sum(caps.values())
    return max(loads.values()) / level


def test_an_idle_newcomer_beside_a_fleet_in_band_is_given_one_lease_to_learn_from() -> None:
    # "hot" carries only a 580 KB/s lease, 41 %: the unmovable peak, so the fleet is in band.
    # The newcomer has reported no capacity; it learns it from one lease (a's 200 KB/s, the
    # heaviest within what brings the smallest worker to the level, 220 KB/s). Before, it was
    # then given b's 8 KB/s lease too, to fill that share: two moves where none was needed.
    snapshot = fleet_of(
        {
            "hot": (1400.0, [580.0]),
            "a": (1000.0, [29.0, 40.0, 200.0]),
            "b": (1400.0, [60.0, 50.0, 46.0, 39.0, 34.0, 30.0, 8.0]),
        }
    )
    new = WorkerLoad("new", cpu_percent=0.0)
    snapshot = FleetSnapshot(snapshot.leases, (*snapshot.workers, new))
    moves = plan_load_aware(snapshot).moves
    assert len(moves) == 1, moves
    assert moves[0].to_worker == "new"


def test_a_peak_is_brought_into_band_with_the_fewest_moves_not_by_levelling_pairs() -> None:
    # "a" (1000 KB/s) runs 121 %; the fleet's level is 28.7 %, its band up to 30.2 %. Levelling
    # "a" with the lightest worker, pair by pair, sent its 600 KB/s lease to "b", filled "b"
    # above the band and took "b"'s leases back and on to "c": eight moves. Three reach the
    # band: the 600 to "c", which has room for it, and two of a's leases to "b".
    snapshot = fleet_of(
        {
            "a": (1000.0, [60.0, 150.0, 200.0, 600.0, 200.0]),
            "b": (2000.0, [40.0, 60.0, 60.0, 40.0]),
            "c": (4000.0, [600.0]),
        }
    )
    moves = plan_load_aware(snapshot).moves
    assert len(moves) <= 3, moves
    assert _max_over_level(snapshot, moves) <= 1.05, moves


def test_a_run_is_held_while_the_throughputs_still_move_though_the_cpu_cannot_tell() -> None:
    # Six seconds after a traffic change the leases' EMAs are halfway to the new rates; the
    # CPU samples predate the change (or read 100 %), so they agree with the half-old
    # throughputs and ``throughputs_in_flux`` saw nothing: the plan moved eleven leases, and the
    # next run, on settled throughputs, nine more (tuning hot seed 0). Against the previous
    # run's snapshot the throughputs moved by 40 % of their total: this run only assigns.
    workers = (
        WorkerLoad("w1", 60.0, capacity_kbps=1000.0),
        WorkerLoad("w2", 10.0, capacity_kbps=1000.0),
    )
    before = FleetSnapshot(
        (LeaseLoad("a", "w1", 400.0), LeaseLoad("b", "w1", 200.0), LeaseLoad("c", "w2", 100.0)),
        workers,
    )
    after = FleetSnapshot(
        (LeaseLoad("a", "w1", 250.0), LeaseLoad("b", "w1", 350.0), LeaseLoad("c", "w2", 100.0)),
        workers,
    )
    assert throughputs_moving(after, before)
    assert not throughputs_moving(after, after)
    assert not throughputs_moving(after, None)
    assert rebalance_step(after, moved_last_run=False, previous=before) == (False, True)
    # Not two runs in a row: traffic that keeps changing must not block balancing for good.
    assert rebalance_step(after, False, held_last_run=True, previous=before) == (True, False)
    assert rebalance_step(after, moved_last_run=False, previous=after) == (True, False)


def test_a_hot_lease_goes_where_one_lease_back_makes_room_for_it() -> None:
    # w1 carries a 2049 KB/s lease (68 % of its 3000); only a 4000 KB/s worker can carry it
    # within the band, and neither has quite the room: on w3 it overflows the ceiling by a few
    # tenths of a point. Given where the pair levels best (w2), it took three of w2's leases
    # back, one move each; the fewest give it to w3 and take w3's 110 KB/s lease back
    # (tuning medium seed 0's traffic change: six moves where three reach the band).
    snapshot = fleet_of(MEDIUM_0_TRAFFIC)
    moves = plan_load_aware(snapshot).moves
    assert len(moves) == 3, moves
    assert Move("w1-0", "w1", "w3") in moves
    assert Move("w3-0", "w3", "w1") in moves


def test_a_newcomer_is_given_one_learning_lease_when_nothing_lowers_the_peak() -> None:
    # "hot" carries a 1900 KB/s lease and crumbs: 67 % on its 2850, just above the band over
    # the unmovable peak (that lease on the 3000 KB/s "big", 63 %, + 5 %), and no move or
    # exchange lowers it (the lease fits nowhere as it is, an exchange for big's twenty light
    # leases does not pay for them, a crumb is below the minimum gain). The idle newcomer,
    # priced from a guess, takes one lease to learn its capacity. Before, the learning fallback
    # ran again for every step that found nothing: lease after lease to the newcomer within
    # its learning budget, none of which lowered the peak (tuning large seed 0's join: 2 moves
    # where the fewest are 0).
    snapshot = fleet_of(
        {
            "hot": (2850.0, [1900.0, 5.0, 5.0, 5.0]),
            "big": (3000.0, [20.0] * 20),
            "a": (1000.0, [100.0, 90.0, 80.0, 70.0]),
        }
    )
    snapshot = FleetSnapshot(snapshot.leases, (*snapshot.workers, WorkerLoad("new", 0.0)))
    moves = plan_load_aware(snapshot).moves
    assert moves == (Move("a-0", "a", "new"),), moves


def test_a_newcomer_priced_from_a_guess_does_not_lower_the_unmovable_peak() -> None:
    # The 1150 KB/s lease on a 4000 KB/s worker (29.75 % with its crumbs) is as low as that
    # lease goes on any worker whose capacity is known: the fleet is in band. The idle newcomer
    # reports 10 CPUs, 5000 KB/s at the fleet's capacity per CPU; judged by that guess the
    # unmovable peak was 23 % and w3 above its band: the hot lease went to the newcomer (a
    # 4000 KB/s worker, no lower there) and the plan moved on (held-out-3 hot seed 300's join:
    # 5 moves where the fewest are 0). It takes one lease to learn its capacity, nothing else.
    spec = {
        "w3": (4000.0, [1150.0, 20.0, 20.0]),
        "w4": (4000.0, [1100.0]),
        "a": (2000.0, [250.0, 200.0, 100.0]),
    }
    cores = {"w3": 8.0, "w4": 8.0, "a": 4.0}
    snapshot = fleet_of(spec)
    workers = tuple(dataclasses.replace(w, cores=cores[w.worker_id]) for w in snapshot.workers)
    new = WorkerLoad("new", cpu_percent=0.0, cores=10.0)
    moves = plan_load_aware(FleetSnapshot(snapshot.leases, (*workers, new))).moves
    assert moves == (Move("a-0", "a", "new"),), moves


def test_an_idle_newcomer_does_not_narrow_the_band_of_a_fleet_within_its_trigger() -> None:
    # Six 4000 KB/s workers at 32-34 %, a level of 31.0 % with the newcomer (2 CPUs, 1000 KB/s
    # at the fleet's capacity per CPU): "p" (33.9 %) is above the target band (32.6 %) and
    # within the trigger band (34.0 %, 9.5 % over the level). The idle newcomer narrowed the
    # trigger to the target band, and the plan levelled the fleet to it: two of p's leases to
    # the newcomer (held-out hot seed 101 and held-out-6 medium seed 601's joins: 3 moves where
    # the fewest are 0). A newcomer priced from a guess is given its learning lease (the
    # heaviest that leaves it below its donor: w0's 80 KB/s, 8 %; a 400 KB/s one would be
    # 40 %), and nothing else.
    spec = {"p": (4000.0, [400.0, 400.0, 400.0, 40.0, 40.0, 40.0, 30.0, 5.0])}
    spec |= {f"w{i}": (4000.0, [400.0, 400.0, 400.0, 80.0]) for i in range(5)}
    snapshot = fleet_of(spec)
    workers = tuple(dataclasses.replace(w, cores=8.0) for w in snapshot.workers)
    new = WorkerLoad("new", cpu_percent=0.0, cores=2.0)
    moves = plan_load_aware(FleetSnapshot(snapshot.leases, (*workers, new))).moves
    assert moves == (Move("w0-3", "w0", "new"),), moves


def test_a_plan_that_stops_outside_the_band_gives_way_to_one_that_ends_in_it() -> None:
    # Tuning hot seed 2's traffic change, as a variant of the planner measured and not taken
    # (an exchange for a lease that does not settle its donor) reached it: w4 carries a 1133
    # KB/s lease (57 % of its 2000), w2 a 763 KB/s one (76 % of its 1000); the fleet's level
    # is 31.9 %. Levelling each peak with its partner put the 1133 KB/s lease on w5 (37.8 % of
    # its 3000) and then found no single move or exchange off w5 that lowered it: ten moves,
    # 1.18x the level, and the next run planned the same, so the fleet stayed there. The
    # fewest-moves descent ends within the band (14 moves; the fewest to within 1.05x of the
    # optimum are 6).
    snapshot = fleet_of(
        {
            "w0": (2000.0, [219.0, 159.0, 125.0, 73.0, 53.0, 44.0, 43.0, 30.0, 24.0]),
            "w1": (2000.0, [139.0, 51.0, 35.0, 23.0, 21.0, 21.0, 19.0]),
            "w2": (1000.0, [763.0, 64.0, 60.0, 51.0, 36.0, 25.0, 18.0]),
            "w3": (1000.0, [111.0, 85.0, 78.0, 40.0, 31.0, 30.0, 27.0, 23.0]),
            "w4": (2000.0, [1133.0, 184.0, 101.0, 57.0, 35.0, 18.0]),
            "w5": (3000.0, [271.0, 68.0, 39.0, 36.0, 28.0, 20.0]),
            "w6": (3000.0, [350.0, 46.0, 39.0, 32.0, 30.0, 26.0, 26.0, 21.0, 17.0]),
            "w7": (4000.0, [479.0, 92.0, 36.0, 27.0, 20.0, 17.0]),
        }
    )
    moves = plan_load_aware(snapshot).moves
    assert _max_over_level(snapshot, moves) <= 1.05, moves
    assert len(moves) <= 14, moves


def test_a_fleet_no_single_move_or_exchange_improves_is_reached_by_a_chain() -> None:
    # Held-out-3 small seed 300 after its leader crash: w3 (4000 KB/s) at 20.5 % against a
    # level of 18.0 %, outside the trigger band. Every single move or exchange off w3 leaves its
    # receiver higher than w3 was (the 236 KB/s lease on any 1000-1400 KB/s worker is 17-24
    # points), so the plan was empty at every run, for good (1.115x the optimum). A chain gets
    # there: a lease to a worker it overflows, which passes one of its own on (5 moves; the
    # fewest to within 1.05x of the optimum are 4).
    snapshot = fleet_of(
        {
            "w1": (1000.0, [57.0, 46.0, 33.0, 29.0]),
            "w2": (1400.0, [139.0, 96.0, 39.0]),
            "w3": (4000.0, [582.0, 236.0]),
            "w4": (1000.0, [72.0]),
        }
    )
    moves = plan_load_aware(snapshot).moves
    assert _max_over_level(snapshot, moves) <= 1.05, moves
    assert len(moves) <= 7, moves


def test_an_exchange_may_take_back_one_lease_more_than_fits_under_the_level() -> None:
    # Cause 24, the same shape as above on a later trajectory: w3 (4000 KB/s) at 20.5 % against
    # a level of 16.9 %, with [582, 236]; w5 (1460 KB/s) holds [96, 72]. Levelling the pair
    # takes back at most 140 KB/s for the 236 KB/s lease: the 96 alone, which leaves w5 above
    # w3 was; no single lease of w5 is above 140 either. Both of w5's leases (168) for the 236
    # lower the pair's peak to 18.8 %, and a chain cannot hand a lease back to where it came
    # from, so the plan was empty at every run (1.19x the optimum for the rest of the window).
    snapshot = fleet_of(
        {
            "w1": (1000.0, [57.0, 46.0]),
            "w2": (1400.0, [139.0, 39.0, 33.0, 29.0]),
            "w3": (4000.0, [582.0, 236.0]),
            "w5": (1460.0, [96.0, 72.0]),
        }
    )
    moves = plan_load_aware(snapshot).moves
    assert _max_over_level(snapshot, moves) <= 1.05, moves
    assert len(moves) <= 3, moves


def test_a_hot_lease_that_fits_nowhere_is_passed_on_in_a_chain_of_few_moves() -> None:
    # Cause 25, held-out-8 medium seed 800's traffic change: w1 (1400 KB/s) at 131 % with a
    # lease grown to 1083 KB/s, which no worker takes within the band as it is. Levelling moved
    # it to w3 and then 13 leases off w3 and the others: 15 moves. The fewest are 4, two
    # chains: 1083 to w5 (4000 KB/s), whose 519 goes on to w3; 338 to w4, whose 162 goes on
    # to w0. The fewest-moves descent with chains now finds them.
    snapshot = fleet_of(
        {
            "w0": (1400.0, [106.0, 94.0, 46.0, 29.0, 19.0, 17.0]),
            "w1": (1400.0, [1083.0, 338.0, 138.0, 88.0, 62.0, 58.0, 25.0, 24.0, 21.0, 17.0]),
            "w2": (1000.0, [78.0, 72.0, 48.0, 37.0, 31.0, 23.0, 22.0, 20.0, 19.0]),
            "w3": (3000.0, [249.0, 55.0, 55.0, 33.0, 32.0, 26.0, 26.0, 22.0, 21.0, 19.0, 18.0]),
            "w4": (2000.0, [162.0, 120.0, 66.0, 47.0, 39.0, 30.0, 27.0, 21.0, 17.0]),
            "w5": (4000.0, [519.0, 212.0, 41.0, 36.0, 36.0, 28.0, 18.0]),
        }
    )
    moves = plan_load_aware(snapshot).moves
    assert _max_over_level(snapshot, moves) <= 1.05, moves
    assert len(moves) <= 6, moves


def test_a_plan_drops_the_moves_it_can_do_without() -> None:
    # Cause 26, held-out-6 medium seed 602's traffic change: a 1597 KB/s lease on w5 (2000
    # KB/s) sets the optimum (alone on w2, 4000 KB/s). The plan put it there after moving
    # w5's light leases off one at a time, and then w2's leases on: 17 moves, of which 8 were
    # only needed before the hot lease went. The fewest to within 1.05x of the optimum are 6.
    w0 = [214.0, 103.0, 55.0, 34.0, 32.0, 28.0, 25.0, 23.0, 23.0, 19.0, 18.0, 15.0, 12.0]
    spec = {
        "w0": (1400.0, w0),
        "w1": (2000.0, [171.0, 142.0, 43.0, 26.0, 24.0, 21.0, 19.0, 16.0, 13.0]),
        "w2": (4000.0, [407.0, 282.0, 119.0, 36.0, 29.0]),
        "w3": (3000.0, [51.0, 41.0, 24.0, 23.0, 18.0, 17.0, 16.0, 14.0, 12.0]),
        "w4": (2000.0, [671.0, 90.0, 39.0, 30.0, 29.0, 21.0, 17.0, 14.0]),
        "w5": (2000.0, [1597.0, 81.0, 73.0, 65.0, 63.0, 46.0, 13.0, 12.0]),
    }
    snapshot = fleet_of(spec)
    moves = plan_load_aware(snapshot).moves
    assert Move("w5-0", "w5", "w2") in moves
    assert len(moves) <= 10, moves
    # Every worker but w2 ends within the band over the peak the hot lease sets there.
    owner = {f"{wid}-{i}": wid for wid, (_, rates) in spec.items() for i in range(len(rates))}
    owner.update({m.lease_key: m.to_worker for m in moves})
    loads = dict.fromkeys(spec, 0.0)
    for wid, (_, rates) in spec.items():
        for i, rate in enumerate(rates):
            holder = owner[f"{wid}-{i}"]
            loads[holder] += rate * 100 / spec[holder][0]
    peak = 1597.0 * 100 / 4000.0
    assert max(v for w, v in loads.items() if w != "w2") <= peak * 1.05, loads
