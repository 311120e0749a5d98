"""The load-aware planner's settings (``BalancerSettings``), shared by the plan
(``load_balancer``) and its descents (``load_descent``).

Owns: the bands, the minimum gain, the noise floor and the caps a plan is made with, and their
validation. Must not: plan, or read clocks, tables or metrics.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BalancerSettings"]


@dataclass(frozen=True, slots=True)
class BalancerSettings:
    """``trigger_percent``: rebalance only when a worker is above the fleet's level + this (or
    above the unmovable peak + this, when that is higher; or above its operating range; or a
    worker has nothing), times ``TRIGGER_MARGIN``. ``target_percent``: once triggered, plan
    until no worker is above level (or peak) + this. ``min_gain_percent``: a move must lower
    the higher load of its two workers by at least this share of the mean for each lease it
    moves (noise guard).
    ``noise_floor_percent``: a worker whose load is its measured CPU (no capacity) counts as
    outside a band only when it is also this many CPU points above the level (at a level of a
    few percent, 10 % of it is well below the noise of one reading); predicted loads have no such
    floor. ``max_moves``: cap per plan (None: no cap). ``peak_target_percent``: where one hot
    lease sets the optimum (its unmovable peak, this much lower, is still above the level's
    target band), a triggered plan carries on until every worker but the one holding that lease
    is within the peak + this (negative: below it), when that moves at most ``POLISH_FACTOR``
    times the leases + 1, and at most ``POLISH_EXTRA`` more
    (the three constants are ``load_balancer``'s)."""

    trigger_percent: float = 10.0
    target_percent: float = 5.0
    min_gain_percent: float = 1.0
    noise_floor_percent: float = 1.0
    max_moves: int | None = None
    take_expired_sticky: bool = False
    peak_target_percent: float = -1.0

    def __post_init__(self) -> None:
        if not 0 <= self.target_percent <= self.trigger_percent:
            raise ValueError("need 0 <= target_percent <= trigger_percent")
        if self.min_gain_percent < 0 or self.noise_floor_percent < 0:
            raise ValueError("min_gain_percent and noise_floor_percent must be >= 0")
        if self.max_moves is not None and self.max_moves < 0:
            raise ValueError("max_moves must be >= 0")
