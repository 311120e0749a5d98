"""Prometheus metrics for consumers.

Owns: metric names, labels and help texts. Several consumers (workers) may share one registry;
they are told apart by the ``worker`` label. Per-shard series carry ``stream`` and ``shard``.
"""

from __future__ import annotations

import threading
import weakref

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

_LOCK = threading.Lock()
_BY_REGISTRY: weakref.WeakKeyDictionary[CollectorRegistry, ConsumerMetrics] = (
    weakref.WeakKeyDictionary()
)

_W = ("application", "worker")
_S = ("application", "worker", "stream", "shard")


class ConsumerMetrics:
    """The metric families of one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.leases_held = Gauge(
            "kclasync_leases_held", "Leases held by the worker", _W, registry=r
        )
        self.renewals = Counter(
            "kclasync_lease_renewals_total", "Successful lease renewals", _W, registry=r
        )
        self.renewal_failures = Counter(
            "kclasync_lease_renewal_failures_total",
            "Lease renewals that failed (lost lease or unreachable table)",
            (*_W, "reason"),
            registry=r,
        )
        self.renewal_lateness = Histogram(
            "kclasync_lease_renewal_lateness_seconds",
            "How long after its due time each lease renewal was sent (a busy event loop or a "
            "slow round of the worker's renewals)",
            _W,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
            registry=r,
        )
        self.reads_limit = Gauge(
            "kclasync_reads_in_flight_limit",
            "GetRecords calls the worker lets run at once: max_reads_in_flight, less while its "
            "lease renewals run late (renewals_first)",
            _W,
            registry=r,
        )
        self.leases_lost = Counter(
            "kclasync_leases_lost_total", "Leases this worker lost", _W, registry=r
        )
        self.takes = Counter("kclasync_lease_takes_total", "Available leases taken", _W, registry=r)
        self.steals = Counter(
            "kclasync_lease_steals_total", "Leases stolen from other workers", _W, registry=r
        )
        self.released = Counter(
            "kclasync_leases_released_total", "Leases released by this worker", _W, registry=r
        )
        self.records = Counter(
            "kclasync_records_processed_total", "Records processed successfully", _S, registry=r
        )
        self.bytes = Counter(
            "kclasync_bytes_processed_total", "Record payload bytes processed", _S, registry=r
        )
        self.millis_behind = Gauge(
            "kclasync_millis_behind_latest",
            "How far the last GetRecords call or fan-out event was behind the tip of the shard",
            _S,
            registry=r,
        )
        self.checkpoints = Counter(
            "kclasync_checkpoints_total", "Checkpoints written", _S, registry=r
        )
        self.processor_failures = Counter(
            "kclasync_processor_failures_total",
            "Batches a processor failed on after every retry",
            _S,
            registry=r,
        )
        self.processor_errors = Counter(
            "kclasync_processor_errors_total",
            "Exceptions raised by processors (each retry counts)",
            _S,
            registry=r,
        )
        self.malformed_aggregates = Counter(
            "kclasync_malformed_aggregated_records_total",
            "Records with the KPL magic bytes that did not parse (delivered as they are)",
            _S,
            registry=r,
        )
        self.throttles = Counter(
            "kclasync_throttled_total", "Throttling errors from AWS", (*_W, "service"), registry=r
        )
        self.retries = Counter(
            "kclasync_aws_retries_total",
            "AWS calls retried after a throttling or transient error, by who retried (layer: "
            "sdk for botocore's own attempts, named by API operation; kclasync for the "
            "runtime's, named by call, e.g. renew_lease), service, operation and the error "
            "code (or network error) of the failed attempt",
            (*_W, "layer", "service", "operation", "code"),
            registry=r,
        )
        self.fanout_subscriptions = Counter(
            "kclasync_fanout_subscriptions_total",
            "SubscribeToShard calls (enhanced fan-out)",
            _S,
            registry=r,
        )
        self.fanout_resubscriptions = Counter(
            "kclasync_fanout_resubscriptions_total",
            "Fan-out subscriptions renewed, by why the previous one ended",
            (*_S, "reason"),
            registry=r,
        )
        self.corrupt_leases = Gauge(
            "kclasync_corrupt_leases",
            "Lease-table items that could not be read as leases in the last scan",
            _W,
            registry=r,
        )
        self.corrupt_worker_entries = Gauge(
            "kclasync_corrupt_worker_entries",
            "Worker-metrics table items that could not be read in the last registry read",
            _W,
            registry=r,
        )


def metrics_for(registry: CollectorRegistry | None) -> ConsumerMetrics:
    registry = REGISTRY if registry is None else registry
    with _LOCK:
        metrics = _BY_REGISTRY.get(registry)
        if metrics is None:
            metrics = ConsumerMetrics(registry)
            _BY_REGISTRY[registry] = metrics
        return metrics
