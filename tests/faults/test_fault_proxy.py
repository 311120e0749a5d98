"""The fault proxy itself, on moto: each fault does what it says to botocore's client, the
error answers parse into the codes the services send, a lost reply still applied the write, the
limits answer as the service does, and botocore's retries are counted by operation and code."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from botocore.exceptions import ClientError, ConnectionClosedError, EndpointConnectionError

from kclasync._adapters import sdk_retries
from kclasync.errors import ThrottledError, TransientError, error_code
from kclasync.testing.emulators import LocalAws
from kclasync.testing.fault_proxy import Fault, FaultKind, FaultPlan, FaultProxy
from kclasync.testing.service_limits import Limits, ServiceLimits
from tests.faults.fleet import botocore_options

pytestmark = pytest.mark.asyncio


@contextlib.asynccontextmanager
async def _clients(url: str, retries: int = 0) -> AsyncIterator[tuple[Any, Any]]:
    options = botocore_options(url, max_attempts=retries)
    async with options.create_client("kinesis") as kin, options.create_client("dynamodb") as ddb:
        yield kin, ddb


def _only(kind: FaultKind, service: str | None = None, *ops: str) -> FaultPlan:
    return FaultPlan((Fault(kind, 1.0, service, frozenset(ops) if ops else None),), 0.3)


async def test_each_fault_reaches_botocore_as_the_network_or_service_would(
    moto: LocalAws, unique_name: str
) -> None:
    proxy = FaultProxy(moto.endpoint_url, seed=1)
    async with proxy as url, _clients(url) as (kin, ddb):
        await kin.create_stream(StreamName=unique_name, ShardCount=1)
        expected: dict[FaultKind, type[Exception] | tuple[type[Exception], ...]] = {
            FaultKind.RESET_BEFORE: (EndpointConnectionError, ConnectionClosedError),
            FaultKind.RESET_AFTER: (EndpointConnectionError, ConnectionClosedError),
            FaultKind.HALF_CLOSE: ConnectionClosedError,
            FaultKind.TRUNCATE: ConnectionClosedError,
        }
        for kind, error in expected.items():
            proxy.plan = _only(kind)
            with pytest.raises(error):
                await kin.list_shards(StreamName=unique_name)
            with pytest.raises(error):
                await ddb.list_tables()
        codes: dict[tuple[FaultKind, str], set[str]] = {}
        for kind in (FaultKind.HTTP_500, FaultKind.HTTP_503, FaultKind.THROTTLE):
            proxy.plan = _only(kind)
            for service, call in (
                ("kinesis", lambda: kin.list_shards(StreamName=unique_name)),
                (
                    "kinesis",
                    lambda: kin.get_shard_iterator(
                        StreamName=unique_name,
                        ShardId="shardId-000000000000",
                        ShardIteratorType="TRIM_HORIZON",
                    ),
                ),
                ("dynamodb", lambda: ddb.list_tables()),
                ("dynamodb", lambda: ddb.get_item(TableName="t", Key={"k": {"S": "x"}})),
            ):
                for _ in range(4):
                    with pytest.raises(ClientError) as info:
                        await call()
                    codes.setdefault((kind, service), set()).add(
                        info.value.response["Error"]["Code"]
                    )
        proxy.plan = _only(FaultKind.LATENCY)
        await kin.list_shards(StreamName=unique_name)  # only slower
    assert codes[(FaultKind.HTTP_500, "kinesis")] == {"InternalFailure"}
    assert codes[(FaultKind.HTTP_500, "dynamodb")] == {"InternalServerError"}
    assert codes[(FaultKind.HTTP_503, "dynamodb")] == {"ServiceUnavailable"}
    assert codes[(FaultKind.THROTTLE, "kinesis")] == {
        "LimitExceededException",
        "ProvisionedThroughputExceededException",
    }
    assert codes[(FaultKind.THROTTLE, "dynamodb")] == {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
    }
    assert proxy.injected["latency"] == 1
    assert proxy.injected["reset_before"] == proxy.injected["reset_after"] == 2
    assert proxy.injected["half_close"] == proxy.injected["truncate"] == 2


async def test_a_reply_lost_after_forwarding_still_applied_the_write(
    moto: LocalAws, unique_name: str
) -> None:
    proxy = FaultProxy(moto.endpoint_url)
    async with proxy as url, _clients(url) as (_, ddb):
        await ddb.create_table(
            TableName=unique_name,
            KeySchema=[{"AttributeName": "k", "KeyType": "HASH"}],
            AttributeDefinitions=[{"AttributeName": "k", "AttributeType": "S"}],
            BillingMode="PAY_PER_REQUEST",
        )
        for kind, applied in ((FaultKind.RESET_BEFORE, False), (FaultKind.RESET_AFTER, True)):
            proxy.plan = _only(kind, "dynamodb", "PutItem")
            key = {"k": {"S": kind.value}}
            with pytest.raises((EndpointConnectionError, ConnectionClosedError)):
                await ddb.put_item(TableName=unique_name, Item=key)
            proxy.plan = FaultPlan()
            item = await ddb.get_item(TableName=unique_name, Key=key, ConsistentRead=True)
            assert ("Item" in item) is applied, kind


async def test_botocore_retries_are_counted_by_operation_and_code(
    moto: LocalAws, unique_name: str
) -> None:
    proxy = FaultProxy(moto.endpoint_url, seed=3)
    seen: Counter[tuple[str, str]] = Counter()
    async with proxy as url, _clients(url, retries=10) as (kin, _):
        sdk_retries.count(kin, lambda op, code: seen.update([(op, code)]))
        await kin.create_stream(StreamName=unique_name, ShardCount=1)
        proxy.plan = FaultPlan.mixed(
            0.3, kinds=(FaultKind.THROTTLE, FaultKind.RESET_BEFORE, FaultKind.HTTP_503)
        )
        for _ in range(20):
            await kin.list_shards(StreamName=unique_name)
    assert seen[("ListShards", "LimitExceededException")] > 0
    assert seen[("ListShards", "ServiceUnavailable")] > 0
    network = sum(n for (op, code), n in seen.items() if code.endswith("Error"))
    assert network > 0, seen
    assert (
        sum(seen.values())
        == proxy.injected["throttle"] + proxy.injected["reset_before"] + proxy.injected["http_503"]
    )


async def _put(kin: Any, stream: str, count: int, size: int = 10) -> dict[str, Any]:
    data = b"x" * size
    result: dict[str, Any] = await kin.put_records(
        StreamName=stream,
        Records=[{"Data": data, "PartitionKey": f"k{i}"} for i in range(count)],
    )
    return result


async def test_limits_answer_as_the_service_does(moto: LocalAws, unique_name: str) -> None:
    # The limits read a clock the test moves: how fast this machine sends the requests (a
    # loaded machine may take longer than a bucket's refill between two of them) changes
    # nothing in what they answer.
    clock = [0.0]
    limits = ServiceLimits(
        Limits(iterator_lifetime=1.0, subscribe_interval=5.0), clock=lambda: clock[0]
    )
    async with FaultProxy(moto.endpoint_url, limits=limits) as url, _clients(url) as (kin, _):
        await kin.create_stream(StreamName=unique_name, ShardCount=1)
        await asyncio.sleep(0.2)
        # Writes: 1,000 records per second per shard; the rest fail entry by entry.
        first = await _put(kin, unique_name, 500)
        second = await _put(kin, unique_name, 500)
        third = await _put(kin, unique_name, 500)
        assert first["FailedRecordCount"] == 0
        assert second["FailedRecordCount"] == 0
        assert third["FailedRecordCount"] == 500
        refused = [r for r in third["Records"] if "ErrorCode" in r]
        assert refused[0]["ErrorCode"] == "ProvisionedThroughputExceededException"
        assert "Rate exceeded for shard shardId-000000000000" in refused[0]["ErrorMessage"]
        assert all("SequenceNumber" in r for r in first["Records"])
        # 1 MB per second per shard: a second record of 900 KB right away is refused.
        clock[0] += 1.0  # a second later: the record bucket is full again
        big = b"x" * 900_000
        await kin.put_record(StreamName=unique_name, Data=big, PartitionKey="k")
        with pytest.raises(ClientError) as info:
            await kin.put_record(StreamName=unique_name, Data=big, PartitionKey="k")
        assert info.value.response["Error"]["Code"] == "ProvisionedThroughputExceededException"
        # Reads: 5 calls per second per shard.
        it = (
            await kin.get_shard_iterator(
                StreamName=unique_name,
                ShardId="shardId-000000000000",
                ShardIteratorType="TRIM_HORIZON",
            )
        )["ShardIterator"]
        codes = []
        for _ in range(7):
            try:
                it = (await kin.get_records(ShardIterator=it, Limit=10))["NextShardIterator"]
                codes.append("ok")
            except ClientError as exc:
                codes.append(exc.response["Error"]["Code"])
        assert codes[:5] == ["ok"] * 5
        assert "ProvisionedThroughputExceededException" in codes[5:]
        # An iterator expires after its lifetime.
        clock[0] += 1.2
        with pytest.raises(ClientError) as info:
            await kin.get_records(ShardIterator=it)
        assert info.value.response["Error"]["Code"] == "ExpiredIteratorException"
    assert limits.answers["expired_iterator"] == 1
    assert limits.answers["get_records_rate"] >= 1
    assert limits.answers["put_record"] == 1


async def test_subscribe_to_shard_as_the_service_limits_it() -> None:
    """Per consumer and shard: within the interval (5 s; 1.5 s here) of a call the service
    accepted, ResourceInUseException; above one call per second, LimitExceededException; a
    call the service refused does not count as accepted."""
    limits = ServiceLimits(Limits(subscribe_interval=1.5))
    body = (
        b'{"ConsumerARN": "arn:aws:kinesis:us-east-1:123456789012:stream/s/consumer/c:1",'
        b' "ShardId": "shardId-000000000000", "StartingPosition": {"Type": "LATEST"}}'
    )

    async def subscribe(upstream_status: int = 200) -> str:
        decision = await limits.before("SubscribeToShard", body)
        if decision.answer is not None:
            status, _, answer = decision.answer
            assert status == 400
            return str(orjson.loads(answer)["__type"])
        limits.after(decision, upstream_status, b"")
        return "forwarded"

    answers = [await subscribe(400)]  # refused upstream: not an accepted call
    await asyncio.sleep(1.05)
    answers.append(await subscribe())  # accepted
    answers.append(await subscribe())  # at once: more than one call per second
    await asyncio.sleep(1.05)
    answers.append(await subscribe())  # within the interval of the accepted call
    await asyncio.sleep(1.05)
    answers.append(await subscribe())  # the interval has passed
    assert answers == [
        "forwarded",
        "forwarded",
        "LimitExceededException",
        "ResourceInUseException",
        "forwarded",
    ]
    assert limits.answers == {"subscribe_rate": 1, "subscribe_in_use": 1}


async def test_put_records_shard_of_a_key_is_the_md5_of_its_partition_key() -> None:
    ranges = [("a", 0, 2**127 - 1), ("b", 2**127, 2**128 - 1)]
    for key in ("k1", "k2", "user-7"):
        expected = "a" if int(hashlib.md5(key.encode()).hexdigest(), 16) < 2**127 else "b"
        assert ServiceLimits._shard_of({"PartitionKey": key}, ranges) == expected
    assert ServiceLimits._shard_of({"PartitionKey": "x", "ExplicitHashKey": "5"}, ranges) == "a"


async def test_error_code_names_the_aws_code_or_the_network_error_at_the_root() -> None:
    throttled = ClientError(
        {"Error": {"Code": "ThrottlingException", "Message": "slow down"}}, "UpdateItem"
    )
    try:
        try:
            raise throttled
        except ClientError as exc:
            raise ThrottledError("DynamoDB UpdateItem throttled") from exc
    except ThrottledError as wrapped:
        assert error_code(wrapped) == "ThrottlingException"
    try:
        try:
            raise ConnectionResetError(104, "reset")
        except OSError as exc:
            raise TransientError("DynamoDB UpdateItem failed") from exc
    except TransientError as wrapped:
        assert error_code(wrapped) == "ConnectionResetError"


async def test_a_truncated_answer_to_a_client_that_already_hung_up_is_dropped_quietly() -> None:
    """Found under load: the client's read timeout closed the connection before the proxy wrote
    the truncated answer; aiohttp logged the handler's ConnectionResetError with a traceback."""
    from unittest import mock

    from aiohttp.client_exceptions import ClientConnectionResetError
    from aiohttp.test_utils import make_mocked_request

    from kclasync.testing import fault_proxy

    gone = ClientConnectionResetError("Cannot write to closing transport")
    writer = mock.Mock()
    writer.send_headers = mock.Mock(side_effect=gone)
    writer.write_headers = mock.AsyncMock(side_effect=gone)
    writer.write = mock.AsyncMock(side_effect=gone)
    request = make_mocked_request("POST", "/", writer=writer)
    answer = await fault_proxy._truncated(request, 200, {}, b"x" * 100)
    assert isinstance(answer, fault_proxy._Gone)
