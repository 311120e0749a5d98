"""What the driver checks against AWS when a ``format("kinesis")`` DataFrame is defined.

Owns: turning "the stream does not exist", "the endpoint cannot be reached" and "the progress
table cannot be made" into one clear error naming the stream, the endpoint or the option,
raised by ``load()`` (source) or ``save()``/``start()`` (sink) instead of minutes later inside
an executor.
Must not: import pyspark.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import attrs
from botocore.exceptions import BotoCoreError, ClientError

from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync._adapters.protocols import TransientError
from kclasync.errors import ConfigError, StreamNotFoundError
from kclasync.spark.fetch import AwsOptions
from kclasync.spark.options import SinkOptions, SourceOptions

__all__ = ["check_sink", "check_source"]

#: Bounds for the checks: fail in seconds, not after the executors' patient retries.
_CHECK_TIMEOUT = 20.0


def _quick(aws: AwsOptions) -> Any:
    return attrs.evolve(aws.client_options(), connect_timeout=3.0, read_timeout=5.0, max_attempts=2)


def _where(endpoint: str | None, service: str, region: str | None) -> str:
    if endpoint:
        return endpoint
    return f"the default {service} endpoint of region {region or '(from the environment)'}"


def _unreachable(option: str, service: str, where: str, exc: BaseException) -> ConfigError:
    return ConfigError(option, f"cannot reach {service} at {where}: {type(exc).__name__}: {exc}")


async def _check_stream(aws: AwsOptions, stream: str) -> None:
    options = _quick(aws)
    where = _where(options.kinesis_endpoint_url or options.endpoint_url, "Kinesis", aws.region_name)
    try:
        async with options.create_client("kinesis") as client:
            await KinesisStreamClient(client).describe_stream(stream)
    except StreamNotFoundError as exc:
        raise StreamNotFoundError(stream) from exc
    except ClientError as exc:
        raise ConfigError(
            "streamName", f"Kinesis at {where} refused DescribeStreamSummary({stream!r}): {exc}"
        ) from None
    except (TransientError, BotoCoreError, OSError) as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise _unreachable("endpointUrl", "Kinesis", where, cause) from None


async def _check_progress_table(aws: AwsOptions, table: str) -> None:
    from kclasync.spark.progress_dynamodb import DynamoProgressStore

    options = _quick(aws)
    where = _where(options.dynamodb_endpoint_url or options.endpoint_url, "DynamoDB", None)
    try:
        async with options.create_client("dynamodb") as client:
            await DynamoProgressStore(client, table).ensure_table()
    except ClientError as exc:
        raise ConfigError(
            "progressTable", f"cannot create or read table {table!r} at {where}: {exc}"
        ) from None
    except (BotoCoreError, OSError) as exc:
        raise _unreachable("dynamodbEndpointUrl", "DynamoDB", where, exc) from None


def _run(check: Any, what: str) -> None:
    async def bounded() -> None:
        await asyncio.wait_for(check, _CHECK_TIMEOUT)

    try:
        asyncio.run(bounded())
    except TimeoutError:
        raise ConfigError(
            "endpointUrl", f"{what} got no answer in {_CHECK_TIMEOUT:.0f} s"
        ) from None


def check_source(options: SourceOptions) -> None:
    """The stream exists and answers; the progress store is usable (the DynamoDB table is
    created if missing, the directory made)."""

    async def both() -> None:
        await _check_stream(options.aws, options.stream_name)
        if options.metadata_path is None:
            await _check_progress_table(options.aws, options.progress_table)

    if options.metadata_path is not None:
        try:
            os.makedirs(options.metadata_path, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                "metadataPath", f"cannot create {options.metadata_path!r}: {exc}"
            ) from None
    _run(both(), f"checking stream {options.stream_name!r}")


def check_sink(options: SinkOptions) -> None:
    """The target stream exists and answers."""
    _run(
        _check_stream(options.aws, options.stream_name), f"checking stream {options.stream_name!r}"
    )
