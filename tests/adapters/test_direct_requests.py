"""The direct path gives what botocore's path gives, on moto (DynamoDB, Kinesis) and
kinesis-local, and its signatures are accepted by a server that checks them.

Each comparison makes the same call through a client on the direct path (made from kclasync's
own session, the default) and one on botocore's (``fast_requests=False``): the parsed responses
are equal (``ResponseMetadata`` aside), errors are the same exception class with the same
``Error``, and the adapters return equal leases and records. moto with IAM authentication on
(``/moto-api/reset-auth``) refuses a request signed with a wrong secret and accepts the direct
path's, also with refreshable credentials that are refreshed between calls.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import urllib.request
from typing import Any

import attrs
import pytest
from aiobotocore.credentials import AioRefreshableCredentials
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from kclasync import ClientOptions
from kclasync._adapters import direct_requests, fast_requests
from kclasync._adapters.dynamodb import DynamoLeaseStore
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._adapters.protocols import IteratorType, ShardNotFoundError, StartingPosition
from kclasync._core.lease import Lease
from kclasync._core.position import Checkpoint
from kclasync.errors import StreamNotFoundError
from kclasync.testing.emulators import LocalAws, moto_process

pytestmark = pytest.mark.asyncio


def _without_metadata(resp: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resp.items() if k != "ResponseMetadata"}


async def test_lease_writes_same_as_botocore(moto: LocalAws, unique_name: str) -> None:
    async with (
        moto.client_options().create_client("dynamodb") as d,
        moto.client_options(fast_requests=False).create_client("dynamodb") as p,
    ):
        caller = direct_requests.caller_for(d)
        assert caller is not None and direct_requests.caller_for(p) is None
        direct, plain = DynamoLeaseStore(d, unique_name), DynamoLeaseStore(p, unique_name)
        await direct.ensure_table()
        for key in ("a", "b"):
            lease = Lease(
                key=f"shardId-{key}",
                counter=3,
                owner="w1",
                checkpoint=Checkpoint("49590338271490256608559692538361571095921575989136588898"),
                parent_shard_ids=frozenset({"shardId-p"}),
                throughput_kbps=1.5,
            )
            assert await direct.create_lease(lease)
        a, b = (
            Lease(key="shardId-a", counter=3, owner="w1"),
            Lease(key="shardId-b", counter=3, owner="w1"),
        )
        ra = await direct.renew_lease(a, throughput_kbps=2.25)
        rb = await plain.renew_lease(b, throughput_kbps=2.25)
        assert ra is not None and rb is not None
        assert ra.counter == 4 and ra == attrs.evolve(rb, key="shardId-a")
        # Taking, checkpointing, child shards: the other UpdateItem writes.
        ta = await direct.take_lease(ra, "w2")
        tb = await plain.take_lease(rb, "w2")
        assert ta is not None and tb is not None and ta.owner == "w2"
        ca = await direct.checkpoint(ta, Checkpoint("SHARD_END"))
        cb = await plain.checkpoint(tb, Checkpoint("SHARD_END"))
        assert ca is not None and cb is not None
        ka = await direct.update_child_shard_ids(ca, frozenset({"shardId-c1", "shardId-c2"}))
        kb = await plain.update_child_shard_ids(cb, frozenset({"shardId-c1", "shardId-c2"}))
        assert ka is not None and kb is not None
        assert ka == attrs.evolve(kb, key="shardId-a")
        # The raw responses are the same dict.
        params = {
            "TableName": unique_name,
            "UpdateExpression": "SET #c = #c + :one",
            "ExpressionAttributeNames": {"#c": "leaseCounter"},
            "ExpressionAttributeValues": {":one": {"N": "1"}},
            "ReturnValues": "ALL_NEW",
        }
        ours = await direct_requests.call(d, "UpdateItem", {**params, "Key": _key("shardId-a")})
        theirs = await p.update_item(**params, Key=_key("shardId-b"))
        ours["Attributes"].pop("leaseKey")
        theirs["Attributes"].pop("leaseKey")
        assert _without_metadata(ours) == _without_metadata(theirs)
        assert ours["ResponseMetadata"]["HTTPStatusCode"] == 200

        # A failed condition: the same exception; the adapter reports a lost lease on both.
        stale = Lease(key="shardId-a", counter=3, owner="w1")
        assert await direct.renew_lease(stale) is None
        assert await plain.renew_lease(stale) is None
        errors = []
        for client in (d, p):
            with pytest.raises(ClientError) as info:
                await direct_requests.call(
                    client,
                    "UpdateItem",
                    {**params, "Key": _key("shardId-a"), "ConditionExpression": "#c = :one"},
                )
            errors.append(info.value)
        assert [type(e).__name__ for e in errors] == ["ConditionalCheckFailedException"] * 2
        assert errors[0].response["Error"] == errors[1].response["Error"]

        # A missing table: the same exception class through the adapter.
        missing = []
        for store in (DynamoLeaseStore(d, "no-such-table"), DynamoLeaseStore(p, "no-such-table")):
            with pytest.raises(ClientError) as info:
                await store.renew_lease(stale)
            missing.append(info.value)
        assert [type(e).__name__ for e in missing] == ["ResourceNotFoundException"] * 2
        assert missing[0].response["Error"] == missing[1].response["Error"]
        assert caller.direct >= 8 and caller.fallbacks == 0


def _key(key: str) -> dict[str, Any]:
    return {"leaseKey": {"S": key}}


@pytest.mark.parametrize("emulator", ["moto", "kinesis"])
async def test_get_records_same_as_botocore(
    request: pytest.FixtureRequest, emulator: str, unique_name: str
) -> None:
    aws: LocalAws = request.getfixturevalue(emulator)
    async with (
        aws.client_options().create_client("kinesis") as d,
        aws.client_options(fast_requests=False).create_client("kinesis") as p,
    ):
        caller = direct_requests.caller_for(d)
        assert caller is not None
        direct, plain = KinesisStreamClient(d), KinesisStreamClient(p)
        await plain.create_stream(unique_name, 1)
        shard = (await plain.list_shards(unique_name))[0].shard_id
        position = StartingPosition(IteratorType.TRIM_HORIZON)
        iterator = await plain.get_shard_iterator(unique_name, shard, position)
        # An empty shard first, then records (binary data, one empty).
        empty = [
            await direct.get_records(unique_name, shard, iterator, 100),
            await plain.get_records(unique_name, shard, iterator, 100),
        ]
        assert empty[0].records == empty[1].records == []
        assert empty[0].millis_behind_latest == empty[1].millis_behind_latest
        payloads = [bytes(range(256)), b"", "päyload".encode(), b"x" * 3000]
        await plain.put_records(unique_name, [(f"pk-{i}", d) for i, d in enumerate(payloads)])
        ours = await direct_requests.call(d, "GetRecords", {"ShardIterator": iterator})
        theirs = await p.get_records(ShardIterator=iterator)
        assert len(ours["Records"]) == len(payloads)
        # The iterator each response hands out may differ (kinesis-local stamps it).
        for resp in (ours, theirs):
            assert isinstance(resp.pop("NextShardIterator"), str)
        assert _without_metadata(ours) == _without_metadata(theirs)
        results = [
            await direct.get_records(unique_name, shard, iterator, 100),
            await plain.get_records(unique_name, shard, iterator, 100),
        ]
        assert results[0].records == results[1].records
        assert [r.data for r in results[0].records] == payloads
        arrival = results[0].records[0].approximate_arrival
        assert isinstance(arrival, datetime.datetime) and arrival.tzinfo is not None

        # The stream deleted: the same ResourceNotFoundException on both paths, which the
        # adapter maps to ShardNotFoundError on both.
        await p.delete_stream(StreamName=unique_name)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while loop.time() < deadline:
            try:
                await plain.describe_stream(unique_name)
            except StreamNotFoundError:
                break
            await asyncio.sleep(0.05)
        errors = []
        for client in (d, p):
            with pytest.raises(ClientError) as info:
                await direct_requests.call(client, "GetRecords", {"ShardIterator": iterator})
            errors.append(info.value)
        assert [type(e).__name__ for e in errors] == ["ResourceNotFoundException"] * 2
        assert errors[0].response["Error"] == errors[1].response["Error"]
        for adapter in (direct, plain):
            with pytest.raises(ShardNotFoundError):
                await adapter.get_records(unique_name, shard, iterator, 10)
        assert caller.fallbacks == 0 and caller.direct >= 3


def _post(url: str, data: bytes) -> None:
    headers = {"Content-Type": "text/plain"}  # a form body would not reach moto's handler
    request = urllib.request.Request(url, data=data, method="POST", headers=headers)
    urllib.request.urlopen(request, timeout=10).close()


async def _iam_user(aws: LocalAws) -> tuple[str, str]:
    """An IAM user allowed everything, and its access key (three unauthenticated actions)."""
    _post(f"{aws.endpoint_url}/moto-api/reset-auth", b"3")
    async with get_session().create_client(
        "iam",
        region_name="us-east-1",
        endpoint_url=aws.endpoint_url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ) as iam:
        await iam.create_user(UserName="worker")
        policy = {
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        }
        await iam.put_user_policy(
            UserName="worker", PolicyName="all", PolicyDocument=json.dumps(policy)
        )
        key = (await iam.create_access_key(UserName="worker"))["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]


async def test_signatures_accepted_where_they_are_checked(unique_name: str) -> None:
    with moto_process() as aws:
        key_id, secret = await _iam_user(aws)
        good = ClientOptions(
            region_name="us-east-1",
            endpoint_url=aws.endpoint_url,
            aws_access_key_id=key_id,
            aws_secret_access_key=secret,
        )
        async with good.create_client("dynamodb") as ddb, good.create_client("kinesis") as kin:
            store = DynamoLeaseStore(ddb, unique_name)
            await store.ensure_table()
            assert await store.create_lease(Lease(key="shardId-a", counter=1, owner="w"))
            renewed = await store.renew_lease(Lease(key="shardId-a", counter=1, owner="w"))
            assert renewed is not None and renewed.counter == 2
            stream = KinesisStreamClient(kin)
            await stream.create_stream(unique_name, 1)
            shard = (await stream.list_shards(unique_name))[0].shard_id
            it = await stream.get_shard_iterator(
                unique_name, shard, StartingPosition(IteratorType.TRIM_HORIZON)
            )
            assert (await stream.get_records(unique_name, shard, it, 10)).records == []
            for client in (ddb, kin):
                caller = direct_requests.caller_for(client)
                assert caller is not None and caller.direct >= 1 and caller.fallbacks == 0

            # A wrong secret is refused (so signatures are checked): the direct attempt is
            # refused, and botocore's own attempt raises botocore's error.
            bad = attrs.evolve(good, aws_secret_access_key="wrong")
            async with bad.create_client("dynamodb") as wrong:
                with pytest.raises(ClientError) as info:
                    await DynamoLeaseStore(wrong, unique_name).renew_lease(renewed)
                # moto answers SignatureDoesNotMatch in XML, which the JSON parser reports as
                # the status code.
                assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
                caller = direct_requests.caller_for(wrong)
                assert caller is not None and (caller.direct, caller.fallbacks) == (1, 1)

            # Refreshable credentials: frozen for each call, refreshed when they near expiry.
            refreshed = []

            async def refresh() -> dict[str, str]:
                refreshed.append(1)
                soon = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=60)
                return {
                    "access_key": key_id,
                    "secret_key": secret,
                    "token": "",
                    "expiry_time": soon.isoformat(),
                }

            session = get_session()
            session._credentials = AioRefreshableCredentials.create_from_metadata(
                await refresh(), refresh, "test"
            )
            async with session.create_client(
                "dynamodb", region_name="us-east-1", endpoint_url=aws.endpoint_url
            ) as client:
                fast_requests.install(client)
                direct_requests.enable(client)
                store = DynamoLeaseStore(client, unique_name)
                lease = renewed
                for _ in range(3):
                    lease = await store.renew_lease(lease)  # type: ignore[assignment]
                    assert lease is not None
                caller = direct_requests.caller_for(client)
                assert caller is not None and (caller.direct, caller.fallbacks) == (3, 0)
            assert len(refreshed) >= 3  # 60 s from expiry: refreshed before each call
