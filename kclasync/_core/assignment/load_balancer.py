"""kclasync's load-aware assignment policy: one plan that balances the fleet in one round.

Owns: ``plan_load_aware``, the default policy of the leader, and ``peak_floor``. It first
places unowned and expired leases (``assign_unowned``), then, if some worker is above the
trigger band over the fleet's capacity-weighted level (or over the unmovable peak: the hottest
lease alone on its cheapest worker, when that is higher), above its operating range, or has
nothing while the fleet has load, moves leases one at a time, each time choosing the move that
lowers the higher of the two workers' *predicted* loads the most, and re-plans against the
loads predicted after that move. A worker below the level is no reason to move by itself: the
fleet is sized for its most loaded worker. Compared with the KCL 3.x variance decider:

- it plans the whole correction at once against predicted loads instead of taking a dampened
  fraction of each donor's excess every third run, so one round reaches the band;
- it counts leases still in handoff at their new owner (the CPU still shows the old one), so a
  move already under way is not planned twice;
- a lease costs a different amount of CPU on each worker (its capacity), so a small worker is
  not filled to the fleet's average throughput;
- when no single move helps (a hot lease nobody can absorb as is), it exchanges one lease of
  the most loaded worker for lighter ones of another worker, when the gain pays for every
  lease the exchange moves;
- every move (or exchange) must lower the pair's peak by a minimum gain, so the descending
  vector of loads strictly decreases: no A->B->A cycle on a static load, and a fixed point
  once no move helps;
- sticky leases, leases in handoff and leases placed in this plan are never moved, and a
  lease changes owner at most once per plan.

Must not: read clocks, tables or metrics, or use randomness; ties are broken by keys.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from kclasync._core.assignment.load_assignment import (
    FleetSnapshot,
    LeaseLoad,
    LoadModel,
    Move,
    Plan,
    assign_unowned,
    lease_throughputs,
)

__all__ = ["BalancerSettings", "peak_floor", "plan_load_aware"]


@dataclass(frozen=True, slots=True)
class BalancerSettings:
    """``trigger_percent``: rebalance only when a worker is above the fleet's level + this (or
    above the unmovable peak + this, when that is higher; or above its operating range; or a
    worker has nothing). ``target_percent``: once triggered, plan until no worker is above
    level (or peak) + this. ``min_gain_percent``: a move must lower the higher load of its two
    workers by at least this share of the mean for each lease it moves (noise guard).
    ``noise_floor_percent``: a worker whose load is its measured CPU (no capacity) counts as
    outside a band only when it is also this many CPU points above the level (at a level of a
    few percent, 10 % of it is well below the noise of one reading); predicted loads have no such
    floor. ``max_moves``: cap per plan (None: no cap)."""

    trigger_percent: float = 10.0
    target_percent: float = 5.0
    min_gain_percent: float = 1.0
    noise_floor_percent: float = 1.0
    max_moves: int | None = None
    take_expired_sticky: bool = False

    def __post_init__(self) -> None:
        if not 0 <= self.target_percent <= self.trigger_percent:
            raise ValueError("need 0 <= target_percent <= trigger_percent")
        if self.min_gain_percent < 0 or self.noise_floor_percent < 0:
            raise ValueError("min_gain_percent and noise_floor_percent must be >= 0")
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


def peak_floor(model: LoadModel, snapshot: FleetSnapshot, throughputs: dict[str, float]) -> float:
    """A load no plan can bring the most loaded worker below: the hottest lease alone on the
    worker where it costs least, and what is pinned (sticky leases, leases in handoff) on each
    worker. Above the fleet's level, the balance is judged against it: moves that level the
    other workers below an unmovable peak do not lower the peak."""
    live = model.workers
    hottest = max(
        (throughputs[lease.key] for lease in snapshot.leases if not lease.expired),
        default=0.0,
    )
    cheapest = min((r for r in model.rate.values() if r > 0), default=0.0)
    pinned = dict.fromkeys(live, 0.0)
    for lease in snapshot.leases:
        if lease.owner in pinned and not lease.expired and (lease.sticky or lease.in_handoff):
            pinned[lease.owner] += model.cost(lease.owner, throughputs[lease.key])
    return max(hottest * cheapest, max(pinned.values(), default=0.0))


def _outside(
    model: LoadModel,
    band_percent: float,
    floor: float = 0.0,
    peak: float = 0.0,
    *,
    spare_leases: bool = True,
    empty_band_percent: float | None = None,
) -> bool:
    """Whether the fleet is out of balance: a worker above the fleet's level + band (or, when
    an unmovable peak is higher, above that peak + band), or above its operating range; or a
    worker with nothing assigned while the fleet has load (a newcomer) and more leases with
    load than workers (``spare_leases``: with as many workers as leases, or more, some worker
    holds nothing whatever the plan, and moving leases to fill one empties another, back and
    forth from one plan to the next), when some worker is also above the narrower
    ``empty_band_percent`` (an idle newcomer beside a fleet already within that band of its
    level lowers no peak: its leases would move for nothing). A measured load must also be
    ``floor`` points above the level (noise). A worker below the level is no reason to move by
    itself: the highest load is what the fleet is sized for, and levelling the others below it
    moves leases for nothing."""
    level = model.level()

    def above(percent: float) -> bool:
        top = max(level * (1 + percent / 100), peak * (1 + percent / 100))
        for wid, load in model.load.items():
            # A measured CPU reading is only known to within its noise; a predicted load is not.
            high = max(top, level + floor) if wid in model.measured else top
            if load > high or load > model.limit[wid]:
                return True
        return False

    if above(band_percent):
        return True
    empty = level > 0 and spare_leases and any(v <= 0 for v in model.assigned_kbps.values())
    return empty and above(band_percent if empty_band_percent is None else empty_band_percent)


def _rebalance(
    snapshot: FleetSnapshot,
    model: LoadModel,
    throughputs: dict[str, float],
    settings: BalancerSettings,
    placed: set[str],
) -> list[Move]:
    if len(model.workers) < 2 or model.mean() <= 0:
        return []
    peak = peak_floor(model, snapshot, throughputs)
    loaded = sum(1 for lease in snapshot.leases if not lease.expired and throughputs[lease.key] > 0)
    spare = loaded > len(model.workers)
    triggered = _outside(
        model,
        settings.trigger_percent,
        settings.noise_floor_percent,
        peak,
        spare_leases=spare,
        empty_band_percent=settings.target_percent,
    )
    # An idle worker priced from a guess (no capacity reported) is not a reason to level the
    # fleet, but it is one to give it a little load: until it reports a capacity, whether the
    # peak could go there (a hot lease on a large newcomer) is unknown (``_learning_step``).
    learning = spare and any(
        wid in model.guessed and model.assigned_kbps[wid] <= 0 for wid in model.workers
    )
    if not triggered and not learning:
        return []
    movable: dict[str, _Holdings] = {wid: _Holdings() for wid in model.workers}
    for lease in snapshot.leases:
        if (
            lease.owner in movable
            and not lease.sticky
            and not lease.expired
            and not lease.in_handoff
            and lease.key not in placed
            and throughputs[lease.key] > 0
        ):
            movable[lease.owner].add(throughputs[lease.key], lease)
    # A lease moved earlier in this plan may move again (the plan keeps improving from the
    # predicted state); only its net change of owner is returned, so no lease goes back and forth.
    origin = {entry[2].key: wid for wid, held in movable.items() for entry in held.entries}
    current = dict(origin)
    order: list[str] = []
    steps = 0
    limit = 4 * len(origin) + 8  # each step strictly lowers the sorted loads; this is a backstop
    changed = 0
    while steps < limit:
        if settings.max_moves is not None and changed >= settings.max_moves:
            break
        if _outside(
            model,
            settings.target_percent,
            settings.noise_floor_percent / 2,
            peak,
            spare_leases=spare,
        ):
            step = _best_step(model, movable, settings)
        elif learning:
            step = _learning_step(model, movable, settings)
        else:
            break
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
            movable[donor].remove(tp, lease)
            movable[receiver].add(tp, lease)
            changed += (current[lease.key] == origin[lease.key]) - (receiver == origin[lease.key])
            current[lease.key] = receiver
            if lease.key not in order:
                order.append(lease.key)
    return [Move(key, origin[key], current[key]) for key in order if current[key] != origin[key]]


_Entry = tuple[float, str, LeaseLoad]
# Donors tried from the most loaded and receivers from the least loaded, per step: keeps a plan
# for hundreds of workers fast; each step still strictly improves, so convergence is unchanged.
_SEARCH_WIDTH = 12
# ... plus the few workers where a lease costs least (the largest): a hot lease may fit only
# there, and in a large fleet those need not be among the least loaded.
_CHEAPEST = 3


def _receivers(donor: str, lightest: list[str], cheapest: list[str]) -> list[str]:
    """The receivers searched for ``donor``: the least loaded, then the cheapest."""
    out = [wid for wid in lightest if wid != donor][:_SEARCH_WIDTH]
    out += [wid for wid in cheapest if wid != donor and wid not in out][:_CHEAPEST]
    return out


def _by_cost(model: LoadModel) -> list[str]:
    return sorted(model.workers, key=lambda wid: (model.rate[wid], model.load[wid], wid))


class _Holdings:
    """A worker's movable leases sorted by (throughput, key), for nearest-throughput lookups."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []

    def add(self, tp: float, lease: LeaseLoad) -> None:
        bisect.insort(self.entries, (tp, lease.key, lease), key=lambda e: (e[0], e[1]))

    def remove(self, tp: float, lease: LeaseLoad) -> None:
        index = bisect.bisect_left(self.entries, (tp, lease.key), key=lambda e: (e[0], e[1]))
        del self.entries[index]

    def at_most(self, value: float) -> _Entry | None:
        """The largest throughput <= value (the smallest key among equals)."""
        index = bisect.bisect_right(self.entries, value, key=lambda e: e[0]) - 1
        if index < 0:
            return None
        first = bisect.bisect_left(self.entries, self.entries[index][0], key=lambda e: e[0])
        return self.entries[first]

    def above(self, value: float) -> _Entry | None:
        """The smallest throughput > value (the smallest key among equals)."""
        index = bisect.bisect_right(self.entries, value, key=lambda e: e[0])
        return self.entries[index] if index < len(self.entries) else None


