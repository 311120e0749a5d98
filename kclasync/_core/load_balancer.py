"""kclasync's load-aware assignment policy: one plan that balances the fleet in one round.

Owns: ``plan_load_aware``, the default policy of the leader. It first places unowned and
expired leases (``assign_unowned``), then, if some worker is outside the trigger band around the
mean load (or above its operating range), moves leases one at a time, each time choosing the
move that lowers the higher of the two workers' *predicted* loads the most, and re-plans against
the loads predicted after that move. Compared with the KCL 3.x variance decider:

- it plans the whole correction at once against predicted loads instead of taking a dampened
  fraction of each donor's excess every third run, so one round reaches the band;
- it counts leases still in handoff at their new owner (the CPU still shows the old one), so a
  move already under way is not planned twice;
- a lease costs a different amount of CPU on each worker (its capacity), so a small worker is
  not filled to the fleet's average throughput;
- when no single move helps (a hot lease nobody can absorb as is), it exchanges one lease of
  the most loaded worker for a lighter one of another worker;
- every move (or exchange) must lower the pair's peak by a minimum gain, so the descending
  vector of loads strictly decreases: no A->B->A cycle on a static load, and a fixed point
  once no move helps;
- sticky leases, leases in handoff and leases placed in this plan are never moved, and a
  lease changes owner at most once per plan.

Must not: read clocks, tables or metrics, or use randomness; ties are broken by keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from kclasync._core.load_assignment import (
    FleetSnapshot,
    LeaseLoad,
    LoadModel,
    Move,
    Plan,
    assign_unowned,
    lease_throughputs,
)

__all__ = ["BalancerSettings", "plan_load_aware"]


@dataclass(frozen=True, slots=True)
class BalancerSettings:
    """``trigger_percent``: rebalance only when a worker is outside mean +- this (or above its
    operating range). ``target_percent``: once triggered, plan until every worker is within
    mean +- this. ``min_gain_percent``: a move must lower the higher load of its two workers by
    at least this share of the mean (noise guard). ``max_moves``: cap per plan (None: no cap)."""

    trigger_percent: float = 10.0
    target_percent: float = 5.0
    min_gain_percent: float = 1.0
    max_moves: int | None = None
    take_expired_sticky: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.target_percent <= self.trigger_percent:
            raise ValueError("need 0 <= target_percent <= trigger_percent")
        if self.min_gain_percent < 0:
            raise ValueError("min_gain_percent must be >= 0")
        if self.max_moves is not None and self.max_moves < 0:
            raise ValueError("max_moves must be >= 0")


def plan_load_aware(snapshot: FleetSnapshot, settings: BalancerSettings | None = None) -> Plan:
    """The plan for one assignment run of the leader (see the module docstring)."""
    settings = settings or BalancerSettings()
    throughputs = lease_throughputs(snapshot.leases)
    model = LoadModel(snapshot, throughputs)
    assignments = assign_unowned(
        snapshot, model, throughputs, take_expired_sticky=settings.take_expired_sticky
    )
    placed = {move.lease_key for move in assignments}
    moves = _rebalance(snapshot, model, throughputs, settings, placed)
    return Plan(assignments=tuple(assignments), moves=tuple(moves))


def _outside(model: LoadModel, band_percent: float) -> bool:
    mean = model.mean()
    low, high = mean * (1 - band_percent / 100), mean * (1 + band_percent / 100)
    return any(
        load > high or load < low or load > model.limit[wid] for wid, load in model.load.items()
    )


def _rebalance(
    snapshot: FleetSnapshot,
    model: LoadModel,
    throughputs: dict[str, float],
    settings: BalancerSettings,
    placed: set[str],
) -> list[Move]:
    if len(model.workers) < 2 or model.mean() <= 0:
        return []
    if not _outside(model, settings.trigger_percent):
        return []
    movable: dict[str, list[LeaseLoad]] = {wid: [] for wid in model.workers}
    for lease in sorted(snapshot.leases, key=lambda item: item.key):
        if (
            lease.owner in movable
            and not lease.sticky
            and not lease.expired
            and not lease.in_handoff
            and lease.key not in placed
            and throughputs[lease.key] > 0
        ):
            movable[lease.owner].append(lease)
    # A lease moved earlier in this plan may move again (the plan keeps improving from the
    # predicted state); only its net change of owner is returned, so no lease goes back and forth.
    origin = {lease.key: wid for wid, leases in movable.items() for lease in leases}
    current = dict(origin)
    order: list[str] = []
    steps = 0
    limit = 4 * len(origin) + 8  # each step strictly lowers the sorted loads; this is a backstop
    while steps < limit:
        changed = sum(1 for key in current if current[key] != origin[key])
        if settings.max_moves is not None and changed >= settings.max_moves:
            break
        if not _outside(model, settings.target_percent):
            break
        step = _best_move(model, movable, throughputs, settings) or _best_swap(
            model, movable, throughputs, settings
        )
        if step is None:
            break
        if settings.max_moves is not None and changed + len(step) > settings.max_moves:
            break
        steps += 1
        for lease, donor, receiver in step:
            tp = throughputs[lease.key]
            model.load[donor] -= model.cost(donor, tp)
            model.load[receiver] += model.cost(receiver, tp)
            model.assigned_kbps[donor] -= tp
            model.assigned_kbps[receiver] += tp
            movable[donor].remove(lease)
            movable[receiver].append(lease)
            movable[receiver].sort(key=lambda item: item.key)
            current[lease.key] = receiver
            if lease.key not in order:
                order.append(lease.key)
    return [Move(key, origin[key], current[key]) for key in order if current[key] != origin[key]]


def _best_move(
    model: LoadModel,
    movable: dict[str, list[LeaseLoad]],
    throughputs: dict[str, float],
    settings: BalancerSettings,
) -> list[tuple[LeaseLoad, str, str]] | None:
    """The move that lowers a pair's peak load the most, trying donors from the most loaded."""
    min_gain = model.mean() * settings.min_gain_percent / 100
    donors = sorted(model.workers, key=lambda wid: (-model.load[wid], wid))
    receivers = sorted(model.workers, key=lambda wid: (model.load[wid], wid))
    for donor in donors:
        before = model.load[donor]
        best: tuple[float, str, str, LeaseLoad] | None = None
        for receiver in receivers:
            if receiver == donor or model.load[receiver] >= before:
                continue
            for lease in movable[donor]:
                tp = throughputs[lease.key]
                new_receiver = model.load[receiver] + model.cost(receiver, tp)
                if new_receiver > model.limit[receiver]:
                    continue
                peak = max(before - model.cost(donor, tp), new_receiver)
                if peak > before - min_gain or peak >= before:
                    continue
                candidate = (peak, lease.key, receiver, lease)
                if best is None or candidate[:3] < best[:3]:
                    best = candidate
        if best is not None:
            return [(best[3], donor, best[2])]
    return None


