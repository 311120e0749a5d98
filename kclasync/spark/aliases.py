"""The option names of the other Spark Kinesis connectors, translated to the source's own.

A query written for awslabs' spark-sql-kinesis-connector (``format("aws-kinesis")``, options
prefixed ``kinesis.``) or for Databricks' built-in ``kinesis`` source moves to
``format("kinesis")`` unchanged: each of their options is either

* **translated** to the source's own option, with the value rewritten where the two spell it
  differently (``GetRecords`` -> ``POLLING``, ``EARLIEST`` -> ``TRIM_HORIZON``, ``"10s"`` ->
  ``10``, a stream ARN -> its name and region);
* **accepted without effect** when it only tunes how the other connector works inside (thread
  pools, buffer sizes, its own retry counts): kclasync does that job its own way, and the option
  changes nothing that a query can observe; the name is kept in ``Translation.ignored`` so the
  driver can say so once;
* or **refused** with a one-line reason, when its meaning cannot be honoured here (assuming an
  IAM role, a Java credential-provider class, a metadata path on S3 or HDFS).

docs/spark.md has the table. Owns: that table as data (``AWSLABS``, ``DATABRICKS``) and
``translate``. Must not: import pyspark, do I/O, or check values the source's own parser checks
(``kclasync.spark.options`` does that after translation, naming the option the user wrote).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Final

import attrs

from kclasync.errors import ConfigError

__all__ = ["AWSLABS", "DATABRICKS", "Alias", "Translation", "translate"]

Convert = Callable[[str, str], dict[str, str]]


@attrs.frozen
class Alias:
    """One foreign option: what it becomes (``convert`` returns our options for its value),
    or why it is ignored or refused."""

    convert: Convert | None = None
    ignored: str | None = None
    refused: str | None = None


def _to(name: str) -> Convert:
    return lambda _key, value: {name: value}


_DURATION: Final = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|min|h)?\s*", re.IGNORECASE)
_SCALE: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def _seconds(name: str) -> Convert:
    """A duration such as ``10s``, ``100ms``, ``2m`` or a bare number of seconds."""

    def convert(key: str, value: str) -> dict[str, str]:
        match = _DURATION.fullmatch(value)
        if match is None:
            raise ConfigError(key, f"must be a duration such as 10s, 500ms or 2m, got {value!r}")
        amount = float(match[1]) * _SCALE[(match[2] or "s").lower()]
        return {name: f"{amount:g}"}

    return convert


def _milliseconds(name: str) -> Convert:
    def convert(key: str, value: str) -> dict[str, str]:
        try:
            millis = float(value)
        except ValueError:
            raise ConfigError(key, f"must be a number of milliseconds, got {value!r}") from None
        return {name: f"{millis / 1000:g}"}

    return convert


def _position(key: str, value: str) -> dict[str, str]:
    """awslabs: LATEST, TRIM_HORIZON, EARLIEST, ``AT_TIMESTAMP <ISO-8601>``; Databricks:
    latest, trim_horizon, earliest, or JSON ``{"at_timestamp": "<time>"}``."""
    text = value.strip()
    if text.startswith("{"):
        try:
            spec = json.loads(text)
            when = str(spec["at_timestamp"])
        except (ValueError, KeyError, TypeError):
            raise ConfigError(
                key,
                f'must be latest, trim_horizon, earliest or {{"at_timestamp": ...}}, got {text!r}',
            ) from None
        if spec.get("format") not in (None, ""):
            raise ConfigError(
                key,
                "a custom at_timestamp format is not supported: give the time in ISO-8601 "
                '(e.g. {"at_timestamp": "2026-01-01T00:00:00+00:00"}) and leave out "format"',
            )
        return {"startingPosition": f"AT_TIMESTAMP:{_iso(key, when)}"}
    if text.upper().startswith("AT_TIMESTAMP"):
        when = text[len("AT_TIMESTAMP") :].lstrip(" :")
        return {"startingPosition": f"AT_TIMESTAMP:{_iso(key, when)}"}
    kind = text.upper()
    return {"startingPosition": "TRIM_HORIZON" if kind == "EARLIEST" else kind}


def _iso(key: str, when: str) -> str:
    stamp = when.strip()
    try:
        datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError(key, f"the time must be ISO-8601 with an offset, got {when!r}") from None
    return stamp.replace("Z", "+00:00")


def _consumer_type(key: str, value: str) -> dict[str, str]:
    kinds = {"getrecords": "POLLING", "polling": "POLLING", "subscribetoshard": "EFO", "efo": "EFO"}
    kind = kinds.get(value.strip().lower())
    if kind is None:
        raise ConfigError(key, f"must be GetRecords or SubscribeToShard, got {value!r}")
    return {"consumerType": kind}


def _consumer_mode(key: str, value: str) -> dict[str, str]:
    mode = value.strip().lower()
    if mode == "auto":
        return {"consumerType": "AUTO"}  # resolved in ``translate``: EFO with a consumer name
    if mode not in ("polling", "efo"):
        raise ConfigError(key, f"must be polling, efo or auto, got {value!r}")
    return {"consumerType": mode.upper()}


_ARN: Final = re.compile(r"arn:aws[\w-]*:kinesis:([\w-]+):\d{12}:stream/([\w.-]+)")


def _stream_arn(key: str, value: str) -> dict[str, str]:
    match = _ARN.fullmatch(value.strip())
    if match is None:
        raise ConfigError(
            key,
            f"must be a stream ARN (arn:aws:kinesis:<region>:<account>:stream/<name>), "
            f"got {value!r}",
        )
    return {"streamName": match[2], "region": match[1]}


def _stream_names(key: str, value: str) -> dict[str, str]:
    if "," in value:
        raise ConfigError(
            key, "reading several streams in one source is not supported: one stream per query"
        )
    return {"streamName": value}


def _committer(key: str, value: str) -> dict[str, str]:
    kind = value.strip().upper()
    if kind not in ("HDFS", "DYNAMODB"):
        raise ConfigError(key, f"must be HDFS or DYNAMODB, got {value!r}")
    return {}  # DYNAMODB is the default here; HDFS takes effect through kinesis.metadataPath


def _metadata_path(key: str, value: str) -> dict[str, str]:
    if "://" in value:
        raise ConfigError(
            key,
            f"{value!r}: progress records need a directory every executor shares on a mounted "
            "file system; leave the option out to keep them in DynamoDB (progressTable)",
        )
    return {"metadataPath": value}


_TUNING = "tunes the other connector's internals; kclasync reads its own way"

#: awslabs' spark-sql-kinesis-connector, keyed by the lower-cased option name.
AWSLABS: Final[dict[str, Alias]] = {
    "kinesis.streamname": Alias(_stream_names),
    "kinesis.region": Alias(_to("region")),
    "kinesis.kinesisregion": Alias(_to("region")),
    "kinesis.endpointurl": Alias(_to("endpointUrl")),
    "kinesis.startingposition": Alias(_position),
    "kinesis.consumertype": Alias(_consumer_type),
    "kinesis.consumername": Alias(_to("consumerName")),
    "kinesis.maxfetchrecordspershard": Alias(_to("maxRecordsPerShard")),
    "kinesis.maxfetchtimepershardsec": Alias(_to("maxFetchTimePerShardSec")),
    "kinesis.failondataloss": Alias(_to("failOnDataLoss")),
    "kinesis.describeshardinterval": Alias(_seconds("shardListIntervalSec")),
    "kinesis.metadatacommittertype": Alias(_committer),
    "kinesis.metadatapath": Alias(_metadata_path),
    "kinesis.dynamodb.tablename": Alias(_to("progressTable")),
    "kinesis.awsaccesskeyid": Alias(_to("awsAccessKeyId")),
    "kinesis.awssecretkey": Alias(_to("awsSecretKey")),
    "kinesis.getrecords.numberofrecordsperfetch": Alias(_to("maxRecordsPerFetch")),
    "kinesis.getrecords.fetchintervalms": Alias(ignored=_TUNING),
    "kinesis.minbatchestoretain": Alias(ignored="progress of committed batches is deleted"),
    "kinesis.checknewrecordthreads": Alias(ignored=_TUNING),
    "kinesis.metadatanumretries": Alias(ignored=_TUNING),
    "kinesis.metadataretryintervalsms": Alias(ignored=_TUNING),
    "kinesis.metadatamaxretryintervalms": Alias(ignored=_TUNING),
    "kinesis.clientnumretries": Alias(ignored=_TUNING),
    "kinesis.clientretryintervalsms": Alias(ignored=_TUNING),
    "kinesis.clientmaxretryintervalms": Alias(ignored=_TUNING),
    "kinesis.subscribetoshard.timeoutsec": Alias(ignored=_TUNING),
    "kinesis.subscribetoshard.maxretries": Alias(ignored=_TUNING),
    # The sink's: it sends PutRecords batches without KPL aggregation, retrying what failed.
    "kinesis.sink.flushwaittimems": Alias(ignored=_TUNING),
    "kinesis.sink.recordmaxbufferedtimems": Alias(ignored=_TUNING),
    "kinesis.sink.maxconnections": Alias(ignored=_TUNING),
    "kinesis.sink.aggregationenabled": Alias(
        ignored="records are put one by one (readers see the same user records)"
    ),
    "kinesis.sink.recordttl": Alias(ignored="a record is retried up to maxAttempts instead"),
    "kinesis.stsrolearn": Alias(
        refused="assuming an IAM role is not supported: give the executors credentials for the "
        "role (instance profile, AWS_* environment, or awsAccessKeyId/awsSecretKey)"
    ),
    "kinesis.stssessionname": Alias(refused="goes with kinesis.stsRoleArn, which is not supported"),
    "kinesis.stsendpointurl": Alias(refused="goes with kinesis.stsRoleArn, which is not supported"),
    "kinesis.credentialproviderclass": Alias(
        refused="a Java credential provider cannot run here: use the default credential chain "
        "or awsAccessKeyId/awsSecretKey"
    ),
    "kinesis.credentialproviderparam": Alias(
        refused="goes with kinesis.credentialProviderClass, which cannot run here"
    ),
}

#: Databricks' ``kinesis`` source (only the names that are not already the source's own).
DATABRICKS: Final[dict[str, Alias]] = {
    "initialposition": Alias(_position),
    "maxrecordsperfetch": Alias(_to("maxRecordsPerFetch")),
    "maxfetchduration": Alias(_seconds("maxFetchTimePerShardSec")),
    "shardfetchinterval": Alias(_seconds("shardListIntervalSec")),
    "awsaccesskey": Alias(_to("awsAccessKeyId")),
    "endpoint": Alias(_to("endpointUrl")),
    "streamarn": Alias(_stream_arn),
    "consumermode": Alias(_consumer_mode),
    "maxfetchrate": Alias(ignored="GetRecords is paced by the shard's own limits"),
    "fetchbuffersize": Alias(ignored=_TUNING),
    "coalescethresholdblocksize": Alias(ignored=_TUNING),
    "coalescebinsize": Alias(ignored=_TUNING),
    "consumerrefreshinterval": Alias(ignored=_TUNING),
    "requireconsumerderegistration": Alias(
        ignored="the stream consumer is kept for the next run of the query"
    ),
    "rolearn": Alias(
        refused="assuming an IAM role is not supported: give the executors credentials for the "
        "role (instance profile, AWS_* environment, or awsAccessKeyId/awsSecretKey)"
    ),
    "roleexternalid": Alias(refused="goes with roleArn, which is not supported"),
    "rolesessionname": Alias(refused="goes with roleArn, which is not supported"),
    "stsendpoint": Alias(refused="goes with roleArn, which is not supported"),
    "servicecredential": Alias(
        refused="Databricks service credentials exist only on Databricks: use the default "
        "credential chain or awsAccessKeyId/awsSecretKey"
    ),
}

_ALL: Final = {**AWSLABS, **DATABRICKS}


@attrs.frozen
class Translation:
    """The options in the source's own names, and what was dropped."""

    options: dict[str, str]
    #: Foreign names accepted without effect, with why.
    ignored: dict[str, str]
    #: Whether any ``kinesis.``-prefixed (awslabs) option was given.
    awslabs: bool
    #: For each of our (lower-cased) names, the name the user wrote.
    origin: dict[str, str]

    def named(self, exc: ConfigError) -> ConfigError:
        """``exc`` about one of our options, re-named to the option the user wrote."""
        given = self.origin.get(exc.field.lower())
        if given is None or given.lower() == exc.field.lower():
            return exc
        return ConfigError(given, exc.problem)


