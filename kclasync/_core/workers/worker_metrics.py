"""Worker metrics in the KCL 3.x ``<app>-WorkerMetricStats`` format: the worker registry that a
Java 3.x leader and kclasync share.

Owns: the value type of one worker's entry, the rules a KCL 3.x leader applies to an entry
(valid, live), adding a sample, when a kclasync worker may report CPU among Java workers, and
which lease-table keys are the registry items of earlier kclasync versions (the one-time
migration).

The item's attributes and their codec: ``_core.workers.worker_metrics_item``. ``cap``,
``impl``, ``hb``, ``hbi``, ``sil`` and ``mv`` are kclasync's own; a KCL 3.x leader ignores
attributes it does not know.

Metric short names: ``C`` CPU, ``M`` memory, ``NI``/``NO`` network in/out (percent of the
operating range's maximum); ``T`` throughput exists as a short name too, but the leader's
"default metric" test looks for the key ``THROUGHPUT``. A worker that measures none writes empty
``sts`` and ``opr`` maps, as the Java worker does where it cannot read CPU; the leader then
balances on lease throughput only.

Must not: do I/O, read clocks (``now`` is passed in, in epoch seconds), or draw randomness.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import attrs

#: The ``impl`` value of every entry a kclasync worker writes.
KCLASYNC = "kclasync"

CPU = "C"
MEMORY = "M"
NETWORK_IN = "NI"
NETWORK_OUT = "NO"
#: The KCL tests ``sts`` for this *name* (not a short name) to mean "balance on throughput".
THROUGHPUT_MARKER = "THROUGHPUT"

#: noOfPersistedMetricsPerWorkerMetrics (KCL default): samples kept per metric.
DEFAULT_SAMPLES_KEPT = 10
#: workerMetricsReporterFreqInMillis (KCL default), in seconds.
DEFAULT_REPORT_PERIOD = 30.0
#: A sample value meaning "this metric could not be read".
FAILED_SAMPLE = -1.0

#: The lease-table key prefix of the registry items earlier kclasync versions wrote there.
LEGACY_WORKER_KEY_PREFIX = "__worker__:"


@attrs.frozen
class SilenceDigest:
    """What a kclasync leader publishes in its own entry for early failover
    (``core.workers.silence_digest``)."""

    #: Workers the leader judged silent and worth following -> the heartbeat value each stood
    #: still at.
    silent: Mapping[str, int] = attrs.field(factory=dict)
    #: Moves each time the leader saw an entry join or leave the registry.
    members: int = 0


@attrs.frozen
class WorkerMetrics:
    """One worker's entry."""

    worker_id: str
    #: Wall-clock epoch seconds of the last report.
    last_update: int
    #: Metric short name -> recent samples, oldest first.
    metric_stats: Mapping[str, tuple[float, ...]] = attrs.field(factory=dict)
    #: Metric short name -> operating range (first value: the maximum).
    operating_range: Mapping[str, tuple[int, ...]] = attrs.field(factory=dict)
    support_code: int | None = None
    support_last_update: int | None = None
    #: kclasync's extra attribute: KB/s this worker could process at 100 % CPU (None: unknown).
    capacity_kbps: float | None = None
    #: kclasync's extra attribute: the relative standard error of an estimated
    #: ``capacity_kbps`` (0.05: within about 5 %); None for a configured capacity or none.
    capacity_error: float | None = None
    #: kclasync's extra attribute: the CPUs this worker may use (its cgroup or ECS limit, its
    #: affinity mask, or a configured value); a hint to price a worker that has no capacity
    #: yet (None: unknown).
    cores: float | None = None
    #: ``"kclasync"`` on a kclasync worker's entry; None on the Java KCL's.
    implementation: str | None = None
    #: kclasync's heartbeat (``hb``): changes with every write; only compared for change.
    heartbeat: int | None = None
    #: kclasync's heartbeat period (``hbi``) in seconds; None: the entry is written only with
    #: the renewals (no early silence judgement).
    heartbeat_interval: float | None = None
    #: kclasync's silence digest (``sil``, ``mv``): only on the leader's entry.
    digest: SilenceDigest | None = None

    def with_sample(
        self, metric: str, value: float, *, maximum: int = 100, keep: int = DEFAULT_SAMPLES_KEPT
    ) -> WorkerMetrics:
        """A copy with ``value`` appended to ``metric`` (at most ``keep`` samples) and the
        metric's operating range set to ``[maximum]``."""
        if keep < 1:
            raise ValueError("keep must be at least 1")
        samples = (*self.metric_stats.get(metric, ()), float(value))[-keep:]
        return attrs.evolve(
            self,
            metric_stats={**self.metric_stats, metric: samples},
            operating_range={**self.operating_range, metric: (maximum,)},
        )

    def reported_at(self, now: float) -> WorkerMetrics:
        return attrs.evolve(self, last_update=int(now))

    def without(self, metric: str) -> WorkerMetrics:
        """A copy that reports nothing for ``metric`` (neither samples nor operating range)."""
        return attrs.evolve(
            self,
            metric_stats={k: v for k, v in self.metric_stats.items() if k != metric},
            operating_range={k: v for k, v in self.operating_range.items() if k != metric},
        )