def _donors(model: LoadModel) -> list[str]:
    """The workers a step may take a lease from: the most loaded one (the fleet's peak; among
    equals the smallest id), and any worker above its operating range. A move off any other
    worker lowers no peak: the fleet's max/mean stays where it is, and levelling two workers
    below the peak only moves leases (the next run, on new throughputs, may move them again)."""
    top = min(model.workers, key=lambda wid: (-model.load[wid], wid))
    over = sorted(
        (wid for wid in model.workers if wid != top and model.load[wid] > model.limit[wid]),
        key=lambda wid: (-model.load[wid], wid),
    )
    return [top, *over]


def _best_step(
    model: LoadModel, movable: dict[str, _Holdings], settings: BalancerSettings
) -> list[tuple[LeaseLoad, str, str]] | None:
    """The next step off the fleet's peak (``_donors``): the best single move, else the best
    exchange, else the exchange that takes back a little more; None when none passes."""
    lightest = sorted(model.workers, key=lambda wid: (model.load[wid], wid))
    cheapest = _by_cost(model)
    for donor in _donors(model):
        receivers = _receivers(donor, lightest, cheapest)
        step = (
            _best_move(model, movable, settings, donor, receivers)
            or _best_swap(model, movable, settings, donor, receivers, beyond=False)
            or _best_swap(model, movable, settings, donor, receivers, beyond=True)
        )
        if step is not None:
            return step
    # Nothing lowers the peak as the loads are priced; but a worker priced from a guess (it
    # has not reported a capacity) is only known once it carries load. Left idle it never
    # reports one, and a hot lease that fits only there (the guess is the fleet's average)
    # never goes. So it may take light leases from the most loaded workers, as much as would
    # bring the fleet's smallest worker to the level: enough CPU for its estimate, and no
    # overload should it be that small (the average's price overfilled a small newcomer).
    return _learning_step(model, movable, settings)


