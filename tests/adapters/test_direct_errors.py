"""The direct path against recorded AWS responses: the same exceptions as botocore, the same
request, and botocore's retries for anything botocore retries.

A small HTTP server on 127.0.0.1 answers each request with the next recorded response (status,
headers, body, as DynamoDB and Kinesis send them) and keeps the requests it got. The same
responses are served to a client on the direct path and to one on botocore's path; both must
raise the same exception class with the same ``Error``, and the adapters map both to the same
kclasync error. Errors botocore retries (throttling, a server error, a DynamoDB CRC32 mismatch)
are made again through botocore (the server sees the extra request); a Retrier above the adapter
still sees the failure and retries it.
"""

from __future__ import annotations

import contextlib
import json
import random
import zlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiobotocore.session import get_session
from aiohttp import web
from botocore.exceptions import ClientError

from kclasync import ClientOptions
from kclasync._adapters import direct_requests
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._adapters.protocols import ExpiredIteratorError, ShardNotFoundError
from kclasync._core.lease import Lease
from kclasync._core.retry_policy import OpClass, RetryPolicy
from kclasync._runtime.retrying import Retrier, RetryingStreamClient
from kclasync.errors import ThrottledError, TransientError

pytestmark = pytest.mark.asyncio

LEASE_ITEM = {
    "leaseKey": {"S": "shardId-000000000001"},
    "leaseCounter": {"N": "8"},
    "leaseOwner": {"S": "w1"},
    "checkpoint": {"S": "TRIM_HORIZON"},
    "checkpointSubSequenceNumber": {"N": "0"},
    "ownerSwitchesSinceCheckpoint": {"N": "0"},
}
RECORDS = {
    "Records": [
        {
            "SequenceNumber": "49590338271490256608559692538361571095921575989136588898",
            "ApproximateArrivalTimestamp": 1.764e9,
            "Data": "aGVsbG8=",
            "PartitionKey": "p",
        }
    ],
    "NextShardIterator": "AAAA-next",
    "MillisBehindLatest": 0,
}


def _error(code: str, message: str, status: int = 400) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps({"__type": f"com.amazonaws.service#{code}", "message": message}).encode()
    return status, {"x-amzn-RequestId": "r-1"}, body


def _ok(doc: dict[str, Any], crc: int | None = None) -> tuple[int, dict[str, str], bytes]:
    body = json.dumps(doc).encode()
    return 200, {"x-amz-crc32": str(zlib.crc32(body) if crc is None else crc)}, body


class Recorded:
    """Serves queued responses in order; keeps the requests."""

    def __init__(self) -> None:
        self.responses: list[tuple[int, dict[str, str], bytes]] = []
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append((dict(request.headers), await request.read()))
        status, headers, body = self.responses.pop(0)
        return web.Response(
            status=status,
            headers=headers,
            body=body,
            content_type="application/x-amz-json-1.0",
        )


