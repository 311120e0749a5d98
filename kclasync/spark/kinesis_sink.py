"""``df.write.format("kinesis")`` and ``df.writeStream.format("kinesis")``: a Kinesis sink.

Owns: the Spark writers (batch and streaming) that turn each partition's rows into PutRecords
entries (a partition-key column, a data column, an optional explicit-hash-key column), put
them from the executors (``kclasync.spark.put``), and sum the tasks' counts on the driver,
logged per batch and kept in ``SINK_TOTALS`` for the process that commits.
Must not: promise exactly-once: a retried task or a replayed micro-batch puts its rows again
(at-least-once; consumers that must not see duplicates deduplicate, e.g. on a key in the data).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Iterator
from typing import Any

import attrs
from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage

from kclasync.errors import ConfigError
from kclasync.spark.options import SinkOptions
from kclasync.spark.put import Entry, PutStats, put_all

__all__ = ["SINK_TOTALS", "KinesisBatchWriter", "KinesisStreamWriter", "check_columns"]

log = logging.getLogger("kclasync.spark")

#: Counts of every commit made in this process (the driver's Python worker that commits).
SINK_TOTALS = PutStats()


@attrs.frozen
class PutMessage(WriterCommitMessage):
    """One task's counts, sent to the driver with the commit."""

    stats: PutStats


def check_columns(options: SinkOptions, names: list[str]) -> None:
    """The columns the options name exist (checked on the driver before anything runs)."""
    wanted = [
        ("partitionKeyColumn", options.partition_key_column),
        ("dataColumn", options.data_column),
    ]
    if options.explicit_hash_key_column is not None:
        wanted.append(("explicitHashKeyColumn", options.explicit_hash_key_column))
    for option, column in wanted:
        if column not in names:
            raise ConfigError(
                option, f"column {column!r} is not in the DataFrame (columns: {', '.join(names)})"
            )


def _data(value: Any, row: int) -> bytes:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise ValueError(
        f"row {row}: the data column must be BINARY or STRING, got {type(value).__name__}"
    )


def _entries(options: SinkOptions, rows: Iterator[Any]) -> Iterator[Entry]:
    hash_col = options.explicit_hash_key_column
    for i, row in enumerate(rows):
        key = row[options.partition_key_column]
        data = row[options.data_column]
        if key is None or data is None:
            raise ValueError(
                f"row {i}: {options.partition_key_column if key is None else options.data_column}"
                " is null; every record needs a partition key and data"
            )
        explicit = row[hash_col] if hash_col is not None else None
        yield Entry(str(key), _data(data, i), str(explicit) if explicit is not None else None)


def write_partition(options: SinkOptions, rows: Iterator[Any]) -> PutMessage:
    """Put one partition's rows (on an executor)."""

    async def go() -> PutStats:
        async with options.aws.client_options().create_client("kinesis") as client:
            return await put_all(
                client,
                options.stream_name,
                _entries(options, rows),
                max_records=options.max_records_per_request,
                attempts=options.max_attempts,
            )

    return PutMessage(asyncio.run(go()))


def _visible() -> None:
    """Make this process's INFO lines of ``kclasync.spark`` reach its stderr (which Spark
    passes on to the driver's console and log) when nothing was configured: the commit runs in
    a Python process of Spark's own, where Python logging has no handler and would drop them."""
    if logging.getLogger().handlers or log.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    if log.getEffectiveLevel() > logging.INFO:
        log.setLevel(logging.INFO)


def _total(messages: list[Any]) -> PutStats:
    _visible()
    total = PutStats()
    for m in messages:
        if isinstance(m, PutMessage):
            total.add(m.stats)
    SINK_TOTALS.add(total)
    return total


class KinesisBatchWriter(DataSourceWriter):
    """``df.write.format("kinesis")``."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> PutMessage:
        return write_partition(self.options, iterator)

    def commit(self, messages: list[Any]) -> None:
        t = _total(messages)
        log.info(
            "kinesis sink to %s: %d records, %d bytes, %d PutRecords calls, %d records retried",
            self.options.stream_name,
            t.records,
            t.bytes,
            t.requests,
            t.retried_records,
        )

    def abort(self, messages: list[Any]) -> None:
        t = _total(messages)
        log.warning(
            "kinesis sink to %s aborted after %d records were written (they stay written)",
            self.options.stream_name,
            t.records,
        )


class KinesisStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("kinesis")``: each micro-batch's rows are put by the tasks."""

    def __init__(self, options: SinkOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> PutMessage:
        return write_partition(self.options, iterator)

    def commit(self, messages: list[Any], batchId: int) -> None:
        t = _total(messages)
        log.info(
            "kinesis sink to %s, batch %d: %d records, %d bytes, %d PutRecords calls, "
            "%d records retried, %d requests throttled",
            self.options.stream_name,
            batchId,
            t.records,
            t.bytes,
            t.requests,
            t.retried_records,
            t.throttled_requests,
        )

    def abort(self, messages: list[Any], batchId: int) -> None:
        t = _total(messages)
        log.warning(
            "kinesis sink to %s, batch %d aborted after %d records were written; the batch is "
            "written again when it is retried (at-least-once)",
            self.options.stream_name,
            batchId,
            t.records,
        )
