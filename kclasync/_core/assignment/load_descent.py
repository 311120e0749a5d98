"""One descent of the load-aware plan (``load_balancer``): the steps from the fleet as it is
until it is within its band.

Owns: ``Round``, what a plan's descents share, and ``descend``: each step off the peak
(``load_steps.best_step``, or ``load_frugal.frugal_step`` for the fewest moves), a learning
lease for a worker priced from a guess, single moves at ``CRUMB_GAIN`` of the minimum gain
where nothing else passes outside the trigger band, and the net moves once no step passes.
Must not: choose between descents (``load_balancer._plan``), read clocks or use randomness.
"""

from __future__ import annotations

from dataclasses import dataclass

from kclasync._core.assignment.load_assignment import (
    CAPACITY_MIN_CPU_PERCENT,
    FleetSnapshot,
    LeaseLoad,
    LoadModel,
    Move,
)
from kclasync._core.assignment.load_band import band_ceiling, out_of_band
from kclasync._core.assignment.load_frugal import frugal_step, model_after, shift
from kclasync._core.assignment.load_settings import BalancerSettings
from kclasync._core.assignment.load_steps import Holdings, best_step, learning_step

__all__ = ["CRUMB_GAIN", "Round", "descend", "stop_peak", "unlearnt"]

#: Out of its trigger band with no step left, a plan's single moves need only this share of
#: the minimum gain (cause 32): a hot lease's holder whose other leases are each below it.
CRUMB_GAIN = 0.25


@dataclass(frozen=True, slots=True)
class Round:
    """What one plan's descents share: the snapshot and its model (left as they are), the
    leases placed in this plan, the unmovable peak, and the rebalance's reasons (``spare``
    leases beyond one per worker, ``triggered`` out of band, ``learning`` for a guessed
    newcomer that holds too little to learn from, only ``once`` a learning lease); the
    band out of which a fleet sets off a plan (``trigger_percent``, its margin applied); and
    the unmovable peak a plan stops at the target band over (``band_peak``: ``peak`` with each
    capacity estimate a standard error smaller; a worker within an estimate's error of the
    band is no reason for a move, cause 33)."""

    snapshot: FleetSnapshot
    model: LoadModel
    throughputs: dict[str, float]
    settings: BalancerSettings
    placed: set[str]
    peak: float
    spare: bool
    triggered: bool
    learning: bool
    once: bool
    trigger_percent: float
    band_peak: float


def stop_peak(rnd: Round, peak_percent: float) -> float:
    """The unmovable peak a plan stops at: ``band_peak`` for the target band, the peak as
    estimated for a polish below it (that aims at the peak itself, a margin under it)."""
    return rnd.band_peak if peak_percent >= rnd.settings.target_percent else rnd.peak


def unlearnt(model: LoadModel, wid: str) -> bool:
    """A worker priced from a guess that holds too little to learn its capacity from: idle, or
    below the CPU a capacity estimate needs (``CAPACITY_MIN_CPU_PERCENT``)."""
    return model.assigned_kbps[wid] <= 0 or model.load[wid] < CAPACITY_MIN_CPU_PERCENT