@pytest.fixture
async def server() -> AsyncIterator[Recorded]:
    recorded = Recorded()
    app = web.Application()
    app.router.add_post("/", recorded.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    recorded.url = f"http://127.0.0.1:{port}"
    yield recorded
    await runner.cleanup()


#: One session for every client here (its loaded service models are shared: quicker).
SESSION = get_session()


@contextlib.asynccontextmanager
async def _client(url: str, service: str, direct: bool = True) -> AsyncIterator[Any]:
    """A client as kclasync makes it (botocore makes one request: no retries), on the direct
    path or on botocore's."""
    options = ClientOptions(
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="AK",
        aws_secret_access_key="SK",
        max_attempts=0,
        session=SESSION,
    )
    async with options.create_client(service) as client:
        if direct:
            direct_requests.enable(client)
        yield client


async def _both(server: Recorded, service: str, responses: list[Any], op: Any) -> list[Any]:
    """Run ``op(client)`` on the direct client, then on the botocore one, each with
    ``responses`` queued; returns (outcome, requests seen) of each."""
    out = []
    for direct in (True, False):
        async with _client(server.url, service, direct) as client:
            assert (direct_requests.caller_for(client) is not None) is direct
            server.responses = list(responses)
            server.requests = []
            try:
                result: Any = await op(client)
            except Exception as exc:
                result = exc
            out.append((result, len(server.requests)))
            assert not server.responses or len(server.requests) < len(responses)
    return out


LEASE = Lease(key="shardId-000000000001", counter=7, owner="w1")


@pytest.mark.parametrize(
    ("code", "mapped"),
    [
        ("ConditionalCheckFailedException", None),
        ("ResourceNotFoundException", ClientError),
        ("ValidationException", ClientError),
    ],
)
async def test_final_dynamodb_errors_are_botocore_s(
    server: Recorded, code: str, mapped: type[Exception] | None
) -> None:
    raw = await _both(
        server,
        "dynamodb",
        [_error(code, "The conditional request failed")],
        lambda c: direct_requests.call(c, "UpdateItem", {"TableName": "t", "Key": {}}),
    )
    (direct, direct_sent), (plain, plain_sent) = raw
    assert direct_sent == plain_sent == 1  # a final error is not made again
    assert isinstance(direct, ClientError) and isinstance(plain, ClientError)
    # The client's class for the code (ClientError itself for a code the model does not name).
    assert type(direct).__name__ == type(plain).__name__ in (code, "ClientError")
    assert direct.response["Error"] == plain.response["Error"]
    assert direct.response["Error"]["Code"] == code
    assert direct.operation_name == plain.operation_name == "UpdateItem"

    adapted = await _both(
        server,
        "dynamodb",
        [_error(code, "no")],
        lambda c: DynamoLeaseStore(c, "t").renew_lease(LEASE),
    )
    for result, _ in adapted:
        if mapped is None:
            assert result is None  # the lease is lost
        else:
            assert isinstance(result, mapped)
            assert result.response["Error"]["Code"] == code  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("code", "mapped"),
    [
        ("ExpiredIteratorException", ExpiredIteratorError),
        ("ResourceNotFoundException", ShardNotFoundError),
        ("InvalidArgumentException", ClientError),
    ],
)
async def test_final_kinesis_errors_map_the_same(
    server: Recorded, code: str, mapped: type[Exception]
) -> None:
    raw = await _both(
        server,
        "kinesis",
        [_error(code, "Iterator expired")],
        lambda c: direct_requests.call(c, "GetRecords", {"ShardIterator": "AAAA", "Limit": 10}),
    )
    (direct, direct_sent), (plain, plain_sent) = raw
    assert direct_sent == plain_sent == 1
    assert type(direct).__name__ == type(plain).__name__ in (code, "ClientError")
    assert direct.response["Error"] == plain.response["Error"]
    assert direct.response["Error"]["Code"] == code

    adapted = await _both(
        server,
        "kinesis",
        [_error(code, "x")],
        lambda c: KinesisStreamClient(c).get_records("s", "shardId-0", "AAAA", 10),
    )
    for result, _ in adapted:
        assert isinstance(result, mapped)


@pytest.mark.parametrize(
    ("responses", "mapped"),
    [
        ([_error("ProvisionedThroughputExceededException", "slow down")] * 2, ThrottledError),
        ([_error("ThrottlingException", "slow down")] * 2, ThrottledError),
        ([_error("InternalServerError", "oops", 500)] * 2, TransientError),
        ([_error("ServiceUnavailable", "oops", 503)] * 2, TransientError),
    ],
)
async def test_retried_errors_go_through_botocore(
    server: Recorded, responses: list[Any], mapped: type[Exception]
) -> None:
    adapted = await _both(
        server,
        "dynamodb",
        responses,
        lambda c: DynamoLeaseStore(c, "t").renew_lease(LEASE),
    )
    (direct, direct_sent), (plain, plain_sent) = adapted
    # botocore makes one request (no retries here); the direct path one more before it.
    assert (direct_sent, plain_sent) == (2, 1)
    assert type(direct) is type(plain) is mapped
    assert type(direct.__cause__).__name__ == type(plain.__cause__).__name__


