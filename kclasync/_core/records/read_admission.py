"""How many GetRecords calls a worker lets run at once: renewals first when its loop is busy.

A worker's event loop runs its lease renewals and its shards' reads and processing in one
queue. When the loop cannot keep up, a renewal waits behind every callback queued ahead of it,
and the queue grows with the reads in flight (each read brings its response, its records and
their processing). A renewal that waits long enough costs the lease, and with it a shard that
was being processed: duplicates, and a move that helps nobody. Reading less often only delays
records (the shard's lag shows it, nothing is lost), so the data path gives way.

The signal is the renewals' own lateness (how long after its due time each one was sent), the
thing to protect. Over each step (``STEP_SHARE`` of the failover time) the worst lateness seen
decides: later than ``LATE_SHARE`` of the failover time (and than ``LATE_FLOOR``) halves the
reads allowed in flight (at least one); within ``ON_TIME_SHARE`` (or ``ON_TIME_FLOOR``) adds one
back, up to the configured ceiling
(``max_reads_in_flight``); in between, or with no renewal seen, the limit stays. Halving on
trouble and growing by one converges on the most reads the loop can carry with renewals on
time, and does not swing back to a full queue at the first quiet step.

Owns: that decision, for the runtime's read slots. Must not: read a clock, sleep, or do I/O.
"""

from __future__ import annotations

import attrs

#: Renewals sent later than this share of the failover time cut the reads in flight (0.2 s at
#: the default 10 s; half of the ``periods.LATE_RENEWAL_SHARE`` that is worth a WARNING).
LATE_SHARE = 0.02
#: Renewals at most this late (as a share of the failover time) let the limit grow back.
ON_TIME_SHARE = 0.005
#: The limit changes at most once per this share of the failover time.
STEP_SHARE = 0.05
#: Floors (seconds) of the two thresholds: with a short failover time (a test's 1-3 s) a loop
#: hiccup of a few tens of milliseconds endangers no lease and must not hold the reads back.
LATE_FLOOR = 0.1
ON_TIME_FLOOR = 0.025


@attrs.frozen
class ReadAdmission:
    """The reads allowed in flight, when that last changed, and the worst renewal lateness
    (seconds) seen since then (None: no renewal seen)."""

    limit: int
    since: float
    worst: float | None = None


def admit_reads(
    state: ReadAdmission,
    *,
    lateness: float | None,
    now: float,
    failover_time: float,
    ceiling: int,
) -> ReadAdmission:
    """The admission after a renewal sent ``lateness`` seconds after it was due (None: no new
    renewal, only time has passed) at ``now``."""
    worst = state.worst
    if lateness is not None:
        worst = lateness if worst is None else max(worst, lateness)
    if now - state.since < STEP_SHARE * failover_time or worst is None:
        return ReadAdmission(state.limit, state.since, worst)
    limit = state.limit
    if worst > max(LATE_SHARE * failover_time, LATE_FLOOR):
        limit = max(1, limit // 2)
    elif worst <= max(ON_TIME_SHARE * failover_time, ON_TIME_FLOOR):
        limit = min(ceiling, limit + 1)
    return ReadAdmission(min(limit, ceiling), now, None)