def descend(
    rnd: Round,
    *,
    frugal: bool = False,
    chain: bool = False,
    peak_percent: float,
    prior: tuple[Move, ...] = (),
    hot: tuple[str, str | None, float] | None = None,
) -> tuple[list[Move], LoadModel]:
    """One plan's steps from ``rnd.model`` (left as it is) until the fleet is within the target
    band: each ``best_step``, or (``frugal``) each ``frugal_step`` when one passes (each
    lowering its pair's peak by the minimum gain, or single moves by a quarter of it once
    out of the trigger band with no step left: ``CRUMB_GAIN``); when not ``triggered`` (only
    an idle worker priced from a guess), its learning lease alone. The moves of a ``prior``
    plan are made first (and no learning lease after them). Returns the
    net moves and the model after them."""
    snapshot, start, throughputs, settings = rnd.snapshot, rnd.model, rnd.throughputs, rnd.settings
    placed, peak, spare, triggered, learning, once = (
        rnd.placed,
        rnd.peak,
        rnd.spare,
        rnd.triggered,
        rnd.learning,
        rnd.once,
    )
    model = model_after(start, throughputs)
    current: dict[str, str] = {}
    holder = None
    if hot is not None:
        key, owner, kbps = hot
        holder = lambda: (current.get(key, owner), kbps)  # noqa: E731
    band = (
        settings.target_percent,
        settings.noise_floor_percent / 2,
        stop_peak(rnd, peak_percent),
        peak_percent,
        holder,
    )
    ceiling = band_ceiling(model, *band)
    movable: dict[str, Holdings] = {wid: Holdings() for wid in model.workers}
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
    current.update(origin)
    order: list[str] = []
    steps = 0
    limit = 4 * len(origin) + 8  # each step strictly lowers the sorted loads; this is a backstop
    changed = 0
    learned = bool(prior)
    crumbs = False

    def make(step: list[tuple[LeaseLoad, str, str]]) -> None:
        nonlocal changed
        for lease, donor, receiver in step:
            tp = throughputs[lease.key]
            shift(model, tp, donor, receiver)
            movable[donor].remove(tp, lease)
            movable[receiver].add(tp, lease)
            changed += (current[lease.key] == origin[lease.key]) - (receiver == origin[lease.key])
            current[lease.key] = receiver
            if lease.key not in order:
                order.append(lease.key)

    leases = {entry[2].key: entry[2] for held in movable.values() for entry in held.entries}
    for move in prior:
        if move.from_worker is not None:
            make([(leases[move.lease_key], move.from_worker, move.to_worker)])
    while steps < limit:
        if settings.max_moves is not None and changed >= settings.max_moves:
            break
        if triggered and out_of_band(model, *band, spare_leases=spare):
            step = None
            if frugal:
                step = frugal_step(model, movable, settings.min_gain_percent, ceiling, chain=chain)
            if step is None:
                step = best_step(model, movable, settings.min_gain_percent)
            if step is None and not (learned and once):
                # Nothing lowers the peak as the loads are priced, but a worker priced from a
                # guess is only known once it carries load: a lease to learn from (``once``:
                # only one, see ``load_balancer._rebalance``).
                step = learning_step(model, movable, settings.min_gain_percent)
                learned = True
            if step is None:
                # A worker far out of band whose leases are each below the minimum gain (a
                # hot lease's holder with 38 leases of under 14 KB/s beside it, in a fleet of
                # 456 shards: 1.11-1.15x the optimum after every change, as every run planned
                # nothing) sheds them in smaller steps (cause 32): only where the fleet is
                # still out of its trigger band (it would stay there for good), and from then
                # on until it is within the target band.
                floor = settings.noise_floor_percent
                crumbs = crumbs or out_of_band(
                    model, rnd.trigger_percent, floor, peak, spare_leases=spare
                )
                if crumbs:
                    # Single moves only: an exchange still pays the whole gain for each lease.
                    gain = settings.min_gain_percent * CRUMB_GAIN
                    step = best_step(model, movable, gain, exchanges=False)
        elif learning and not learned and any(unlearnt(model, w) for w in model.guessed):
            # One lease is enough to learn from: within the band nothing else needs to move,
            # and a few more leases to the newcomer are moves the fewest do not make (nor one
            # to a newcomer given a lease by the steps above).
            step = learning_step(model, movable, settings.min_gain_percent)
            learned = True
        else:
            break
        if step is None:
            break
        if settings.max_moves is not None and changed + len(step) > settings.max_moves:
            break
        steps += 1
        make(step)
    moves = [Move(key, origin[key], current[key]) for key in order if current[key] != origin[key]]
    return moves, model
