"""From a MultiLangDaemon properties file to kclasync's configuration.

Owns: which property sets which ``ConsumerConfig`` field or ``ClientOptions`` value (the table in
docs/multilang.md), the credentials provider mapped to a boto session, and the notes printed
once at start for the keys kclasync does not support (with what happens instead). Every value
is decoded before anything starts; a malformed one is a ``PropertiesError`` naming the key.
Must not: start a consumer or a child process.
"""

from __future__ import annotations

from typing import Any

import attrs

from kclasync._adapters.aws import ClientOptions
from kclasync._config import ConsumerConfig, LeaseTakerKind, RetrievalMode
from kclasync._core.leases.position import InitialPosition
from kclasync.errors import ConfigError
from kclasync.multilang.properties import (
    PropertiesError,
    Values,
    read_properties,
    retrieval_is_fanout,
    split_command,
    stream_from_arn,
)

#: Properties read into ``ConsumerConfig``: key -> (field, kind). Kinds: ms (milliseconds),
#: int, flag, text.
_CONFIG_KEYS: dict[str, tuple[str, str]] = {
    "failoverTimeMillis": ("failover_time", "ms"),
    "shardSyncIntervalMillis": ("shard_sync_interval", "ms"),
    "parentShardPollIntervalMillis": ("parent_shard_poll_interval", "ms"),
    "idleTimeBetweenReadsInMillis": ("idle_time_between_reads", "ms"),
    "shutdownGraceMillis": ("shutdown_timeout", "ms"),
    "leaseAssignmentIntervalMillis": ("assignment_interval", "ms"),
    "gracefulLeaseHandoffTimeoutMillis": ("handoff_timeout", "ms"),
    "maxRecords": ("max_records", "int"),
    "maxLeasesForWorker": ("max_leases_for_worker", "int"),
    "maxLeasesToStealAtOneTime": ("max_leases_to_steal", "int"),
    "dampeningPercentage": ("dampening_percent", "int"),
    "reBalanceThresholdPercentage": ("rebalance_threshold_percent", "int"),
    "varianceBalancingFrequency": ("variance_balancing_frequency", "int"),
    "cleanupLeasesUponShardCompletion": ("cleanup_leases_upon_shard_completion", "flag"),
    "isGracefulLeaseHandoffEnabled": ("graceful_handoff", "flag"),
    "workerId": ("worker_id", "text"),
    "tableName": ("table_name", "text"),
    "consumerName": ("fanout_consumer_name", "text"),
}

#: Keys read elsewhere in this module (or by the daemon runner).
_OTHER_KEYS = frozenset(
    {
        "executableName",
        "streamName",
        "streamArn",
        "applicationName",
        "processingLanguage",
        "initialPositionInStream",
        "initialPositionInStreamExtended",
        "regionName",
        "kinesisEndpoint",
        "dynamoDBEndpoint",
        "retrievalMode",
        "clientVersionConfig",
        "timeoutInSeconds",
        "callProcessRecordsEvenForEmptyRecordList",
        "AWSCredentialsProvider",
        "metricsLevel",
    }
)

#: Keys of the daemon that kclasync does not use, with what happens instead.
_UNSUPPORTED: dict[str, str] = {
    "AWSCredentialsProviderDynamoDB": "the lease table is reached with AWSCredentialsProvider's "
    "credentials",
    "AWSCredentialsProviderCloudWatch": "no CloudWatch metrics are sent",
    "consumerArn": "the stream consumer is found (or registered) by consumerName",
    "maxActiveThreads": "children are driven from one event loop, no thread pool",
    "metricsBufferTimeMillis": "no CloudWatch metrics; see kclasync's Prometheus metrics",
    "metricsMaxQueueSize": "no CloudWatch metrics; see kclasync's Prometheus metrics",
    "metricsEnabledDimensions": "no CloudWatch metrics; see kclasync's Prometheus metrics",
    "validateSequenceNumberBeforeCheckpointing": "checkpoints are checked against the records "
    "delivered, without a Kinesis call",
    "maxGetRecordsThreadPool": "reads are asyncio tasks",
    "retryGetRecordsInSeconds": "reads are asyncio tasks",
    "logWarningForTaskAfterMillis": "not logged",
    "skipShardSyncAtWorkerInitializationIfLeasesExist": "kclasync syncs at start only an empty "
    "lease table",
}

_CREDENTIAL_PREFIX = "awscredentialsprovider"


@attrs.frozen
class MultiLangSettings:
    """Everything ``kclasync multilang`` runs with, decoded from the properties file."""

    command: tuple[str, ...]
    stream: str
    application: str
    config: ConsumerConfig
    client: ClientOptions
    #: How long a child may take to answer a message (``timeoutInSeconds``); None: no limit.
    child_timeout: float | None
    #: One line per property kclasync does not use, with what happens instead.
    notes: tuple[str, ...]
    processing_language: str | None = None


def _credential_keys(values: Values) -> dict[str, str]:
    """The daemon matches the ``AWSCredentialsProvider`` prefix case-insensitively."""
    out = {}
    for key in values.names():
        if key.lower().startswith(_CREDENTIAL_PREFIX):
            canonical = "AWSCredentialsProvider" + key[len(_CREDENTIAL_PREFIX) :]
            out[canonical] = key
    return out


