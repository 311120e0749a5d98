"""The properties file: every mapped key lands in kclasync's configuration, an unsupported key
is reported once with what happens instead, and a malformed value is a one-line error naming
the key, raised before anything starts."""

from __future__ import annotations

import pathlib
from datetime import UTC, datetime

import pytest

from kclasync._cli import main
from kclasync._config import LeaseTakerKind, RetrievalMode
from kclasync._core.leases.position import InitialPositionKind
from kclasync.multilang.properties import PropertiesError, split_command
from kclasync.multilang.settings import load_settings

BASE = {
    "executableName": "python3  app.py --flag",
    "streamName": "orders",
    "applicationName": "billing",
    "AWSCredentialsProvider": "DefaultCredentialsProvider",
}


def write(tmp_path: pathlib.Path, **props: str) -> str:
    path = tmp_path / "app.properties"
    body = {**BASE, **props}
    path.write_text("# a comment\n" + "".join(f"{k} = {v}\n" for k, v in body.items() if v))
    return str(path)


def test_every_mapped_key(tmp_path: pathlib.Path) -> None:
    s = load_settings(
        write(
            tmp_path,
            processingLanguage="python/3.11",
            initialPositionInStream="trim_horizon",
            regionName="eu-west-1",
            kinesisEndpoint="http://127.0.0.1:4567",
            dynamoDBEndpoint="http://127.0.0.1:5000",
            failoverTimeMillis="3000",
            maxRecords="500",
            idleTimeBetweenReadsInMillis="250",
            shardSyncIntervalMillis="5000",
            maxLeasesForWorker="7",
            maxLeasesToStealAtOneTime="2",
            workerId="w-1",
            parentShardPollIntervalMillis="1000",
            shutdownGraceMillis="20000",
            cleanupLeasesUponShardCompletion="false",
            tableName="billing-leases",
            timeoutInSeconds="9",
            clientVersionConfig="CLIENT_VERSION_CONFIG_3X",
        )
    )
    assert s.command == ("python3", "app.py", "--flag")  # split on runs of spaces
    assert (s.stream, s.application) == ("orders", "billing")
    c = s.config
    assert c.initial_position.kind is InitialPositionKind.TRIM_HORIZON
    assert (c.failover_time, c.max_records, c.idle_time_between_reads) == (3.0, 500, 0.25)
    assert (c.shard_sync_interval, c.max_leases_for_worker, c.max_leases_to_steal) == (5.0, 7, 2)
    assert (c.worker_id, c.parent_shard_poll_interval, c.shutdown_timeout) == ("w-1", 1.0, 20.0)
    assert c.cleanup_leases_upon_shard_completion is False
    assert c.table_name == "billing-leases"
    assert c.retrieval is RetrievalMode.POLLING  # polling keys set: DEFAULT polls
    assert c.lease_taker is LeaseTakerKind.KCL3
    assert s.client.region_name == "eu-west-1"
    assert s.client.kinesis_endpoint_url == "http://127.0.0.1:4567"
    assert s.client.dynamodb_endpoint_url == "http://127.0.0.1:5000"
    assert s.child_timeout == 9.0
    assert s.processing_language == "python/3.11"
    assert s.notes == ()


def test_stream_arn_retrieval_and_position(tmp_path: pathlib.Path) -> None:
    s = load_settings(
        write(
            tmp_path,
            streamName="",
            streamArn="arn:aws:kinesis:us-west-2:123456789012:stream/payments",
            initialPositionInStreamExtended="1700000000",
            consumerName="billing-efo",
        )
    )
    assert s.stream == "payments" and s.client.region_name == "us-west-2"
    assert s.config.initial_position.timestamp == datetime.fromtimestamp(1700000000, UTC)
    # No polling key and retrievalMode unset: the daemon's DEFAULT is enhanced fan-out.
    assert s.config.retrieval is RetrievalMode.FANOUT
    assert s.config.fanout_consumer_name == "billing-efo"
    assert s.config.lease_taker is LeaseTakerKind.BALANCED
    polling = load_settings(write(tmp_path, retrievalMode="POLLING"))
    assert polling.config.retrieval is RetrievalMode.POLLING
    v2 = load_settings(
        write(tmp_path, clientVersionConfig="CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X")
    )
    assert v2.config.lease_taker is LeaseTakerKind.KCL2


def test_unsupported_keys_are_reported_once(tmp_path: pathlib.Path) -> None:
    s = load_settings(
        write(
            tmp_path,
            callProcessRecordsEvenForEmptyRecordList="true",
            metricsLevel="SUMMARY",
            maxActiveThreads="4",
            AWSCredentialsProviderDynamoDB="DefaultCredentialsProvider",
            somethingElse="1",
            AWSCredentialsProvider="StsAssumeRoleCredentialsProvider|arn:aws:iam::1:role/r|s",
        )
    )
    text = "\n".join(s.notes)
    assert len(s.notes) == 6, text
    assert "callProcessRecordsEvenForEmptyRecordList" in text and "only with records" in text
    assert "metricsLevel = SUMMARY: no CloudWatch metrics" in text
    assert "maxActiveThreads: ignored; children are driven from one event loop" in text
    assert "AWSCredentialsProviderDynamoDB: ignored" in text
    assert "somethingElse: ignored" in text
    assert "StsAssumeRoleCredentialsProvider" in text and "default credential chain" in text


@pytest.mark.parametrize(
    ("props", "message"),
    [
        ({"failoverTimeMillis": "3s"}, "failoverTimeMillis = '3s': expected a whole number"),
        ({"maxRecords": "0"}, "maxRecords = '0': expected a whole number of at least 1"),
        ({"cleanupLeasesUponShardCompletion": "maybe"}, "expected true or false"),
        ({"initialPositionInStream": "EARLIEST"}, "initialPositionInStream = 'EARLIEST'"),
        ({"kinesisEndpoint": "localhost:4567"}, "kinesisEndpoint = 'localhost:4567'"),
        ({"streamName": "", "streamArn": "orders"}, "streamArn = 'orders'"),
        ({"executableName": ""}, "executableName: must name the record processor"),
        ({"applicationName": ""}, "applicationName: is required"),
        ({"retrievalMode": "PUSH"}, "retrievalMode = 'PUSH': expected FANOUT or POLLING"),
        ({"maxRecords": "20000"}, "maxRecords:"),
    ],
)
def test_malformed_value_names_the_key(
    tmp_path: pathlib.Path, props: dict[str, str], message: str
) -> None:
    with pytest.raises(PropertiesError) as info:
        load_settings(write(tmp_path, **props))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_cli_reports_one_line_before_starting(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, failoverTimeMillis="soon")
    assert main(["multilang", "--properties-file", path]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "kclasync multilang: error: failoverTimeMillis = 'soon': expected a whole number"
    assert main(["multilang", str(tmp_path / "missing.properties")]) == 1
    assert "properties file not found" in capsys.readouterr().err


def test_command_split_as_the_daemon_splits() -> None:
    assert split_command("node  index.js  ") == ("node", "index.js")
    assert split_command("python\tapp.py") == ("python\tapp.py",)  # tabs do not split
