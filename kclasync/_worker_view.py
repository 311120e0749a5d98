"""Rendering the fleet's workers for people (``kclasync workers``): each worker's reported
metrics (``<table>-WorkerMetricStats``: latest CPU sample and operating range, capacity), the
throughput of the leases it owns and their count.

Must not: decide liveness or assignment.
"""

from __future__ import annotations

from collections.abc import Iterable

from kclasync._adapters.aws import ClientOptions
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import CPU, WorkerMetrics


def _metric(entry: WorkerMetrics | None, name: str) -> str:
    if entry is None:
        return "-"
    samples = entry.metric_stats.get(name, ())
    if not samples:
        return "-"
    latest = samples[-1]
    rng = entry.operating_range.get(name, ())
    limit = f"/{rng[0]}" if rng else ""
    return "failed" if latest < 0 else f"{latest:.1f}{limit}"


def render_workers(leases: Iterable[Lease], entries: Iterable[WorkerMetrics]) -> list[str]:
    """One line per worker that owns a lease or has a metrics entry, sorted by id; leases
    without an owner are counted on a last line."""
    by_worker = {e.worker_id: e for e in entries}
    count: dict[str, int] = {}
    kbps: dict[str, float] = {}
    unowned = 0
    for lease in leases:
        if lease.checkpoint.is_shard_end:
            continue
        if lease.owner is None:
            unowned += 1
            continue
        count[lease.owner] = count.get(lease.owner, 0) + 1
        kbps[lease.owner] = kbps.get(lease.owner, 0.0) + (lease.throughput_kbps or 0.0)
    ids = sorted(set(count) | set(by_worker))
    lines = [
        f"{'worker':<28} {'leases':>6} {'assigned KB/s':>13} {'CPU %/range':>12} "
        f"{'capacity KB/s':>13} {'updated':>11}"
    ]
    for wid in ids:
        entry = by_worker.get(wid)
        updated = str(entry.last_update) if entry is not None else "-"
        cap = entry.capacity_kbps if entry is not None else None
        capacity = "-" if cap is None else f"{cap:.1f}"
        name = wid if len(wid) <= 28 else "…" + wid[-27:]
        lines.append(
            f"{name:<28} {count.get(wid, 0):>6} {kbps.get(wid, 0.0):>13.1f} "
            f"{_metric(entry, CPU):>12} {capacity:>13} {updated:>11}"
        )
    lines.append(f"{len(ids)} workers, {sum(count.values())} leases owned, {unowned} unowned")
    return lines


async def print_workers(options: ClientOptions, table: str) -> int:
    from botocore.exceptions import ClientError

    from kclasync._adapters.dynamodb import DynamoLeaseStore
    from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
    from kclasync._adapters.worker_registry import worker_metrics_table_name
    from kclasync.errors import AdapterError

    async with options.create_client("dynamodb") as client:
        scan = await DynamoLeaseStore(client, table).list_leases()
        entries: tuple[WorkerMetrics, ...] = ()
        note = ""
        metrics_table = worker_metrics_table_name(table)
        try:
            entries = (await DynamoWorkerMetrics(client, metrics_table).list_workers()).entries
        except (AdapterError, ClientError) as exc:
            note = f"(no worker metrics: {metrics_table} could not be read: {exc})"
    print("\n".join(render_workers(scan.leases, entries)))
    if note:
        print(note)
    return 0
