"""The dashboard in headless Chromium against a three-worker fleet on moto: the rendered page
shows every lease with its owner, and shows the owner change after a worker is killed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import shutil
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from kclasync import Consumer
from kclasync.dashboard import dashboard_app
from kclasync.integrations.aiohttp import add_metrics_route
from kclasync.testing.emulators import LocalAws
from tests.dashboard.cdp import chromium_page, chromium_path
from tests.dashboard.serving import serve_aiohttp
from tests.support import Aws, Tally, aws_for, wait_until

pytestmark = pytest.mark.skipif(
    chromium_path() is None,
    reason="Debian's chromium is not installed (.ci/run installs it: apt-get install chromium)",
)

SHARDS = 4
WORKERS = ("worker-a", "worker-b", "worker-c")
ROWS = """JSON.stringify([...document.querySelectorAll('#leases tbody tr')].map(
  r => [r.dataset.lease, r.querySelector('[data-col=owner]').textContent,
        r.querySelector('[data-col=lag]').textContent]))"""
WORKER_ROWS = """JSON.stringify([...document.querySelectorAll('#workers tbody tr')].map(
  r => [r.dataset.worker, r.querySelector('[data-col=leases]').textContent]))"""
CHANGES = """JSON.stringify([...document.querySelectorAll('#changes li[data-lease]')].map(
  li => li.textContent))"""


@contextlib.asynccontextmanager
async def fleet(aws: Aws, tally: Tally) -> AsyncIterator[tuple[dict[str, asyncio.Task[None]], str]]:
    """Three workers, each with its own registry served at ``<base>/<worker>/metrics``."""
    metrics_app = web.Application()
    consumers: dict[str, Consumer] = {}
    for worker in WORKERS:
        registry = CollectorRegistry()
        consumers[worker] = aws.consumer(
            tally.handler(worker),
            registry=registry,
            worker_id=worker,
            leader_lock_duration=4.0,
            leader_heartbeat_interval=1.0,
        )
        add_metrics_route(metrics_app, registry, path=f"/{worker}/metrics")
    tasks = {w: asyncio.create_task(c.run(), name=w) for w, c in consumers.items()}
    try:
        async with serve_aiohttp(metrics_app) as metrics_base:
            yield tasks, metrics_base
    finally:
        for worker, task in tasks.items():
            if not task.done():
                await consumers[worker].stop()
        await asyncio.wait_for(asyncio.gather(*tasks.values(), return_exceptions=True), 30)


async def produce_for_a_while(aws: Aws, stop: asyncio.Event) -> None:
    while not stop.is_set():  # bounded by the test: it sets ``stop`` on every exit path
        await aws.produce(40)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


async def test_leases_and_failover_in_chromium(
    moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    tally = Tally()
    unique_name = "orders-" + unique_name.removeprefix("t-")  # the page's title, in docs/
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(SHARDS)
        await aws.produce(1000)
        stop_producing = asyncio.Event()
        producer = asyncio.create_task(produce_for_a_while(aws, stop_producing))
        try:
            async with fleet(aws, tally) as (tasks, metrics_base):
                urls = [f"{metrics_base}/{w}/metrics" for w in WORKERS]
                app = dashboard_app(
                    unique_name,
                    client_options=moto.client_options(),
                    metrics_urls=urls,
                    interval=0.5,
                )
                async with serve_aiohttp(app) as base, chromium_page() as page:
                    await page.navigate(base + "/")
                    await check_page(page, tasks, tmp_path)
        finally:
            stop_producing.set()
            await producer


async def check_page(page: Any, tasks: dict[str, asyncio.Task[None]], tmp: pathlib.Path) -> None:
    rows: list[list[str]] = []

    async def all_leases_owned() -> bool:
        nonlocal rows
        rows = json.loads(await page.evaluate(ROWS) or "[]")
        return len(rows) == SHARDS and all(owner in WORKERS for _, owner, _ in rows)

    await wait_until(all_leases_owned, 60, "every lease rendered with an owner")
    assert [key for key, _, _ in rows] == [f"shardId-{i:012d}" for i in range(SHARDS)]

    async def lag_shown() -> bool:
        rows_now = json.loads(await page.evaluate(ROWS))
        return all(lag.endswith("ms behind") for _, _, lag in rows_now)

    await wait_until(lag_shown, 30, "millis behind latest shown for every lease")

    victim = rows[0][1]
    tasks[victim].cancel()  # abrupt: its leases are left to expire, as after a crash
    with contextlib.suppress(asyncio.CancelledError):
        await tasks[victim]

    async def taken_over() -> bool:
        rows_now = json.loads(await page.evaluate(ROWS))
        changes = json.loads(await page.evaluate(CHANGES))
        owners = {owner for _, owner, _ in rows_now}
        moved = any(f"{victim} → " in change for change in changes)
        return len(rows_now) == SHARDS and victim not in owners and owners <= set(WORKERS) and moved

    await wait_until(taken_over, 45, f"the leases of {victim} shown with new owners")
    workers = dict(json.loads(await page.evaluate(WORKER_ROWS)))
    assert workers.get(victim, "0") == "0"
    assert sum(int(n) for n in workers.values()) == SHARDS
    assert await page.evaluate("document.getElementById('connection').textContent") == "live"
    # The new owners read on: their lag shows up again on every lease.
    await wait_until(lag_shown, 30, "millis behind latest shown again after the takeover")

    shot = tmp / "dashboard.png"
    await page.screenshot(str(shot))
    assert (await asyncio.to_thread(shot.stat)).st_size > 10_000
    keep = os.environ.get("KCLASYNC_DASHBOARD_SCREENSHOT")
    if keep:
        await asyncio.to_thread(shutil.copyfile, shot, keep)
