"""When a starting worker takes its first leases.

A worker that starts together with others waits a short settling time after registering, so
that its first taking round already sees the others and spreads the leases evenly. That wait
is pointless for a worker that is alone: a first worker on an empty table, or a worker that
restarts (with the same id or after a graceful stop) while no other worker is registered. The
registry it reads right after its own first heartbeat tells the two cases apart. Two workers
that start at the same moment cannot both miss each other (each writes its heartbeat before it
reads the registry), so at most one of them skips the wait; the other waits, and balancing
moves leases later if the first took them all.

Owns: that decision, and how long the settling time is for each lease taker.
Must not: read a clock or do I/O.
"""

from __future__ import annotations

from collections.abc import Iterable


def first_round_delay(worker_id: str, registered: Iterable[str], settle_time: float) -> float:
    """Seconds to wait before the first taking round: ``settle_time`` when the registry shows
    any worker but ``worker_id`` (live or not: a first sight cannot tell), else 0."""
    if settle_time <= 0:
        return 0.0
    return settle_time if any(w != worker_id for w in registered) else 0.0


#: The longest settling wait: enough for workers started together to see each other.
SETTLE_CAP = 1.0


def settle_time(*, batch_taker: bool, renewer_interval: float) -> float:
    """The settling wait a starting worker may use before its first round (see
    ``first_round_delay``): the renewer interval, at most ``SETTLE_CAP``, for the balanced
    taker, which plans the whole fleet at once and so wants to see every worker first; 0 for a
    taker that takes a fair share a round (KCL 2.x rules), which starts at once as the Java
    KCL does."""
    if not batch_taker:
        return 0.0
    return max(0.0, min(renewer_interval, SETTLE_CAP))
