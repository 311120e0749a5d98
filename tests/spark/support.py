"""Helpers for the Spark tests: streams with JSON ids on the emulators, source options."""

from __future__ import annotations

import asyncio
import pathlib
from typing import Any

from kclasync.testing.emulators import LocalAws
from tests.support import aws_for


def kinesis_endpoint(local: LocalAws) -> str:
    return local.kinesis_endpoint_url or local.endpoint_url


def create_and_produce(local: LocalAws, stream: str, shards: int, count: int) -> list[int]:
    async def go() -> list[int]:
        async with aws_for(local, stream) as aws:
            await aws.create_stream(shards)
            return await aws.produce(count)

    return asyncio.run(go())


def produce(local: LocalAws, stream: str, first_id: int, count: int) -> list[int]:
    async def go() -> list[int]:
        async with aws_for(local, stream) as aws:
            aws.next_id = first_id
            return await aws.produce(count)

    return asyncio.run(go())


def source_options(local: LocalAws, stream: str, tmp: pathlib.Path, **extra: Any) -> dict[str, str]:
    opts = {
        "streamName": stream,
        "endpointUrl": kinesis_endpoint(local),
        "region": "us-east-1",
        "awsAccessKeyId": "testing",
        "awsSecretKey": "testing",
        "startingPosition": "TRIM_HORIZON",
        "dynamodbEndpointUrl": local.endpoint_url,
        "shardListIntervalSec": "0",
        "maxFetchTimePerShardSec": "5",
    }
    opts.update({k: str(v) for k, v in extra.items()})
    return opts
