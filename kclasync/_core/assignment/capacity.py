"""A worker's estimate of its own capacity, and the value it reports to the leader.

Owns: ``CapacityEstimator``: the KB/s a worker could process at 100 % CPU, estimated from its
CPU samples against the throughput of the leases it processes (a least-squares fit of
``cpu = rate * processed`` over the samples, equal weights at first, then forgetting old ones
slowly), its standard error, and the reported value, which moves only when the estimate has
moved away from it by more than the estimate's own uncertainty (and a small dead band). The
leader plans on reported capacities; a value that twitches with every noisy CPU sample would
make it re-plan a balanced fleet, and a value stuck at an early, rough estimate leaves the
fleet unbalanced. And ``capacity_from_cores``: the leader's guess of a worker's capacity before
it has reported one, from the CPUs it may use (its ``cor`` hint) and the fleet's known capacity
per CPU.

Must not: read clocks, CPU or tables, or draw randomness.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import attrs

__all__ = ["SATURATED_CPU_PERCENT", "CapacityEstimator", "capacity_from_cores"]

#: Near 100 % a CPU reading is censored: the worker is saturated and its backlog grows, so its
#: CPU over its throughput says only that it is smaller than that. The estimators skip readings
#: above this, and the leader prices a worker that reads this or more at least at its guess
#: (``LoadModel``).
SATURATED_CPU_PERCENT = 98.0


def capacity_from_cores(
    cores: float | None, known: Iterable[tuple[float | None, float | None]]
) -> float | None:
    """A worker's capacity guessed from its ``cores`` (the CPUs it may use) and ``known``
    (capacity, cores) pairs of the fleet's other workers: the fleet's known capacity per core
    (summed capacities over summed cores, of the workers that report both) times its cores.
    None when the worker gives no core count or no worker reports both: the caller then keeps
    its own guess. Capacity per core is the same on every worker only when the hardware is;
    the guess is a prior, replaced by the worker's own estimate as soon as it reports one."""
    if cores is None or not math.isfinite(cores) or cores <= 0:
        return None
    capacity = cores_total = 0.0
    for cap, n in known:
        if cap is None or n is None or not (math.isfinite(cap) and math.isfinite(n)):
            continue
        if cap > 0 and n > 0:
            capacity += cap
            cores_total += n
    if cores_total <= 0:
        return None
    return cores * capacity / cores_total


@attrs.define
class CapacityEstimator:
    """``update`` with each report period's processed throughput (KB/s) and CPU (percent);
    ``reported`` is None until enough is known.

    A period is usable when something was processed, the CPU is at most ``max_cpu_percent`` (a
    saturated reading is censored), and the processed throughput changed by at most
    ``steady_percent`` since the previous period (a CPU sample averages over the period, so
    right after leases came or went it does not match). Low readings are kept: dropping the
    samples that noise pushed below a threshold would bias a lightly loaded worker's estimate
    low; a low reading simply weighs little in the fit.

    The CPU cost per KB/s is ``sum(p * c) / sum(p * p)`` over the usable periods (regression
    through the origin: a sample weighs by its throughput, so noise on small readings does not
    skew it, unlike a mean of ratios), with every period weighted equally over the first
    ``1 / alpha`` periods, then old ones forgotten by ``1 - alpha`` per period. The capacity is
    ``100 / cost``. It is reported once ``min_samples`` periods are in, their mean CPU is at
    least ``min_cpu_percent`` (too little load says nothing) and the relative standard error of
    the fit is at most ``max_error_percent``. While it is still learning (the first
    ``1 / alpha`` periods) the reported value follows the estimate whenever they differ by more
    than ``dead_band_percent``: a rough first value is replaced as the data comes in. After that
    it moves only when they also differ by more than ``band_sigmas`` standard errors: a good
    value stays still. The standard error takes one CPU reading's noise as at least
    ``cpu_noise_percent`` points, whatever the residuals of a few samples say; the worker reports
    it with the capacity, and the leader prices a move onto the worker that much higher."""

    alpha: float = 0.02
    min_samples: int = 3
    dead_band_percent: float = 2.0
    band_sigmas: float = 2.0
    max_error_percent: float = 10.0
    min_cpu_percent: float = 2.0
    max_cpu_percent: float = SATURATED_CPU_PERCENT
    steady_percent: float = 20.0
    cpu_noise_percent: float = 1.0
    estimate: float | None = None
    samples: int = 0
    reported: float | None = None
    last_processed: float | None = None
    #: Weighted sums of the fit: weights, squared weights, p*p, p*c, c*c, c, and w*w*p*p.
    _sw: float = 0.0
    _pp: float = 0.0
    _pc: float = 0.0
    _cc: float = 0.0
    _c: float = 0.0
    _w2pp: float = 0.0

    def __attrs_post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.min_samples < 1:
            raise ValueError("min_samples must be at least 1")
        if self.dead_band_percent < 0 or self.band_sigmas < 0 or self.cpu_noise_percent < 0:
            raise ValueError("dead_band_percent, band_sigmas and cpu_noise_percent must be >= 0")
        if not self.max_error_percent > 0:
            raise ValueError("max_error_percent must be > 0")

    @property
    def relative_error(self) -> float:
        """The fit's relative standard error (inf before two usable periods)."""
        if self.samples < 2 or self._pp <= 0 or self._pc <= 0:
            return math.inf
        rate = self._pc / self._pp
        residual = max(0.0, self._cc - self._pc * self._pc / self._pp)
        # A few samples' residuals can sit close by chance (three read 0.4 % where the estimate
        # was 12 % off): one reading is taken as never closer than ``cpu_noise_percent``.
        variance = max(residual / max(self._sw - 1.0, 1.0), self.cpu_noise_percent**2)
        return math.sqrt(variance * self._w2pp) / self._pp / rate

    def _fold(self, processed: float, cpu: float) -> None:
        self.samples += 1
        keep = 1.0 - self.alpha if self.samples > 1.0 / self.alpha else 1.0
        self._sw = self._sw * keep + 1.0
        self._pp = self._pp * keep + processed * processed
        self._pc = self._pc * keep + processed * cpu
        self._cc = self._cc * keep + cpu * cpu
        self._c = self._c * keep + cpu
        self._w2pp = self._w2pp * keep * keep + processed * processed
        if self._pc > 0:
            self.estimate = 100.0 * self._pp / self._pc

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
            and 0 <= cpu_percent <= self.max_cpu_percent
        )
        if usable:
            self._fold(processed_kbps, cpu_percent)
        if self.estimate is None or self.samples < self.min_samples:
            return self.reported
        # One period has no error estimate of its own: it is taken as it is (min_samples = 1).
        error = self.relative_error if self.samples >= 2 else 0.0
        if self._c / self._sw < self.min_cpu_percent or error > self.max_error_percent / 100.0:
            return self.reported
        band = self.dead_band_percent / 100.0
        if self.samples > 1.0 / self.alpha:
            band = max(band, self.band_sigmas * error)
        if self.reported is None or abs(self.estimate - self.reported) > band * self.reported:
            self.reported = self.estimate
        return self.reported
