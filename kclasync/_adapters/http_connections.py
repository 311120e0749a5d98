"""The connections of the direct path's HTTP transport: one request and its answer at a time.

A plain-HTTP connection is a non-blocking socket driven by the loop's reader and writer
callbacks (no asyncio transport or protocol objects): the request is one ``send``, tried at once
after ``connect`` (on a connection not yet made it fails with EAGAIN, and the socket's
writability is awaited instead), and what arrives is fed to ``http_wire.ResponseReader``. An
HTTPS connection is an asyncio SSL transport feeding the same reader. Both apply the connect
timeout until the request is sent and then the read timeout as the longest silence (aiohttp's
``sock_connect`` and ``sock_read``), with one timer re-armed only when it fires.

Owns: ``Plain``, ``Tls``, ``TransportError``.
Must not: pool, resolve names, or decide what to do after a failure (``http_transport`` does).
"""

from __future__ import annotations

import asyncio
import os
import socket

from kclasync._adapters.http_wire import FramingError, ResponseReader

_RECV = 256 * 1024


class TransportError(OSError):
    """A request that did not get a complete answer. ``connected``: the connection was made;
    ``received``: a byte of the answer arrived."""

    def __init__(self, message: str, *, connected: bool, received: bool) -> None:
        super().__init__(message)
        self.connected = connected
        self.received = received


class _Exchange:
    """One request and its answer on one connection (the parts both kinds share)."""

    __slots__ = (
        "closed",
        "connected",
        "fut",
        "limit",
        "loop",
        "reader",
        "received",
        "since",
        "timer",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.connected = False
        self.closed = False
        self.received = False
        self.fut: asyncio.Future[ResponseReader] | None = None
        self.reader = ResponseReader()
        self.timer: asyncio.TimerHandle | None = None
        self.since = 0.0
        self.limit: float | None = None

    def _start(self, limit: float | None) -> asyncio.Future[ResponseReader]:
        self.fut = self.loop.create_future()
        self.reader = ResponseReader()
        self.received = False
        self._arm(limit)
        return self.fut

    def _arm(self, limit: float | None) -> None:
        self.since, self.limit = self.loop.time(), limit
        if limit is None:
            return
        due = self.since + limit
        if self.timer is not None:
            if self.timer.when() <= due:
                return  # re-armed when it fires
            self.timer.cancel()
        self.timer = self.loop.call_at(due, self._check_time)

    def _check_time(self) -> None:
        self.timer = None
        if self.fut is None or self.fut.done() or self.limit is None:
            return
        due = self.since + self.limit
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._check_time)
            return
        what = "read" if self.connected else "connect"
        self._fail(TimeoutError(f"{what} timeout ({self.limit:g} s)"))

    def _feed(self, data: bytes) -> None:
        try:
            if data:
                self.received = True
                self.since = self.loop.time()
                done = self.reader.feed(data)
            else:
                done = self.reader.feed_eof()
        except FramingError as exc:
            self._fail(exc)
            return
        if done:
            self._done()

    def _done(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.fut is not None and not self.fut.done():
            self.fut.set_result(self.reader)

    def _fail(self, exc: BaseException) -> None:
        self.close()
        if self.fut is not None and not self.fut.done():
            error = TransportError(str(exc), connected=self.connected, received=self.received)
            error.__cause__ = exc
            self.fut.set_exception(error)

    def close(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.closed = True


class Plain(_Exchange):
    """A plain TCP connection: a non-blocking socket and the loop's reader/writer callbacks."""

    __slots__ = ("fd", "out", "reading", "sock", "writing")

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        super().__init__(loop)
        self.sock = sock
        self.fd = sock.fileno()
        self.out = memoryview(b"")
        self.reading = self.writing = False

    def alive(self) -> bool:
        """Still open, with nothing unread (a closed or chatty connection is not reused)."""
        if self.closed:
            return False
        try:
            self.sock.recv(1, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return True
        except OSError:
            pass
        return False

    def exchange(
        self, data: bytes, connect_timeout: float | None, read_timeout: float | None
    ) -> asyncio.Future[ResponseReader]:
        fut = self._start(read_timeout if self.connected else connect_timeout)
        self.out = memoryview(data)
        self._send(read_timeout)
        return fut

    def _send(self, read_timeout: float | None) -> None:
        try:
            sent = self.sock.send(self.out)
        except (BlockingIOError, InterruptedError):
            self._watch_writable(read_timeout)
            return
        except OSError as exc:
            self._fail(exc)
            return
        if not self.connected:
            self.connected = True
            self._arm(read_timeout)
        self.out = self.out[sent:]
        if self.out:
            self._watch_writable(read_timeout)
            return
        self.reading = True
        self.loop.add_reader(self.fd, self._readable)

    def _watch_writable(self, read_timeout: float | None) -> None:
        self.writing = True
        self.loop.add_writer(self.fd, self._writable, read_timeout)

    def _writable(self, read_timeout: float | None) -> None:
        self.loop.remove_writer(self.fd)
        self.writing = False
        if not self.connected:
            err = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self._fail(OSError(err, os.strerror(err)))
                return
        self._send(read_timeout)

    def _readable(self) -> None:
        try:
            data = self.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(exc)
            return
        self._feed(data)

    def _done(self) -> None:
        if self.reading:
            self.loop.remove_reader(self.fd)
            self.reading = False
        super()._done()

    def close(self) -> None:
        super().close()
        if self.reading:
            self.loop.remove_reader(self.fd)
        if self.writing:
            self.loop.remove_writer(self.fd)
        self.reading = self.writing = False
        self.sock.close()


class Tls(_Exchange, asyncio.Protocol):
    """An HTTPS connection: an asyncio SSL transport feeding the same reader."""

    __slots__ = ("transport",)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.connected = True
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def alive(self) -> bool:
        return not self.closed and self.transport is not None and not self.transport.is_closing()

    def exchange(
        self, data: bytes, connect_timeout: float | None, read_timeout: float | None
    ) -> asyncio.Future[ResponseReader]:
        fut = self._start(read_timeout)
        assert self.transport is not None
        self.transport.write(data)
        return fut

    def data_received(self, data: bytes) -> None:
        if self.fut is None or self.fut.done():  # nothing asked: not reusable
            self.close()
            return
        self._feed(data)

    def eof_received(self) -> bool:
        if self.fut is not None and not self.fut.done():
            self._feed(b"")
        self.closed = True
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.fut is not None and not self.fut.done():
            self._fail(exc or ConnectionResetError("connection closed"))
        self.closed = True

    def close(self) -> None:
        super().close()
        if self.transport is None:
            return
        if self.fut is not None and not self.fut.done():
            self.transport.abort()  # an answer cut short: no TLS close
        else:
            self.transport.close()


Connection = Plain | Tls
