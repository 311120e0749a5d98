"""Consumers in an aiohttp service, with a Prometheus endpoint.

    from aiohttp import web
    from kclasync.integrations.aiohttp import add_metrics_route, consumer_context

    app = web.Application()
    app.cleanup_ctx.append(consumer_context(consumer))
    add_metrics_route(app)                            # GET /metrics

The consumer starts with the app and stops gracefully on shutdown (batches finish, processors
checkpoint, leases are released for the other instances).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from kclasync._consumer import Consumer


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
