"""The best possible assignment, as a yardstick for the assignment policies.

Owns: for a set of shard rates (KB/s) and worker capacities (KB/s at 100 % CPU), the lowest
max/mean utilisation any assignment of whole shards reaches (``best_ratio``: an integer program
solved with HiGHS through ``highspy``, with a proven lower bound when its time limit cuts the
search short), the bin-packing lower bound of the highest utilisation
(``max_util_lower_bound``), and the fewest lease moves from a given assignment that reach
within a factor of that optimum (``fewest_moves``).

Utilisation of worker w is ``sum of its shards' rates / capacity_w``; the mean is the fleet's,
``total rate / total capacity`` (the same for every assignment), so the lowest max/mean is the
lowest highest utilisation. An unweighted mean over workers would reward loading the small
workers (each KB/s there counts more), which is no goal of an operator.

Must not: be imported by the library's runtime or planners. ``highspy`` is a development
dependency: it is imported lazily, and a clear error says how to install it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Optimum",
    "SolverMissingError",
    "best_ratio",
    "fewest_moves",
    "greedy_assignment",
    "max_util_lower_bound",
    "ratio_of",
]


class SolverMissingError(RuntimeError):
    """highspy is not installed (it is in the development dependency group)."""


def _highspy() -> Any:
    try:
        import highspy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise SolverMissingError(
            "the optimum yardstick needs the HiGHS solver: `uv sync` (dev group) or "
            "`pip install highspy`"
        ) from exc
    return highspy


@dataclass(frozen=True, slots=True)
class Optimum:
    """``ratio``: the lowest max/mean utilisation found; ``lower_bound``: no assignment goes
    below it (equal to ``ratio`` when proven optimal); ``assignment``: shard -> worker reaching
    ``ratio``."""

    ratio: float
    lower_bound: float
    assignment: Mapping[str, str]
    proven: bool

    @property
    def gap(self) -> float:
        """Relative gap between the ratio found and the proven lower bound."""
        return (self.ratio - self.lower_bound) / self.ratio if self.ratio > 0 else 0.0


def ratio_of(
    assignment: Mapping[str, str], rates: Mapping[str, float], capacities: Mapping[str, float]
) -> float:
    """Max/mean utilisation of ``assignment`` (shard -> worker) over ``capacities``' workers,
    the mean being the fleet's: total rate / total capacity."""
    util = dict.fromkeys(capacities, 0.0)
    for shard, worker in assignment.items():
        util[worker] += rates[shard] / capacities[worker]
    fleet = sum(rates[s] for s in assignment) / sum(capacities.values())
    return max(util.values()) / fleet if fleet > 0 else 1.0


def max_util_lower_bound(rates: Mapping[str, float], capacities: Mapping[str, float]) -> float:
    """No assignment's highest utilisation is below max(total rate / total capacity, the
    largest shard on the largest worker)."""
    return max(
        sum(rates.values()) / sum(capacities.values()),
        max(rates.values(), default=0.0) / max(capacities.values()),
    )


def greedy_assignment(
    rates: Mapping[str, float], capacities: Mapping[str, float]
) -> dict[str, str]:
    """Largest shard first onto the worker whose utilisation stays lowest (a starting point)."""
    util = dict.fromkeys(sorted(capacities), 0.0)
    out: dict[str, str] = {}
    for shard in sorted(rates, key=lambda s: (-rates[s], s)):
        best = min(util, key=lambda w: (util[w] + rates[shard] / capacities[w], w))
        util[best] += rates[shard] / capacities[best]
        out[shard] = best
    return out


