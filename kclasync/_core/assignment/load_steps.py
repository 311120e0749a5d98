"""The steps of the load-aware plan (``load_balancer``): which lease to move next.

Owns: each worker's movable leases sorted by throughput (``Holdings``), the receivers a step
searches (``search_receivers``) and the choice of one step against the predicted loads:
``best_step`` takes from the fleet's peak worker (or a worker above its operating range) the
single move that lowers the pair's peak the most, else the best exchange of one of its leases
for lighter ones; ``learning_step`` gives a worker priced from a guess (no capacity reported
yet) one light lease, so it learns its capacity. The fewest-moves step is ``load_frugal``'s.
A step must lower the pair's peak by the minimum gain for every lease it moves.
Must not: change the model (the caller applies a step), read clocks or use randomness; ties
are broken by load, lease key and worker id.
"""

from __future__ import annotations

import bisect
import math

from kclasync._core.assignment.load_assignment import LeaseLoad, LoadModel

__all__ = ["SEARCH_WIDTH", "Holdings", "best_step", "by_cost", "learning_step", "search_receivers"]

_Entry = tuple[float, str, LeaseLoad]
# Donors tried from the most loaded and receivers from the least loaded, per step: keeps a plan
# for hundreds of workers fast; each step still strictly improves, so convergence is unchanged.
SEARCH_WIDTH = 12
# ... plus the few workers where a lease costs least (the largest): a hot lease may fit only
# there, and in a large fleet those need not be among the least loaded.
_CHEAPEST = 3


def search_receivers(donor: str, lightest: list[str], cheapest: list[str]) -> list[str]:
    """The receivers searched for ``donor``: the least loaded, then the cheapest."""
    out = [wid for wid in lightest if wid != donor][:SEARCH_WIDTH]
    out += [wid for wid in cheapest if wid != donor and wid not in out][:_CHEAPEST]
    return out


def by_cost(model: LoadModel) -> list[str]:
    return sorted(model.workers, key=lambda wid: (model.rate[wid], model.load[wid], wid))


class Holdings:
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


def best_step(
    model: LoadModel,
    movable: dict[str, Holdings],
    min_gain_percent: float,
    *,
    exchanges: bool = True,
) -> list[tuple[LeaseLoad, str, str]] | None:
    """The next step off the fleet's peak (``_donors``): the best single move, else (with
    ``exchanges``) the best exchange, else the exchange that takes back a little more (one
    lease just above what levels the pair, then one lease more than fits under it); None
    when none passes."""
    lightest = sorted(model.workers, key=lambda wid: (model.load[wid], wid))
    cheapest = by_cost(model)
    for donor in _donors(model):
        receivers = search_receivers(donor, lightest, cheapest)
        step = _best_move(model, movable, min_gain_percent, donor, receivers)
        for beyond, more in ((False, False), (True, False), (True, True)):
            if step is None and exchanges:
                step = _best_swap(
                    model, movable, min_gain_percent, donor, receivers, beyond=beyond, more=more
                )
        if step is not None:
            return step
    return None


