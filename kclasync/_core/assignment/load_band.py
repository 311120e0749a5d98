"""Where a fleet stands against its band, for the load-aware planner (``load_balancer``).

Owns: the unmovable peak no plan can go below (``peak_floor``: the hottest lease alone on the
worker where it costs least, and what is pinned), the most load a worker may carry within a
band (``band_ceiling``) and whether the fleet is out of balance (``out_of_band``: a worker above
the band or its operating range, or an idle newcomer beside spare leases).
Must not: plan moves (``load_balancer``, ``load_steps``, ``load_frugal``), read clocks or tables.
"""

from __future__ import annotations

from collections.abc import Callable

from kclasync._core.assignment.load_assignment import FleetSnapshot, LoadModel

__all__ = ["GUESS_ERROR", "band_ceiling", "out_of_band", "peak_floor"]

#: How far off a capacity guessed from a worker's CPU count may be (its per-CPU speed differs
#: from the fleet's): ``peak_floor`` prices a guessed worker as this much smaller.
GUESS_ERROR = 1.5


def peak_floor(
    model: LoadModel,
    snapshot: FleetSnapshot,
    throughputs: dict[str, float],
    *,
    guess_error: float = GUESS_ERROR,
    sigmas: float = 0.0,
) -> float:
    """A load no plan can bring the most loaded worker below: the hottest lease alone on the
    worker where it costs least (a price from a guess counted ``guess_error`` times higher,
    an estimate ``sigmas`` standard errors smaller), and what is pinned (sticky leases, leases
    in handoff) on each worker. Above the fleet's
    level, the balance is judged against it: moves that level the other workers below an
    unmovable peak do not lower the peak."""
    live = model.workers
    hottest = max(
        (throughputs[lease.key] for lease in snapshot.leases if not lease.expired),
        default=0.0,
    )
    # Where the hottest lease costs least; a worker priced from a guess (a newcomer's CPU count
    # at the fleet's capacity per CPU) counts as ``GUESS_ERROR`` times smaller: the guess is
    # that far off at times, and judged by it a peak already in band on a known worker looked
    # above it (a 4000 KB/s newcomer guessed at 4577 took the hot lease off a 4000 KB/s worker,
    # and the plan shuffled the leases behind it). A newcomer that much larger still counts.
    prices = [
        r * guess_error
        if wid in model.guessed
        else r * (1.0 + model.doubt[wid]) * (1.0 + sigmas * model.error[wid])
        for wid, r in model.rate.items()
    ]
    cheapest = min((r for r in prices if r > 0), default=0.0)
    pinned = dict.fromkeys(live, 0.0)
    for lease in snapshot.leases:
        if lease.owner in pinned and not lease.expired and (lease.sticky or lease.in_handoff):
            pinned[lease.owner] += model.cost(lease.owner, throughputs[lease.key])
    return max(hottest * cheapest, max(pinned.values(), default=0.0))


def band_ceiling(
    model: LoadModel,
    band_percent: float,
    floor: float,
    peak: float,
    peak_percent: float | None = None,
    holder: Callable[[], tuple[str | None, float]] | None = None,
    level: float | None = None,
) -> Callable[[str], float]:
    """The most load a worker may carry within the band: the fleet's level + band (or the
    unmovable peak + band, when higher); a measured load also ``floor`` points above the level
    (a CPU reading is only known to within its noise; a predicted load is not). With
    ``peak_percent`` (below the band, may be negative), every worker is held to the unmovable
    peak + that instead, but the ``holder`` of the hottest lease (its id and the lease's KB/s)
    to what that lease costs on it. The level does not change as leases move (it is the
    capacity-weighted mean), so neither does this. ``level`` replaces the model's own."""
    level = model.level() if level is None else level
    top = max(level * (1 + band_percent / 100), peak * (1 + band_percent / 100))
    rest = top
    tight = peak_percent is not None and peak_percent < band_percent
    if peak_percent is not None and tight:
        rest = max(level * (1 + band_percent / 100), peak * (1 + peak_percent / 100))

    def ceiling(wid: str) -> float:
        mine = rest
        if tight and holder is not None:
            owner, kbps = holder()
            if wid == owner:
                mine = max(level * (1 + band_percent / 100), model.cost(wid, kbps))
        return max(mine, level + floor) if wid in model.measured else mine

    return ceiling


def out_of_band(
    model: LoadModel,
    band_percent: float,
    floor: float = 0.0,
    peak: float = 0.0,
    peak_percent: float | None = None,
    holder: Callable[[], tuple[str | None, float]] | None = None,
    *,
    spare_leases: bool = True,
    empty_band_percent: float | None = None,
    level: float | None = None,
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
    moves leases for nothing. ``level`` replaces the model's own."""
    level = model.level() if level is None else level

    def above(percent: float) -> bool:
        ceiling = band_ceiling(model, percent, floor, peak, peak_percent, holder, level)
        return any(
            load > ceiling(wid) or load > model.limit[wid] for wid, load in model.load.items()
        )

    if above(band_percent):
        return True
    empty = (
        level > 0
        and spare_leases
        and any(v <= 0 and wid not in model.guessed for wid, v in model.assigned_kbps.items())
    )
    return empty and above(band_percent if empty_band_percent is None else empty_band_percent)
