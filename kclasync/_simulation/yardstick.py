"""The load scenario judged against the best possible assignment ("x of optimum").

Owns: per change of a finished ``LoadScenario``, the optimum of max/mean utilisation for the
worker set and rates of every sample in its window (``kclasync._simulation.optimum``, cached per
rates and worker set, so every policy on the same seed shares the solves), the sample's max/mean
as a multiple of it, the assignment runs until it stays within ``SETTLE_FACTOR`` of it, the
leases moved in the window and the fewest moves that reach within ``MOVES_FACTOR`` of the
optimum from the owners at the change.

Must not: drive the scenario or import the solver before it is asked for a verdict (the solver
is a development dependency).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

import attrs

from kclasync._simulation import optimum


class LoadScenario(Protocol):
    """What the yardstick reads of a finished ``load_scenario.LoadScenario`` (a protocol, so
    the scenario can import the yardstick without an import circle)."""

    @property
    def sim(self) -> Any: ...
    @property
    def changes(self) -> list[tuple[str, float]]: ...
    @property
    def marks(self) -> list[tuple[dict[str, float], dict[str, str | None], int]]: ...
    @property
    def utils(self) -> list[tuple[float, dict[str, float]]]: ...
    @property
    def owner_changes(self) -> int: ...
    @property
    def capacity(self) -> Mapping[str, float]: ...

    def _runs_between(self, start: float, end: float) -> int: ...


__all__ = ["MOVES_FACTOR", "SETTLE_FACTOR", "ChangeVerdict", "judge"]

#: A sample is "settled" within this multiple of the optimum's max/mean.
SETTLE_FACTOR = 1.10
#: The fewest moves are counted to reach within this multiple of the optimum.
MOVES_FACTOR = 1.05

_Key = tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]
_CACHE: dict[_Key, optimum.Optimum] = {}


@attrs.frozen(kw_only=True)
class ChangeVerdict:
    change: str
    #: The optimum's max/mean for the worker set at the window's end, and its proven bound.
    optimum: float
    lower_bound: float
    #: Max/mean at the window's end as a multiple of the optimum (of the proven bound: >= 1).
    x_final: float
    #: Assignment runs from the change until every later sample stays within SETTLE_FACTOR of
    #: the optimum (None: never in the window).
    runs: int | None
    seconds: float | None
    moved: int
    #: The fewest moves found (and proven at least) to reach MOVES_FACTOR x the optimum.
    fewest: int
    fewest_lower: int


def _optimum(
    rates: Mapping[str, float], capacities: Mapping[str, float], time_limit: float
) -> optimum.Optimum:
    key = (
        tuple(sorted((k, round(v, 9)) for k, v in rates.items() if v > 0)),
        tuple(sorted(capacities.items())),
    )
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = optimum.best_ratio(rates, capacities, time_limit=time_limit)
    return found


def _ratio(utils: Mapping[str, float], capacities: Mapping[str, float]) -> float:
    """Highest utilisation over the fleet's (processed / capacity, summed over workers)."""
    fleet = sum(u * capacities[w] for w, u in utils.items()) / sum(capacities.values())
    return max(utils.values()) / fleet if fleet > 0 else 1.0


def _runs(scenario: LoadScenario, start: float, settled: float) -> int:
    """Leader runs from the change to ``settled``; for a policy without a leader, the
    assignment intervals that passed (its rounds are every worker's, not one loop's)."""
    settings = scenario.sim.settings
    if settings.taker in ("kcl3", "load"):
        return scenario._runs_between(start, settled)
    interval: float = settings.consumer_config("x").effective_assignment_interval
    return math.ceil((settled - start) / interval - 1e-9)


def judge(scenario: LoadScenario, end: float, *, time_limit: float = 2.0) -> list[ChangeVerdict]:
    """One verdict per change of the finished ``scenario`` (see the module docstring)."""
    bounds = [t for _, t in scenario.changes] + [end]
    out: list[ChangeVerdict] = []
    for i, (name, start) in enumerate(scenario.changes):
        rates, owners, moves_before = scenario.marks[i]
        moves_after = (
            scenario.marks[i + 1][2] if i + 1 < len(scenario.marks) else scenario.owner_changes
        )
        window = [(t, u) for t, u in scenario.utils if bounds[i] <= t < bounds[i + 1] and u]
        if not window or not any(v > 0 for v in rates.values()):
            continue
        xs: list[tuple[float, float]] = []
        last: optimum.Optimum | None = None
        for t, utils in window:
            caps = {w: scenario.capacity[w] for w in utils}
            if len(caps) < 2:
                continue
            last = _optimum(rates, caps, time_limit)
            xs.append((t, _ratio(utils, caps) / last.ratio))
        if last is None:
            continue
        settled: float | None = None
        for t, x in xs:
            if x <= SETTLE_FACTOR and settled is None:
                settled = t
            elif x > SETTLE_FACTOR:
                settled = None
        final_caps = {w: scenario.capacity[w] for w in window[-1][1]}
        fewest, fewest_lower = optimum.fewest_moves(
            {k: v for k, v in rates.items() if v > 0},
            final_caps,
            owners,
            MOVES_FACTOR * last.ratio,
            start=last.assignment,
            time_limit=time_limit,
        )
        out.append(
            ChangeVerdict(
                change=name,
                optimum=last.ratio,
                lower_bound=last.lower_bound,
                x_final=xs[-1][1],
                runs=None if settled is None else _runs(scenario, start, settled),
                seconds=None if settled is None else settled - start,
                moved=moves_after - moves_before,
                fewest=fewest,
                fewest_lower=fewest_lower,
            )
        )
    return out
