"""The fewest-moves step of the load-aware plan (``load_balancer``).

Owns: ``frugal_step``, which takes off a worker above its ceiling the lease that brings it
within in one move (the fewest leases, not the most even pair); when no lease fits as it is,
an exchange with the receiver (``_frugal_swap``) or, asked for, a chain of moves through
workers that each pass one lease on (``_frugal_chain``).
And ``pruned``: a finished plan without the moves it can do without.
Must not: change the model (the caller applies a step), read clocks or use randomness; ties
are broken by load, lease key and worker id.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

from kclasync._core.assignment.load_assignment import LeaseLoad, LoadModel, Move
from kclasync._core.assignment.load_steps import SEARCH_WIDTH, Holdings, by_cost, search_receivers

__all__ = ["frugal_step", "model_after", "pruned", "shift"]

# A fewest-moves exchange takes back at most this many leases (``_frugal_swap``).
_FRUGAL_BACK = 2


def frugal_step(
    model: LoadModel,
    movable: dict[str, Holdings],
    min_gain_percent: float,
    ceiling: Callable[[str], float],
    *,
    chain: bool = False,
) -> list[tuple[LeaseLoad, str, str]] | None:
    """A step for the fewest moves: from any worker above its ``ceiling`` (or operating range),
    the move that takes the most of its excess off in one lease while the receiver stays within
    its own ceiling: per donor and receiver the heaviest lease that fits; the most excess
    removed first (a lease larger than the excess removes only the excess), then the lighter
    lease, then the receiver it fills most tightly (the roomiest stay free for heavy leases).
    Largest first, as in bin packing: a heavy lease placed early settles its worker in one
    move. None when no lease fits or none lowers its donor by the minimum gain: the caller
    falls back to ``best_step``, which levels the pair instead (it may take back leases, or fill
    a receiver above the band). With ``chain``, when no lease settles the donor where it fits,
    a chain of moves (``_frugal_chain``) where it is shorter than the exchange; the plan runs
    one descent with chains beside one without (``load_balancer._plan``)."""
    lightest = sorted(model.workers, key=lambda wid: (model.load[wid], wid))
    cheapest = by_cost(model)
    min_gain = model.mean() * min_gain_percent / 100
    tops = {wid: min(ceiling(wid), model.limit[wid]) for wid in model.workers}
    donors = sorted(
        (wid for wid in model.workers if model.load[wid] > tops[wid] and movable[wid].entries),
        key=lambda wid: (-model.load[wid], wid),
    )
    best: tuple[float, float, float, str, str, str, LeaseLoad] | None = None
    for donor in donors[:SEARCH_WIDTH]:
        held = movable[donor]
        rate_d = model.rate[donor]
        if rate_d <= 0:
            continue
        need = (model.load[donor] - tops[donor]) / rate_d  # KB/s the donor must shed
        for receiver in search_receivers(donor, lightest, cheapest):
            rate_r = model.rate[receiver]
            if rate_r <= 0 or model.load[receiver] >= tops[receiver]:
                continue
            dear = rate_r * (1.0 + model.doubt[receiver])
            entry = held.at_most((tops[receiver] - model.load[receiver]) / dear)
            if entry is None:
                continue
            tp, key, lease = entry
            after = model.load[receiver] + tp * dear
            if tp * rate_d < min_gain or after > model.load[donor] - min_gain:
                continue
            candidate = (-min(tp, need), tp, -after, donor, receiver, key, lease)
            if best is None or candidate[:6] < best[:6]:
                best = candidate
    if best is not None and -best[0] >= _need(model, tops, best[3]) * (1 - 1e-9):
        return [(best[6], best[3], best[4])]  # settles its donor in one move
    swap = _frugal_swap(model, movable, min_gain, tops, donors[:1], lightest, cheapest)
    if chain and donors:
        ejected = _frugal_chain(model, movable, min_gain, tops, donors[0], lightest, cheapest)
        if ejected is not None and (swap is None or len(ejected) < len(swap)):
            return ejected
    if swap is not None or best is None:
        return swap
    return [(best[6], best[3], best[4])]


_Step = list[tuple[LeaseLoad, str, str]]
#: Moves in one chain (``_frugal_chain``): a lease to a worker that overflows, one of its
#: leases on to another that may overflow in turn, and one of that one's to a third.
_CHAIN_DEPTH = 3


def _frugal_chain(
    model: LoadModel,
    movable: dict[str, Holdings],
    min_gain: float,
    tops: dict[str, float],
    donor: str,
    lightest: list[str],
    cheapest: list[str],
) -> _Step | None:
    """When no lease settles the peak where it fits as it is, nor an exchange with its
    receiver: a chain. The lightest lease that settles the donor (or, when none does, its
    heaviest) goes to a worker it overflows, which passes its lightest lease that covers the
    overflow (and is lighter than the one it took) on to another, and so on, each worker but
    the donor ending within its ceiling: the fewest moves, then the lowest load among the
    workers touched. At most ``_CHAIN_DEPTH`` moves."""
    rate_d = model.rate[donor]
    entries = movable[donor].entries
    if rate_d <= 0 or not entries:
        return None
    need = _need(model, tops, donor)
    settling = [entry for entry in entries if entry[0] >= need]
    gives = settling[:2] if settling else [entries[-1]]
    found: list[tuple[int, float, str, _Step]] = []
    for give, key, given in gives:
        if give * rate_d < min_gain:
            continue
        for receiver in search_receivers(donor, lightest, cheapest):
            chain = _place(
                model,
                movable,
                tops,
                (give, given),
                donor,
                receiver,
                {donor: -give},
                {key},
                _CHAIN_DEPTH - 1,
                lightest,
                cheapest,
            )
            if chain is not None:
                steps, peak = chain
                found.append((len(steps), peak, key + "/" + receiver, steps))
    if not found:
        return None
    return min(found, key=lambda c: (c[0], c[1], c[2]))[3]


def _place(
    model: LoadModel,
    movable: dict[str, Holdings],
    tops: dict[str, float],
    lease: tuple[float, LeaseLoad],
    source: str,
    target: str,
    added: dict[str, float],
    moved: set[str],
    depth: int,
    lightest: list[str],
    cheapest: list[str],
) -> tuple[_Step, float] | None:
    """``lease`` (KB/s, lease) from ``source`` to ``target`` with the KB/s already ``added``
    per worker by the chain so far; the chain's steps and the highest load it leaves on the
    workers it touched, or None."""
    tp, item = lease
    rate = model.rate[target] * (1.0 + model.doubt[target])
    if rate <= 0:
        return None
    added = dict(added)
    added[target] = added.get(target, 0.0) + tp
    load = model.load[target] + added[target] * rate
    step = [(item, source, target)]
    if load <= min(tops[target], model.limit[target]):
        return step, load
    if depth <= 0:
        return None
    shed = (load - tops[target]) / rate  # KB/s the target must pass on
    # The lightest lease of at least ``shed`` (a hair below it, for rounding), not moved yet.
    entry = movable[target].above(shed * (1 - 1e-9) - 1e-12)
    while entry is not None and entry[1] in moved:
        entry = movable[target].above(entry[0])
    if entry is None or entry[0] >= tp:
        return None
    h, key, nxt = entry
    best: tuple[_Step, float] | None = None
    for onward in search_receivers(target, lightest, cheapest):
        if onward == source:
            continue
        below = model.load[target] + (added[target] - h) * rate
        rest = _place(
            model,
            movable,
            tops,
            (h, nxt),
            target,
            onward,
            {**added, target: added[target] - h},
            moved | {key},
            depth - 1,
            lightest,
            cheapest,
        )
        if rest is None:
            continue
        steps, peak = rest
        candidate = (step + steps, max(peak, below))
        if best is None or (len(candidate[0]), candidate[1]) < (len(best[0]), best[1]):
            best = candidate
    return best


def _need(model: LoadModel, tops: dict[str, float], donor: str) -> float:
    return (model.load[donor] - tops[donor]) / model.rate[donor]


def _frugal_swap(
    model: LoadModel,
    movable: dict[str, Holdings],
    min_gain: float,
    tops: dict[str, float],
    donors: list[str],
    lightest: list[str],
    cheapest: list[str],
) -> list[tuple[LeaseLoad, str, str]] | None:
    """When no lease that settles the peak fits anywhere as it is: the lease that settles it,
    given to the worker where it overflows the ceiling least, and back from that worker its
    heaviest leases (lighter than the given one) until it is within its ceiling again; at most
    ``_FRUGAL_BACK`` of them, and the donor must stay within its own ceiling with them."""
    best: tuple[int, float, str, str, LeaseLoad, list[LeaseLoad]] | None = None
    for donor in donors:
        rate_d = model.rate[donor]
        need = _need(model, tops, donor)
        for give, key, given in movable[donor].entries:
            if give < need:
                continue
            for receiver in search_receivers(donor, lightest, cheapest):
                rate_r = model.rate[receiver]
                over = model.load[receiver] + model.dear(receiver, give) - tops[receiver]
                if rate_r <= 0 or over <= 0:
                    continue
                back: list[tuple[float, LeaseLoad]] = []
                taken = 0.0
                for tp, _, lease in reversed(movable[receiver].entries):
                    if taken * rate_r >= over or len(back) >= _FRUGAL_BACK:
                        break
                    if tp < give:
                        back.append((tp, lease))
                        taken += tp
                if taken * rate_r < over:
                    continue
                donor_after = model.load[donor] - (give - taken) * rate_d
                if donor_after > tops[donor] or model.load[donor] - donor_after < min_gain:
                    continue
                candidate = (len(back), over, key, receiver, given, [b for _, b in back])
                if best is None or candidate[:4] < best[:4]:
                    best = candidate
    if best is None:
        return None
    _, _, _, receiver, given, leases = best
    donor = donors[0]
    return [(given, donor, receiver)] + [(lease, receiver, donor) for lease in leases]


def model_after(
    model: LoadModel, throughputs: dict[str, float], plan: list[Move] | tuple[Move, ...] = ()
) -> LoadModel:
    """A copy of ``model`` (its loads and assigned KB/s; the rest is shared, unchanged) after
    ``plan``'s moves."""
    after = copy.copy(model)
    after.load = dict(model.load)
    after.assigned_kbps = dict(model.assigned_kbps)
    for move in plan:
        if move.from_worker is not None:
            shift(after, throughputs[move.lease_key], move.from_worker, move.to_worker)
    return after


