"""Consumers in an ASGI service (FastAPI, Starlette, ...), without importing either.

    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from prometheus_client import make_asgi_app

    from kclasync import Consumer
    from kclasync.integrations.asgi import consumer_lifespan
    from kclasync.integrations.probes import liveness, readiness


    async def handle(records):
        for record in records:
            print(record.shard_id, record.sequence_number, len(record.data))


    # Starts at LATEST (the default): records put before this application first takes a
    # shard's lease are not read. To read what the stream still retains, pass
    # config=ConsumerConfig(initial_position="TRIM_HORIZON").
    consumer = Consumer(stream_name="orders", application_name="billing", processor=handle)
    app = FastAPI(lifespan=consumer_lifespan(consumer))
    app.mount("/metrics", make_asgi_app())  # Prometheus scrapes kclasync_* here


    @app.get("/healthz")
    def healthz():
        return consumer.health


    @app.get("/livez")
    def livez():
        status, body = liveness(consumer)
        return JSONResponse(body, status_code=status)


    @app.get("/readyz")
    def readyz():
        status, body = readiness(consumer)
        return JSONResponse(body, status_code=status)

Run it with ``uvicorn service:app``. The consumers start with the app (start-up fails if one
cannot start: a missing stream, bad credentials) and stop gracefully with it, on SIGTERM too:
batches finish, processors checkpoint, leases are released for the other instances of the
service. ``consumer.health`` may be read from any thread: FastAPI runs plain ``def`` endpoints
in a thread pool.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from kclasync._consumer import Consumer


def consumer_lifespan(
    *consumers: Consumer,
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[None]]:
    """A ``lifespan=`` function that runs ``consumers`` for as long as the app runs."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with contextlib.AsyncExitStack() as stack:
            for consumer in consumers:
                await stack.enter_async_context(consumer)
            yield

    return lifespan
