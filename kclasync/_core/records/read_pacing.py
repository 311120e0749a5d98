"""How long a shard's fetcher waits before its next GetRecords call.

A shard that returned records, or that is behind the tip, is read again after the short busy
pause. A shard that is caught up (no records, nothing behind) is idle: its first idle pause is the
configured idle time, and each further empty read in a row multiplies the pause by
``IDLE_GROWTH`` up to the maximum idle time, never beyond it. Any record (or any lag) brings the
pause straight back to the busy pause. So a shard that wakes up has its first record read at most
the maximum idle time after it was written (plus one call), and a quiet shard costs a call per
maximum idle time instead of one per idle time.

Owns: that decision, for the runtime's fetchers and (through them) the simulation.
Must not: read a clock, sleep, or do I/O.
"""

from __future__ import annotations

import attrs

#: Each further empty read of a caught-up shard multiplies its idle pause by this.
IDLE_GROWTH = 2.0


@attrs.frozen
class ReadPause:
    """The pause before a shard's next read, and the empty reads in a row that led to it."""

    delay: float
    idle_streak: int


def next_read_pause(
    *,
    records: int,
    millis_behind: int | None,
    idle_streak: int,
    busy: float,
    idle: float,
    max_idle: float,
) -> ReadPause:
    """The pause after a read that returned ``records`` records and ``millis_behind``
    (MillisBehindLatest; None: not reported, read as caught up).

    ``idle_streak``: the caught-up reads in a row before this one (0 after a read with records
    or lag, and before the first read). ``busy``: the pause after a read with records or lag;
    ``idle``: the first idle pause; ``max_idle``: the longest idle pause (below ``idle`` it is
    read as ``idle``: no growth).
    """
    if idle <= 0:
        raise ValueError(f"idle must be positive, got {idle!r}")
    if records > 0 or millis_behind:
        return ReadPause(busy, 0)
    ceiling = idle_ceiling(idle, max_idle)
    delay = idle
    for _ in range(idle_streak):
        delay *= IDLE_GROWTH
        if delay >= ceiling:
            # At the ceiling the streak stops counting, so it stays small.
            return ReadPause(ceiling, idle_streak)
    return ReadPause(delay, idle_streak + 1)


def idle_ceiling(idle: float, max_idle: float | None) -> float:
    """The longest pause between reads of an idle shard (so the bound on its wake-up):
    ``max_idle``, but never below ``idle``; None: ``idle`` (no growth)."""
    if max_idle is None:
        return idle
    return max(idle, max_idle)