def learning_step(
    model: LoadModel, movable: dict[str, Holdings], min_gain_percent: float
) -> list[tuple[LeaseLoad, str, str]] | None:
    """One light lease for a worker priced from a guess (no capacity reported), the heaviest
    that fits from the most loaded workers, within what would bring the fleet's smallest known
    worker to the level: enough CPU for its estimate, and no overload should it be that small
    (the average's price overfilled a small newcomer). Until it carries load, whether the peak
    could go there (a hot lease on a large newcomer) is unknown: the plan's last resort when
    nothing lowers the peak, and its only step for such a worker idle beside a fleet in band;
    one per plan (``load_balancer``)."""
    level = model.level()
    known = [model.rate[wid] for wid in model.workers if wid not in model.guessed]
    if not model.guessed or not known or max(known) <= 0:
        return None
    budget = level / max(known)  # KB/s that bring the smallest known worker to the level
    min_gain = model.mean() * min_gain_percent / 100
    donors = sorted(model.workers, key=lambda wid: (-model.load[wid], wid))
    for learner in sorted(model.guessed):
        room = budget - model.assigned_kbps[learner]
        if room <= 0:
            continue
        # The heaviest lease that fits, from any of the most loaded workers: few leases move.
        best: tuple[float, float, str, str, LeaseLoad] | None = None
        rate = model.rate[learner]
        for donor in (d for d in donors[:SEARCH_WIDTH] if d not in model.guessed):
            # ... and that leaves the learner below the donor (a lease that fits the budget but
            # not that hid the lighter ones that do: a small newcomer beside large workers).
            gap = model.load[donor] - min_gain - model.load[learner]
            below = gap / rate if rate > 0 else room
            entry = movable[donor].at_most(min(room, below))
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
    movable: dict[str, Holdings],
    min_gain_percent: float,
    donor: str,
    receivers: list[str],
) -> list[tuple[LeaseLoad, str, str]] | None:
    """The move of one of ``donor``'s leases that lowers the pair's peak load the most.

    For a donor d and receiver r the pair's peak after moving throughput t is
    max(L_d - c_d t, L_r + c_r t): falling up to t* = (L_d - L_r) / (c_d + c_r), rising after,
    so the best lease is one of the two nearest t* (within the receiver's operating range)."""
    min_gain = model.mean() * min_gain_percent / 100
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
            worst = model.load[receiver] + model.dear(receiver, tp)
            if worst > model.limit[receiver]:
                continue
            peak = max(before - tp * rate_d, new_receiver)
            if max(peak, worst) > before - min_gain or peak >= before:
                continue
            candidate = (peak, key, receiver, lease)
            if best is None or candidate[:3] < best[:3]:
                best = candidate
    if best is None:
        return None
    return [(best[3], donor, best[2])]


def _take_back(
    held: Holdings, give: float, room: float, *, beyond: bool, more: bool = False
) -> list[tuple[float, LeaseLoad]]:
    """What an exchange of a lease of ``give`` KB/s takes back from the receiver (``held``),
    when ``room`` KB/s back leaves the pair level: its largest leases lighter than ``give``
    that fit into ``room``, greedily; or (``beyond``) its one lease just above ``room`` and
    still lighter than ``give``, which leaves the donor a little above the receiver instead;
    or (``beyond`` and ``more``) the greedy fill and the lightest of its other leases, for a
    receiver whose leases are each below ``room`` but fill it only together with one more."""
    if beyond and not more:
        above = held.above(room)
        return [(above[0], above[2])] if above is not None and above[0] < give else []
    taken: list[tuple[float, LeaseLoad]] = []
    take = 0.0
    rest: list[tuple[float, LeaseLoad]] = []
    for tp, _, lease in reversed(held.entries):
        if tp < give and take + tp <= room:
            taken.append((tp, lease))
            take += tp
        elif tp < give:
            rest.append((tp, lease))
    if more:
        return [*taken, rest[-1]] if rest else []
    return taken


def _best_swap(
    model: LoadModel,
    movable: dict[str, Holdings],
    min_gain_percent: float,
    donor: str,
    receivers: list[str],
    *,
    beyond: bool,
    more: bool = False,
) -> list[tuple[LeaseLoad, str, str]] | None:
    """When no single move helps (a hot lease no other worker can absorb as it is), the
    exchange of one of ``donor``'s leases for lighter leases of another worker that lowers the
    pair's peak the most (within the noise guard: the fewest leases): the given lease g, and
    back from the receiver its largest leases that fit, greedily, into
    g - (L_d - L_r) / (c_d + c_r) (what leaves the pair level); or (``beyond``, tried only when
    no such exchange passes) g for the receiver's one lease just above that amount. An exchange
    is one step, and must lower the peak by the minimum gain for every lease it moves."""
    min_gain = model.mean() * min_gain_percent / 100
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
            back = _take_back(held, give, room, beyond=beyond, more=more)
            if not back:
                continue
            net = give - sum(tp for tp, _ in back)
            new_receiver = model.load[receiver] + net * rate_r
            worst = model.load[receiver] + model.dear(receiver, net)
            if worst > model.limit[receiver]:
                continue
            peak = max(before - net * rate_d, new_receiver)
            # Every lease an exchange moves must pay for itself: a hot lease traded for six
            # light ones is worth it only for a large gain, not to shave a point off a peak.
            if max(peak, worst) > before - min_gain * (1 + len(back)) or peak >= before:
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
