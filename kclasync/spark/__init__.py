"""Spark integration: a ``kinesis`` streaming source for PySpark, and a Spark processor for
kclasync workers. Needs the ``spark`` extra (``pip install 'kclasync[spark]'``: pyspark, pyarrow).

* ``register(spark)`` then ``spark.readStream.format("kinesis").option("streamName", ...)``:
  see ``kclasync.spark.source`` and docs/spark.md for the options.
* ``SparkProcessor.factory(spark, write)`` as a ``Consumer``'s processor: each batch becomes a
  DataFrame handed to ``write(df, info)``; ``ParquetSink(path)`` is an idempotent ``write``.

``import kclasync`` never imports this package; importing it imports pyspark and pyarrow.
"""

from __future__ import annotations

from typing import Any

from kclasync.spark.schema import ARROW_SCHEMA, COLUMNS, SCHEMA_DDL, records_to_arrow
from kclasync.spark.sink import BatchInfo, ParquetSink, ResumableWriter, SparkProcessor
from kclasync.spark.source import KinesisDataSource, SourceOptions

__all__ = [
    "ARROW_SCHEMA",
    "COLUMNS",
    "SCHEMA_DDL",
    "BatchInfo",
    "KinesisDataSource",
    "ParquetSink",
    "ResumableWriter",
    "SourceOptions",
    "SparkProcessor",
    "records_to_arrow",
    "register",
]


def register(spark: Any) -> None:
    """Make ``spark.readStream.format("kinesis")`` available in ``spark``'s session."""
    spark.dataSource.register(KinesisDataSource)
