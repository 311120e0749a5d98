"""The protocol's periods a worker derives from its failover time when none is configured.

Owns: how often held leases are renewed (the KCL's failover / 3 - epsilon), how often the taker
scans (the KCL's 2 x (failover + epsilon) with early failover, failover + epsilon without), the
registry heartbeat of early failover (off in the leader-based modes), when a registry entry
that stood still means a dead worker, and how often the leader-based modes assign and discover.
Also owns when each held lease is renewed (``first_renewal_due``, ``renewal_round_due``,
``renewals_due``: spread over the interval, not all at once) and when renewals run late enough
to say so (``late_renewals``).
Must not: hold settings or their defaults (``kclasync._config``), read a clock or do I/O.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping

from kclasync._core.workers.worker_silence import default_heartbeat_interval

#: Registry entries carry whole seconds (``lut``): a worker's entry may stand still this much
#: longer than its report period without the worker being dead.
ENTRY_RESOLUTION = 1.0


def renewer_interval(failover_time: float, epsilon: float) -> float:
    """How often held leases are renewed: three renewals per failover time, a little early."""
    return failover_time / 3 - epsilon


def taker_interval(failover_time: float, epsilon: float, *, early_failover: bool) -> float:
    """How often the taker scans and takes when no period is configured. With early failover
    (dead workers found through the registry) the Java KCL's 2 x (failover + epsilon); without
    it failover + epsilon, so a dead worker's leases are taken within about 2 x failover."""
    if early_failover:
        return 2 * (failover_time + epsilon)
    return failover_time + epsilon


def heartbeat_interval(
    failover_time: float,
    configured: float | None,
    *,
    early_failover: bool,
    leader_based: bool,
) -> float | None:
    """The registry heartbeat period of early failover; None when it is off, also in the
    leader-based modes, where the leader assigns what a dead worker held."""
    if not early_failover or leader_based:
        return None
    if configured is not None:
        return configured
    return default_heartbeat_interval(failover_time)


def worker_timeout(failover_time: float) -> float:
    """How long a registry entry may stand still before its worker no longer counts as live,
    when none is configured."""
    return failover_time + ENTRY_RESOLUTION


def assignment_interval(failover_time: float) -> float:
    """Leader-based modes: how often the leader plans (the KCL 3.x default of
    leaseAssignmentIntervalMillis, 2 x failover)."""
    return 2 * failover_time


def discovery_interval(failover_time: float) -> float:
    """Leader-based modes: how often a worker looks for leases assigned to it: well within the
    failover time, so an assigned lease is renewed before the leader could judge it expired."""
    return failover_time / 3


#: A renewal sent this share of the failover time after it was due is worth a WARNING: the
#: lease has then lived that much of its failover time without a renewal on its way, and a
#: worker whose loop is that busy is on its way to losing leases it is still processing.
LATE_RENEWAL_SHARE = 0.1


def renewal_round_due(due: float, interval: float, started: float) -> float:
    """When a lease's next renewal is due, after the one due at ``due`` was started at
    ``started``: one interval after ``due``; but a worker that fell behind (started more than
    an interval late) is not asked to catch up with renewals back to back: the next one is due
    when this one started."""
    return max(due + interval, started)


def renewal_phase(key: str) -> float:
    """A lease's fixed point in the renewal interval, as a share of it, from its key: spread
    evenly over [0, 1) across keys, the same on every run and host (CRC-32, not ``hash``)."""
    return zlib.crc32(key.encode()) / 2**32


def first_renewal_due(key: str, seen: float, interval: float) -> float:
    """When a lease the renewer first sees at ``seen`` (just taken or handed to this worker) is
    first renewed: at the next of its slots, the points ``phase x interval`` past each whole
    multiple of the interval on the loop's clock; within one interval of ``seen``, as a round
    would renew it.

    The KCL renews every lease in one round per interval. With thousands of leases such a round
    is a burst of requests that one event loop sends over a second or more, so the round's last
    renewals go out late by that much (measured: p99 0.19 x the failover time at 2,000 busy
    shards, failover 10 s). On their slots, leases taken together (a start, a failover) are
    renewed spread over the interval and stay so, one interval apart each: the loop sends a
    steady trickle and each renewal goes out when it is due."""
    offset = renewal_phase(key) * interval
    periods = math.ceil((seen - offset) / interval)
    return offset + periods * interval


#: Renewals due within this share of the interval from now go out together (one wake-up).
RENEWAL_BATCH_SHARE = 0.02
#: The renewer wakes at least this often (a share of the interval) to see newly held leases.
RENEWER_WAKE_SHARE = 0.25


def renewals_due(
    schedule: Mapping[str, float], now: float, interval: float
) -> tuple[list[str], float]:
    """The leases of ``schedule`` (key -> due time) to renew now (due within the batch window),
    and when the renewer wakes next: the next due time after them, at the latest a wake share
    of the interval from now."""
    horizon = now + RENEWAL_BATCH_SHARE * interval
    due = [key for key, at in schedule.items() if at <= horizon]
    later = [at for at in schedule.values() if at > horizon]
    wake = now + RENEWER_WAKE_SHARE * interval
    if later:
        wake = min(wake, min(later))
    return due, wake


def late_renewals(lateness: float, failover_time: float) -> bool:
    """Whether a renewal sent ``lateness`` seconds after it was due is late enough to warn:
    more than ``LATE_RENEWAL_SHARE`` of the failover time."""
    return lateness > LATE_RENEWAL_SHARE * failover_time
