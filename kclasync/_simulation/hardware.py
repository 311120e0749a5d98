"""The simulated hardware behind a load-scenario worker's capacity: how many CPUs it has.

Owns: ``model_cores``: a worker's CPU count, consistent with its capacity but not exact.
A worker's capacity is its CPUs times what one of its CPUs processes, and that speed differs
between workers (hardware generations, instance families, what else shares the host): each
worker draws its own per-CPU speed around a nominal value, and its CPU count is its capacity
over that speed, rounded. So a CPU count is informative (a 4000 KB/s worker has more CPUs than
a 1000 KB/s one) without handing anyone the capacity: two workers of one capacity may report
different counts, and capacity per CPU varies by the spread and the rounding.

Must not: be read by the planner (only the worker's own report of its CPUs is), or share a
random stream with the scenario (drawing here must not change the scenario's traffic or noise).
"""

from __future__ import annotations

import random

#: Nominal KB/s one CPU processes at 100 %.
PER_CORE_KBPS = 500.0
#: Each worker's per-CPU speed is drawn uniformly within +-this share of the nominal.
PER_CORE_SPREAD = 0.25


def model_cores(
    capacity_kbps: float,
    *,
    seed: int,
    worker: str,
    per_core_kbps: float = PER_CORE_KBPS,
    spread: float = PER_CORE_SPREAD,
) -> float:
    """The CPUs of the simulated worker ``worker`` of capacity ``capacity_kbps``: its capacity
    over its own per-CPU speed (``per_core_kbps`` within +-``spread``, drawn from a stream of
    its own, keyed by the run's seed and the worker's name), rounded, at least 1."""
    if per_core_kbps <= 0 or not 0 <= spread < 1:
        raise ValueError(
            f"need per_core_kbps > 0 and 0 <= spread < 1, got {per_core_kbps}, {spread}"
        )
    speed = per_core_kbps * random.Random(f"cores-{seed}-{worker}").uniform(1 - spread, 1 + spread)
    return float(max(1, round(capacity_kbps / speed)))
