"""A fault-injecting HTTP proxy between workers and the emulators (DynamoDB and Kinesis).

``async with FaultProxy({"dynamodb": moto_url, "kinesis": kinesis_url}) as url:`` clients whose
endpoint is ``url`` reach the emulators through it. Requests are told apart by their
``X-Amz-Target`` (``DynamoDB_20120810.<Operation>`` or ``Kinesis_20131202.<Operation>``). A
``FaultPlan`` (replaceable at any time: ``proxy.plan = ...``) says which faults hit which
service and operation, each with a probability, drawn from a seeded ``random.Random``:

``latency``        a pause of 0 to ``max_latency`` seconds before the request is forwarded;
``reset_before``   the connection reset (RST) before the request is forwarded: not applied;
``reset_after``    the request forwarded and answered, then the connection reset: applied, the
                   answer lost (a renewal whose reply is lost);
``half_close``     the proxy closes its side (FIN) without answering, before forwarding;
``truncate``       forwarded, the answer's headers and half its body sent, then the connection
                   closed (a body cut in the middle);
``http_500`` / ``http_503``  the service's server-error answer, not forwarded;
``throttle``       the throttling answer the service sends for that operation
                   (``aws_errors.throttling_codes``), not forwarded.

Latency combines with one other fault; of the others, at most one hits a request. With
``limits`` (``service_limits.ServiceLimits``) the proxy also enforces the Kinesis limits on the
requests that no fault stopped. ``injected`` counts what was done, by kind (and throttling
answers also by code); ``injected_by`` by (service, operation, kind).

Owns: the faults and where they apply. Must not: be used by the library's normal path.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import random
import socket
import struct
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp
import attrs
import orjson
from aiobotocore.session import get_session
from aiohttp import web

from kclasync.testing.aws_errors import SERVER_ERRORS, error_answer, throttling_codes
from kclasync.testing.emulators import REGION
from kclasync.testing.relay import HttpRelay, relayed_headers, service_and_operation
from kclasync.testing.service_limits import ServiceLimits, ShardRanges


class FaultKind(enum.Enum):
    LATENCY = "latency"
    RESET_BEFORE = "reset_before"
    RESET_AFTER = "reset_after"
    HALF_CLOSE = "half_close"
    TRUNCATE = "truncate"
    HTTP_500 = "http_500"
    HTTP_503 = "http_503"
    THROTTLE = "throttle"


#: Every fault but latency (at most one of these hits a request).
BREAKING = tuple(k for k in FaultKind if k is not FaultKind.LATENCY)


@attrs.frozen
class Fault:
    """``kind`` hits a request with ``probability`` when its service is ``service`` (None:
    either) and its operation is in ``operations`` (None: any)."""

    kind: FaultKind
    probability: float
    service: str | None = None
    operations: frozenset[str] | None = None

    def applies(self, service: str | None, operation: str) -> bool:
        return (self.service is None or self.service == service) and (
            self.operations is None or operation in self.operations
        )


@attrs.frozen
class FaultPlan:
    faults: tuple[Fault, ...] = ()
    max_latency: float = 2.0

    @classmethod
    def mixed(
        cls,
        rate: float,
        *,
        service: str | None = None,
        operations: Iterable[str] | None = None,
        kinds: Iterable[FaultKind] = BREAKING,
        latency: float = 0.0,
        max_latency: float = 2.0,
    ) -> FaultPlan:
        """``rate``: the chance that a request meets one of ``kinds`` (shared equally);
        ``latency``: the chance of an added pause, besides."""
        ops = frozenset(operations) if operations is not None else None
        chosen = list(kinds)
        faults = [Fault(k, rate / len(chosen), service, ops) for k in chosen]
        if latency:
            faults.append(Fault(FaultKind.LATENCY, latency, service, ops))
        return cls(tuple(faults), max_latency)

    def __add__(self, other: FaultPlan) -> FaultPlan:
        return FaultPlan(self.faults + other.faults, max(self.max_latency, other.max_latency))


class FaultProxy(HttpRelay):
    """See the module docstring. ``upstreams``: the emulator of each service (a single URL:
    both); ``seed``: the fault schedule's random generator."""

    def __init__(
        self,
        upstreams: Mapping[str, str] | str,
        *,
        plan: FaultPlan | None = None,
        seed: int = 0,
        limits: ServiceLimits | None = None,
    ) -> None:
        super().__init__()
        if isinstance(upstreams, str):
            upstreams = {"dynamodb": upstreams, "kinesis": upstreams}
        self.upstreams = dict(upstreams)
        self.plan = plan or FaultPlan()
        self.rng = random.Random(seed)
        self.limits = limits
        self.injected: Counter[str] = Counter()
        self.injected_by: Counter[tuple[str, str, str]] = Counter()
        #: Requests received, by (service, operation).
        self.requests: Counter[tuple[str, str]] = Counter()

    async def _started(self, stack: contextlib.AsyncExitStack) -> None:
        if self.limits is None:
            return
        client = await stack.enter_async_context(
            get_session().create_client(
                "kinesis",
                endpoint_url=self.upstreams["kinesis"],
                region_name=REGION,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
        )

        async def open_shards(stream: str) -> ShardRanges:
            ranges: ShardRanges = []
            kwargs: dict[str, Any] = {"StreamName": stream}
            while True:
                resp = await client.list_shards(**kwargs)
                for shard in resp["Shards"]:
                    if "EndingSequenceNumber" not in shard.get("SequenceNumberRange", {}):
                        keys = shard["HashKeyRange"]
                        low, high = int(keys["StartingHashKey"]), int(keys["EndingHashKey"])
                        ranges.append((shard["ShardId"], low, high))
                if not resp.get("NextToken"):
                    return ranges
                kwargs = {"NextToken": resp["NextToken"]}

        self.limits.lister = open_shards

    def _draw(self, service: str | None, operation: str) -> tuple[float, FaultKind | None]:
        delay = 0.0
        breaking: FaultKind | None = None
        for fault in self.plan.faults:
            if not fault.applies(service, operation):
                continue
            if self.rng.random() >= fault.probability:
                continue
            if fault.kind is FaultKind.LATENCY:
                delay = self.rng.uniform(0.0, self.plan.max_latency)
            elif breaking is None:
                breaking = fault.kind
        return delay, breaking

    def _count(self, service: str, operation: str, kind: str) -> None:
        self.injected[kind] += 1
        self.injected_by[(service, operation, kind)] += 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        known, operation = service_and_operation(request.headers.get("X-Amz-Target", ""))
        service = known or "kinesis"
        self.requests[(service, operation)] += 1
        delay, fault = self._draw(service, operation)
        if delay:
            self._count(service, operation, FaultKind.LATENCY.value)
            await asyncio.sleep(delay)
        if fault is not None:
            self._count(service, operation, fault.value)
            if fault is FaultKind.RESET_BEFORE:
                return _reset(request)
            if fault is FaultKind.HALF_CLOSE:
                return await _half_close(request)
            if fault is FaultKind.THROTTLE:
                code = self.rng.choice(throttling_codes(service, operation))
                self.injected[f"throttle:{code}"] += 1
                stream, shard = _names(body)
                return _answer(error_answer(service, code, stream=stream, shard=shard))
            if fault in (FaultKind.HTTP_500, FaultKind.HTTP_503):
                status = 500 if fault is FaultKind.HTTP_500 else 503
                return _answer(error_answer(service, SERVER_ERRORS[status][service], status))
        decision = None
        if self.limits is not None and known == "kinesis":
            decision = await self.limits.before(operation, body)
            if decision.answer is not None:
                return _answer(decision.answer)
            body = decision.body if decision.body is not None else body
        upstream = await self.forward(request, body, self.upstreams[service])
        try:
            headers = relayed_headers(upstream.headers)
            if "eventstream" in upstream.headers.get("Content-Type", ""):
                limits, status = self.limits, upstream.status

                def accepted() -> None:
                    if decision is not None and limits is not None:
                        limits.after(decision, status, b"")

                cut = fault is not None
                return await _stream(request, upstream, headers, cut=cut, accepted=accepted)
            answer = await upstream.read()
            if decision is not None and self.limits is not None:
                answer = self.limits.after(decision, upstream.status, answer)
                headers.pop("x-amz-crc32", None)
            if fault is FaultKind.RESET_AFTER:
                return _reset(request)
            if fault is FaultKind.TRUNCATE:
                return await _truncated(request, upstream.status, headers, answer)
            return web.Response(status=upstream.status, headers=headers, body=answer)
        finally:
            upstream.release()


def _names(body: bytes) -> tuple[str, str]:
    """The stream and shard a Kinesis request names, for the error message ("?": none)."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict):
        return "?", "?"
    return str(doc.get("StreamName") or "?"), str(doc.get("ShardId") or "?")


def _answer(answer: tuple[int, dict[str, str], bytes]) -> web.Response:
    status, headers, body = answer
    return web.Response(status=status, headers=headers, body=body)


def _reset(request: web.Request) -> web.StreamResponse:
    """Reset the client's connection (RST: linger 0, then abort)."""
    transport = request.transport
    if transport is not None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        transport.abort()
    return _Gone()


async def _half_close(request: web.Request) -> web.StreamResponse:
    """Send FIN and no answer; the client's side stays open until it closes it."""
    transport = request.transport
    if transport is not None and transport.can_write_eof():
        transport.write_eof()
        # The client sees the end of the stream and closes; then drop the connection.
        await asyncio.sleep(0.5)
        transport.abort()
    return _Gone()


async def _truncated(
    request: web.Request, status: int, headers: dict[str, str], body: bytes
) -> web.StreamResponse:
    """The headers (with the whole body's length) and half the body, then the end."""
    resp = web.StreamResponse(status=status, headers=headers)
    resp.content_length = len(body)
    try:
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
    except ConnectionResetError:
        return _Gone()  # the client hung up first (its timeout): nothing left to cut
    transport = request.transport
    if transport is not None:
        transport.close()  # FIN after the half that was written
    return _Gone()


async def _stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    headers: dict[str, str],
    cut: bool,
    accepted: Callable[[], None],
) -> web.StreamResponse:
    """An event stream relayed as it comes; ``cut``: the connection reset after the first
    chunk. ``accepted`` is called once the subscription is known to have been accepted: its
    first SubscribeToShardEvent (an emulator may refuse inside the stream), or the cut."""
    resp = web.StreamResponse(status=upstream.status, headers=headers)
    resp.enable_chunked_encoding()
    await resp.prepare(request)
    told = False
    try:
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)
            if not told and (cut or b"SubscribeToShardEvent" in chunk):
                told = True
                accepted()
            if cut:
                _reset(request)
                return _Gone()
        await resp.write_eof()
    except (ConnectionError, aiohttp.ClientError):
        if request.transport is not None:
            request.transport.abort()
    return resp


class _Gone(web.StreamResponse):
    """What a handler returns for a connection it has already reset or closed: aiohttp has
    nothing left to write."""

    def __init__(self) -> None:
        super().__init__(status=500)

    async def prepare(self, request: web.BaseRequest) -> None:
        return None

    async def write_eof(self, data: bytes = b"") -> None:
        return None
