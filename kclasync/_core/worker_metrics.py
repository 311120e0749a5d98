"""Worker metrics in the KCL 3.x ``<app>-WorkerMetricStats`` format: the worker registry that a
Java 3.x leader and kclasync share.

Owns: the value type of one worker's entry, its DynamoDB item codec (tolerant parsing: an item
that cannot be read raises ``CorruptWorkerMetricsError``; ``decode_items`` skips and counts such
items), the rules a KCL 3.x leader applies to an entry (valid, live), adding a sample, and which
lease-table keys are the registry items of earlier kclasync versions (the one-time migration).

The item, as the KCL 3.1.3 writes it (table HASH key ``wid``; checked against the jar):

========  ====  ===========================================================================
``wid``   S     worker id, the same string as ``leaseOwner`` in the lease table
``lut``   N     last update, wall-clock epoch **seconds**
``sts``   M     metric short name -> L of N: the last samples (10 by default), oldest first;
                a sample of -1 means "could not be measured"
``opr``   M     metric short name -> L of N: operating range; the first value is the maximum
``sup``   N     (later 3.x) support code for breaking features; read and kept, never needed
``slu``   N     (later 3.x) when ``sup`` was last written, epoch seconds
``cap``   N     kclasync only: the worker's capacity, KB/s it could process at 100 % CPU
``impl``  S     kclasync only: ``"kclasync"``. The KCL's reader maps known attributes and
                ignores the rest; kclasync uses it to tell its own entries from Java ones
``hb``    N     kclasync only: the heartbeat, a value that changes with every write (the
                writer's wall-clock milliseconds; readers only compare it for change)
``hbi``   N     kclasync only: the heartbeat period in milliseconds the writer keeps; an
                entry with it is judged silent early (``core.worker_silence``)
========  ====  ===========================================================================

``cap`` is an extra top-level attribute: the KCL 3.x maps the item onto its own bean and ignores
attributes it does not know, so a Java leader reads the entry as before (``sts`` and ``opr``
stay exactly the KCL's). A value that is not a positive finite number reads as no capacity
rather than making the whole entry unreadable: it is advisory.

Metric short names: ``C`` CPU, ``M`` memory, ``NI``/``NO`` network in/out (percent of the
operating range's maximum); ``T`` throughput exists as a short name too, but the leader's
"default metric" test looks for the key ``THROUGHPUT``. A worker that measures none writes empty
``sts`` and ``opr`` maps, as the Java worker does where it cannot read CPU; the leader then
balances on lease throughput only.

Must not: do I/O, read clocks (``now`` is passed in, in epoch seconds), or draw randomness.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import orjson

from kclasync.errors import KclAsyncError

WORKER_ID = "wid"
LAST_UPDATE = "lut"
METRIC_STATS = "sts"
OPERATING_RANGE = "opr"
SUPPORT_CODE = "sup"
SUPPORT_LAST_UPDATE = "slu"
CAPACITY = "cap"
IMPLEMENTATION = "impl"
HEARTBEAT = "hb"
HEARTBEAT_INTERVAL = "hbi"
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

Item = dict[str, Any]


class CorruptWorkerMetricsError(KclAsyncError):
    """An item of the worker-metrics table that cannot be read as a worker entry."""

    def __init__(self, worker_id: str | None, reason: str) -> None:
        super().__init__(f"worker metrics item {worker_id!r} is unreadable: {reason}")
        self.worker_id = worker_id
        self.reason = reason
        #: A digest of the item's content (set by ``decode_items``): it changes when the item
        #: is rewritten, which is all that liveness needs (``presence_marks``).
        self.fingerprint: int | None = None


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
    #: ``"kclasync"`` on a kclasync worker's entry; None on the Java KCL's.
    implementation: str | None = None
    #: kclasync's heartbeat (``hb``): changes with every write; only compared for change.
    heartbeat: int | None = None
    #: kclasync's heartbeat period (``hbi``) in seconds; None: the entry is written only with
    #: the renewals (no early silence judgement).
    heartbeat_interval: float | None = None

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


# ---------------------------------------------------------------------------------------------
# Codec


def encode_item(metrics: WorkerMetrics) -> Item:
    item: Item = {
        WORKER_ID: {"S": metrics.worker_id},
        LAST_UPDATE: {"N": str(metrics.last_update)},
        METRIC_STATS: {
            "M": {k: {"L": [{"N": _num(v)} for v in vs]} for k, vs in metrics.metric_stats.items()}
        },
        OPERATING_RANGE: {
            "M": {
                k: {"L": [{"N": str(int(v))} for v in vs]}
                for k, vs in metrics.operating_range.items()
            }
        },
    }
    if metrics.support_code is not None:
        item[SUPPORT_CODE] = {"N": str(metrics.support_code)}
    if metrics.support_last_update is not None:
        item[SUPPORT_LAST_UPDATE] = {"N": str(metrics.support_last_update)}
    if metrics.capacity_kbps is not None:
        item[CAPACITY] = {"N": _num(metrics.capacity_kbps)}
    if metrics.implementation is not None:
        item[IMPLEMENTATION] = {"S": metrics.implementation}
    if metrics.heartbeat is not None and metrics.heartbeat_interval is not None:
        item[HEARTBEAT] = {"N": str(int(metrics.heartbeat))}
        item[HEARTBEAT_INTERVAL] = {"N": str(round(metrics.heartbeat_interval * 1000))}
    return item


def _heartbeat(item: Item) -> tuple[int | None, float | None]:
    """The advisory ``hb`` and ``hbi`` attributes (``hbi`` in seconds): both readable, with a
    positive period, or neither (an entry without them is never judged silent early)."""
    try:
        beat = int(item[HEARTBEAT]["N"])
        period = float(item[HEARTBEAT_INTERVAL]["N"]) / 1000
    except (KeyError, TypeError, ValueError):
        return None, None
    if not math.isfinite(period) or period <= 0:
        return None, None
    return beat, period


def _capacity(item: Item) -> float | None:
    """The advisory ``cap`` attribute: a positive finite number, else None."""
    attr = item.get(CAPACITY)
    if not isinstance(attr, dict):
        return None
    try:
        value = float(attr.get("N"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value > 0 else None


def _num(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"metric samples must be finite, got {value}")
    return repr(float(value))


def _number(item: Item, name: str, worker_id: str | None) -> float | None:
    attr = item.get(name)
    if attr is None:
        return None
    if not isinstance(attr, dict) or "N" not in attr:
        raise CorruptWorkerMetricsError(worker_id, f"{name} is not a number: {attr!r}")
    try:
        value = float(attr["N"])
    except (TypeError, ValueError):
        raise CorruptWorkerMetricsError(worker_id, f"{name} is not a number: {attr!r}") from None
    if not math.isfinite(value):
        raise CorruptWorkerMetricsError(worker_id, f"{name} is not finite: {attr!r}")
    return value


def _series(item: Item, name: str, worker_id: str | None) -> dict[str, tuple[float, ...]]:
    attr = item.get(name)
    if attr is None:
        return {}
    if not isinstance(attr, dict) or not isinstance(attr.get("M"), dict):
        raise CorruptWorkerMetricsError(worker_id, f"{name} is not a map: {attr!r}")
    out: dict[str, tuple[float, ...]] = {}
    for metric, values in attr["M"].items():
        if not isinstance(values, dict) or not isinstance(values.get("L"), list):
            raise CorruptWorkerMetricsError(worker_id, f"{name}.{metric} is not a list")
        samples = []
        for entry in values["L"]:
            if not isinstance(entry, dict) or "N" not in entry:
                raise CorruptWorkerMetricsError(worker_id, f"{name}.{metric} holds {entry!r}")
            try:
                samples.append(float(entry["N"]))
            except (TypeError, ValueError):
                raise CorruptWorkerMetricsError(
                    worker_id, f"{name}.{metric} holds {entry!r}"
                ) from None
        out[str(metric)] = tuple(samples)
    return out


def decode_item(item: Item) -> WorkerMetrics:
    """Read one item; raises ``CorruptWorkerMetricsError`` naming the worker and the field."""
    wid_attr = item.get(WORKER_ID)
    worker_id = wid_attr.get("S") if isinstance(wid_attr, dict) else None
    if not isinstance(worker_id, str) or not worker_id:
        raise CorruptWorkerMetricsError(None, f"no string {WORKER_ID}: {wid_attr!r}")
    last_update = _number(item, LAST_UPDATE, worker_id)
    if last_update is None:
        raise CorruptWorkerMetricsError(worker_id, f"no {LAST_UPDATE}")
    support = _number(item, SUPPORT_CODE, worker_id)
    support_at = _number(item, SUPPORT_LAST_UPDATE, worker_id)
    impl_attr = item.get(IMPLEMENTATION)
    implementation = impl_attr.get("S") if isinstance(impl_attr, dict) else None
    beat, period = _heartbeat(item)
    return WorkerMetrics(
        worker_id=worker_id,
        last_update=int(last_update),
        metric_stats=_series(item, METRIC_STATS, worker_id),
        operating_range={
            k: tuple(int(v) for v in vs)
            for k, vs in _series(item, OPERATING_RANGE, worker_id).items()
        },
        support_code=None if support is None else int(support),
        support_last_update=None if support_at is None else int(support_at),
        capacity_kbps=_capacity(item),
        implementation=implementation if isinstance(implementation, str) else None,
        heartbeat=beat,
        heartbeat_interval=period,
    )


@attrs.frozen
class DecodedEntries:
    """A full read of the table: readable entries and the errors of the skipped items."""

    entries: tuple[WorkerMetrics, ...]
    corrupt: tuple[CorruptWorkerMetricsError, ...] = ()


def decode_items(items: Iterable[Item]) -> DecodedEntries:
    """Decode every item; unreadable ones are skipped and returned as errors (to be logged and
    counted by the caller), never silently dropped."""
    entries: list[WorkerMetrics] = []
    corrupt: list[CorruptWorkerMetricsError] = []
    for item in items:
        try:
            entries.append(decode_item(item))
        except CorruptWorkerMetricsError as exc:
            exc.fingerprint = _fingerprint(item)
            corrupt.append(exc)
    return DecodedEntries(tuple(entries), tuple(corrupt))


def _fingerprint(item: Item) -> int:
    """A digest that depends on the item's content only, not on the order of its map keys
    (binary values, which JSON cannot hold, are digested through their repr)."""
    return zlib.crc32(orjson.dumps(item, option=orjson.OPT_SORT_KEYS, default=repr))


def presence_marks(decoded: DecodedEntries) -> tuple[tuple[str, int], ...]:
    """Each worker's liveness evidence in one read: ``(worker id, mark)``, where the mark
    changes whenever the worker rewrites its entry. A readable entry's mark is its ``lut``.

    An unreadable item that names its worker counts too, marked by a digest of its content: a
    worker is live while its item changes, readable or not. An item seen half-written (a
    server that creates an updated item before it applies the update shows the key alone for
    a moment) thus still counts as the worker that is writing it, so a taker does not plan the
    fleet without it; an item that stays corrupt stops changing and expires like any silent
    entry. An item without a worker id cannot count."""
    marks = [(e.worker_id, e.last_update) for e in decoded.entries]
    marks.extend(
        (exc.worker_id, exc.fingerprint)
        for exc in decoded.corrupt
        if exc.worker_id is not None and exc.fingerprint is not None
    )
    return tuple(marks)


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
