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

from kclasync.spark.data_source import KinesisDataSource
from kclasync.spark.load_checks import install as install_load_checks
from kclasync.spark.options import SourceOptions
from kclasync.spark.schema import ARROW_SCHEMA, COLUMNS, SCHEMA_DDL, records_to_arrow
from kclasync.spark.sink import BatchInfo, ParquetSink, ResumableWriter, SparkProcessor

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


def register(spark: Any, *, check_at_load: bool = True) -> None:
    """Make ``spark.readStream.format("kinesis")`` available in ``spark``'s session (classic or
    Spark Connect).

    With ``check_at_load`` (the default), ``load()`` of a ``kinesis`` stream in this process
    checks the options, the stream and the progress table and pins ``LATEST`` whether or not
    the query gives a schema, and raises kclasync's own error there
    (``kclasync.spark.load_checks``)."""
    spark.dataSource.register(KinesisDataSource)
    if check_at_load:
        install_load_checks()
