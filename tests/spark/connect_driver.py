"""A Spark Connect client for the Connect test, run as its own process:

    python -m tests.spark.connect_driver <options.json> <checkpoint> <out-dir> [<sink.json>]

Connects to the Spark Connect server at ``$KCLASYNC_CONNECT_REMOTE`` (``sc://host:port``), or
without it starts a local one (``SparkSession.builder.remote("local[2]")``, from the pyspark
install), registers the source through the Connect client, reads the ``kinesis``
source with Trigger.AvailableNow and appends each micro-batch's rows with its batch id to
parquet in ``<out-dir>``. With ``<sink.json>`` (``{"options": {...}, "rows": N}``) it then puts
N rows into a stream with ``df.write.format("kinesis")``. Prints ``done <rows read>``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main() -> None:
    options_file, checkpoint, out = sys.argv[1:4]
    sink_file = sys.argv[4] if len(sys.argv) > 4 else None
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from kclasync.spark import register

    with open(options_file, encoding="utf-8") as f:
        options = json.load(f)
    spark = (
        SparkSession.builder.remote(os.environ.get("KCLASYNC_CONNECT_REMOTE", "local[2]"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    register(spark)

    def keep(df: Any, batch_id: int) -> None:
        df.withColumn("batch", F.lit(batch_id)).write.mode("append").parquet(out)

    query = (
        spark.readStream.format("kinesis")
        .options(**options)
        .load()
        .writeStream.foreachBatch(keep)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        print(f"failed {query.exception()}", flush=True)
        sys.exit(1)
    rows = sum(p.numInputRows or 0 for p in query.recentProgress)
    if sink_file is not None:
        with open(sink_file, encoding="utf-8") as f:
            sink = json.load(f)
        (
            spark.range(sink["rows"])
            .select(
                F.col("id").cast("string").alias("partitionKey"),
                F.to_json(F.struct(F.col("id"))).alias("data"),
            )
            .write.format("kinesis")
            .options(**sink["options"])
            .mode("append")
            .save()
        )
    print(f"done {rows}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