def uses_default_metric(metrics: WorkerMetrics) -> bool:
    """No explicit metric (both maps empty, or ``sts`` names ``THROUGHPUT``): the leader
    balances this worker on lease throughput alone."""
    if not metrics.metric_stats and not metrics.operating_range:
        return True
    return THROUGHPUT_MARKER in metrics.metric_stats


def is_valid(metrics: WorkerMetrics) -> bool:
    """The KCL 3.x leader's validity test; an invalid entry is ignored (the worker gets no
    leases). Every measured metric needs an operating range whose maximum is not 0."""
    if uses_default_metric(metrics):
        return True
    if any(name not in metrics.operating_range for name in metrics.metric_stats):
        return False
    return all(rng and rng[0] != 0 for rng in metrics.operating_range.values())


def is_failing(metrics: WorkerMetrics) -> bool:
    """Some metric's latest sample is the failure marker -1."""
    return any(s and s[-1] == FAILED_SAMPLE for s in metrics.metric_stats.values())


def is_live(metrics: WorkerMetrics, now: float, report_period: float) -> bool:
    """Whether a KCL 3.x leader with reporting period ``report_period`` (seconds; the leader's
    ``workerMetricsReporterFreqInMillis``) counts this worker when it assigns at wall-clock
    ``now``: a valid entry, updated within two periods (compared in whole seconds, as the
    leader does), with no failing metric. Wall clocks of reporter and leader are compared here:
    the KCL's design, so hosts need roughly synchronised clocks."""
    threshold = math.floor(now - 2 * report_period)
    return is_valid(metrics) and metrics.last_update >= threshold and not is_failing(metrics)


def may_report_metric(
    entries: Iterable[WorkerMetrics],
    worker_id: str,
    now: float,
    *,
    present_within: float = 2 * DEFAULT_REPORT_PERIOD,
) -> bool:
    """Whether a kclasync worker may report a measured metric (CPU) in its entry.

    A KCL 3.x leader compares each worker only with the workers that report the *same*
    metrics: its fleet average is taken per metric name, and a worker that reports none (the
    "default metric") is scored on lease throughput. Mixing the two makes the scores
    incomparable: a default-metric worker whose leases carry no throughput yet always scores
    highest (100 % of headroom), and no rebalance ever moves leases from it to a worker that
    reports CPU. So a CPU-reporting kclasync worker in a fleet of Java workers that report no
    CPU gets no leases at all (observed with the KCL 3.1.3 jar).

    The rule: report a metric unless a worker of another implementation (an entry without the
    kclasync marker) that is present (``lut`` within ``present_within`` seconds of ``now``,
    wall clock, by default the two default KCL report periods after which a Java leader drops
    it too) reports the default metric. kclasync entries never decide it, so a kclasync-only
    fleet goes back to CPU once the Java workers have gone."""
    horizon = now - present_within
    return not any(
        e.worker_id != worker_id
        and e.implementation != KCLASYNC
        and e.last_update >= horizon
        and uses_default_metric(e)
        for e in entries
    )


def live_workers(
    entries: Sequence[WorkerMetrics], now: float, report_period: float
) -> frozenset[str]:
    """The worker ids a KCL 3.x leader would assign to at ``now``."""
    return frozenset(e.worker_id for e in entries if is_live(e, now, report_period))


# ---------------------------------------------------------------------------------------------
# One-time migration of the lease table


def legacy_registry_keys(lease_keys: Iterable[str]) -> list[str]:
    """The lease-table keys that are worker-registry items of earlier kclasync versions (the
    Java KCL cannot parse them as leases); a worker deletes them on start."""
    return sorted(k for k in lease_keys if k.startswith(LEGACY_WORKER_KEY_PREFIX))


def entry_timeout(entry: WorkerMetrics, worker_timeout: float) -> float:
    """How long a leader counts a worker live after its entry's ``lut`` last changed (on the
    leader's clock). A kclasync entry: ``worker_timeout`` (kclasync reports every renewer
    interval). Another implementation's (a Java KCL worker, which reports every
    ``workerMetricsReporterFreqInMillis``, 30 s by default): two default report periods, the
    Java leader's own rule, and never less than ``worker_timeout``; with the shorter window a
    Java worker would be live for only part of each period and a leader's balancing run could
    miss it every time."""
    if entry.implementation == KCLASYNC:
        return worker_timeout
    return max(worker_timeout, 2 * DEFAULT_REPORT_PERIOD)