@pytest.mark.parametrize(
    ("code", "status", "mapped"),
    [
        ("ProvisionedThroughputExceededException", 400, ThrottledError),
        ("KMSThrottlingException", 400, ThrottledError),
        ("InternalFailureException", 500, TransientError),
        ("ServiceUnavailable", 503, TransientError),
    ],
)
async def test_retried_kinesis_errors_map_like_fan_out_s(
    server: Recorded, code: str, status: int, mapped: type[Exception]
) -> None:
    # Polling and fan-out share one list of throttling and transient codes.
    adapted = await _both(
        server,
        "kinesis",
        [_error(code, "x", status)] * 2,
        lambda c: KinesisStreamClient(c).get_records("s", "shardId-0", "AAAA", 10),
    )
    for result, _ in adapted:
        assert type(result) is mapped


async def test_a_server_error_then_success_returns_the_success(server: Recorded) -> None:
    adapted = await _both(
        server,
        "dynamodb",
        [_error("InternalServerError", "oops", 500), _ok({"Attributes": LEASE_ITEM})],
        lambda c: DynamoLeaseStore(c, "t").renew_lease(LEASE),
    )
    (direct, direct_sent), (plain, _) = adapted
    assert direct_sent == 2 and isinstance(direct, Lease) and direct.counter == 8
    assert isinstance(plain, TransientError)  # no retries here: botocore gives up at once


async def test_a_dynamodb_checksum_mismatch_is_left_to_botocore(server: Recorded) -> None:
    good = _ok({"Attributes": LEASE_ITEM})
    bad = _ok({"Attributes": LEASE_ITEM}, crc=12345)
    async with _client(server.url, "dynamodb") as client:
        caller = direct_requests.caller_for(client)
        assert caller is not None
        server.responses = [bad, good]
        lease = await DynamoLeaseStore(client, "t").renew_lease(LEASE)
        assert lease is not None and lease.counter == 8
        assert len(server.requests) == 2 and (caller.direct, caller.fallbacks) == (1, 1)


async def test_same_request_as_botocore(server: Recorded) -> None:
    params = {"ShardIterator": "AAAA", "Limit": 25}
    sent = []
    for direct in (True, False):
        async with _client(server.url, "kinesis", direct) as client:
            server.responses = [_ok(RECORDS)]
            server.requests = []
            result = await direct_requests.call(client, "GetRecords", params)
            sent.append((server.requests[0], result))
    (direct_headers, direct_body), direct_result = sent[0]
    (plain_headers, plain_body), plain_result = sent[1]
    assert json.loads(direct_body) == json.loads(plain_body) == params
    # Every header botocore sends is sent, with the same value where it is not per request
    # (the body is the same JSON written without spaces, so its length differs).
    per_request = {"Authorization", "X-Amz-Date", "amz-sdk-invocation-id", "Content-Length"}
    assert set(direct_headers) == set(plain_headers)
    for name in set(plain_headers) - per_request:
        assert direct_headers[name] == plain_headers[name], name
    scope = [h["Authorization"].split("Signature=")[0] for h in (direct_headers, plain_headers)]
    assert scope[0] == scope[1]
    direct_result.pop("ResponseMetadata")
    plain_result.pop("ResponseMetadata")
    assert direct_result == plain_result


async def test_the_retrier_sees_a_throttled_direct_call(server: Recorded) -> None:
    throttled = _error("ProvisionedThroughputExceededException", "slow down")
    async with _client(server.url, "kinesis") as client:
        caller = direct_requests.caller_for(client)
        assert caller is not None
        adapter = KinesisStreamClient(client)
        policy = RetryPolicy(attempts=3, base=0.01, cap=0.01, budget=5.0)
        retrier = Retrier(dict.fromkeys(OpClass, policy), random.Random(1))
        wrapped = RetryingStreamClient(adapter, retrier)
        server.responses = [throttled, throttled, _ok(RECORDS)]
        result = await wrapped.get_records("s", "shardId-0", "AAAA", 10)
        assert [r.data for r in result.records] == [b"hello"]
        assert retrier.retried == {"get_records": 1}
        assert adapter.calls == {"get_records": 2}  # counted per call, as before
        assert (caller.direct, caller.fallbacks) == (2, 1)