def shift(model: LoadModel, kbps: float, source: str, target: str) -> None:
    """Move ``kbps`` of assigned throughput, and what it costs, from ``source`` to ``target``."""
    model.load[source] -= model.cost(source, kbps)
    model.load[target] += model.cost(target, kbps)
    model.assigned_kbps[source] -= kbps
    model.assigned_kbps[target] += kbps


def pruned(
    model: LoadModel,
    throughputs: dict[str, float],
    plan: list[Move],
    inside: Callable[[list[Move], LoadModel], bool],
    after: LoadModel,
) -> list[Move]:
    """``plan`` (ending within the band: ``inside``; ``after``: the model after it) without
    the moves it can do without: each lease put back where it was, lightest first, while the
    fleet after the rest stays within the band. A descent takes its steps one at a time, and a
    lease moved early to make room may not be needed once a later step has made more
    (held-out-6 medium seed 602's traffic change: 17 moves, 8 of them such; the fewest 6). A
    lease to a worker priced from a guess stays: it is there to learn the worker's capacity
    from. O(moves x (moves + workers)), on the leader, once per plan that ends in the band."""
    order = sorted(
        range(len(plan)), key=lambda i: (throughputs[plan[i].lease_key], plan[i].lease_key)
    )
    dropped: set[int] = set()
    for i in order:
        move = plan[i]
        if move.from_worker is None or move.to_worker in model.guessed:
            continue
        trial = model_after(after, throughputs)
        shift(trial, throughputs[move.lease_key], move.to_worker, move.from_worker)
        rest = [m for j, m in enumerate(plan) if j != i and j not in dropped]
        if inside(rest, trial):
            dropped.add(i)
            after = trial
    return [m for j, m in enumerate(plan) if j not in dropped]
