"""Per-lease throughput and a capacity sample, as workers write and read them.

Owns: the per-lease throughput EMA (``throughput_ema``), what a renewal writes of it
(``renewal_throughput``), and the EMA of one worker's capacity from its reports
(``estimate_capacity``; the worker's own estimator is ``capacity.CapacityEstimator``).

Must not: read clocks, tables or metrics.
"""

from __future__ import annotations

import math

from kclasync._core.assignment.capacity import SATURATED_CPU_PERCENT

__all__ = [
    "CAPACITY_MIN_CPU_PERCENT",
    "THROUGHPUT_EMA_ALPHA",
    "estimate_capacity",
    "renewal_throughput",
    "throughput_ema",
]

THROUGHPUT_EMA_ALPHA = 0.5
#: Below this CPU one reading says little about a worker's capacity (a point or two of noise is
#: a large share of it): ``estimate_capacity`` skips such periods, and ``LoadModel`` does not
#: price a worker from one.
CAPACITY_MIN_CPU_PERCENT = 5.0


def throughput_ema(
    previous_kbps: float | None,
    bytes_delivered: int,
    period_seconds: float,
    alpha: float = THROUGHPUT_EMA_ALPHA,
) -> float:
    """One renewal period's throughput folded into the lease's EMA, in KB/s.

    ``bytes_delivered`` is what reached the processor since the previous renewal and
    ``period_seconds`` the time between the two renewals. Without a previous value the sample
    itself is the average (seed 003: alpha 0.5 on the previous and the current value).
    """
    if bytes_delivered < 0:
        raise ValueError(f"bytes_delivered must be >= 0, got {bytes_delivered}")
    if not period_seconds > 0:
        raise ValueError(f"period_seconds must be > 0, got {period_seconds}")
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    sample = bytes_delivered / 1024.0 / period_seconds
    if previous_kbps is None or not math.isfinite(previous_kbps) or previous_kbps < 0:
        return sample
    return alpha * sample + (1.0 - alpha) * previous_kbps


def renewal_throughput(
    previous_kbps: float | None, bytes_delivered: int, since: float | None, now: float
) -> float | None:
    """``throughputKBps`` to write with a renewal sent at ``now``: the EMA (``throughput_ema``)
    of the bytes delivered since the last renewal that wrote it, at ``since``. None (write
    nothing) while there is no period yet: before the first renewal, or ``now`` not after it."""
    if since is None or now <= since:
        return None
    return throughput_ema(previous_kbps, bytes_delivered, now - since)


def estimate_capacity(
    previous_kbps: float | None,
    processed_kbps: float,
    cpu_percent: float,
    *,
    alpha: float = THROUGHPUT_EMA_ALPHA,
    min_cpu_percent: float = CAPACITY_MIN_CPU_PERCENT,
    max_cpu_percent: float = SATURATED_CPU_PERCENT,
) -> float | None:
    """A worker's own estimate of what it could process at 100 % CPU, in KB/s: an EMA of
    ``processed * 100 / cpu`` over its reporting periods. Periods with too little CPU to say
    anything (below ``min_cpu_percent``) or a saturated CPU (above ``max_cpu_percent``, where
    the reading is censored) leave the previous estimate unchanged."""
    if not 0 < alpha <= 1:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    if (
        not math.isfinite(processed_kbps)
        or not math.isfinite(cpu_percent)
        or processed_kbps <= 0
        or not min_cpu_percent <= cpu_percent <= max_cpu_percent
    ):
        return previous_kbps
    sample = processed_kbps * 100.0 / cpu_percent
    if previous_kbps is None or not previous_kbps > 0:
        return sample
    return alpha * sample + (1.0 - alpha) * previous_kbps
