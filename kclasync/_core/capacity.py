"""A worker's estimate of its own capacity, and the value it reports to the leader.

Owns: ``CapacityEstimator``: the KB/s a worker could process at 100 % CPU, estimated from its
CPU samples against the throughput of the leases it processes (the running mean of the first
samples, then an EMA), and the reported value, which moves only when the estimate has moved
away from it by more than a dead band. The leader plans on reported capacities; a value that
twitches with every noisy CPU sample would make it re-plan a balanced fleet.

Must not: read clocks, CPU or tables, or draw randomness.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["CapacityEstimator"]


@attrs.define
class CapacityEstimator:
    """``update`` with each report period's processed throughput (KB/s) and CPU (percent);
    ``reported`` is None until ``min_samples`` usable periods have been seen.

    A period is usable when the CPU is between ``min_cpu_percent`` (too little to say anything)
    and ``max_cpu_percent`` (a saturated reading is censored), something was processed, and the
    processed throughput changed by at most ``steady_percent`` since the previous period (a CPU
    sample averages over the period, so right after leases came or went it does not match). The
    estimate is the mean of the per-period ratios ``processed * 100 / cpu`` over the first
    ``1 / alpha`` periods, then an EMA with weight ``alpha``. The reported value follows the
    estimate only when they differ by more than ``dead_band_percent``."""

    alpha: float = 0.05
    min_samples: int = 5
    dead_band_percent: float = 5.0
    min_cpu_percent: float = 5.0
    max_cpu_percent: float = 98.0
    steady_percent: float = 20.0
    estimate: float | None = None
    samples: int = 0
    reported: float | None = None
    last_processed: float | None = None

    def __attrs_post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.min_samples < 1:
            raise ValueError("min_samples must be at least 1")
        if self.dead_band_percent < 0:
            raise ValueError("dead_band_percent must be >= 0")

    def update(self, processed_kbps: float, cpu_percent: float) -> float | None:
        """Fold one period in; returns the value to report (None: nothing known yet)."""
        previous_processed, self.last_processed = self.last_processed, processed_kbps
        steady = previous_processed is not None and abs(
            processed_kbps - previous_processed
        ) <= self.steady_percent / 100.0 * max(previous_processed, 1e-9)
        usable = (
            steady
            and math.isfinite(processed_kbps)
            and math.isfinite(cpu_percent)
            and processed_kbps > 0
            and self.min_cpu_percent <= cpu_percent <= self.max_cpu_percent
        )
        if usable:
            sample = processed_kbps * 100.0 / cpu_percent
            self.samples += 1
            weight = max(self.alpha, 1.0 / self.samples)
            previous = self.estimate if self.estimate is not None else sample
            self.estimate = weight * sample + (1.0 - weight) * previous
        if self.estimate is None or self.samples < self.min_samples:
            return self.reported
        band = self.dead_band_percent / 100.0
        if self.reported is None or abs(self.estimate - self.reported) > band * self.reported:
            self.reported = self.estimate
        return self.reported
