"""The dashboard as a plain ASGI application (FastAPI / Starlette ``app.mount``, or uvicorn).

Owns: the ASGI protocol handling: routing below the mount point, the event stream with
disconnect detection, and the lifespan messages when it runs on its own.
Must not: read the fleet itself (``Dashboard`` does) or import a web framework.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

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

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _route(scope: Scope) -> str:
    """The request path below the mount point (Starlette keeps the full path and puts the
    mount prefix in ``root_path``), without the leading slash; "-" when the slash after
    the mount point is missing."""
    path: str = scope["path"]
    root: str = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :]
    if path == "":
        return "-"
    return path[1:]


async def _respond(send: Send, status: int, body: bytes, headers: dict[str, str]) -> None:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    raw.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class DashboardAsgi:
    """An ASGI application serving one ``Dashboard``."""

    def __init__(self, dashboard: Dashboard) -> None:
        self.dashboard = dashboard

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        route = _route(scope)
        if scope["method"] not in ("GET", "HEAD"):
            await _respond(send, 405, b"method not allowed", {"Allow": "GET"})
        elif route == "-":
            target = scope.get("root_path", "") + "/"
            await _respond(send, 307, b"", {"Location": target})
        elif route == EVENTS:
            await self._events(receive, send)
        elif route == HISTORY:
            body = json.dumps(self.dashboard.history_document()).encode()
            await _respond(send, 200, body, {"Content-Type": "application/json"})
        elif route == SNAPSHOT:
            body = json.dumps(await self.dashboard.snapshot()).encode()
            await _respond(send, 200, body, {"Content-Type": "application/json"})
        else:
            found = asset(route)
            if found is None:
                await _respond(send, 404, b"not found", {"Content-Type": "text/plain"})
            else:
                await _respond(send, 200, found[0], {"Content-Type": found[1]})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.dashboard.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _events(self, receive: Receive, send: Send) -> None:
        headers = [(k.lower().encode(), v.encode()) for k, v in SSE_HEADERS.items()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})

        async def disconnected() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        gone = asyncio.ensure_future(disconnected())
        try:
            async with self.dashboard.listen() as queue:
                while not gone.done():
                    getter = asyncio.ensure_future(self.dashboard.next(queue, KEEPALIVE))
                    await asyncio.wait({getter, gone}, return_when=asyncio.FIRST_COMPLETED)
                    if not getter.done():
                        getter.cancel()
                        break  # the client went away
                    document = getter.result()
                    if document is None:
                        break  # the dashboard was closed
                    chunk = sse_event(document) if document else SSE_KEEPALIVE
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except OSError:
            pass  # the client went away mid-write
        finally:
            gone.cancel()