def _best_swap(
    model: LoadModel,
    movable: dict[str, list[LeaseLoad]],
    throughputs: dict[str, float],
    settings: BalancerSettings,
) -> list[tuple[LeaseLoad, str, str]] | None:
    """When no single move helps (a hot lease no other worker can absorb as it is), the exchange
    of one lease of the most loaded worker for one lease of another that lowers the pair's peak
    the most."""
    min_gain = model.mean() * settings.min_gain_percent / 100
    donor = min(model.workers, key=lambda wid: (-model.load[wid], wid))
    before = model.load[donor]
    best: tuple[float, str, str, str, LeaseLoad, LeaseLoad] | None = None
    for receiver in sorted(model.workers):
        if receiver == donor:
            continue
        for given in movable[donor]:
            give = throughputs[given.key]
            for taken in movable[receiver]:
                take = throughputs[taken.key]
                if take >= give:
                    continue
                new_receiver = (
                    model.load[receiver] + model.cost(receiver, give) - model.cost(receiver, take)
                )
                if new_receiver > model.limit[receiver]:
                    continue
                new_donor = before - model.cost(donor, give) + model.cost(donor, take)
                peak = max(new_donor, new_receiver)
                if peak > before - min_gain or peak >= before:
                    continue
                candidate = (peak, given.key, taken.key, receiver, given, taken)
                if best is None or candidate[:4] < best[:4]:
                    best = candidate
    if best is None:
        return None
    _, _, _, receiver, given, taken = best
    return [(given, donor, receiver), (taken, receiver, donor)]
