"""A small HTTP/1.1 client for the direct request path: POSTs to an AWS endpoint with as little
CPU per request as the event loop allows.

The direct path's calls are small and frequent (a GetRecords per shard per pause, a renewal per
lease per renewer period). Through aiohttp each one costs a request object, a connector round,
happy-eyeballs connection set-up and a response object; against a server that closes every
connection (moto's: its werkzeug server sends ``Connection: close`` on every response) that is
most of a call's CPU. Here the connections are ``http_connections``'s (a bare non-blocking
socket for plain HTTP, an asyncio SSL transport for HTTPS, whose TLS context is the one the
client's HTTP session builds: its ``verify`` setting, CA bundle and client certificate).

Connections the server keeps open are pooled per origin (most recently used first) and closed
after the session's keep-alive time; a pooled connection is checked before reuse, and if the
server closed it anyway before a byte of the answer arrived, the request is made once more on a
new connection. At most the session's ``max_pool_connections`` requests are in flight, with its
connect and read timeouts. Host names are resolved through the loop and cached for ``DNS_TTL``
seconds, as aiohttp's connector does.

``for_session`` decides whether a client's HTTP session can be replaced for the direct path: an
aiobotocore ``AIOHTTPSession`` with no connector arguments but the keep-alive time, on a loop
with reader callbacks; ``Origin.of`` refuses URLs it does not handle and the caller checks that
no proxy applies. Every failure is a ``TransportError``, and the caller then makes the call
through botocore.

Owns: ``HttpTransport`` (pool, limit, timeouts, ``post``), ``Origin``, ``for_session``.
Must not: sign, retry beyond the one stale-connection case, or parse a body.
"""

from __future__ import annotations

import asyncio
import collections
import errno
import ipaddress
import os
import socket
import ssl
import sys
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from kclasync._adapters.http_connections import Connection, Plain, Tls, TransportError
from kclasync._adapters.http_wire import request_bytes

#: Seconds a resolved host name is reused.
DNS_TTL = 10.0


