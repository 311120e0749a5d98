"""The dashboard as an aiohttp application (standalone, or a sub-application of a user's app).

Owns: the aiohttp routes: the page and its files, the event stream and the JSON snapshot.
Must not: read the fleet itself (``Dashboard`` does).
"""

from __future__ import annotations

import contextlib

from aiohttp import web

from kclasync.dashboard._assets import (
    EVENTS,
    HISTORY,
    KEEPALIVE,
    SNAPSHOT,
    SSE_HEADERS,
    SSE_KEEPALIVE,
    asset,
    sse_event,
)
from kclasync.dashboard._hub import Dashboard

DASHBOARD_KEY = web.AppKey("kclasync_dashboard", Dashboard)


def aiohttp_app(dashboard: Dashboard) -> web.Application:
    """An application serving ``dashboard``; mount it with ``app.add_subapp("/fleet/", ...)``
    or run it on its own. Polling stops when the application shuts down."""
    app = web.Application()
    app[DASHBOARD_KEY] = dashboard

    async def page(request: web.Request) -> web.StreamResponse:
        found = asset(request.match_info.get("path", ""))
        if found is None:
            raise web.HTTPNotFound()
        body, content_type = found
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def snapshot(request: web.Request) -> web.Response:
        return web.json_response(await dashboard.snapshot())

    async def history(request: web.Request) -> web.Response:
        return web.json_response(dashboard.history_document())

    async def events(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers=SSE_HEADERS)
        await response.prepare(request)
        async with dashboard.listen() as queue:
            with contextlib.suppress(ConnectionResetError):
                while (document := await dashboard.next(queue, KEEPALIVE)) is not None:
                    await response.write(sse_event(document) if document else SSE_KEEPALIVE)
        return response

    async def stop_polling(app: web.Application) -> None:
        await dashboard.close()

    app.router.add_get("/", page)
    app.router.add_get("/" + EVENTS, events)
    app.router.add_get("/" + SNAPSHOT, snapshot)
    app.router.add_get("/" + HISTORY, history)
    app.router.add_get("/{path:static/[A-Za-z.]+(?:/[A-Za-z.]+)?}", page)
    app.on_cleanup.append(stop_polling)
    return app
