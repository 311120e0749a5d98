"""A Spark Connect client for the Connect test, run as its own process:

    python -m tests.spark.connect_driver <options.json> <checkpoint> <out-dir> <sink.json>

Connects to the Spark Connect server at ``$KCLASYNC_CONNECT_REMOTE`` (``sc://host:port``), or
without it starts a local one (``SparkSession.builder.remote("local[2]")``, from the pyspark
install), registers the source through the Connect client, reads the ``kinesis``
source with Trigger.AvailableNow and appends each micro-batch's rows with its batch id to
parquet in ``<out-dir>``, prints ``done <rows read> <session id>`` and stops the session. Then
it reads a line from stdin: on ``restart`` it does the same in a new session (the query
restarted from the same checkpoint), then puts the N rows of ``<sink.json>``
(``{"options": {...}, "rows": N}``, read then) into a stream with ``df.write.format("kinesis")``
and prints ``done`` again; at the end of stdin it exits.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def run_query(options: dict[str, str], checkpoint: str, out: str) -> Any:
    """A new Connect session with the source registered, after the query ran in it."""
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from kclasync.spark import register

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
    print(f"done {rows} {spark.session_id}", flush=True)
    return spark


def put_rows(spark: Any, sink_file: str) -> None:
    from pyspark.sql import functions as F

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


def main() -> None:
    options_file, checkpoint, out, sink_file = sys.argv[1:5]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with open(options_file, encoding="utf-8") as f:
        options = json.load(f)
    run_query(options, checkpoint, out).stop()
    if sys.stdin.readline().strip() != "restart":
        return
    spark = run_query(options, checkpoint, out)
    put_rows(spark, sink_file)
    print("done", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