class Origin:
    """Scheme, host and port of an endpoint URL, and the Host header signed for it."""

    __slots__ = ("host", "host_header", "key", "path", "port", "tls")

    def __init__(self, tls: bool, host: str, port: int, host_header: str, path: str) -> None:
        self.tls, self.host, self.port = tls, host, port
        self.host_header, self.path = host_header, path
        self.key = (tls, host, port)

    @classmethod
    def of(cls, url: str, host_header: str) -> Origin | None:
        """The origin of ``url`` (http or https, no user info or query), else None."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or parts.query or parts.fragment:
            return None
        if "@" in parts.netloc or not parts.hostname:
            return None
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return None
        return cls(parts.scheme == "https", parts.hostname, port, host_header, parts.path or "/")


class HttpTransport:
    """POSTs on pooled HTTP/1.1 connections (see the module docstring)."""

    def __init__(
        self,
        *,
        connect_timeout: float | None,
        read_timeout: float | None,
        keepalive: float,
        limit: int,
        ssl_context: Callable[[], ssl.SSLContext],
    ) -> None:
        self._connect_timeout, self._read_timeout = connect_timeout, read_timeout
        self._keepalive, self._limit = keepalive, limit
        self._make_ssl = ssl_context
        self._ssl: ssl.SSLContext | None = None
        self._idle: dict[tuple[bool, str, int], list[tuple[float, Connection]]] = {}
        self._addresses: dict[tuple[str, int], tuple[float, list[tuple[int, Any]]]] = {}
        self._busy = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closed = False
        #: Connections opened, and requests sent on a pooled one.
        self.opened = 0
        self.reused = 0

    async def post(
        self, origin: Origin, headers: Mapping[str, str], body: bytes
    ) -> tuple[int, dict[str, str], bytes]:
        """Status, headers (lower-case names) and body of the answer; ``TransportError`` (or
        ``FramingError`` for headers that cannot be sent) when there is none."""
        data = request_bytes("POST", origin.path, origin.host_header, headers, body)
        await self._acquire()
        try:
            for attempt in (0, 1):
                conn = self._pooled(origin) if attempt == 0 else None
                reused = conn is not None
                if conn is None:
                    conn = await self._open(origin)
                else:
                    self.reused += 1
                try:
                    reader = await conn.exchange(data, self._connect_timeout, self._read_timeout)
                except TransportError as exc:
                    if reused and not exc.received and not isinstance(exc.__cause__, TimeoutError):
                        continue  # a kept connection the server had closed: once more, on a new one
                    if not exc.connected:
                        self._forget(origin)
                    raise
                except BaseException:
                    conn.close()
                    raise
                if reader.keep_alive and not conn.closed and not self._closed:
                    self._idle.setdefault(origin.key, []).append((conn.loop.time(), conn))
                else:
                    conn.close()
                return reader.status, reader.headers, reader.body
            raise AssertionError("unreachable")
        finally:
            self._release()

    def _pooled(self, origin: Origin) -> Connection | None:
        idle = self._idle.get(origin.key)
        if not idle:
            return None
        now = asyncio.get_running_loop().time()
        while idle and now - idle[0][0] > self._keepalive:  # the oldest first
            idle.pop(0)[1].close()
        while idle:
            _, conn = idle.pop()
            if conn.alive():
                return conn
            conn.close()
        return None

    async def _open(self, origin: Origin) -> Connection:
        if self._closed:
            raise TransportError("transport closed", connected=False, received=False)
        loop = asyncio.get_running_loop()
        family, address = (await self._resolve(loop, origin))[0]
        self.opened += 1
        if origin.tls:
            if self._ssl is None:
                self._ssl = await asyncio.to_thread(self._make_ssl)
            try:
                async with asyncio.timeout(self._connect_timeout):
                    _, proto = await loop.create_connection(
                        lambda: Tls(loop),
                        address[0],
                        address[1],
                        family=family,
                        ssl=self._ssl,
                        server_hostname=origin.host,
                    )
            except (OSError, TimeoutError, ssl.SSLError) as exc:
                self._forget(origin)
                raise TransportError(str(exc), connected=False, received=False) from exc
            return proto
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(address)
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            self._forget(origin)
            raise TransportError(os.strerror(err), connected=False, received=False)
        return Plain(loop, sock)

    async def _resolve(
        self, loop: asyncio.AbstractEventLoop, origin: Origin
    ) -> list[tuple[int, Any]]:
        key = (origin.host, origin.port)
        entry = self._addresses.get(key)
        now = loop.time()
        if entry is not None and entry[0] > now:
            return entry[1]
        if _literal(origin.host):
            family = socket.AF_INET6 if ":" in origin.host else socket.AF_INET
            address = (origin.host, origin.port) + ((0, 0) if ":" in origin.host else ())
            self._addresses[key] = (float("inf"), [(family, address)])
            return [(family, address)]
        try:
            infos = await loop.getaddrinfo(origin.host, origin.port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise TransportError(str(exc), connected=False, received=False) from exc
        found: list[tuple[int, Any]] = [(info[0], info[4]) for info in infos]
        if not found:
            raise TransportError(f"no address for {origin.host}", connected=False, received=False)
        self._addresses[key] = (now + DNS_TTL, found)
        return found

    def _forget(self, origin: Origin) -> None:
        """A connection could not be made: the next one tries the host's next address."""
        entry = self._addresses.get((origin.host, origin.port))
        if entry is not None and len(entry[1]) > 1:
            entry[1].append(entry[1].pop(0))

    async def _acquire(self) -> None:
        if (self._limit <= 0 or self._busy < self._limit) and not self._waiters:
            self._busy += 1
            return
        waiter = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter  # a finished request hands its slot over
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self._release()
            raise

    def _release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy -= 1

    def close(self) -> None:
        """Close the kept connections; later requests fail (and go through botocore)."""
        self._closed = True
        for idle in self._idle.values():
            for _, conn in idle:
                conn.close()
        self._idle.clear()


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def for_session(session: Any) -> HttpTransport | None:
    """A transport standing in for aiobotocore's HTTP session ``session`` on the direct path, or
    None when that session is one this transport cannot stand in for."""
    try:
        from aiobotocore.httpsession import AIOHTTPSession
    except ImportError:  # pragma: no cover
        return None
    if type(session) is not AIOHTTPSession or sys.platform == "win32":
        return None
    http: Any = session  # read through its private settings
    args = getattr(http, "_connector_args", None) or {}
    if set(args) - {"keepalive_timeout"}:
        return None  # a resolver, a local address, forced closes...: aiohttp's path
    timeout = http._timeout
    keepalive = args.get("keepalive_timeout")
    return HttpTransport(
        connect_timeout=timeout.sock_connect,
        read_timeout=timeout.sock_read,
        keepalive=15.0 if keepalive is None else float(keepalive),
        limit=int(http._max_pool_connections or 0),
        ssl_context=lambda: http._build_ssl_contexts(None)[0],
    )


def proxied(http: Any, url: str) -> bool:
    """Whether ``http`` sends requests for ``url`` through a proxy (configured or from the
    environment, as botocore resolved it when the client was made)."""
    return http._proxy_config.proxy_url_for(url) is not None
