"""An HTTP relay on 127.0.0.1 in front of the emulators, the base of the test proxies.

``HttpRelay`` serves every path on a free 127.0.0.1 port (aiohttp's server) and forwards
requests with one aiohttp client session; subclasses decide what to do with each request
(``_handle``). The relays built on it: ``fanout_proxy`` (kinesis-local's fan-out answers
completed) and ``fault_proxy`` (faults and service limits).

Owns: starting and stopping the server and the client session, which headers are not relayed,
and telling the service and operation of a request from its ``X-Amz-Target``.
Must not: change a request or an answer (subclasses do).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping

import aiohttp
from aiohttp import web

#: Headers that belong to one hop (the relay sets its own).
HOP = frozenset({"host", "content-length", "transfer-encoding", "connection"})

#: The largest request relayed (a PutRecords of 5 MB of data is about 7 MB in base64).
MAX_BODY = 32 * 1024 * 1024

#: X-Amz-Target prefixes (the API name and version) of each service.
TARGET_SERVICES = {"DynamoDB_20120810": "dynamodb", "Kinesis_20131202": "kinesis"}


def service_and_operation(target: str) -> tuple[str | None, str]:
    """(service, operation) of an ``X-Amz-Target`` (service None: not one we know)."""
    prefix, _, operation = target.rpartition(".")
    return TARGET_SERVICES.get(prefix), operation


def relayed_headers(headers: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in HOP}


class HttpRelay:
    """``async with relay as url:`` serves on ``url`` until the block ends."""

    #: Cancel a request's handler when its client disconnects (aiohttp's
    #: ``handler_cancellation``), so that the upstream call ends with it.
    cancel_on_disconnect = False

    def __init__(self) -> None:
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None
        self._exit = contextlib.AsyncExitStack()

    async def __aenter__(self) -> str:
        self._http = await self._exit.enter_async_context(
            aiohttp.ClientSession(auto_decompress=False)
        )
        await self._started(self._exit)
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(
            app,
            handle_signals=False,
            access_log=None,
            handler_cancellation=self.cancel_on_disconnect,
        )
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        await self._exit.aclose()

    async def _started(self, stack: contextlib.AsyncExitStack) -> None:
        """Called once the client session exists: open what the subclass needs on ``stack``."""

    @property
    def http(self) -> aiohttp.ClientSession:
        assert self._http is not None, "the relay is not running"
        return self._http

    async def forward(
        self, request: web.Request, body: bytes, upstream: str
    ) -> aiohttp.ClientResponse:
        """``request`` (with ``body``) sent to ``upstream``; the caller releases the answer."""
        return await self.http.request(
            request.method,
            upstream.rstrip("/") + request.path_qs,
            headers=relayed_headers(request.headers),
            data=body,
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError
