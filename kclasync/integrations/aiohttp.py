"""Consumers in an aiohttp service, with a Prometheus endpoint and health probes.

    import os

    from aiohttp import web

    from kclasync import Consumer
    from kclasync.integrations.aiohttp import add_metrics_route, add_probe_routes, consumer_context


    async def handle(records):
        for record in records:
            print(record.shard_id, record.sequence_number, len(record.data))


    # Starts at LATEST (the default): records put before this application first takes a
    # shard's lease are not read. To read what the stream still retains, pass
    # config=ConsumerConfig(initial_position="TRIM_HORIZON").
    consumer = Consumer(stream_name="orders", application_name="billing", processor=handle)
    app = web.Application()
    app.cleanup_ctx.append(consumer_context(consumer))
    add_metrics_route(app)  # GET /metrics
    add_probe_routes(app, consumer)  # GET /livez, /readyz

    if __name__ == "__main__":
        # 127.0.0.1: reachable from this host only; bind a wider address on purpose.
        web.run_app(app, host="127.0.0.1", port=int(os.environ.get("PORT", "8080")))

The consumer starts with the app and stops gracefully on shutdown, SIGTERM included (batches
finish, processors checkpoint, leases are released for the other instances).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from kclasync._consumer import Consumer
from kclasync.integrations.probes import liveness, readiness


def consumer_context(
    *consumers: Consumer,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """An ``app.cleanup_ctx`` entry that runs ``consumers`` for as long as the app runs."""

    async def context(app: web.Application) -> AsyncIterator[None]:
        started: list[Consumer] = []
        try:
            for consumer in consumers:
                await consumer.__aenter__()
                started.append(consumer)
            yield
        finally:
            for consumer in reversed(started):
                await consumer.__aexit__(None, None, None)

    return context


def add_metrics_route(
    app: web.Application, registry: CollectorRegistry | None = None, path: str = "/metrics"
) -> None:
    """Serve the registry (default: the global one) in Prometheus' text format at ``path``."""
    chosen = REGISTRY if registry is None else registry

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(chosen)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get(path, metrics)


def add_probe_routes(
    app: web.Application, *consumers: Consumer, live: str = "/livez", ready: str = "/readyz"
) -> None:
    """Serve ``liveness`` and ``readiness`` of ``consumers`` (200 or 503, JSON bodies)."""

    async def live_route(request: web.Request) -> web.Response:
        status, body = liveness(*consumers)
        return web.json_response(body, status=status)

    async def ready_route(request: web.Request) -> web.Response:
        status, body = readiness(*consumers)
        return web.json_response(body, status=status)

    app.router.add_get(live, live_route)
    app.router.add_get(ready, ready_route)
