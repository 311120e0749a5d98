"""Which faults a simulation injects, how often, and how hard.

Fault kinds (``--faults`` takes a comma-separated subset, or ``all``):

``crash``     a worker's ``run()`` task is cancelled (no release, leases left to expire); a new
              worker (new id, as after a process restart) joins 0.5-2 x failover later.
``leader``    as ``crash``, but the worker that leads (leader-based takers only: with a
              worker-side taker nothing, and no draw of the generator); its leases are counted
              in the failover figures and, apart, in the leader failover ones.
``pause``     a worker freezes for 1.5-3 x failover (a GC-like stall): its lease-table and stream
              calls and its processors block, then everything resumes where it was.
``stop``      a worker stops gracefully (``stop()``: checkpoint, release) and a new one joins:
              a planned move, which must cause neither overlap nor duplicates.
``throttle``  windows of 0.5-1.5 x failover in which 40% of lease-table calls are throttled.
``errors``    throughout, 1% of lease-table and stream calls fail transiently; half of the failed
              lease-table writes were applied anyway (an unknown outcome, like a timeout).
``slow``      2% of batches take 0.3-1.5 x failover to process.
``delay``     lease-table and stream calls take 2-20 ms, and 1% of them 0.5-2 s.
``reshard``   open shards are split, or merged with an adjacent open shard.

Event faults (crash, pause, stop, throttle, reshard) arrive as Poisson processes at
``rate_per_hour`` each, scaled by the simulation's ``fault_rate``.

Owns: the fault vocabulary and the ``OpFaults`` profiles. Must not: read clocks or global
randomness (the harness passes its seeded generators).
"""

from __future__ import annotations

import random

from kclasync._adapters.memory import NO_FAULTS, Latency, OpFaults

ALL_FAULTS = frozenset(
    {"crash", "leader", "pause", "stop", "throttle", "errors", "slow", "delay", "reshard"}
)
EVENT_FAULTS = ("crash", "leader", "pause", "stop", "throttle", "reshard")

#: Events per hour of each event fault kind at ``fault_rate`` 1.
RATE_PER_HOUR = {
    "crash": 6.0,
    "leader": 4.0,
    "pause": 6.0,
    "stop": 6.0,
    "throttle": 4.0,
    "reshard": 8.0,
}

#: Longest injected lease-table latency (seconds) under ``delay``.
MAX_DELAY = 2.0
SLOW_BATCH_SHARE = 0.02


def parse_faults(text: str) -> frozenset[str]:
    """``"crash,pause"`` -> that set; ``"all"`` -> every kind; ``"none"`` or ``""`` -> none."""
    text = text.strip().lower()
    if text in ("", "none"):
        return frozenset()
    if text == "all":
        return ALL_FAULTS
    kinds = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = kinds - ALL_FAULTS
    if unknown:
        raise ValueError(
            f"unknown fault kinds {sorted(unknown)}; choose from {sorted(ALL_FAULTS)} or 'all'"
        )
    return kinds


def _delay(rng: random.Random) -> float:
    if rng.random() < 0.01:
        return rng.uniform(0.5, MAX_DELAY)
    return rng.uniform(0.002, 0.02)


def store_faults(kinds: frozenset[str], *, throttled: bool) -> OpFaults:
    """The lease-table call profile for the active kinds (``throttled``: inside a window)."""
    latency: Latency | None = _delay if "delay" in kinds else None
    errors = "errors" in kinds
    if latency is None and not errors and not throttled:
        return NO_FAULTS
    return OpFaults(
        latency=latency,
        throttle=0.4 if throttled else 0.0,
        transient=0.01 if errors else 0.0,
        transient_after_write=0.5 if errors else 0.0,
    )


def stream_faults(kinds: frozenset[str]) -> OpFaults:
    latency: Latency | None = _delay if "delay" in kinds else None
    errors = "errors" in kinds
    if latency is None and not errors:
        return NO_FAULTS
    return OpFaults(latency=latency, transient=0.01 if errors else 0.0)


def max_store_latency(kinds: frozenset[str]) -> float:
    return MAX_DELAY if "delay" in kinds else 0.0


__all__ = [
    "ALL_FAULTS",
    "EVENT_FAULTS",
    "MAX_DELAY",
    "RATE_PER_HOUR",
    "SLOW_BATCH_SHARE",
    "max_store_latency",
    "parse_faults",
    "store_faults",
    "stream_faults",
]