def translate(options: Mapping[str, str]) -> Translation:
    """``options`` (lower-cased keys out) with every foreign name replaced by the source's own. A
    foreign option and the source's own for the same thing, given with different values, is an
    error naming both; so is a refused option."""
    out: dict[str, str] = {}
    origin: dict[str, str] = {}
    ignored: dict[str, str] = {}
    awslabs = False
    for key, value in options.items():
        alias = _ALL.get(key.lower())
        if alias is None:
            _put(out, origin, key.lower(), value, key)
            continue
        awslabs = awslabs or key.lower().startswith("kinesis.")
        if alias.refused is not None:
            raise ConfigError(key, alias.refused)
        if alias.ignored is not None:
            ignored[key] = alias.ignored
            continue
        assert alias.convert is not None
        for ours, converted in alias.convert(key, value).items():
            _put(out, origin, ours.lower(), converted, key)
    if out.get("consumertype") == "AUTO":
        out["consumertype"] = "EFO" if out.get("consumername") else "POLLING"
    return Translation(out, ignored, awslabs, origin)


def _put(out: dict[str, str], origin: dict[str, str], ours: str, value: str, given: str) -> None:
    if ours in out and out[ours] != value:
        raise ConfigError(
            given, f"says {value!r} but {origin[ours]} says {out[ours]!r}: give only one of them"
        )
    out[ours] = value
    origin.setdefault(ours, given)
