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
#: Points drawn per series of a chart (set by charts.js on each redraw).
POINTS = "document.getElementById('{chart}').dataset.points || '{{}}'"
#: Per lease row of the timeline: its bars' owner and reason, left to right.
TIMELINE = """JSON.stringify(Object.fromEntries([...document.querySelectorAll(
  '#timeline g.lease-row')].map(g => [g.dataset.lease,
  [...g.querySelectorAll('rect.bar[data-owner]')].map(
    r => [r.dataset.owner, r.dataset.reason])])))"""
#: Hover the last bar of a lease's row; the tooltip's text.
HOVER = """(() => {{
  const bars = document.querySelectorAll('#timeline g[data-lease="{lease}"] rect.bar[data-owner]');
  const bar = bars[bars.length - 1], box = bar.getBoundingClientRect();
  bar.dispatchEvent(new MouseEvent('mousemove', {{bubbles: true,
    clientX: box.x + box.width / 2, clientY: box.y + box.height / 2}}));
  const tip = document.getElementById('timeline-tip');
  return tip.hidden ? '' : tip.innerText;
}})()"""


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
    await check_history(page, victim, rows)
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


async def check_history(page: Any, victim: str, rows: list[list[str]]) -> None:
    """The charts have points for each worker; the timeline shows the victim's leases going to
    another worker, after expiry, with the details on hover; a reload keeps all of it."""
    lost = [key for key, owner, _ in rows if owner == victim]

    async def timeline_shows_takeover() -> bool:
        bars = json.loads(await page.evaluate(TIMELINE) or "{}")
        for key in lost:
            owners = [owner for owner, _ in bars.get(key, [])]
            if victim not in owners or owners[-1] not in set(WORKERS) - {victim}:
                return False
        return True

    await wait_until(timeline_shows_takeover, 30, f"the timeline shows {victim}'s leases moving")
    bars = json.loads(await page.evaluate(TIMELINE))
    # Each of the victim's leases was taken after its expiry, except one that a rebalance was
    # already handing over when the worker was killed (the handoff then completed).
    reasons = {bars[key][-1][1] for key in lost}
    assert "taken after expiry" in reasons, bars
    assert reasons <= {"taken after expiry", "handed over"}, bars

    async def points_for_every_worker() -> bool:
        rate = json.loads(await page.evaluate(POINTS.format(chart="chart-rate")))
        leases = json.loads(await page.evaluate(POINTS.format(chart="chart-leases")))
        return all(rate.get(w, 0) >= 2 and leases.get(w, 0) >= 2 for w in WORKERS)

    await wait_until(points_for_every_worker, 30, "chart points for every worker")
    behind = json.loads(await page.evaluate(POINTS.format(chart="chart-behind")))
    assert set(behind) == set(WORKERS) and all(behind.values()), behind
    failures = json.loads(await page.evaluate(POINTS.format(chart="chart-failures")))
    assert set(failures) == {"renewal failures", "processor errors"}

    expired = next(key for key in lost if bars[key][-1][1] == "taken after expiry")
    tip = await page.evaluate(HOVER.format(lease=expired))
    new_owner = bars[expired][-1][0]
    assert f"owner: {new_owner}" in tip and "reason: taken after expiry" in tip, tip
    assert "start: " in tip and "end: (holds it now)" in tip, tip

    await page.reload()  # the history lives in the dashboard's process
    await wait_until(timeline_shows_takeover, 30, "the takeover shown again after a reload")
    await wait_until(points_for_every_worker, 30, "chart points again after a reload")


async def test_a_simulated_hour_replayed_in_chromium(tmp_path: pathlib.Path) -> None:
    """``kclasync simulate --record`` read by ``--replay``: the page draws every simulated
    worker's series and a row per lease, crashes marked."""
    from kclasync._cli import main
    from kclasync._observations import read_recording
    from kclasync.dashboard import _aiohttp
    from kclasync.dashboard._hub import Dashboard

    path = tmp_path / "sim.jsonl"
    args = ["simulate", "--workers", "4", "--shards", "6", "--hours", "0.2", "--seed", "3"]
    code = await asyncio.to_thread(main, [*args, "--faults", "crash", "--record", str(path)])
    assert code == 0
    recording = read_recording(path)
    workers = {w for o in recording.observations if o["kind"] == "workers" for w in o["workers"]}
    app = _aiohttp.aiohttp_app(Dashboard("sim", replay=recording))
    async with serve_aiohttp(app) as base, chromium_page() as page:
        await page.navigate(base + "/")

        async def replaying() -> bool:
            pill = "(document.getElementById('connection') || {}).textContent"
            return bool(await page.evaluate(pill) == "replay (simulation)")

        await wait_until(replaying, 30, "the page shows the recording")
        await page.evaluate(
            "(() => { const s = document.getElementById('window'); s.value = '3600';"
            " s.dispatchEvent(new Event('change')); })()"
        )

        async def drawn() -> bool:
            points = json.loads(await page.evaluate(POINTS.format(chart="chart-leases")))
            return set(points) == workers and all(points.values())

        await wait_until(drawn, 30, "a series per simulated worker")
        bars = json.loads(await page.evaluate(TIMELINE))
        assert len(bars) >= 6 and all(bars[key] for key in bars if key.startswith("shardId"))