def _session(provider: str | None, key: str, notes: list[str]) -> Any:
    """A boto session for the daemon's credentials provider (None: the default chain).
    The daemon tries each comma-separated provider in turn; the first one known here wins."""
    if provider is None:
        return None
    for entry in provider.split(","):
        name, *args = entry.strip().split("|")
        simple = name.rsplit(".", 1)[-1]
        if simple in (
            "DefaultCredentialsProvider",
            "DefaultAWSCredentialsProviderChain",
            "EnvironmentVariableCredentialsProvider",
            "SystemPropertyCredentialsProvider",
            "InstanceProfileCredentialsProvider",
            "ContainerCredentialsProvider",
            "WebIdentityTokenFileCredentialsProvider",
        ):
            return None
        if simple in ("ProfileCredentialsProvider", "ProfileCredentialsProviderV1"):
            from aiobotocore.session import AioSession

            return AioSession(profile=args[0]) if args else None
    notes.append(
        f"{key} = {provider}: not a provider kclasync maps; the default credential chain "
        "(environment, profile, container, instance) is used"
    )
    return None


def _initial_position(values: Values) -> InitialPosition | None:
    when = values.epoch_seconds("initialPositionInStreamExtended")
    if when is not None:
        return InitialPosition.at_timestamp(when)
    kind = values.choice("initialPositionInStream", ("LATEST", "TRIM_HORIZON", "AT_TIMESTAMP"))
    if kind == "AT_TIMESTAMP":
        raise PropertiesError(
            "initialPositionInStream = AT_TIMESTAMP: give the time as "
            "initialPositionInStreamExtended (seconds since the epoch)"
        )
    return None if kind is None else InitialPosition.parse(kind)


def _config_fields(values: Values) -> tuple[dict[str, Any], dict[str, str]]:
    fields: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for key, (field, kind) in _CONFIG_KEYS.items():
        value: Any
        if kind == "ms":
            value = values.millis(key, positive=True)
        elif kind == "int":
            value = values.whole(key, minimum=1)
        elif kind == "flag":
            value = values.flag(key)
        else:
            value = values.text(key)
        if value is not None:
            fields[field] = value
            origin[field] = key
    return fields, origin


def load_settings(path: str) -> MultiLangSettings:
    """Read and decode the whole file; raises ``PropertiesError`` (one line) on a bad value."""
    values = Values(read_properties(path))
    notes: list[str] = []
    command = split_command(
        values.required(
            "executableName", "must name the record processor, e.g. executableName = app.py"
        )
    )
    application = values.required("applicationName", "is required")
    region = values.text("regionName")
    arn = values.text("streamArn")
    if arn is not None:
        stream, arn_region = stream_from_arn("streamArn", arn)
        region = region or arn_region
        values.text("streamName")
    else:
        stream = values.required("streamName", "is required (or streamArn)")
    fields, origin = _config_fields(values)
    position = _initial_position(values)
    if position is not None:
        fields["initial_position"] = position
        origin["initial_position"] = "initialPositionInStream"
    if retrieval_is_fanout(values):
        fields["retrieval"] = RetrievalMode.FANOUT
    version = values.choice(
        "clientVersionConfig",
        ("CLIENT_VERSION_CONFIG_3X", "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X"),
    )
    # Not set: kclasync's own lease taker (fast failover). CLIENT_VERSION_CONFIG_3X: the KCL 3.x
    # leader-assigned mode, for a table shared with Java 3.x daemons at the same time;
    # COMPATIBLE_WITH_2X: the KCL 2.x rules (every worker takes leases).
    if version == "CLIENT_VERSION_CONFIG_3X":
        fields["lease_taker"] = LeaseTakerKind.KCL3
    elif version == "CLIENT_VERSION_CONFIG_COMPATIBLE_WITH_2X":
        fields["lease_taker"] = LeaseTakerKind.KCL2
    timeout = values.whole("timeoutInSeconds", minimum=1)
    if values.flag("callProcessRecordsEvenForEmptyRecordList"):
        notes.append(
            "callProcessRecordsEvenForEmptyRecordList = true: processRecords is sent only "
            "with records (an empty read is not delivered)"
        )
    level = values.choice("metricsLevel", ("NONE", "SUMMARY", "DETAILED"))
    if level not in (None, "NONE"):
        notes.append(
            f"metricsLevel = {level}: no CloudWatch metrics are sent; kclasync's Prometheus "
            "metrics are kept in the process"
        )
    credentials = _credential_keys(values)
    provider_key = credentials.get("AWSCredentialsProvider")
    session = _session(
        values.text(provider_key) if provider_key else None, "AWSCredentialsProvider", notes
    )
    for canonical, key in credentials.items():
        if canonical != "AWSCredentialsProvider":
            values.used.add(key)
            notes.append(f"{key}: ignored; {_UNSUPPORTED.get(canonical, 'not used')}")
    values.text("processingLanguage")
    client = ClientOptions(
        region_name=region,
        kinesis_endpoint_url=values.endpoint("kinesisEndpoint"),
        dynamodb_endpoint_url=values.endpoint("dynamoDBEndpoint"),
        session=session,
    )
    for key in values.names():
        if key in values.used or key in _OTHER_KEYS:
            continue
        values.used.add(key)
        instead = _UNSUPPORTED.get(key, "kclasync does not use it (kclasync's own default)")
        notes.append(f"{key}: ignored; {instead}")
    try:
        config = ConsumerConfig(**fields)
    except ConfigError as exc:
        key = origin.get(exc.field, exc.field)
        raise PropertiesError(f"{key}: {exc.problem}") from None
    return MultiLangSettings(
        command=command,
        stream=stream,
        application=application,
        config=config,
        client=client,
        child_timeout=None if timeout is None else float(timeout),
        notes=tuple(notes),
        processing_language=values.text("processingLanguage"),
    )
