"""Bad options fail at ``load()`` on the driver, before any query starts, with one error that
names the option, the stream or the endpoint (checked on the text a user sees)."""

from __future__ import annotations

import pathlib
import traceback
from typing import Any

import pytest

from kclasync.errors import ConfigError, KclAsyncError
from kclasync.spark import SCHEMA_DDL
from kclasync.spark.options import ConsumerType, SinkOptions, SourceOptions
from kclasync.testing.emulators import LocalAws, free_port
from tests.spark.support import create_and_produce, source_options


def load_error(spark: Any, options: dict[str, str], schema: str | None = None) -> str:
    """What ``load()`` raises, as a user reads it: kclasync's own error, raised in the driver
    by ``register()``'s check (no Spark wrapper, nothing chained), with or without a schema."""
    reader = spark.readStream.format("kinesis").options(**options)
    if schema is not None:
        reader = reader.schema(schema)
    running_before = {q.id for q in spark.streams.active}
    with pytest.raises(KclAsyncError) as caught:
        reader.load()
    started = {q.id for q in spark.streams.active} - running_before
    assert not started, "a query was started"
    error = caught.value
    assert error.__cause__ is None and error.__context__ is None
    # The traceback is the test's own frame and the wrapper's: no asyncio, no botocore.
    frames = [f.filename for f in traceback.extract_tb(caught.tb)]
    assert not [f for f in frames if "asyncio" in f or "botocore" in f], frames
    return f"{type(error).__name__}: {error}"


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"streamName": ""}, "ConfigError: invalid configuration: streamName: is required"),
        (
            {"metadataPath": "progress"},
            "ConfigError: invalid configuration: metadataPath: must be an absolute path",
        ),
        (
            {"startingPosition": "EARLIEST"},
            "ConfigError: invalid configuration: startingPosition: unknown initial position "
            "'EARLIEST'",
        ),
        (
            {"maxRecordsPerShard": "0"},
            "ConfigError: invalid configuration: maxRecordsPerShard: must be between 1 and",
        ),
        (
            {"maxRecordPerShard": "10"},
            "ConfigError: invalid configuration: maxRecordPerShard: is not an option",
        ),
        (
            {"failOnDataLoss": "maybe"},
            "ConfigError: invalid configuration: failOnDataLoss: must be true or false, "
            "got 'maybe'",
        ),
        (
            {"consumerType": "PUSH"},
            "ConfigError: invalid configuration: consumerType: must be POLLING or EFO "
            "(enhanced fan-out), got 'PUSH'",
        ),
        (
            {"consumerType": "EFO"},
            "ConfigError: invalid configuration: consumerName: is required with consumerType=EFO",
        ),
    ],
)
@pytest.mark.parametrize("schema", [None, SCHEMA_DDL], ids=["inferred", "user-schema"])
def test_bad_options_fail_at_load(
    spark: Any,
    moto: LocalAws,
    tmp_path: pathlib.Path,
    change: dict[str, str],
    expected: str,
    schema: str | None,
) -> None:
    opts = {**source_options(moto, "any-stream", tmp_path), **change}
    assert load_error(spark, opts, schema).startswith(expected)


@pytest.mark.parametrize("schema", [None, SCHEMA_DDL], ids=["inferred", "user-schema"])
def test_a_missing_stream_fails_at_load(
    spark: Any, moto: LocalAws, tmp_path: pathlib.Path, unique_name: str, schema: str | None
) -> None:
    text = load_error(spark, source_options(moto, unique_name, tmp_path), schema)
    assert text == f"StreamNotFoundError: stream '{unique_name}' does not exist"


def test_without_the_load_check_spark_still_refuses_at_load(
    spark: Any, moto: LocalAws, tmp_path: pathlib.Path, unique_name: str
) -> None:
    """A data source registered by hand (no wrapper): the source's own ``schema()`` checks,
    and Spark wraps the error; its traceback holds no asyncio frames."""
    from pyspark.errors import PySparkException

    from kclasync.spark import load_checks

    opts = {**source_options(moto, unique_name, tmp_path), "maxRecordsPerShard": "0"}
    opts[load_checks.CHECKED] = "true"  # as if checked: only the parse runs in schema()
    reader = spark.readStream.format("kinesis").options(**opts)
    with pytest.raises(PySparkException) as caught:
        type(reader).load.__wrapped__(reader)  # the unwrapped load
    text = str(caught.value)
    assert "ConfigError: invalid configuration: maxRecordsPerShard: must be between 1" in text
    assert "asyncio" not in text


def test_an_unreachable_endpoint_is_named_at_load(
    spark: Any, moto: LocalAws, tmp_path: pathlib.Path
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    text = load_error(spark, source_options(moto, "s", tmp_path, endpointUrl=dead))
    assert f"ConfigError: invalid configuration: endpointUrl: cannot reach Kinesis at {dead}" in (
        text
    )


def test_a_good_load_creates_the_progress_table(
    spark: Any, moto: LocalAws, tmp_path: pathlib.Path, unique_name: str
) -> None:
    import asyncio

    create_and_produce(moto, unique_name, 1, 1)
    opts = source_options(moto, unique_name, tmp_path, progressTable=unique_name)
    df = spark.readStream.format("kinesis").options(**opts).load()
    assert df.isStreaming

    async def table_status() -> str:
        async with moto.client_options().create_client("dynamodb") as ddb:
            desc = await ddb.describe_table(TableName=unique_name)
            return str(desc["Table"]["TableStatus"])

    # Described by name: a listing is paged, and the test session's moto holds many tables.
    assert asyncio.run(table_status()) == "ACTIVE"


def test_option_parsing_without_spark() -> None:
    parsed = SourceOptions.parse({"STREAMNAME": "s", "metadataPath": "/mnt/p"})
    assert parsed.stream_name == "s" and parsed.metadata_path == "/mnt/p"
    assert parsed.fail_on_data_loss
    with pytest.raises(ConfigError, match="maxRecordsPerBatch: must be an integer"):
        SourceOptions.parse({"streamName": "s", "maxRecordsPerBatch": "lots"})
    with pytest.raises(ConfigError, match="maxFetchTimePerShardSec"):
        SourceOptions.parse({"streamName": "s", "maxFetchTimePerShardSec": "-1"})
    efo = SourceOptions.parse({"streamName": "s", "consumerType": "efo", "consumerName": "a.b-1"})
    assert efo.consumer_type is ConsumerType.EFO and efo.consumer_name == "a.b-1"
    assert parsed.consumer_type is ConsumerType.POLLING and parsed.shards_per_task == 1
    with pytest.raises(ConfigError, match="consumerName: must be 1-128 characters of letters"):
        SourceOptions.parse({"streamName": "s", "consumerType": "EFO", "consumerName": "a b"})
    with pytest.raises(ConfigError, match="consumerName: applies only with consumerType=EFO"):
        SourceOptions.parse({"streamName": "s", "consumerName": "lake"})
    with pytest.raises(ConfigError, match="shardsPerTask: must be between 1 and 1000, got 0"):
        SourceOptions.parse({"streamName": "s", "shardsPerTask": "0"})
    sink = SinkOptions.parse({"streamName": "out", "partitionKeyColumn": "k"})
    assert sink.partition_key_column == "k" and sink.max_records_per_request == 500
    with pytest.raises(ConfigError, match="maxRecordsPerRequest: must be between 1 and 500"):
        SinkOptions.parse({"streamName": "out", "maxRecordsPerRequest": "501"})