def _learning_step(
    model: LoadModel, movable: dict[str, _Holdings], settings: BalancerSettings
) -> list[tuple[LeaseLoad, str, str]] | None:
    """One light lease for a worker priced from a guess (``_best_step``'s last resort)."""
    level = model.level()
    known = [model.rate[wid] for wid in model.workers if wid not in model.guessed]
    if not model.guessed or not known or max(known) <= 0:
        return None
    budget = level / max(known)  # KB/s that bring the smallest known worker to the level
    min_gain = model.mean() * settings.min_gain_percent / 100
    donors = sorted(model.workers, key=lambda wid: (-model.load[wid], wid))
    for learner in sorted(model.guessed):
        room = budget - model.assigned_kbps[learner]
        if room <= 0:
            continue
        # The heaviest lease that fits, from any of the most loaded workers: few leases move.
        best: tuple[float, float, str, str, LeaseLoad] | None = None
        for donor in (d for d in donors[:_SEARCH_WIDTH] if d not in model.guessed):
            entry = movable[donor].at_most(room)
            if entry is None:
                continue
            tp, key, lease = entry
            new_load = model.load[learner] + model.cost(learner, tp)
            if new_load >= model.load[donor] - min_gain or new_load > model.limit[learner]:
                continue
            candidate = (-tp, -model.load[donor], donor, key, lease)
            if best is None or candidate[:4] < best[:4]:
                best = candidate
        if best is not None:
            return [(best[4], best[2], learner)]
    return None


