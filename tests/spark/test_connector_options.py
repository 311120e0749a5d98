"""Queries written for the other Spark Kinesis connectors run unchanged on ``format("kinesis")``:
awslabs' spark-sql-kinesis-connector (``kinesis.``-prefixed options, its columns) and
Databricks' ``kinesis`` source; and the translation table itself, without Spark."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from kclasync.errors import ConfigError
from kclasync.spark.options import ColumnLayout, ConsumerType, SinkOptions, SourceOptions
from kclasync.testing.emulators import LocalAws
from tests.spark.support import create_and_produce, kinesis_endpoint, source_options
from tests.spark.test_source import run_available_now


def test_awslabs_names_and_values_translate() -> None:
    opts = SourceOptions.parse(
        {
            "kinesis.streamName": "orders",
            "kinesis.region": "eu-west-1",
            "kinesis.endpointUrl": "http://127.0.0.1:1",
            "kinesis.startingPosition": "EARLIEST",
            "kinesis.consumerType": "SubscribeToShard",
            "kinesis.consumerName": "lake",
            "kinesis.maxFetchRecordsPerShard": "500",
            "kinesis.describeShardInterval": "500ms",
            "kinesis.getRecords.numberOfRecordsPerFetch": "1000",
            "kinesis.checkNewRecordThreads": "8",
            "kinesis.metadataCommitterType": "DYNAMODB",
            "kinesis.dynamodb.tableName": "progress",
        }
    )
    assert opts.stream_name == "orders" and opts.aws.region_name == "eu-west-1"
    assert opts.starting_position.kind.value == "TRIM_HORIZON"
    assert opts.consumer_type is ConsumerType.EFO and opts.consumer_name == "lake"
    assert opts.max_records_per_shard == 500 and opts.max_records_per_fetch == 1000
    assert opts.shard_list_interval == 0.5 and opts.progress_table == "progress"
    assert opts.column_layout is ColumnLayout.AWSLABS  # their options, their columns
    assert dict(opts.ignored).keys() == {"kinesis.checkNewRecordThreads"}
    at = SourceOptions.parse(
        {"kinesis.streamName": "s", "kinesis.startingPosition": "AT_TIMESTAMP 2026-08-30T19:00:05Z"}
    )
    assert at.starting_position.timestamp is not None
    assert at.starting_position.timestamp.isoformat() == "2026-08-30T19:00:05+00:00"


def test_databricks_names_and_values_translate() -> None:
    opts = SourceOptions.parse(
        {
            "streamARN": "arn:aws:kinesis:eu-west-1:123456789012:stream/orders",
            "initialPosition": '{"at_timestamp": "2026-06-25T10:23:45+00:00"}',
            "maxRecordsPerFetch": "2000",
            "maxFetchDuration": "2m",
            "shardFetchInterval": "1s",
            "shardsPerTask": "5",
            "awsAccessKey": "AKIA",
            "awsSecretKey": "secret",
            "consumerMode": "auto",
            "fetchBufferSize": "2gb",
        }
    )
    assert opts.stream_name == "orders" and opts.aws.region_name == "eu-west-1"
    assert opts.starting_position.kind.value == "AT_TIMESTAMP"
    assert opts.max_records_per_fetch == 2000 and opts.max_fetch_seconds == 120
    assert opts.shard_list_interval == 1 and opts.shards_per_task == 5
    assert opts.aws.aws_access_key_id == "AKIA" and opts.aws.aws_secret_access_key == "secret"
    assert opts.consumer_type is ConsumerType.POLLING  # auto without a consumer name
    assert opts.column_layout is ColumnLayout.KCLASYNC
    assert (
        SourceOptions.parse(
            {"streamName": "s", "initialPosition": "latest", "columnLayout": "Databricks"}
        ).column_layout
        is ColumnLayout.DATABRICKS
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"kinesis.streamName": "s", "kinesis.stsRoleArn": "arn:aws:iam::1:role/r"},
            "kinesis.stsRoleArn: assuming an IAM role is not supported",
        ),
        (
            {"streamName": "s", "roleArn": "arn:aws:iam::1:role/r"},
            "roleArn: assuming an IAM role is not supported",
        ),
        ({"streamName": "a,b"}, "streamName: is required"),  # checked below by the translator
        (
            {"kinesis.streamName": "s", "kinesis.metadataPath": "s3a://b/meta"},
            "kinesis.metadataPath: 's3a://b/meta': progress records need a directory",
        ),
        (
            {"streamName": "s", "kinesis.maxFetchRecordsPerShard": "0"},
            "kinesis.maxFetchRecordsPerShard: must be between 1 and 1000000, got 0",
        ),
        (
            {"streamName": "s", "kinesis.streamName": "t"},
            "kinesis.streamName: says 't' but streamName says 's'",
        ),
        ({"streamName": "s", "maxFetchDuration": "soon"}, "maxFetchDuration: must be a duration"),
        (
            {"streamName": "s", "initialPosition": '{"at_timestamp": "06/25/2020", "format": "x"}'},
            "initialPosition: a custom at_timestamp format is not supported",
        ),
        (
            {"kinesis.streamName": "s", "kinesis.consumerType": "Push"},
            "kinesis.consumerType: must be GetRecords or SubscribeToShard",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_option(
    options: dict[str, str], message: str
) -> None:
    if options.get("streamName") == "a,b":
        with pytest.raises(ConfigError, match="one stream per query"):
            SourceOptions.parse({"kinesis.streamName": "a,b"})
        return
    with pytest.raises(ConfigError) as caught:
        SourceOptions.parse(options)
    assert f"invalid configuration: {message}" in str(caught.value)


def test_awslabs_sink_names() -> None:
    sink = SinkOptions.parse(
        {
            "kinesis.streamName": "out",
            "kinesis.region": "us-east-1",
            "kinesis.endpointUrl": "http://127.0.0.1:1",
            "kinesis.sink.aggregationEnabled": "true",
        }
    )
    assert sink.stream_name == "out" and sink.aws.endpoint_url == "http://127.0.0.1:1"


def _rows(spark: Any, out: pathlib.Path, columns: tuple[str, ...]) -> set[tuple[Any, ...]]:
    return {tuple(r) for r in spark.read.parquet(str(out)).select(*columns).collect()}


def test_a_query_for_each_connector_reads_the_same_rows(
    spark: Any, moto: LocalAws, unique_name: str, tmp_path: pathlib.Path
) -> None:
    ids = create_and_produce(moto, unique_name, 2, 300)
    ours = source_options(moto, unique_name, tmp_path, maxRecordsPerShard=200)
    # awslabs: their option names, unchanged but for format("kinesis").
    awslabs = {
        "kinesis.streamName": unique_name,
        "kinesis.region": "us-east-1",
        "kinesis.endpointUrl": kinesis_endpoint(moto),
        "kinesis.startingPosition": "TRIM_HORIZON",
        "kinesis.maxFetchRecordsPerShard": "200",
        "kinesis.awsAccessKeyId": "testing",
        "kinesis.awsSecretKey": "testing",
        "kinesis.metadataCommitterType": "DYNAMODB",
        "kinesis.dynamodb.tableName": f"{unique_name}-meta",
        "dynamodbEndpointUrl": moto.endpoint_url,
    }
    databricks = {
        "streamName": unique_name,
        "region": "us-east-1",
        "endpoint": kinesis_endpoint(moto),
        "initialPosition": "earliest",
        "awsAccessKey": "testing",
        "awsSecretKey": "testing",
        "maxRecordsPerFetch": "100",
        "dynamodbEndpointUrl": moto.endpoint_url,
    }
    runs = {
        "ours": (ours, ("data", "partitionKey", "sequenceNumber")),
        "awslabs": (awslabs, ("data", "partitionKey", "sequenceNumber")),
        "databricks": (databricks, ("data", "partitionKey", "sequenceNumber")),
    }
    got = {}
    for name, (options, columns) in runs.items():
        out = tmp_path / name
        query = run_available_now(spark, options, out, tmp_path / f"ck-{name}")
        assert query.exception() is None, (name, query.exception())
        got[name] = _rows(spark, out, columns)
        assert len(got[name]) == len(ids), name
    assert got["awslabs"] == got["ours"] == got["databricks"]
    frame = spark.read.parquet(str(tmp_path / "awslabs"))
    assert tuple(frame.columns) == (
        "data",
        "streamName",
        "partitionKey",
        "sequenceNumber",
        "approximateArrivalTimestamp",
    )
    assert {r[0] for r in frame.select("streamName").distinct().collect()} == {unique_name}
