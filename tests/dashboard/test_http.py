"""The dashboard mounted into an aiohttp app and into a FastAPI app, over real HTTP, on moto."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from fastapi import FastAPI

from kclasync.dashboard import DASHBOARD_KEY, dashboard_app, dashboard_asgi
from kclasync.testing.emulators import LocalAws
from tests.dashboard.serving import EventReader, seed_table, serve_aiohttp, serve_asgi
from tests.support import wait_until


async def check_mounted(base: str, store: Any) -> None:
    """The page, its files, the snapshot and the live stream, all under ``base``."""
    async with aiohttp.ClientSession() as http:
        async with http.get(base + "/") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/html")
            page = await resp.text()
        assert 'src="static/dashboard.js"' in page and "http" not in page.split("<body>")[1]
        for name, kind in (("dashboard.js", "javascript"), ("dashboard.css", "css")):
            async with http.get(f"{base}/static/{name}") as resp:
                assert resp.status == 200 and kind in resp.headers["Content-Type"]
                assert len(await resp.read()) > 500
        async with http.get(base + "/static/nope.js") as resp:
            assert resp.status == 404
        # The charting library ships in the package, with its licence: no CDN at run time.
        assert 'src="static/vendor/uPlot.iife.min.js"' in page
        vendored = (("uPlot.iife.min.js", "javascript"), ("uPlot.min.css", "css"))
        for name, kind in (*vendored, ("uPlot.LICENSE", "text/plain")):
            async with http.get(f"{base}/static/vendor/{name}") as resp:
                assert resp.status == 200 and kind in resp.headers["Content-Type"]
                body = await resp.text()
            assert "MIT License" in body if name.endswith("LICENSE") else len(body) > 1000

        async with http.get(base + "/snapshot.json") as resp:
            snap = await resp.json()
        by_key = {lease["key"]: lease for lease in snap["leases"]}
        parent = by_key["shardId-000000000000"]
        assert parent["children"] == ["shardId-000000000001", "shardId-000000000002"]
        assert by_key["shardId-000000000001"]["parents"] == ["shardId-000000000000"]
        assert by_key["shardId-000000000002"]["sticky_mode"] == "pinned"
        assert {w["id"]: w["leases"] for w in snap["workers"]} == {"w-a": 2, "w-b": 1}
        assert snap["leader"] == {"owner": "w-a", "state": "held", "lease_duration": 10.0}
        assert snap["errors"] == []

        async with http.get(base + "/events") as resp:
            assert resp.headers["Content-Type"] == "text/event-stream"
            events = EventReader(resp)
            first = await events.next()
            assert len(first["leases"]) == 3
            # w-a renews its other lease just before: an owner still renewing hands a lease
            # over, whichever read sees both (one seen renewing for the first time more than
            # 1.5 reads before it loses a lease counts as stopped, ``_observations``).
            parent = await store.get_lease("shardId-000000000000")
            assert await store.renew_lease(parent) is not None
            lease = await store.get_lease("shardId-000000000001")
            assert await store.take_lease(lease, "w-b") is not None
            while True:  # the next polls show the new owner and record the change
                doc = await events.next()
                if doc["changes"]:
                    break
            assert doc["changes"][0]["lease"] == "shardId-000000000001"
            assert (doc["changes"][0]["from"], doc["changes"][0]["to"]) == ("w-a", "w-b")
            assert {w["id"]: w["leases"] for w in doc["workers"]} == {"w-a": 1, "w-b": 2}
            closed, opened = doc["timeline_update"]["shardId-000000000001"]
            assert (closed["owner"], closed["end"]) == ("w-a", opened["start"])
            assert (opened["owner"], opened["end"], opened["reason"]) == (
                "w-b",
                None,
                "handed over",
            )
        # A page that loads (or reloads) gets the history from the dashboard's process.
        async with http.get(base + "/history.json") as resp:
            history = await resp.json()
        ring = history["timeline"]["shardId-000000000001"]
        assert [(s["owner"], s["reason"]) for s in ring] == [
            ("w-a", "first seen"),
            ("w-b", opened["reason"]),
        ]
        assert history["samples"] and set(history["samples"][-1]["workers"]) == {"w-a", "w-b"}


async def test_aiohttp_subapp(moto: LocalAws, unique_name: str) -> None:
    options = moto.client_options()
    async with options.create_client("dynamodb") as client:
        store = await seed_table(client, unique_name)
        app = web.Application()

        async def own_route(request: web.Request) -> web.Response:
            return web.Response(text="the service's own page")

        app.router.add_get("/", own_route)
        sub = dashboard_app(unique_name, client_options=options, interval=0.2)
        app.add_subapp("/fleet/", sub)
        async with serve_aiohttp(app) as base:
            async with aiohttp.ClientSession() as http, http.get(base + "/") as resp:
                assert await resp.text() == "the service's own page"
            await check_mounted(base + "/fleet", store)
            # Nobody is looking any more: the table is no longer read.
            await wait_until(lambda: not sub[DASHBOARD_KEY].polling, 10, "polling to stop")
            # Closing the dashboard (as the app's cleanup does) ends the open event streams.
            async with aiohttp.ClientSession() as http, http.get(base + "/fleet/events") as resp:
                await EventReader(resp).next()
                await sub[DASHBOARD_KEY].close()
                async with asyncio.timeout(5):
                    assert await resp.content.read() == b""


async def test_fastapi_mount(moto: LocalAws, unique_name: str) -> None:
    options = moto.client_options()
    async with options.create_client("dynamodb") as client:
        store = await seed_table(client, unique_name)
        app = FastAPI()
        mounted = dashboard_asgi(unique_name, client_options=options, interval=0.2)
        app.mount("/fleet", mounted)

        @app.get("/healthz")
        def healthz() -> dict[str, str]:
            return {"status": "ok"}

        async with serve_asgi(app) as base:
            async with aiohttp.ClientSession() as http:
                async with http.get(base + "/healthz") as resp:
                    assert await resp.json() == {"status": "ok"}
                async with http.get(base + "/fleet", allow_redirects=False) as resp:
                    assert resp.status == 307 and resp.headers["Location"].endswith("/fleet/")
            await check_mounted(base + "/fleet", store)
            await wait_until(lambda: not mounted.dashboard.polling, 10, "polling to stop")


async def test_standalone_asgi_and_missing_table(moto: LocalAws, unique_name: str) -> None:
    """Under uvicorn on its own (lifespan on); a table that does not exist is shown as an
    error on the page, not a crash."""
    app = dashboard_asgi(unique_name, client_options=moto.client_options(), interval=0.2)
    async with (
        serve_asgi(app) as base,
        aiohttp.ClientSession() as http,
        http.get(base + "/snapshot.json") as resp,
    ):
        snap = await resp.json()
    assert snap["leases"] == [] and snap["leader"]["state"] == "none"
    assert len(snap["errors"]) == 1 and unique_name in snap["errors"][0]


async def test_cli_serves_until_terminated(moto: LocalAws, unique_name: str) -> None:
    async with moto.client_options().create_client("dynamodb") as client:
        await seed_table(client, unique_name)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kclasync._cli", "dashboard", "-a", unique_name,
        "--endpoint-url", moto.endpoint_url, "--region", "us-east-1", "--port", "0",
        stdout=subprocess.PIPE, env=env,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), 30)).decode()
        assert line.startswith(f"kclasync dashboard for {unique_name}: http://127.0.0.1:")
        url = line.split(": ", 1)[1].strip()
        async with aiohttp.ClientSession() as http, http.get(url + "snapshot.json") as resp:
            snap = await resp.json()
        assert len(snap["leases"]) == 3
        proc.terminate()
        assert await asyncio.wait_for(proc.wait(), 10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


@pytest.mark.parametrize("interval", ["0", "-1"])
def test_cli_rejects_bad_interval(interval: str, capsys: pytest.CaptureFixture[str]) -> None:
    from kclasync._cli import main

    assert main(["dashboard", "-a", "x", "--interval", interval]) == 2
    assert "--interval must be positive" in capsys.readouterr().err


async def test_no_region_is_shown_on_the_page(monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients that cannot even be created (no region anywhere) give a document naming the
    problem, on the snapshot and on the event stream, instead of a silent page."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_CONFIG_FILE", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance-metadata lookups
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    app = dashboard_asgi("orders", interval=0.2)
    async with serve_asgi(app) as base, aiohttp.ClientSession() as http:
        async with http.get(base + "/snapshot.json") as resp:
            assert resp.status == 200
            snap = await resp.json()
        assert snap["leases"] == [] and "NoRegionError" in snap["errors"][0]
        async with http.get(base + "/events") as resp:
            doc = await EventReader(resp).next()
        assert "NoRegionError" in doc["errors"][0]
