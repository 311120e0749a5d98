"""A forwarding HTTP proxy that keeps its clients' connections open, for measuring what a worker
costs when its connections are reused (as AWS allows) although moto closes every connection.

It runs in its own process (its CPU is not the worker's): each request is forwarded to the
target as it came (path, headers, body) and the answer sent back on the client's connection,
which stays open. Only benchmarks use it; signatures are not checked by moto there.

    python benchmarks/keepalive_proxy.py TARGET_URL PORT
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

from aiohttp import ClientSession, web

_HOP = {"host", "content-length", "connection", "keep-alive", "transfer-encoding"}


def app(target: str) -> web.Application:
    session: ClientSession | None = None

    async def forward(request: web.Request) -> web.Response:
        nonlocal session
        if session is None:
            session = ClientSession(auto_decompress=False)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with session.request(
            request.method, target + request.path_qs, headers=headers, data=await request.read()
        ) as answer:
            body = await answer.read()
            out = {k: v for k, v in answer.headers.items() if k.lower() not in _HOP}
            return web.Response(status=answer.status, headers=out, body=body)

    proxy = web.Application()
    proxy.router.add_route("*", "/{tail:.*}", forward)
    return proxy


@contextlib.contextmanager
def keepalive_proxy(target: str, port: int) -> Iterator[str]:
    """The proxy in a child process on 127.0.0.1:``port``; yields its URL."""
    proc = subprocess.Popen(
        [sys.executable, __file__, target, str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/moto-api/", timeout=2).close()
                break
            except urllib.error.HTTPError:
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    web.run_app(app(sys.argv[1]), host="127.0.0.1", port=int(sys.argv[2]), print=None)
