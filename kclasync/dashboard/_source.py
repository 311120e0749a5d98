"""Reading a fleet's state for the dashboard: lease table, worker registry, leader lock, metrics.

Owns: the reads (through the DynamoDB adapters, which own the table formats) and the scraping
of workers' Prometheus endpoints. ``read_workers`` is the one place that knows where the worker
registry lives (``<app>-WorkerMetricStats``).
Must not: interpret what it reads (``_view`` does) or write anything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import aiohttp
from botocore.exceptions import ClientError
from prometheus_client.parser import text_string_to_metric_families

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.protocols import LeaseScan
from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._adapters.worker_registry import WorkerRegistry, worker_metrics_table_name
from kclasync._core.leases.leader_lock import LEADER_LOCK_KEY, LockItem
from kclasync.dashboard._view import FleetRead, WorkerEntry, WorkerMetrics
from kclasync.errors import AdapterError

SCRAPE_TIMEOUT = 2.0


async def read_workers(registry: WorkerRegistry, errors: list[str]) -> list[WorkerEntry]:
    """The worker registry: every entry of ``<app>-WorkerMetricStats`` (kclasync and Java KCL
    3.x workers alike); an entry's ``lut`` (epoch seconds) changes while the worker lives.
    Unreadable entries and a failed read are reported in ``errors``; a missing table (no
    worker has started yet) is no error."""
    try:
        decoded = await registry.list_workers()
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
            errors.append(f"worker registry: {exc}")
        return []
    except AdapterError as exc:
        errors.append(f"worker registry: {exc}")
        return []
    errors.extend(f"worker registry: {exc}" for exc in decoded.corrupt)
    entries = sorted(decoded.entries, key=lambda e: e.worker_id)
    return [WorkerEntry(e.worker_id, str(e.last_update)) for e in entries]


def parse_worker_metrics(text: str, application: str) -> list[WorkerMetrics]:
    """The kclasync series of one Prometheus text exposition, per worker of ``application``."""
    found: dict[str, dict[str, Any]] = {}

    def slot(worker: str) -> dict[str, Any]:
        return found.setdefault(
            worker,
            {"leases": None, "records": {}, "behind": {}, "failures": 0.0, "errors": 0.0},
        )

    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("application") != application or "worker" not in labels:
                continue
            w = slot(labels["worker"])
            name = sample.name
            if name == "kclasync_leases_held":
                w["leases"] = sample.value
            elif name == "kclasync_records_processed_total":
                w["records"][labels.get("shard", "")] = sample.value
            elif name == "kclasync_millis_behind_latest":
                w["behind"][labels.get("shard", "")] = sample.value
            elif name == "kclasync_lease_renewal_failures_total":
                w["failures"] += sample.value
            elif name == "kclasync_processor_errors_total":
                w["errors"] += sample.value
    return [
        WorkerMetrics(
            worker_id=worker,
            leases_held=w["leases"],
            records=w["records"],
            millis_behind=w["behind"],
            renewal_failures=w["failures"],
            processor_errors=w["errors"],
        )
        for worker, w in sorted(found.items())
    ]


class FleetSource:
    """Reads one application's state; used inside ``open()``, which holds the clients."""

    def __init__(
        self,
        application: str,
        *,
        client_options: ClientOptions | None = None,
        table: str | None = None,
        metrics_urls: Sequence[str] = (),
        metrics_text: Callable[[], str] | None = None,
    ) -> None:
        """``metrics_text``: the Prometheus text of workers in this process (their registry's
        ``generate_latest``), read besides ``metrics_urls``."""
        self.application = application
        self.metrics_text = metrics_text
        self.table = table or application
        self.client_options = client_options or ClientOptions()
        self.metrics_urls = tuple(metrics_urls)
        self._store: DynamoLeaseStore | None = None
        self._coordinator: DynamoCoordinatorState | None = None
        self._registry: DynamoWorkerMetrics | None = None
        self._http: aiohttp.ClientSession | None = None

    @contextlib.asynccontextmanager
    async def open(self) -> AsyncIterator[FleetSource]:
        async with contextlib.AsyncExitStack() as stack:
            client = await stack.enter_async_context(self.client_options.create_client("dynamodb"))
            self._store = DynamoLeaseStore(client, self.table)
            self._coordinator = DynamoCoordinatorState(client, coordinator_table_name(self.table))
            self._registry = DynamoWorkerMetrics(client, worker_metrics_table_name(self.table))
            if self.metrics_urls:
                self._http = await stack.enter_async_context(
                    aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT))
                )
            try:
                yield self
            finally:
                self._store = self._coordinator = self._registry = self._http = None

    async def _leader(self, errors: list[str]) -> LockItem | None:
        assert self._coordinator is not None
        try:
            return await self._coordinator.get_lock(LEADER_LOCK_KEY)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") != "ResourceNotFoundException":
                errors.append(f"leader lock: {exc}")
        except AdapterError as exc:
            errors.append(f"leader lock: {exc}")
        return None

    async def _scrape(self, url: str, errors: list[str]) -> list[WorkerMetrics]:
        assert self._http is not None
        try:
            async with self._http.get(url) as resp:
                resp.raise_for_status()
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError) as exc:
            errors.append(f"metrics {url}: {exc or type(exc).__name__}")
            return []
        try:
            return parse_worker_metrics(text, self.application)
        except ValueError as exc:
            errors.append(f"metrics {url}: not Prometheus text ({exc})")
            return []

    async def read(self) -> FleetRead:
        """One poll. A failing part is reported in ``errors``; the rest is still shown."""
        assert self._store is not None, "use inside open()"
        errors: list[str] = []
        scan = LeaseScan(())
        leases_read = False
        try:
            scan = await self._store.list_leases()
            leases_read = True
        except (ClientError, AdapterError) as exc:
            errors.append(f"lease table {self.table!r}: {exc}")
        assert self._registry is not None
        leader_task = asyncio.ensure_future(self._leader(errors))
        workers_task = asyncio.ensure_future(read_workers(self._registry, errors))
        scraped = await asyncio.gather(*(self._scrape(url, errors) for url in self.metrics_urls))
        leader = await leader_task
        workers = await workers_task
        if self.metrics_text is not None:
            scraped.append(parse_worker_metrics(self.metrics_text(), self.application))
        return FleetRead(
            leases=scan.leases,
            corrupt=[str(exc) for exc in scan.corrupt],
            workers=workers,
            leader=leader,
            metrics=[m for ms in scraped for m in ms],
            errors=errors,
            leases_read=leases_read,
        )
