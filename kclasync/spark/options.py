"""The options of ``format("kinesis")``, parsed and checked on the driver before a query starts.

Owns: ``SourceOptions`` and ``SinkOptions`` (picklable, sent to executors), turning Spark's
string options into them with one ``ConfigError`` naming the option for every bad value, and the
option names each side accepts (an unknown name is refused, so a typo is not silently ignored).
Must not: import pyspark or do I/O (``kclasync.spark.checks`` reaches AWS).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Mapping
from typing import Final

import attrs

from kclasync._core.leases.position import InitialPosition
from kclasync.errors import ConfigError
from kclasync.spark.aliases import translate
from kclasync.spark.fetch import MAX_PAGE, AwsOptions
from kclasync.spark.progress_dynamodb import DEFAULT_PROGRESS_TABLE

__all__ = ["ColumnLayout", "ConsumerType", "SinkOptions", "SourceOptions", "lower_keys"]

_AWS: Final = (
    "region",
    "endpointUrl",
    "dynamodbEndpointUrl",
    "awsAccessKeyId",
    "awsSecretKey",
    "awsSecretAccessKey",
    "awsSessionToken",
)
SOURCE_OPTIONS: Final = (
    "streamName",
    "metadataPath",
    "progressTable",
    "startingPosition",
    "maxRecordsPerShard",
    "maxRecordsPerBatch",
    "maxFetchTimePerShardSec",
    "shardListIntervalSec",
    "leaseTable",
    "failOnDataLoss",
    "consumerType",
    "consumerName",
    "shardsPerTask",
    "maxRecordsPerFetch",
    "columnLayout",
    *_AWS,
)
SINK_OPTIONS: Final = (
    "streamName",
    "partitionKeyColumn",
    "explicitHashKeyColumn",
    "dataColumn",
    "maxRecordsPerRequest",
    "maxAttempts",
    *_AWS,
)
#: Options Spark itself may pass to a data source.
_SPARK_OWN: Final = (
    "path",
    "checkpointlocation",
    "queryname",
    # Added by ``register()``'s ``load()`` (``kclasync.spark.load_checks``).
    "kclasync.latestat",
    "kclasync.checked",
)


#: A stream consumer's name as Kinesis allows it.
_CONSUMER_NAME: Final = re.compile(r"[a-zA-Z0-9_.-]{1,128}")


class ColumnLayout(enum.Enum):
    """Which connector's columns the source emits (``kclasync.spark.schema.LAYOUTS``)."""

    KCLASYNC = "kclasync"
    AWSLABS = "awslabs"
    DATABRICKS = "databricks"


class ConsumerType(enum.Enum):
    """How executors read shards: GetRecords, or enhanced fan-out (SubscribeToShard)."""

    POLLING = "POLLING"
    EFO = "EFO"


