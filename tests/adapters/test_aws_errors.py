"""The adapters' error handling on botocore's request path, against recorded AWS responses.

A small HTTP server on 127.0.0.1 answers each request with the next recorded response (status,
headers, body, as DynamoDB and Kinesis send them) and keeps the requests it got. The clients are
made as kclasync makes them, so every request goes through aiobotocore's HTTP session, signed by
botocore: a final error is raised as the client's own exception class and mapped by the adapter
to the kclasync error (or outcome) it stands for, after one request; throttling, 5xx answers and
a DynamoDB body whose CRC32 does not match are retried by botocore per the client's
``max_attempts`` and, once those are spent, mapped to ``ThrottledError``/``TransientError``
(throttling and 5xx answers); a ``Retrier`` above the adapter sees those and retries them.
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
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._adapters.protocols import ExpiredIteratorError, ShardNotFoundError
from kclasync._adapters.worker_metrics_table import DynamoWorkerMetrics
from kclasync._core.leases.lease import Lease
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
async def _client(
    url: str, service: str, *, max_attempts: int = 0, fast_requests: bool = True
) -> AsyncIterator[Any]:
    """A client as kclasync makes it (``max_attempts`` 0: botocore makes one request)."""
    options = ClientOptions(
        region_name="us-east-1",
        endpoint_url=url,
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="SK",
        max_attempts=max_attempts,
        session=SESSION,
        fast_requests=fast_requests,
    )
    async with options.create_client(service) as client:
        yield client


async def _run(server: Recorded, client: Any, responses: list[Any], op: Any) -> Any:
    """``op(client)`` with ``responses`` queued: its result or the exception it raised."""
    server.responses = list(responses)
    server.requests = []
    try:
        result: Any = await op(client)
    except Exception as exc:
        result = exc
    return result


LEASE = Lease(key="shardId-000000000001", counter=7, owner="w1")


@pytest.mark.parametrize(
    ("code", "mapped"),
    [
        ("ConditionalCheckFailedException", None),
        ("ResourceNotFoundException", ClientError),
        ("ValidationException", ClientError),
    ],
)
async def test_final_dynamodb_errors(
    server: Recorded, code: str, mapped: type[Exception] | None
) -> None:
    async with _client(server.url, "dynamodb", max_attempts=2) as client:
        raw = await _run(
            server,
            client,
            [_error(code, "The conditional request failed")],
            lambda c: c.update_item(TableName="t", Key={}),
        )
        # The client's own class for the code, after one request (never retried).
        assert len(server.requests) == 1
        assert isinstance(raw, client.exceptions.from_code(code))
        assert raw.response["Error"]["Code"] == code
        assert raw.operation_name == "UpdateItem"

        result = await _run(
            server,
            client,
            [_error(code, "no")],
            lambda c: DynamoLeaseStore(c, "t").renew_lease(LEASE),
        )
        assert len(server.requests) == 1
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
async def test_final_kinesis_errors(server: Recorded, code: str, mapped: type[Exception]) -> None:
    async with _client(server.url, "kinesis", max_attempts=2) as client:
        raw = await _run(
            server,
            client,
            [_error(code, "Iterator expired")],
            lambda c: c.get_records(ShardIterator="AAAA", Limit=10),
        )
        assert len(server.requests) == 1
        assert isinstance(raw, client.exceptions.from_code(code))
        assert raw.response["Error"]["Code"] == code

        result = await _run(
            server,
            client,
            [_error(code, "x")],
            lambda c: KinesisStreamClient(c).get_records("s", "shardId-0", "AAAA", 10),
        )
        assert len(server.requests) == 1
        assert isinstance(result, mapped)


RETRIED_DYNAMODB = [
    (_error("ProvisionedThroughputExceededException", "slow down"), ThrottledError),
    (_error("ThrottlingException", "slow down"), ThrottledError),
    (_error("LimitExceededException", "too many"), ThrottledError),
    (_error("InternalServerError", "oops", 500), TransientError),
    (_error("ServiceUnavailable", "oops", 503), TransientError),
]


@pytest.mark.parametrize(("response", "mapped"), RETRIED_DYNAMODB)
async def test_retried_dynamodb_errors_map_once_botocore_gives_up(
    server: Recorded, response: Any, mapped: type[Exception]
) -> None:
    async with _client(server.url, "dynamodb") as client:
        result = await _run(
            server, client, [response], lambda c: DynamoLeaseStore(c, "t").renew_lease(LEASE)
        )
        assert len(server.requests) == 1  # max_attempts 0: no retry by botocore
        assert type(result) is mapped
        assert isinstance(result.__cause__, ClientError)


@pytest.mark.parametrize(
    ("code", "status", "mapped"),
    [
        ("ProvisionedThroughputExceededException", 400, ThrottledError),
        ("KMSThrottlingException", 400, ThrottledError),
        ("LimitExceededException", 400, ThrottledError),
        ("InternalFailureException", 500, TransientError),
        ("ServiceUnavailable", 503, TransientError),
    ],
)
async def test_retried_kinesis_errors_map_like_fan_out_s(
    server: Recorded, code: str, status: int, mapped: type[Exception]
) -> None:
    # Polling and fan-out share one list of throttling and transient codes.
    async with _client(server.url, "kinesis") as client:
        result = await _run(
            server,
            client,
            [_error(code, "x", status)],
            lambda c: KinesisStreamClient(c).get_records("s", "shardId-0", "AAAA", 10),
        )
        assert type(result) is mapped


@pytest.mark.parametrize(("response", "_mapped"), RETRIED_DYNAMODB)
async def test_botocore_retries_then_returns_the_success(
    server: Recorded, response: Any, _mapped: type[Exception]
) -> None:
    async with _client(server.url, "dynamodb", max_attempts=1) as client:
        result = await _run(
            server,
            client,
            [response, _ok({"Attributes": LEASE_ITEM})],
            lambda c: DynamoLeaseStore(c, "t").renew_lease(LEASE),
        )
        assert isinstance(result, Lease) and result.counter == 8
        assert len(server.requests) == 2
        # botocore's retry header counts the attempts.
        attempts = [
            [t.strip() for t in h["amz-sdk-request"].split(";") if "attempt=" in t]
            for h, _ in server.requests
        ]
        assert attempts == [["attempt=1"], ["attempt=2"]]


async def test_a_dynamodb_checksum_mismatch_is_retried(server: Recorded) -> None:
    good = _ok({"Attributes": LEASE_ITEM})
    bad = _ok({"Attributes": LEASE_ITEM}, crc=12345)
    async with _client(server.url, "dynamodb", max_attempts=1) as client:
        lease = await _run(
            server, client, [bad, good], lambda c: DynamoLeaseStore(c, "t").renew_lease(LEASE)
        )
        assert isinstance(lease, Lease) and lease.counter == 8
        assert len(server.requests) == 2  # the mismatching body was asked for again


async def test_the_registry_maps_like_the_lease_table(server: Recorded) -> None:
    async with _client(server.url, "dynamodb") as client:
        registry = DynamoWorkerMetrics(client, "t-WorkerMetricStats")
        result = await _run(
            server,
            client,
            [_error("ProvisionedThroughputExceededException", "slow down")],
            lambda c: registry.list_workers(),
        )
        assert type(result) is ThrottledError
        page = {"Items": [], "Count": 0, "ScannedCount": 0}
        result = await _run(server, client, [_ok(page)], lambda c: registry.list_workers())
        assert not isinstance(result, Exception) and list(result.entries) == []
        assert json.loads(server.requests[0][1]) == {
            "TableName": "t-WorkerMetricStats",
            "ConsistentRead": True,
        }


async def test_the_request_is_botocore_s_signed_with_the_client_s_credentials(
    server: Recorded,
) -> None:
    params = {"ShardIterator": "AAAA", "Limit": 25}
    sent = []
    for fast in (True, False):
        async with _client(server.url, "kinesis", fast_requests=fast) as client:
            result = await _run(server, client, [_ok(RECORDS)], lambda c: c.get_records(**params))
            sent.append((server.requests[0], result))
    (fast_headers, fast_body), fast_result = sent[0]
    (plain_headers, plain_body), plain_result = sent[1]
    assert json.loads(fast_body) == json.loads(plain_body) == params
    assert fast_headers["X-Amz-Target"] == "Kinesis_20131202.GetRecords"
    for headers in (fast_headers, plain_headers):
        auth = headers["Authorization"]
        assert auth.startswith("AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/")
        assert "/us-east-1/kinesis/aws4_request" in auth
    # The same headers either way (fast_requests changes no header).
    per_request = {"Authorization", "X-Amz-Date", "amz-sdk-invocation-id"}
    assert set(fast_headers) == set(plain_headers)
    for name in set(plain_headers) - per_request - {"User-Agent"}:
        assert fast_headers[name] == plain_headers[name], name
    assert set(fast_headers["User-Agent"].split()) == set(plain_headers["User-Agent"].split())
    assert [r["Data"] for r in fast_result["Records"]] == [b"hello"]
    fast_result.pop("ResponseMetadata")
    plain_result.pop("ResponseMetadata")
    assert fast_result == plain_result


async def test_the_retrier_sees_a_throttled_call(server: Recorded) -> None:
    throttled = _error("ProvisionedThroughputExceededException", "slow down")
    async with _client(server.url, "kinesis") as client:
        adapter = KinesisStreamClient(client)
        policy = RetryPolicy(attempts=3, base=0.01, cap=0.01, budget=5.0)
        retrier = Retrier(dict.fromkeys(OpClass, policy), random.Random(1))
        wrapped = RetryingStreamClient(adapter, retrier)
        server.responses = [throttled, throttled, _ok(RECORDS)]
        result = await wrapped.get_records("s", "shardId-0", "AAAA", 10)
        assert [r.data for r in result.records] == [b"hello"]
        assert retrier.retried == {"get_records": 2}
        assert adapter.calls == {"get_records": 3}
        assert len(server.requests) == 3
