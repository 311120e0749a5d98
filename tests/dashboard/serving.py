"""Test helpers: serving an aiohttp app or an ASGI app on a free 127.0.0.1 port, reading
server-sent events, and seeding a lease table."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import uvicorn
from aiohttp import web

from kclasync._adapters.coordinator_state import DynamoCoordinatorState, coordinator_table_name
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._adapters.worker_registry import worker_metrics_table_name
from kclasync._core.leases.leader_lock import LEADER_LOCK_KEY
from kclasync._core.leases.lease import Lease
from kclasync._core.workers.worker_metrics import WorkerMetrics
from kclasync.testing.emulators import free_port


@contextlib.asynccontextmanager
async def serve_aiohttp(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def serve_asgi(app: Any) -> AsyncIterator[str]:
    port = free_port()
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if task.done():
                    task.result()
                await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


class EventReader:
    """Reads ``snapshot`` events from an open server-sent-event response."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self, timeout: float = 10.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            event, data = "", ""
            while True:
                raw = await self.response.content.readline()
                assert raw, "event stream ended"
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: "):
                    data += line[6:]
                elif line == "" and data:
                    assert event == "snapshot"
                    document: dict[str, Any] = json.loads(data)
                    return document


async def seed_table(client: Any, table: str) -> DynamoLeaseStore:
    """Three leases (a parent split into two children), two workers, a leader."""
    store = DynamoLeaseStore(client, table)
    await store.ensure_table()
    parent = "shardId-000000000000"
    kids = ("shardId-000000000001", "shardId-000000000002")
    await store.create_lease(Lease(key=parent, owner="w-a", child_shard_ids=frozenset(kids)))
    await store.create_lease(Lease(key=kids[0], owner="w-a", parent_shard_ids=frozenset({parent})))
    await store.create_lease(
        Lease(key=kids[1], owner="w-b", parent_shard_ids=frozenset({parent}), sticky=10)
    )
    registry = DynamoWorkerMetrics(client, worker_metrics_table_name(table))
    await registry.ensure_table()
    await registry.report(WorkerMetrics("w-a", int(time.time())))
    await registry.report(WorkerMetrics("w-b", int(time.time())))
    state = DynamoCoordinatorState(client, coordinator_table_name(table))
    await state.ensure_table()
    assert await state.create_lock(LEADER_LOCK_KEY, "w-a", 10.0, "v1") is not None
    return store