def lower_keys(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def _refuse_unknown(opts: Mapping[str, str], known: tuple[str, ...], side: str) -> None:
    names = {n.lower(): n for n in known}
    for key in sorted(opts):
        if key not in names and key not in _SPARK_OWN:
            raise ConfigError(
                key,
                f"is not an option of the kinesis {side}; known options: {', '.join(known)}",
            )


def _int_option(opts: Mapping[str, str], name: str, default: int | None, top: int) -> int | None:
    raw = opts.get(name.lower())
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(name, f"must be an integer, got {raw!r}") from None
    if not 1 <= value <= top:
        raise ConfigError(name, f"must be between 1 and {top}, got {value}")
    return value


def _float_option(opts: Mapping[str, str], name: str, default: float) -> float:
    raw = opts.get(name.lower())
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(name, f"must be a number of seconds, got {raw!r}") from None
    if not 0 <= value < float("inf"):
        raise ConfigError(name, f"must be a non-negative number of seconds, got {value}")
    return value


def _bool_option(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name.lower())
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in ("true", "false"):
        raise ConfigError(name, f"must be true or false, got {raw!r}")
    return value == "true"


def _required(opts: Mapping[str, str], name: str, hint: str) -> str:
    value = opts.get(name.lower(), "").strip()
    if not value:
        raise ConfigError(name, f"is required: {hint}")
    return value


def _aws(opts: Mapping[str, str]) -> AwsOptions:
    return AwsOptions(
        region_name=opts.get("region") or None,
        endpoint_url=opts.get("endpointurl") or None,
        dynamodb_endpoint_url=opts.get("dynamodbendpointurl") or None,
        aws_access_key_id=opts.get("awsaccesskeyid") or None,
        aws_secret_access_key=opts.get("awssecretkey") or opts.get("awssecretaccesskey") or None,
        aws_session_token=opts.get("awssessiontoken") or None,
    )


@attrs.frozen
class SourceOptions:
    """The source's options (see docs/spark.md for each)."""

    stream_name: str
    starting_position: InitialPosition
    aws: AwsOptions
    metadata_path: str | None = None
    progress_table: str = DEFAULT_PROGRESS_TABLE
    max_records_per_shard: int = 10_000
    max_records_per_batch: int | None = None
    max_fetch_seconds: float = 10.0
    shard_list_interval: float = 10.0
    lease_table: str | None = None
    fail_on_data_loss: bool = True
    consumer_type: ConsumerType = ConsumerType.POLLING
    consumer_name: str | None = None
    shards_per_task: int = 1
    #: Records asked for per GetRecords call (Kinesis allows at most 10,000).
    max_records_per_fetch: int = MAX_PAGE
    column_layout: ColumnLayout = ColumnLayout.KCLASYNC
    #: Options of another connector that were accepted without effect, with why.
    ignored: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SourceOptions:
        """Our options, or the awslabs or Databricks connectors' names for them
        (``kclasync.spark.aliases``); every error names the option as the user wrote it."""
        names = {str(k).lower(): str(k) for k in dict(options)}
        try:
            translation = translate({str(k): str(v) for k, v in dict(options).items()})
        except ConfigError as exc:
            raise ConfigError(names.get(exc.field, exc.field), exc.problem) from None
        try:
            return cls._parse(translation.options, translation.awslabs, translation.ignored)
        except ConfigError as exc:
            named = translation.named(exc)
            raise ConfigError(names.get(named.field, named.field), named.problem) from None

    @classmethod
    def _parse(
        cls, opts: dict[str, str], awslabs: bool, ignored: Mapping[str, str]
    ) -> SourceOptions:
        _refuse_unknown(opts, SOURCE_OPTIONS, "source")
        stream = _required(opts, "streamName", ".option('streamName', 'orders')")
        metadata = opts.get("metadatapath", "").strip() or None
        if metadata is not None and not os.path.isabs(metadata):
            raise ConfigError(
                "metadataPath",
                f"must be an absolute path that the driver and every executor share, got "
                f"{metadata!r} (a relative path resolves in each executor's own work "
                "directory); leave it out to keep progress in DynamoDB (progressTable)",
            )
        try:
            start = InitialPosition.parse(opts.get("startingposition", "LATEST"))
        except ValueError as exc:
            raise ConfigError("startingPosition", str(exc)) from None
        per_shard = _int_option(opts, "maxRecordsPerShard", 10_000, 1_000_000)
        assert per_shard is not None
        consumer_type, consumer_name = _consumer(opts)
        return cls(
            stream_name=stream,
            starting_position=start,
            aws=_aws(opts),
            metadata_path=metadata,
            progress_table=opts.get("progresstable", "").strip() or DEFAULT_PROGRESS_TABLE,
            max_records_per_shard=per_shard,
            max_records_per_batch=_int_option(opts, "maxRecordsPerBatch", None, 100_000_000),
            max_fetch_seconds=_float_option(opts, "maxFetchTimePerShardSec", 10.0),
            shard_list_interval=_float_option(opts, "shardListIntervalSec", 10.0),
            lease_table=opts.get("leasetable", "").strip() or None,
            fail_on_data_loss=_bool_option(opts, "failOnDataLoss", True),
            consumer_type=consumer_type,
            consumer_name=consumer_name,
            shards_per_task=_int_option(opts, "shardsPerTask", 1, 1000) or 1,
            max_records_per_fetch=_int_option(opts, "maxRecordsPerFetch", MAX_PAGE, MAX_PAGE)
            or MAX_PAGE,
            column_layout=_layout(opts, awslabs),
            ignored=tuple(sorted(ignored.items())),
        )


def _layout(opts: Mapping[str, str], awslabs: bool) -> ColumnLayout:
    raw = opts.get("columnlayout", "").strip().lower()
    if not raw:
        return ColumnLayout.AWSLABS if awslabs else ColumnLayout.KCLASYNC
    try:
        return ColumnLayout(raw)
    except ValueError:
        raise ConfigError(
            "columnLayout", f"must be kclasync, awslabs or databricks, got {raw!r}"
        ) from None


def _consumer(opts: Mapping[str, str]) -> tuple[ConsumerType, str | None]:
    raw = opts.get("consumertype", "").strip() or ConsumerType.POLLING.value
    try:
        kind = ConsumerType(raw.upper())
    except ValueError:
        raise ConfigError(
            "consumerType", f"must be POLLING or EFO (enhanced fan-out), got {raw!r}"
        ) from None
    name = opts.get("consumername", "").strip() or None
    if kind is ConsumerType.POLLING:
        if name is not None:
            raise ConfigError(
                "consumerName", "applies only with consumerType=EFO (enhanced fan-out)"
            )
        return kind, None
    if name is None:
        raise ConfigError(
            "consumerName",
            "is required with consumerType=EFO: the stream consumer to register or reuse, "
            "e.g. .option('consumerName', 'orders-to-lake'); concurrent queries on one "
            "stream need distinct names",
        )
    if not _CONSUMER_NAME.fullmatch(name):
        raise ConfigError(
            "consumerName",
            f"must be 1-128 characters of letters, digits, '_', '.' and '-', got {name!r}",
        )
    return kind, name


@attrs.frozen
class SinkOptions:
    """The sink's options (see docs/spark.md for each)."""

    stream_name: str
    aws: AwsOptions
    partition_key_column: str = "partitionKey"
    explicit_hash_key_column: str | None = None
    data_column: str = "data"
    max_records_per_request: int = 500
    max_attempts: int = 10

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> SinkOptions:
        """Our options or awslabs' ``kinesis.``-prefixed names for them."""
        names = {k.lower(): k for k in dict(options)}
        try:
            translation = translate({str(k): str(v) for k, v in dict(options).items()})
            return cls._parse(translation.options)
        except ConfigError as exc:
            raise ConfigError(names.get(exc.field.lower(), exc.field), exc.problem) from None

    @classmethod
    def _parse(cls, opts: dict[str, str]) -> SinkOptions:
        _refuse_unknown(opts, SINK_OPTIONS, "sink")
        stream = _required(opts, "streamName", ".option('streamName', 'orders')")
        per_request = _int_option(opts, "maxRecordsPerRequest", 500, 500)
        attempts = _int_option(opts, "maxAttempts", 10, 100)
        assert per_request is not None and attempts is not None
        return cls(
            stream_name=stream,
            aws=_aws(opts),
            partition_key_column=opts.get("partitionkeycolumn", "").strip() or "partitionKey",
            explicit_hash_key_column=opts.get("explicithashkeycolumn", "").strip() or None,
            data_column=opts.get("datacolumn", "").strip() or "data",
            max_records_per_request=per_request,
            max_attempts=attempts,
        )
