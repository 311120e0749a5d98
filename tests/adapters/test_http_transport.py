"""The direct path's HTTP transport against real servers on 127.0.0.1.

A scripted asyncio server answers each request it reads with the next step of a script (an
answer, an answer and a close, a close without an answer, silence), so that kept connections,
connections the server closes (idle, or after reading a request), chunked answers written in
pieces, timeouts and the in-flight limit are exercised on real sockets. HTTPS runs against a
local TLS server with a certificate made by the ``openssl`` command (skipped without it),
directly and through clients whose ``verify`` is off, the certificate, or the system's CAs (the
last refused as botocore refuses it, with the same exception). On moto
(which closes every connection) and kinesis-local (which keeps them), the clients kclasync makes
send their direct calls through this transport without falling back to botocore; with a proxy
configured, the direct path leaves the sending to aiohttp, which goes through the proxy.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from kclasync._adapters import direct_requests, http_transport
from kclasync._adapters.http_connections import TransportError
from kclasync._adapters.http_transport import HttpTransport, Origin
from kclasync.testing.emulators import LocalAws

pytestmark = pytest.mark.asyncio

BODY = b'{"Records": [], "NextShardIterator": "AAAA"}'
OK = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
OK_CLOSE = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (
    len(BODY),
    BODY,
)
CHUNKED = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"10\r\n", BODY[:16], b"\r\n"]
CHUNKED += [b"%X\r\n" % (len(BODY) - 16), BODY[16:], b"\r\n0\r\n\r\n"]


class Script:
    """Answers request n with ``steps[n]``: bytes (written, connection kept), a list of bytes
    (written in pieces), ``"close"`` (closed unanswered), ``"hang"``, or ``(bytes, "close")``."""

    def __init__(self, steps: list[Any]) -> None:
        self.steps = steps
        self.requests: list[tuple[int, bytes]] = []  # (connection number, request)
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.release = asyncio.Event()
        self.hold = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                self.requests.append((number, head + await reader.readexactly(length)))
                if self.hold:
                    await self.release.wait()
                step = self.steps.pop(0)
                if step == "close":
                    return
                if step == "hang":
                    await asyncio.sleep(30)
                    return
                if isinstance(step, tuple):
                    writer.write(step[0])
                    await writer.drain()
                    return
                for piece in step if isinstance(step, list) else [step]:
                    writer.write(piece)
                    await writer.drain()
                    if isinstance(step, list):
                        await asyncio.sleep(0.005)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            return  # a client gone, or the server closing
        finally:
            self.open -= 1
            writer.close()


@contextlib.asynccontextmanager
async def serving(script: Script, ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[int]:
    server = await asyncio.start_server(script.handle, "127.0.0.1", 0, ssl=ssl_context)
    async with server:
        yield server.sockets[0].getsockname()[1]


def _transport(
    read_timeout: float = 5.0,
    limit: int = 10,
    ssl_context: Callable[[], Any] = ssl.create_default_context,
) -> HttpTransport:
    return HttpTransport(
        connect_timeout=5.0,
        read_timeout=read_timeout,
        keepalive=12.0,
        limit=limit,
        ssl_context=ssl_context,
    )


def _origin(port: int, scheme: str = "http", host: str = "127.0.0.1") -> Origin:
    origin = Origin.of(f"{scheme}://{host}:{port}/", f"{host}:{port}")
    assert origin is not None
    return origin


async def test_kept_connections_are_reused_and_the_request_is_sent_as_framed() -> None:
    script = Script([OK, OK, OK])
    async with serving(script) as port:
        transport = _transport()
        for _ in range(3):
            status, headers, body = await transport.post(
                _origin(port), {"X-Amz-Target": "t"}, b"{}"
            )
            assert (status, body, headers["content-length"]) == (200, BODY, str(len(BODY)))
        transport.close()
    assert (transport.opened, transport.reused, script.connections) == (1, 2, 1)
    first = script.requests[0][1]
    assert first.startswith(b"POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n" % port)
    assert b"X-Amz-Target: t\r\n" in first and first.endswith(b"\r\n\r\n{}")


async def test_a_server_closing_every_connection_costs_a_connection_per_request() -> None:
    script = Script([(OK_CLOSE, "close")] * 3)
    async with serving(script) as port:
        transport = _transport()
        for _ in range(3):
            assert (await transport.post(_origin(port), {}, b"{}"))[2] == BODY
    assert (transport.opened, transport.reused, script.connections) == (3, 0, 3)


async def test_a_kept_connection_the_server_closed_never_fails_a_request() -> None:
    # Closed while idle (seen before reuse), then closed after reading the request unanswered
    # (the request is made once more on a new connection).
    script = Script([(OK, "close"), OK, "close", OK])
    async with serving(script) as port:
        transport = _transport()
        for _ in range(3):
            await asyncio.sleep(0.05)  # the server's close has arrived
            assert (await transport.post(_origin(port), {}, b"{}"))[2] == BODY
        transport.close()
    assert [n for n, _ in script.requests] == [1, 2, 2, 3]
    assert (transport.opened, transport.reused) == (3, 1)


async def test_a_new_connection_closed_unanswered_is_an_error() -> None:
    async with serving(Script(["close"])) as port:
        with pytest.raises(TransportError) as raised:
            await _transport().post(_origin(port), {}, b"{}")
    assert raised.value.connected and not raised.value.received


async def test_a_chunked_answer_written_in_pieces() -> None:
    script = Script([CHUNKED, OK])
    async with serving(script) as port:
        transport = _transport()
        assert (await transport.post(_origin(port), {}, b"{}"))[2] == BODY
        assert (await transport.post(_origin(port), {}, b"{}"))[2] == BODY
        transport.close()
    assert script.connections == 1


async def test_silence_is_a_read_timeout_and_a_closed_port_a_connect_error() -> None:
    loop = asyncio.get_running_loop()
    async with serving(Script(["hang"])) as port:
        started = loop.time()
        with pytest.raises(TransportError) as raised:
            await _transport(read_timeout=0.2).post(_origin(port), {}, b"{}")
        # The read timeout, not the (5 s) connect timeout, bounds the wait.
        assert loop.time() - started < 2.5
    assert isinstance(raised.value.__cause__, TimeoutError) and raised.value.connected
    with pytest.raises(TransportError) as refused:
        await _transport().post(_origin(port), {}, b"{}")  # the server is gone
    assert not refused.value.connected


async def test_requests_in_flight_are_limited() -> None:
    script = Script([OK] * 5)
    script.hold = True
    async with serving(script) as port:
        transport = _transport(limit=2)
        calls = [asyncio.create_task(transport.post(_origin(port), {}, b"{}")) for _ in range(5)]
        async with asyncio.timeout(10):
            while len(script.requests) < 2:
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        assert len(script.requests) == 2  # the others wait for a slot
        script.release.set()
        results = await asyncio.gather(*calls)
        transport.close()
    assert [r[2] for r in results] == [BODY] * 5 and script.most_open <= 2


def _certificate(tmp: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("the openssl command is not installed: no certificate for a TLS server")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost"),
            *("-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


async def test_https_verifies_the_server_and_keeps_the_connection(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    script = Script([OK, OK, OK])
    async with serving(script, server_ctx) as port:
        trusted = _transport(ssl_context=lambda: ssl.create_default_context(cafile=str(cert)))
        for host in ("127.0.0.1", "localhost", "localhost"):
            origin = _origin(port, "https", host)
            assert (await trusted.post(origin, {}, b"{}"))[2] == BODY
        trusted.close()
        assert trusted.opened == 2 and trusted.reused == 1  # one connection per origin
        with pytest.raises(TransportError):  # the system's CAs do not know this certificate
            await _transport().post(_origin(port, "https"), {}, b"{}")


async def test_moto_and_kinesis_local_calls_go_through_the_transport(
    moto: LocalAws, kinesis: LocalAws, unique_name: str
) -> None:
    for aws, kept in ((moto, False), (kinesis, True)):
        async with aws.client_options().create_client("kinesis") as client:
            await client.create_stream(StreamName=unique_name, ShardCount=1)
            async with asyncio.timeout(30):
                while True:
                    desc = await client.describe_stream_summary(StreamName=unique_name)
                    if desc["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                        break
                    await asyncio.sleep(0.1)
            shard = (await client.list_shards(StreamName=unique_name))["Shards"][0]["ShardId"]
            it = await client.get_shard_iterator(
                StreamName=unique_name, ShardId=shard, ShardIteratorType="TRIM_HORIZON"
            )
            caller = direct_requests.caller_for(client)
            assert caller is not None and caller.transport is not None
            iterator = it["ShardIterator"]
            for _ in range(3):
                resp = await direct_requests.call(
                    client, "GetRecords", {"ShardIterator": iterator, "Limit": 10}
                )
                iterator = resp["NextShardIterator"]
            assert (caller.direct, caller.fallbacks) == (3, 0)
            assert caller.transport.opened == (1 if kept else 3)
            assert caller.transport.reused == (2 if kept else 0)


async def test_with_a_proxy_the_direct_path_sends_through_aiohttp() -> None:
    ok = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.1\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    )
    script = Script([ok])
    async with serving(script) as port:
        config = AioConfig(
            proxies={"http": f"http://127.0.0.1:{port}"}, retries={"max_attempts": 1}
        )
        async with get_session().create_client(
            "kinesis",
            region_name="us-east-1",
            endpoint_url="http://kinesis.invalid:4567",
            aws_access_key_id="a",
            aws_secret_access_key="b",
            config=config,
        ) as client:
            direct_requests.enable(client)
            assert http_transport.proxied(client._endpoint.http_session, "http://kinesis.invalid/")
            resp = await direct_requests.call(client, "GetRecords", {"ShardIterator": "AAAA"})
            caller = direct_requests.caller_for(client)
            assert caller is not None and caller.transport is not None
            assert caller.transport.opened == 0 and caller.direct == 1
            direct_requests.close(client)
    assert resp["NextShardIterator"] == "AAAA"
    assert script.requests[0][1].startswith(b"POST http://kinesis.invalid:4567 HTTP/1.1")


async def test_https_follows_the_clients_verify_setting(tmp_path: Path) -> None:
    cert, key = _certificate(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(cert, key)
    ok = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-amz-json-1.1\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(BODY), BODY)
    )
    script = Script([ok, ok])
    async with serving(script, server_ctx) as port:
        for verify in (False, str(cert)):
            async with get_session().create_client(
                "kinesis",
                region_name="us-east-1",
                endpoint_url=f"https://127.0.0.1:{port}",
                aws_access_key_id="a",
                aws_secret_access_key="b",
                verify=verify,
            ) as client:
                direct_requests.enable(client)
                caller = direct_requests.caller_for(client)
                assert caller is not None and caller.transport is not None
                resp = await direct_requests.call(client, "GetRecords", {"ShardIterator": "A"})
                assert resp["NextShardIterator"] == "AAAA"
                assert (caller.transport.opened, caller.fallbacks) == (1, 0)
                direct_requests.close(client)
        # Verified against the system's CAs: refused by the transport and by botocore alike.
        async with get_session().create_client(
            "kinesis",
            region_name="us-east-1",
            endpoint_url=f"https://127.0.0.1:{port}",
            aws_access_key_id="a",
            aws_secret_access_key="b",
            config=AioConfig(retries={"max_attempts": 1}),
        ) as client:
            direct_requests.enable(client)
            with pytest.raises(Exception) as direct_error:
                await direct_requests.call(client, "GetRecords", {"ShardIterator": "A"})
            with pytest.raises(Exception) as plain_error:
                await client.get_records(ShardIterator="A")
            caller = direct_requests.caller_for(client)
            assert caller is not None and caller.fallbacks == 1
            direct_requests.close(client)
    assert type(direct_error.value) is type(plain_error.value)
    assert type(direct_error.value).__name__ == "SSLError"


async def test_a_kept_connection_that_times_out_is_not_tried_again() -> None:
    # A silent server may be working on the request: no second request, the error goes up (and
    # the direct path leaves the call to botocore's retry policy).
    script = Script([OK, "hang"])
    async with serving(script) as port:
        transport = _transport(read_timeout=0.2)
        assert (await transport.post(_origin(port), {}, b"{}"))[2] == BODY
        with pytest.raises(TransportError) as raised:
            await transport.post(_origin(port), {}, b"{}")
        transport.close()
    assert isinstance(raised.value.__cause__, TimeoutError)
    assert (len(script.requests), script.connections) == (2, 1)
