"""Property tests of the assignment planners on generated fleet snapshots."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kclasync._core.assignment.kcl3_decider import plan_kcl3
from kclasync._core.assignment.load_assignment import (
    FleetSnapshot,
    LeaseLoad,
    LoadModel,
    Plan,
    WorkerLoad,
    lease_throughputs,
)
from kclasync._core.assignment.load_balancer import plan_load_aware


@st.composite
def snapshots(draw: st.DrawFn, *, cpu: bool | None = None) -> FleetSnapshot:
    n_workers = draw(st.integers(1, 5))
    ids = [f"w{i}" for i in range(n_workers)]
    with_cpu = draw(st.booleans()) if cpu is None else cpu
    workers = tuple(
        WorkerLoad(
            wid,
            cpu_percent=draw(st.floats(0, 100)) if with_cpu else None,
            max_cpu_percent=draw(st.sampled_from([60.0, 80.0, 100.0])),
            capacity_kbps=draw(st.one_of(st.none(), st.floats(200, 5000))),
        )
        for wid in ids
    )
    owners = st.one_of(st.none(), st.sampled_from([*ids, "gone"]))
    n_leases = draw(st.integers(0, 24))
    leases = tuple(
        LeaseLoad(
            key=f"shardId-{i:04d}",
            owner=draw(owners),
            throughput_kbps=draw(st.one_of(st.none(), st.floats(0, 3000))),
            sticky=draw(st.booleans()),
            expired=draw(st.booleans()),
            checkpoint_owner=draw(st.one_of(st.none(), st.sampled_from(ids))),
            age_order=draw(st.floats(0, 100)),
        )
        for i in range(n_leases)
    )
    return FleetSnapshot(leases, workers)


def shuffled(snapshot: FleetSnapshot, seed: int) -> FleetSnapshot:
    rng = random.Random(seed)
    leases, workers = list(snapshot.leases), list(snapshot.workers)
    rng.shuffle(leases)
    rng.shuffle(workers)
    return FleetSnapshot(tuple(leases), tuple(workers))


@settings(max_examples=60, deadline=None)
@given(snapshots(), st.integers(0, 1000))
def test_plans_are_deterministic_and_independent_of_input_order(
    snapshot: FleetSnapshot, seed: int
) -> None:
    assert plan_load_aware(snapshot) == plan_load_aware(shuffled(snapshot, seed))
    for balance in (False, True):
        assert plan_kcl3(snapshot, balance=balance, seed=seed) == plan_kcl3(
            snapshot, balance=balance, seed=seed
        )


def test_handoffs_out_of_a_worker_are_priced_whatever_the_lease_order() -> None:
    # w0 is the old owner of a lease nobody owns now, and the new owner of one w2 hands it:
    # its load, floored at 0, used to depend on which of the two came first, and with it
    # whether w0 or w1 got shardId-0003.
    def lease(key: str, owner: str | None = None, old: str | None = None) -> LeaseLoad:
        return LeaseLoad(key, owner, None, False, False, old, 0.0)

    def worker(wid: str, cpu: float, capacity: float | None = None) -> WorkerLoad:
        return WorkerLoad(wid, cpu, 60.0, capacity)

    snapshot = FleetSnapshot(
        (
            lease("shardId-0000"),
            lease("shardId-0001", old="w0"),
            lease("shardId-0002", "w0", "w2"),
            lease("shardId-0003"),
        ),
        (worker("w0", 0.25), worker("w1", 0.25), worker("w2", 0.0), worker("w3", 0.0, 200.0)),
    )
    plan = plan_load_aware(snapshot)
    assert all(plan_load_aware(shuffled(snapshot, seed)) == plan for seed in range(40))


def _check_sticky(snapshot: FleetSnapshot, plan: Plan) -> None:
    by_key = {lease.key: lease for lease in snapshot.leases}
    live = {w.worker_id for w in snapshot.workers}
    for move in plan.all:
        lease = by_key[move.lease_key]
        if lease.sticky:
            # Only a sticky lease nobody holds may be placed; a held one never moves.
            assert lease.owner is None or lease.owner not in live, (lease, move)


@settings(max_examples=60, deadline=None)
@given(snapshots())
def test_sticky_leases_are_never_moved(snapshot: FleetSnapshot) -> None:
    _check_sticky(snapshot, plan_load_aware(snapshot))
    for move in plan_kcl3(snapshot, balance=True).moves:
        assert not {lease.key: lease for lease in snapshot.leases}[move.lease_key].sticky


@settings(max_examples=60, deadline=None)
@given(snapshots())
def test_every_lease_moves_at_most_once_and_only_to_live_workers(snapshot: FleetSnapshot) -> None:
    live = {w.worker_id for w in snapshot.workers}
    for plan in (plan_load_aware(snapshot), plan_kcl3(snapshot, balance=True)):
        assert all(move.to_worker in live for move in plan.all)
        assert all(move.from_worker != move.to_worker for move in plan.moves)
    keys = [move.lease_key for move in plan_load_aware(snapshot).all]
    assert len(keys) == len(set(keys))


@settings(max_examples=80, deadline=None)
@given(snapshots(cpu=True))
def test_never_above_the_operating_range_while_another_worker_has_room(
    snapshot: FleetSnapshot,
) -> None:
    plan = plan_load_aware(snapshot)
    throughputs = lease_throughputs(snapshot.leases)
    model = LoadModel(snapshot, throughputs)
    for move in plan.assignments:
        tp = throughputs[move.lease_key]
        after = model.load[move.to_worker] + model.cost(move.to_worker, tp)
        if after > model.limit[move.to_worker] + 1e-9:
            room = [
                wid
                for wid in model.workers
                if model.load[wid] + model.cost(wid, tp) <= model.limit[wid]
            ]
            assert not room, (move, room)
        model.load[move.to_worker] = after
    for move in plan.moves:
        assert move.from_worker is not None
        tp = throughputs[move.lease_key]
        model.load[move.from_worker] -= model.cost(move.from_worker, tp)
        model.load[move.to_worker] += model.cost(move.to_worker, tp)
    # Rebalancing leaves a worker it gave a lease to above its range only when no other worker
    # could hold that lease within its own (an overloaded fleet: the lease must go somewhere).
    for move in plan.moves:
        wid, tp = move.to_worker, throughputs[move.lease_key]
        if model.load[wid] > model.limit[wid] + 1e-9:
            room = [
                other
                for other in model.workers
                if other != wid and model.load[other] + model.cost(other, tp) <= model.limit[other]
            ]
            assert not room, (move, room)


def test_an_overloaded_fleet_puts_a_lease_just_above_the_range_where_nothing_has_room() -> None:
    """w0 (200 KB/s at 100 % CPU) holds two leases of 120.5 KB/s, one of them in a handoff:
    120.5 % against its 60 % range. The other can go to w2 (60.25 % once it gives its 241 KB/s
    lease to w1) or to w1 (81 % against 80 %): w2, 0.25 points above its range, is the best
    place, and the plan must not leave it on w0 at 120.5 %."""
    moved = LeaseLoad("shardId-0007", "w0", None)
    leases = (
        LeaseLoad("shardId-0000", "w2", 241.0),
        *(LeaseLoad(f"shardId-000{i}", None, None) for i in range(1, 6)),
        LeaseLoad("shardId-0006", None, 0.0),
        moved,
        LeaseLoad("shardId-0008", "w0", None, checkpoint_owner="w1"),
        LeaseLoad("shardId-0009", None, None, checkpoint_owner="w1"),
    )
    workers = (
        WorkerLoad("w0", cpu_percent=0.0, max_cpu_percent=60.0, capacity_kbps=200.0),
        WorkerLoad("w1", cpu_percent=18.0, max_cpu_percent=80.0),
        WorkerLoad("w2", cpu_percent=0.0, max_cpu_percent=60.0),
    )
    snapshot = FleetSnapshot(leases, workers)
    plan = plan_load_aware(snapshot)
    assert {(m.lease_key, m.to_worker) for m in plan.moves} == {
        ("shardId-0007", "w2"),
        ("shardId-0000", "w1"),
    }
    throughputs = lease_throughputs(snapshot.leases)
    model = LoadModel(snapshot, throughputs)
    for move in plan.all:
        tp = throughputs[move.lease_key]
        if move.from_worker is not None:
            model.load[move.from_worker] -= model.cost(move.from_worker, tp)
        model.load[move.to_worker] += model.cost(move.to_worker, tp)
    assert max(model.load.values()) == pytest.approx(72.0)  # w1, within its 80 %
    assert model.load["w2"] == pytest.approx(60.25)


@st.composite
def static_fleets(draw: st.DrawFn) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    n_workers = draw(st.integers(2, 5))
    capacity = {f"w{i}": draw(st.floats(500, 4000)) for i in range(n_workers)}
    n_leases = draw(st.integers(1, 30))
    rates = {f"s{i:03d}": draw(st.floats(1, 800)) for i in range(n_leases)}
    owner = {key: draw(st.sampled_from(sorted(capacity))) for key in rates}
    return capacity, rates, owner


def _run_static(
    capacity: dict[str, float],
    rates: dict[str, float],
    owner: dict[str, str],
    *,
    cpu: bool,
    known_capacity: bool,
) -> None:
    left: dict[str, set[str]] = {key: set() for key in rates}
    for round_number in range(40):
        assigned = dict.fromkeys(capacity, 0.0)
        for key, holder in owner.items():
            assigned[holder] += rates[key]
        workers = tuple(
            WorkerLoad(
                wid,
                cpu_percent=min(100.0, 100 * assigned[wid] / cap) if cpu else None,
                max_cpu_percent=100.0 if not cpu else 1e9,
                capacity_kbps=cap if known_capacity else None,
            )
            for wid, cap in capacity.items()
        )
        leases = tuple(LeaseLoad(key, owner[key], rates[key]) for key in rates)
        plan = plan_load_aware(FleetSnapshot(leases, workers))
        assert not plan.assignments
        if not plan.moves:
            # Predictions are exact here: the first plan reaches the fixed point, give or take
            # a step decided by floating-point rounding at a threshold.
            assert round_number <= 3
            return
        for move in plan.moves:
            assert move.to_worker not in left[move.lease_key], f"{move} went back"
            left[move.lease_key].add(move.from_worker or "")
            owner[move.lease_key] = move.to_worker
    raise AssertionError("no fixed point within 40 rounds")


@settings(max_examples=60, deadline=None)
@given(static_fleets())
# Found at random: no descent ended within the band (the fewest-moves ones 0.01 points over
# it), and the levelling one, far above, was taken; the next plan moved a lease back (cause 27).
@example(
    (
        {"w0": 1149.0, "w1": 500.0, "w2": 894.0, "w3": 1026.0},
        {"s000": 191.0, "s001": 511.0, "s002": 665.0, "s003": 709.0},
        dict.fromkeys(("s000", "s001", "s002", "s003"), "w0"),
    )
)
def test_converges_without_cycles_on_throughput(
    fleet: tuple[dict[str, float], dict[str, float], dict[str, str]],
) -> None:
    capacity, rates, owner = fleet
    _run_static(capacity, rates, dict(owner), cpu=False, known_capacity=False)
    _run_static(capacity, rates, dict(owner), cpu=False, known_capacity=True)


@settings(max_examples=60, deadline=None)
@given(static_fleets())
def test_converges_without_cycles_on_cpu_with_capacities(
    fleet: tuple[dict[str, float], dict[str, float], dict[str, str]],
) -> None:
    capacity, rates, owner = fleet
    _run_static(capacity, rates, dict(owner), cpu=True, known_capacity=True)


def test_as_many_workers_as_leases_does_not_make_leases_go_back() -> None:
    """Five leases, five workers: some worker holds nothing whatever the plan, so an empty
    worker is no reason to move (filling it emptied another, and the next plan moved the lease
    back: found by the property test above)."""
    capacity = {"w0": 500.0, "w1": 500.0, "w2": 601.0, "w3": 1580.0, "w4": 1459.0}
    rates = {
        "s000": 30.0,
        "s001": 30.0,
        "s002": 168.0,
        "s003": 52.896199797868945,
        "s004": 79.48213916915716,
    }
    owner = {"s000": "w0", "s001": "w1", "s002": "w0", "s003": "w0", "s004": "w0"}
    _run_static(capacity, rates, dict(owner), cpu=False, known_capacity=True)
    _run_static(capacity, rates, dict(owner), cpu=False, known_capacity=False)


def test_a_vanishing_throughput_does_not_price_a_worker_infinitely() -> None:
    """A lease throughput of 2.2e-308 KB/s (a float a property test drew) made CPU over
    throughput infinite and every predicted load NaN."""
    tiny = 2.2e-308
    snapshot = FleetSnapshot(
        (
            LeaseLoad(key="shardId-0000", owner="w0", throughput_kbps=tiny),
            LeaseLoad(key="shardId-0001", owner=None, throughput_kbps=100.0),
        ),
        (
            WorkerLoad("w0", cpu_percent=50.0, max_cpu_percent=80.0, capacity_kbps=None),
            WorkerLoad("w1", cpu_percent=10.0, max_cpu_percent=80.0, capacity_kbps=None),
        ),
    )
    model = LoadModel(snapshot, lease_throughputs(snapshot.leases))
    assert all(math.isfinite(load) for load in model.load.values()), model.load
    assert all(math.isfinite(rate) for rate in model.rate.values()), model.rate
    plan = plan_load_aware(snapshot)
    assert [move.lease_key for move in plan.assignments] == ["shardId-0001"]
