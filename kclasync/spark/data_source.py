"""``format("kinesis")``: the Spark 4 Python data source that ``kclasync.spark.register`` adds.

Owns: the ``DataSource`` itself: its name, the schema ``load()`` gets without a user schema (and
the checks and LATEST pin made then), the stream reader it makes (``kclasync.spark.source``) and
the sinks (``kclasync.spark.kinesis_sink``), each checked on the driver before anything runs.
Must not: plan batches or read records (the reader and the shard tasks do).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pyspark.sql.datasource import DataSource

from kclasync.spark.checks import check_sink, check_source
from kclasync.spark.driver_io import in_source_runner
from kclasync.spark.errors_first import user_facing
from kclasync.spark.kinesis_sink import KinesisBatchWriter, KinesisStreamWriter, check_columns
from kclasync.spark.load_checks import CHECKED, LATEST_AT
from kclasync.spark.options import SinkOptions, SourceOptions
from kclasync.spark.schema import layout_ddl, with_schema_layout
from kclasync.spark.source import KinesisStreamReader

__all__ = ["KinesisDataSource"]


class KinesisDataSource(DataSource):
    """``format("kinesis")``: a streaming source, and a batch and streaming sink; register with
    ``kclasync.spark.register(spark)``."""

    @classmethod
    def name(cls) -> str:
        return "kinesis"

    @user_facing
    def schema(self) -> str:
        # Called by ``load()`` without a user schema. ``register()``'s wrapper of ``load()``
        # (``load_checks``) has normally checked the options, the stream and the progress table
        # in the user's process already, and pinned LATEST; without it (the data source
        # registered by hand), the checks run here, and Spark keeps this instance (pickled) for
        # the query, so the moment LATEST stands for is taken here.
        self.loaded_at = datetime.now(UTC)
        options = SourceOptions.parse(self.options)
        if not self._option(CHECKED):
            check_source(options)
        return layout_ddl(options.column_layout.value)

    def _option(self, name: str) -> str | None:
        wanted = name.lower()
        return next((str(v) for k, v in self.options.items() if k.lower() == wanted), None)

    @user_facing
    def streamReader(self, schema: Any) -> KinesisStreamReader:
        options = with_schema_layout(SourceOptions.parse(self.options), schema)
        pinned = self._option(LATEST_AT)
        latest_at = datetime.fromisoformat(pinned) if pinned else getattr(self, "loaded_at", None)
        reader = KinesisStreamReader(options, latest_at)
        if in_source_runner():
            reader.open_early()
        return reader

    @user_facing
    def _sink(self, schema: Any) -> SinkOptions:
        # Called on the driver by ``save()`` / ``start()``: bad options, missing columns, a
        # missing stream or an unreachable endpoint fail here, before any row is written.
        options = SinkOptions.parse(self.options)
        check_columns(options, list(schema.fieldNames()))
        check_sink(options)
        return options

    def writer(self, schema: Any, overwrite: bool) -> KinesisBatchWriter:
        return KinesisBatchWriter(self._sink(schema))

    def streamWriter(self, schema: Any, overwrite: bool) -> KinesisStreamWriter:
        return KinesisStreamWriter(self._sink(schema))
