"""A worker's start-up: its tables and its first shard sync, ready before any loop starts.

Owns: the steps before the task tree runs, overlapped where they are independent (the
coordinator-state and worker-metrics tables beside the lease table and the first shard sync),
the few retries of a start-up step that was throttled or failed transiently (how many and how
long between them: ``kclasync._core.retry_policy``), the one-time removal of registry items an
older kclasync wrote into the lease table, and the first reading (never the writing) of the
Java KCL's migration state, which sets the lease mode before any taking round
(``lease_mode``).
Must not: start the worker's loops or pipelines (``worker``), build its parts (``wiring``),
or decide anything about the protocol (``kclasync._core.leases.client_version`` says what the
migration state means).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from kclasync._adapters.protocols import CoordinatorStateStore, LeaseStore
from kclasync._adapters.worker_registry import WorkerRegistry
from kclasync._config import ConsumerConfig
from kclasync._core.retry_policy import START_ATTEMPTS, start_delay
from kclasync._runtime.lease_mode import LeaseModeWatch
from kclasync._runtime.shard_sync import ShardSync
from kclasync.errors import AdapterError

log = logging.getLogger("kclasync._consumer")


async def overlapped(*steps: Coroutine[Any, Any, None]) -> None:
    """Run independent start-up steps at once; the first failure cancels the others and is
    raised as it is (not wrapped in an exception group)."""
    tasks = [asyncio.ensure_future(step) for step in steps]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        failure = None if task.cancelled() else task.exception()
        if failure is not None:
            raise failure


class WorkerStartup:
    """The start-up steps of one worker, on its (retrying) adapters and shard sync."""

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        store: LeaseStore,
        locks: CoordinatorStateStore,
        registry: WorkerRegistry,
        shard_sync: ShardSync,
        legacy_cleanup: Callable[[], Awaitable[list[str]]] | None,
        lease_mode: LeaseModeWatch,
    ) -> None:
        self._config = config
        self._store = store
        self._locks = locks
        self._registry = registry
        self._shard_sync = shard_sync
        self._legacy_cleanup = legacy_cleanup
        self._lease_mode = lease_mode

    async def run(self) -> None:
        """Every step, in order where one needs another; the first that fails for good is
        raised (``run()`` of the worker then stops with it)."""
        await overlapped(
            self._at_start("creating the coordinator-state table", self._locks.ensure_table),
            self._at_start("creating the worker-metrics table", self._registry.ensure_table),
            self._lease_table_and_first_sync(),
        )
        # Before any taking round: a table whose Java workers follow a leader is never taken
        # from behind their leader's back.
        await self._at_start("reading the Java KCL's migration state", self._lease_mode.check)

    async def _lease_table_and_first_sync(self) -> None:
        await self._at_start("creating the lease table", self._store.ensure_table)
        if self._legacy_cleanup is not None:
            await self._at_start("removing old registry items", self._remove_legacy_items)
        # Also proves the stream exists (StreamNotFoundError is not retried) before anything starts.
        await self._at_start("the first shard sync", self._shard_sync.initial_sync)

    async def _remove_legacy_items(self) -> None:
        """The one-time repair of a lease table an older kclasync wrote registry items into."""
        assert self._legacy_cleanup is not None
        removed = await self._legacy_cleanup()
        log.info(
            "removed %d worker-registry item(s) of an earlier kclasync from the lease table",
            len(removed),
        )

    async def _at_start(self, what: str, step: Callable[[], Awaitable[object]]) -> None:
        """Run a start-up step, retrying throttling and transient errors a few times with
        backoff; anything else, or the last failure, stops ``run()`` with that error."""
        cfg = self._config
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                await step()
                return
            except AdapterError as exc:
                if attempt >= START_ATTEMPTS:
                    raise
                delay = start_delay(attempt, first=cfg.throttle_backoff, cap=cfg.max_backoff)
                log.warning("%s failed (%s); retrying in %.2fs", what, exc, delay)
                await asyncio.sleep(delay)