def _best_move(
    model: LoadModel,
    movable: dict[str, _Holdings],
    settings: BalancerSettings,
    donor: str,
    receivers: list[str],
) -> list[tuple[LeaseLoad, str, str]] | None:
    """The move of one of ``donor``'s leases that lowers the pair's peak load the most.

    For a donor d and receiver r the pair's peak after moving throughput t is
    max(L_d - c_d t, L_r + c_r t): falling up to t* = (L_d - L_r) / (c_d + c_r), rising after,
    so the best lease is one of the two nearest t* (within the receiver's operating range)."""
    min_gain = model.mean() * settings.min_gain_percent / 100
    before = model.load[donor]
    held = movable[donor]
    if not held.entries:
        return None
    best: tuple[float, str, str, LeaseLoad] | None = None
    for receiver in receivers:
        if model.load[receiver] >= before:
            continue
        rate_d, rate_r = model.rate[donor], model.rate[receiver]
        if rate_d + rate_r <= 0:
            continue
        pivot = (before - model.load[receiver]) / (rate_d + rate_r)
        room = model.limit[receiver] - model.load[receiver]
        cap = room / rate_r if rate_r > 0 else math.inf
        for entry in (held.at_most(min(pivot, cap)), held.above(pivot)):
            if entry is None:
                continue
            tp, key, lease = entry
            new_receiver = model.load[receiver] + tp * rate_r
            if new_receiver > model.limit[receiver]:
                continue
            peak = max(before - tp * rate_d, new_receiver)
            if peak > before - min_gain or peak >= before:
                continue
            candidate = (peak, key, receiver, lease)
            if best is None or candidate[:3] < best[:3]:
                best = candidate
    if best is None:
        return None
    return [(best[3], donor, best[2])]


def _take_back(
    held: _Holdings, give: float, room: float, *, beyond: bool
) -> list[tuple[float, LeaseLoad]]:
    """What an exchange of a lease of ``give`` KB/s takes back from the receiver (``held``),
    when ``room`` KB/s back leaves the pair level: its largest leases lighter than ``give``
    that fit into ``room``, greedily; or (``beyond``) its one lease just above ``room`` and
    still lighter than ``give``, which leaves the donor a little above the receiver instead."""
    if beyond:
        above = held.above(room)
        return [(above[0], above[2])] if above is not None and above[0] < give else []
    taken: list[tuple[float, LeaseLoad]] = []
    take = 0.0
    for tp, _, lease in reversed(held.entries):
        if tp < give and take + tp <= room:
            taken.append((tp, lease))
            take += tp
    return taken


def _best_swap(
    model: LoadModel,
    movable: dict[str, _Holdings],
    settings: BalancerSettings,
    donor: str,
    receivers: list[str],
    *,
    beyond: bool,
) -> list[tuple[LeaseLoad, str, str]] | None:
    """When no single move helps (a hot lease no other worker can absorb as it is), the
    exchange of one of ``donor``'s leases for lighter leases of another worker that lowers the
    pair's peak the most (within the noise guard: the fewest leases): the given lease g, and
    back from the receiver its largest leases that fit, greedily, into
    g - (L_d - L_r) / (c_d + c_r) (what leaves the pair level); or (``beyond``, tried only when
    no such exchange passes) g for the receiver's one lease just above that amount. An exchange
    is one step, and must lower the peak by the minimum gain for every lease it moves."""
    min_gain = model.mean() * settings.min_gain_percent / 100
    before = model.load[donor]
    found: list[tuple[float, int, str, str, LeaseLoad, list[LeaseLoad]]] = []
    for receiver in receivers:
        held = movable[receiver]
        if not held.entries:
            continue
        rate_d, rate_r = model.rate[donor], model.rate[receiver]
        if rate_d + rate_r <= 0:
            continue
        gap = (before - model.load[receiver]) / (rate_d + rate_r)
        for give, given_key, given in movable[donor].entries:
            room = give - gap
            if room <= 0:
                continue  # a plain move of this lease: _best_move's job
            back = _take_back(held, give, room, beyond=beyond)
            if not back:
                continue
            net = give - sum(tp for tp, _ in back)
            new_receiver = model.load[receiver] + net * rate_r
            if new_receiver > model.limit[receiver]:
                continue
            peak = max(before - net * rate_d, new_receiver)
            # Every lease an exchange moves must pay for itself: a hot lease traded for six
            # light ones is worth it only for a large gain, not to shave a point off a peak.
            if peak > before - min_gain * (1 + len(back)) or peak >= before:
                continue
            leases = [lease for _, lease in back]
            found.append((peak, len(back), given_key, receiver, given, leases))
    if not found:
        return None
    # Within the noise guard of the lowest peak, the exchange that moves fewest leases.
    lowest = min(c[0] for c in found)
    near = [c for c in found if c[0] <= lowest + min_gain]
    _, _, _, receiver, given, taken = min(near, key=lambda c: (c[1], c[0], c[2], c[3]))
    return [(given, donor, receiver)] + [(lease, receiver, donor) for lease in taken]
