"""Consumers inside web services: aiohttp (with /metrics) and an ASGI lifespan."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from kclasync.integrations.aiohttp import add_metrics_route, consumer_context
from kclasync.integrations.asgi import consumer_lifespan
from kclasync.testing.emulators import LocalAws
from tests.support import Tally, aws_for, wait_until

pytestmark = pytest.mark.asyncio


async def test_aiohttp_app_runs_the_consumer_and_serves_metrics(
    moto: LocalAws, unique_name: str
) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(2)
        ids = await aws.produce(120)
        tally = Tally()
        registry = CollectorRegistry()
        consumer = aws.consumer(tally.handler("w"), registry=registry, worker_id="web-1")
        app = web.Application()
        app.cleanup_ctx.append(consumer_context(consumer))
        add_metrics_route(app, registry)

        async def health(request: web.Request) -> web.Response:
            return web.json_response(consumer.health)

        app.router.add_get("/healthz", health)
        async with TestClient(TestServer(app)) as client:

            async def processed() -> float:
                text = await (await client.get("/metrics")).text()
                return sum(
                    float(line.rsplit(" ", 1)[1])
                    for line in text.splitlines()
                    if line.startswith("kclasync_records_processed_total{")
                )

            async def all_processed() -> bool:
                return await processed() == 120

            await wait_until(lambda: tally.seen(ids), 20, "the records")
            # Counted once each batch returned; scraped over HTTP like Prometheus would.
            await wait_until(all_processed, 10, "the counter to reach 120")
            metrics = await (await client.get("/metrics")).text()
            health_now = await (await client.get("/healthz")).json()
        held = f'kclasync_leases_held{{application="{aws.name}",worker="web-1"}} 2.0'
        assert held in metrics
        assert health_now["running"] is True and health_now["error"] is None
        assert health_now["leases"] == 2
        # App shutdown stopped the consumer gracefully: leases released, checkpoints kept.
        leases = (await aws.store.list_leases()).leases
        assert [lease.owner for lease in leases] == [None, None]
        assert {lease.key: lease.checkpoint.value for lease in leases} == tally.last_seq


async def test_asgi_lifespan_starts_and_stops_consumers(moto: LocalAws, unique_name: str) -> None:
    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        ids = await aws.produce(30)
        tally = Tally()
        consumer = aws.consumer(tally.handler("w"))
        async with consumer_lifespan(consumer)(app=None):
            assert consumer.health["running"] is True
            await wait_until(lambda: tally.seen(ids), 20, "the records")
        assert consumer.health["running"] is False
        (lease,) = (await aws.store.list_leases()).leases
        assert lease.owner is None


async def test_asgi_lifespan_fails_start_up_for_a_missing_stream(
    moto: LocalAws, unique_name: str
) -> None:
    from kclasync import StreamNotFoundError

    async with aws_for(moto, unique_name) as aws:
        consumer = aws.consumer(Tally().handler("w"))
        with pytest.raises(StreamNotFoundError, match=unique_name):
            async with consumer_lifespan(consumer)(app=None):
                pass


async def test_readiness_and_liveness_part_ways(moto: LocalAws, unique_name: str) -> None:
    """Draining (stop requested, no error): alive, not ready. A failed consumer: not alive.
    Both read from a worker thread, as framework thread pools do."""
    import asyncio

    from kclasync.integrations.aiohttp import add_probe_routes

    async def fail(records: object) -> None:
        raise RuntimeError("boom")

    async with aws_for(moto, unique_name) as aws:
        await aws.create_stream(1)
        await aws.produce(5)
        good = aws.consumer(Tally().handler("w"), worker_id="good")
        bad = aws.consumer(fail, worker_id="bad", processor_retries=0)
        app = web.Application()
        app.cleanup_ctx.append(consumer_context(good))
        add_probe_routes(app, good, live="/good/livez", ready="/good/readyz")
        add_probe_routes(app, bad, live="/bad/livez", ready="/bad/readyz")
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/good/livez")).status == 200
            assert (await client.get("/good/readyz")).status == 200
            health = await asyncio.to_thread(lambda: good.health)
            assert health["running"] is True and health["worker_id"] == "good"
            await good.stop()
            assert (await client.get("/good/livez")).status == 200
            assert (await client.get("/good/readyz")).status == 503
            with pytest.raises(Exception, match="processor failed"):
                await bad.run()
            live = await client.get("/bad/livez")
            assert live.status == 503
            (report,) = (await live.json())["consumers"]
            assert "processor failed" in report["error"]


async def test_a_run_that_raised_before_the_worker_existed_is_not_alive(
    moto: LocalAws, unique_name: str
) -> None:
    """``run()`` as a task on a missing stream raises StreamNotFoundError before any worker
    exists; the documented probes then say so: liveness 503 with the error, readiness 503."""
    import asyncio

    from kclasync import StreamNotFoundError
    from kclasync.integrations.aiohttp import add_probe_routes
    from kclasync.integrations.probes import liveness

    async with aws_for(moto, unique_name) as aws:
        consumer = aws.consumer(Tally().handler("w"), worker_id="lonely")
        app = web.Application()
        add_probe_routes(app, consumer)
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/livez")).status == 200  # not started: not failed
            task = asyncio.create_task(consumer.run())
            with pytest.raises(StreamNotFoundError, match=unique_name):
                await task
            live = await client.get("/livez")
            assert live.status == 503
            (report,) = (await live.json())["consumers"]
            assert "StreamNotFoundError" in report["error"] and unique_name in report["error"]
            assert (await client.get("/readyz")).status == 503
            status, body = liveness(consumer)
            assert status == 503 and body["consumers"] == [consumer.health]
