"""The DynamoDB item of one worker's entry in ``<app>-WorkerMetricStats``: its codec.

Owns: the attribute names, encoding a ``WorkerMetrics`` value, tolerant decoding (an item that
cannot be read raises ``CorruptWorkerMetricsError``; ``decode_items`` skips and counts such
items), and each worker's liveness marks in one read of the table (``presence_marks``).
Must not: do I/O, read clocks, or judge entries (``kclasync._core.workers.worker_metrics`` holds the
value type and the rules a KCL 3.x leader applies).

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
``cer``   N     kclasync only: the relative standard error of an estimated ``cap`` (0.05:
                within about 5 %); absent for a configured capacity
``cor``   N     kclasync only: the CPUs the worker may use, from its first report (a hint
                that prices a newcomer before its capacity is known)
``impl``  S     kclasync only: ``"kclasync"``. The KCL's reader maps known attributes and
                ignores the rest; kclasync uses it to tell its own entries from Java ones
``hb``    N     kclasync only: the heartbeat, a value that changes with every write (the
                writer's wall-clock milliseconds; readers only compare it for change)
``hbi``   N     kclasync only: the heartbeat period in milliseconds the writer keeps; an
                entry with it is judged silent early (``core.worker_silence``)
``sil``   M     kclasync only, the leader's entry: worker id -> N, the workers it judged
                silent and the heartbeat each stood still at (``core.workers.silence_digest``)
``mv``    N     kclasync only, the leader's entry: moves when an entry joined or left
========  ====  ===========================================================================

``cap``, ``cer`` and ``cor`` are extra top-level attributes: the KCL 3.x maps the item onto its own
bean and ignores attributes it does not know, so a Java leader reads the entry as before (``sts``
and ``opr`` stay exactly the KCL's). A value that is not a positive finite number reads as
unknown rather than making the whole entry unreadable: both are advisory.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable
from typing import Any

import attrs
import orjson

from kclasync._core.workers.worker_metrics import SilenceDigest, WorkerMetrics
from kclasync.errors import KclAsyncError

WORKER_ID = "wid"
LAST_UPDATE = "lut"
METRIC_STATS = "sts"
OPERATING_RANGE = "opr"
SUPPORT_CODE = "sup"
SUPPORT_LAST_UPDATE = "slu"
CAPACITY = "cap"
CORES = "cor"
CAPACITY_ERROR = "cer"
IMPLEMENTATION = "impl"
HEARTBEAT = "hb"
HEARTBEAT_INTERVAL = "hbi"
SILENT = "sil"
MEMBERS = "mv"
#: kclasync's attributes that a report sets when it has them and removes otherwise (a value
#: from an earlier report, or an earlier leadership, no longer holds).
REPLACED_OR_REMOVED = (
    CAPACITY,
    CAPACITY_ERROR,
    CORES,
    HEARTBEAT,
    HEARTBEAT_INTERVAL,
    SILENT,
    MEMBERS,
)

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
    if metrics.capacity_error is not None:
        item[CAPACITY_ERROR] = {"N": _num(metrics.capacity_error)}
    if metrics.cores is not None:
        item[CORES] = {"N": _num(metrics.cores)}
    if metrics.implementation is not None:
        item[IMPLEMENTATION] = {"S": metrics.implementation}
    if metrics.heartbeat is not None and metrics.heartbeat_interval is not None:
        item[HEARTBEAT] = {"N": str(int(metrics.heartbeat))}
        item[HEARTBEAT_INTERVAL] = {"N": str(round(metrics.heartbeat_interval * 1000))}
    if metrics.digest is not None:
        item[SILENT] = {"M": {w: {"N": str(int(v))} for w, v in metrics.digest.silent.items()}}
        item[MEMBERS] = {"N": str(int(metrics.digest.members))}
    return item


def _digest(item: Item) -> SilenceDigest | None:
    """The advisory ``sil`` and ``mv`` attributes: both readable, or no digest (a follower
    then reads the whole registry, as without one)."""
    try:
        silent = {w: int(v["N"]) for w, v in item[SILENT]["M"].items()}
        members = int(item[MEMBERS]["N"])
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return SilenceDigest(silent=silent, members=members)


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


def _capacity(item: Item, name: str = CAPACITY, *, zero: bool = False) -> float | None:
    """An advisory number (``cap``, ``cor``, ``cer``): a positive (or, ``zero``, non-negative)
    finite number, else None."""
    attr = item.get(name)
    if not isinstance(attr, dict):
        return None
    try:
        value = float(attr.get("N"))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and (value > 0 or (zero and value == 0)) else None


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
        capacity_error=_capacity(item, CAPACITY_ERROR, zero=True),
        cores=_capacity(item, CORES),
        implementation=implementation if isinstance(implementation, str) else None,
        heartbeat=beat,
        heartbeat_interval=period,
        digest=_digest(item),
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
