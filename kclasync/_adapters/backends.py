"""Backends: where a consumer's lease table, lock items, worker registry and streams live.

Owns: ``Backend`` (the seam ``Consumer(backend=...)`` takes, as an HTTP client takes a
transport), ``Adapters`` (what a backend hands the worker: the stores and clients, and the
wall clock that stamps registry entries), ``AWSBackend`` (DynamoDB and Kinesis through
aiobotocore, the default) and ``AdapterBackend`` (adapters given ready-made: in-memory ones,
wrappers that inject faults; every such worker lives on the event loop's clock).
Must not: make protocol decisions, retry (the worker wraps every adapter in its retry policy),
or build runtime parts.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable
from typing import Any

import attrs

from kclasync._adapters.aws import ClientOptions
from kclasync._adapters.cpu_metrics import CpuReader
from kclasync._adapters.fanout import FanOutClient
from kclasync._adapters.memory import MemoryCoordinatorState, MemoryLeaseStore
from kclasync._adapters.memory_worker_metrics import MemoryWorkerMetrics
from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore, StreamClient
from kclasync._adapters.worker_registry import WorkerRegistry

__all__ = ["AWSBackend", "AdapterBackend", "Adapters", "Backend"]

#: Told of each retry the SDK makes inside one call: (service, operation, error code).
OnRetry = Callable[[str, str, str], None] | None


@attrs.frozen
class Adapters:
    """What a backend hands one worker."""

    store: LeaseStore
    stream_client: StreamClient
    locks: CoordinatorStateStore
    registry: WorkerRegistry
    #: Stamps this worker's registry entry (``lut``): wall time on AWS, loop time in memory.
    wall_clock: Callable[[], float]
    #: Where the worker's CPU utilisation comes from (None: not reported).
    cpu_reader: CpuReader | None = None
    #: Enhanced fan-out over the backend's Kinesis client (None: not available).
    fanout: FanOutClient | None = None
    #: Removes a pre-3.x registry's items from the lease table at start-up (AWS only).
    legacy_cleanup: Callable[[], Awaitable[list[str]]] | None = None


class Backend(abc.ABC):
    """Where a ``Consumer``'s lease table and streams live: ``AWSBackend`` (the default) or
    ``kclasync.testing.MemoryBackend``. How a backend hands its adapters to the worker is
    internal; the two backends are the supported ones."""

    @abc.abstractmethod
    async def _connect(
        self, stack: contextlib.AsyncExitStack, table_name: str, *, on_retry: OnRetry = None
    ) -> Adapters:
        """The adapters of one worker on ``table_name``; clients are closed with ``stack``.
        ``on_retry(service, operation, code)``: told of each retry an SDK makes by itself."""


class AWSBackend(Backend):
    """DynamoDB and Kinesis, through clients built from ``client_options`` (or from
    ``region_name``, ``endpoint_url`` and ``session``)."""

    def __init__(
        self,
        *,
        region_name: str | None = None,
        endpoint_url: str | None = None,
        session: Any = None,
        client_options: ClientOptions | None = None,
    ) -> None:
        if client_options is None:
            client_options = ClientOptions(
                region_name=region_name, endpoint_url=endpoint_url, session=session
            )
        elif region_name or endpoint_url or session:
            raise ValueError("give either client_options or region/endpoint/session")
        self.client_options = client_options

    async def _connect(
        self, stack: contextlib.AsyncExitStack, table_name: str, *, on_retry: OnRetry = None
    ) -> Adapters:
        from kclasync._adapters import sdk_retries
        from kclasync._adapters.coordinator_state import (
            DynamoCoordinatorState,
            coordinator_table_name,
        )
        from kclasync._adapters.cpu_metrics import detect_cpu_reader
        from kclasync._adapters.dynamodb import DynamoLeaseStore
        from kclasync._adapters.kinesis import KinesisStreamClient
        from kclasync._adapters.worker_metrics_table import (
            DynamoWorkerMetrics,
            remove_legacy_registry_items,
        )
        from kclasync._adapters.worker_registry import worker_metrics_table_name

        options = self.client_options
        session = options.new_session()
        ddb = await stack.enter_async_context(options.create_client("dynamodb", session))
        kin = await stack.enter_async_context(options.create_client("kinesis", session))
        if on_retry is not None:
            for client, service in ((ddb, "dynamodb"), (kin, "kinesis")):
                sdk_retries.count(client, functools.partial(on_retry, service))

        async def legacy_cleanup() -> list[str]:
            return await remove_legacy_registry_items(ddb, table_name)

        return Adapters(
            store=DynamoLeaseStore(ddb, table_name),
            stream_client=KinesisStreamClient(kin),
            locks=DynamoCoordinatorState(ddb, coordinator_table_name(table_name)),
            registry=DynamoWorkerMetrics(ddb, worker_metrics_table_name(table_name)),
            wall_clock=time.time,
            cpu_reader=detect_cpu_reader(asyncio.get_running_loop().time),
            fanout=FanOutClient(kin),
            legacy_cleanup=legacy_cleanup,
        )


class AdapterBackend(Backend):
    """Adapters given ready-made (tests, the simulation, benchmarks). Without ``locks`` each
    worker gets lock items of its own (it leads alone; the leader's duties are safe to run
    twice); without ``registry`` the one that goes with an in-memory table, else a private one.
    The registry is stamped with the event loop's clock, virtual or not, unless ``wall_clock``
    is given."""

    def __init__(
        self,
        store: LeaseStore,
        stream_client: StreamClient,
        *,
        locks: CoordinatorStateStore | None = None,
        registry: WorkerRegistry | None = None,
        wall_clock: Callable[[], float] | None = None,
        cpu_reader: CpuReader | None = None,
    ) -> None:
        self.store = store
        self.stream_client = stream_client
        self.locks = locks
        self.registry = registry
        self.wall_clock = wall_clock
        self.cpu_reader = cpu_reader

    async def _connect(
        self, stack: contextlib.AsyncExitStack, table_name: str, *, on_retry: OnRetry = None
    ) -> Adapters:
        registry = self.registry
        if registry is None:
            store = self.store
            registry = (
                store.worker_registry()
                if isinstance(store, MemoryLeaseStore)
                else MemoryWorkerMetrics()
            )
        return Adapters(
            store=self.store,
            stream_client=self.stream_client,
            locks=self.locks if self.locks is not None else MemoryCoordinatorState(),
            registry=registry,
            wall_clock=self.wall_clock or asyncio.get_running_loop().time,
            cpu_reader=self.cpu_reader,
        )