class _Model:
    """x[s, w] binary (shard s on worker w), then u_max, continuous."""

    def __init__(
        self, rates: Mapping[str, float], capacities: Mapping[str, float], time_limit: float
    ) -> None:
        hs = _highspy()
        self.hs = hs
        self.shards = sorted(rates)
        self.workers = sorted(capacities)
        n_s, n_w = len(self.shards), len(self.workers)
        self.n_x = n_s * n_w
        self.z = self.n_x
        h = hs.Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("time_limit", float(time_limit))
        h.setOptionValue("mip_rel_gap", 1e-4)
        h.setOptionValue("threads", 1)
        inf = hs.kHighsInf
        n = self.n_x + 1
        h.addVars(n, [0.0] * n, [1.0] * self.n_x + [inf])
        h.changeColsIntegrality(
            self.n_x, list(range(self.n_x)), [hs.HighsVarType.kInteger] * self.n_x
        )
        # Each shard on exactly one worker.
        for i in range(n_s):
            idx = [i * n_w + j for j in range(n_w)]
            h.addRow(1.0, 1.0, n_w, idx, [1.0] * n_w)
        # u_w - z <= 0 for every worker.
        for j, w in enumerate(self.workers):
            cap = capacities[w]
            idx = [i * n_w + j for i in range(n_s)] + [self.z]
            val = [rates[s] / cap for s in self.shards] + [-1.0]
            h.addRow(-inf, 0.0, len(idx), idx, val)
        self.h = h
        self.rates, self.capacities = rates, capacities

    def col(self, shard_index: int, worker_index: int) -> int:
        return shard_index * len(self.workers) + worker_index

    def start(self, assignment: Mapping[str, str]) -> None:
        values = [0.0] * (self.n_x + 1)
        wi = {w: j for j, w in enumerate(self.workers)}
        util = dict.fromkeys(self.workers, 0.0)
        for i, s in enumerate(self.shards):
            w = assignment[s]
            values[self.col(i, wi[w])] = 1.0
            util[w] += self.rates[s] / self.capacities[w]
        values[self.z] = max(util.values())
        sol = self.hs.HighsSolution()
        sol.col_value = values
        sol.value_valid = True
        self.h.setSolution(sol)

    def solve(self) -> tuple[dict[str, str] | None, float, float]:
        """(assignment found or None, objective found, dual bound)."""
        self.h.run()
        info = self.h.getInfo()
        if info.primal_solution_status != 2:  # kSolutionStatusFeasible
            return None, math.inf, float(info.mip_dual_bound)
        values = self.h.getSolution().col_value
        n_w = len(self.workers)
        out: dict[str, str] = {}
        for i, s in enumerate(self.shards):
            j = max(range(n_w), key=lambda j: values[i * n_w + j])
            out[s] = self.workers[j]
        return out, float(info.objective_function_value), float(info.mip_dual_bound)


def best_ratio(
    rates: Mapping[str, float], capacities: Mapping[str, float], *, time_limit: float = 10.0
) -> Optimum:
    """The lowest max/mean utilisation over assignments of whole shards (see the module doc):
    one integer program minimising the highest utilisation, started from the greedy
    assignment; skipped when the greedy one already meets the lower bound."""
    rates = {s: r for s, r in rates.items() if r > 0}
    if not rates or len(capacities) < 2:
        return Optimum(1.0, 1.0, greedy_assignment(rates, capacities), True)
    fleet = sum(rates.values()) / sum(capacities.values())
    best = greedy_assignment(rates, capacities)
    found_ratio = ratio_of(best, rates, capacities)
    lower = max_util_lower_bound(rates, capacities) / fleet
    if lower >= found_ratio * (1 - 1e-3):
        return Optimum(found_ratio, lower, best, True)
    model = _Model(rates, capacities, time_limit)
    model.h.setOptionValue("mip_rel_gap", 1e-3)
    model.h.changeColsCost(1, [model.z], [1.0])
    model.start(best)
    found, _, bound = model.solve()
    if found is not None and ratio_of(found, rates, capacities) < found_ratio:
        best, found_ratio = found, ratio_of(found, rates, capacities)
    lower = max(lower, bound / fleet) if math.isfinite(bound) else lower
    lower = min(lower, found_ratio)
    return Optimum(found_ratio, lower, best, lower >= found_ratio * (1 - 1e-3))


def fewest_moves(
    rates: Mapping[str, float],
    capacities: Mapping[str, float],
    current: Mapping[str, str | None],
    target_ratio: float,
    *,
    start: Mapping[str, str] | None = None,
    time_limit: float = 10.0,
) -> tuple[int, int]:
    """(fewest found, proven lower bound) of shards whose worker changes from ``current`` to
    reach max/mean utilisation <= ``target_ratio``. A shard whose current worker is not in
    ``capacities`` (none, or a worker gone) moves in any case. ``start``: an assignment known
    to reach the target (e.g. ``best_ratio``'s)."""
    rates = {s: r for s, r in rates.items() if r > 0}
    forced = sum(1 for s in rates if current.get(s) not in capacities)
    if not rates or len(capacities) < 2:
        return forced, forced
    model = _Model(rates, capacities, time_limit)
    h = model.h
    wi = {w: j for j, w in enumerate(model.workers)}
    # u_max <= target * the fleet's utilisation.
    fleet = sum(rates.values()) / sum(capacities.values())
    h.changeColBounds(model.z, 0.0, target_ratio * fleet)
    stay = [
        model.col(i, wi[owner])
        for i, s in enumerate(model.shards)
        if (owner := current.get(s)) is not None and owner in wi
    ]
    h.changeColsCost(len(stay), stay, [-1.0] * len(stay))
    if start is not None and ratio_of(start, rates, capacities) <= target_ratio:
        model.start(start)
    found, _, bound = model.solve()
    total = len(rates)
    if found is None:
        return total, max(forced, math.ceil(total + bound - 1e-6) if math.isfinite(bound) else 0)
    moved = sum(1 for s in model.shards if found[s] != current.get(s))
    lower = math.ceil(total + bound - 1e-6) if math.isfinite(bound) else forced
    return moved, max(forced, min(lower, moved))
