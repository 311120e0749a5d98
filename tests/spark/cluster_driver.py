"""A Spark driver for the standalone-cluster test, run as its own process:

    python -m tests.spark.cluster_driver <master-url> <options.json> <checkpoint> <out-dir>

Reads the ``kinesis`` source with Trigger.AvailableNow and writes each micro-batch's rows to
``<out-dir>/batch-<id>.jsonl`` on the driver (written whole under a temporary name, then
renamed; a replayed batch replaces its file), so the output needs no path shared with the
executors. Prints ``done <rows>`` when the query finished.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def main() -> None:
    master, options_file, checkpoint, out = sys.argv[1:5]
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from kclasync.spark import register

    with open(options_file, encoding="utf-8") as f:
        options = json.load(f)
    spark = (
        SparkSession.builder.master(master)
        .appName("kclasync-cluster-test")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.memory", "512m")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "1")
        .config("spark.cores.max", "2")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.executorEnv.PYSPARK_PYTHON", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    os.makedirs(out, exist_ok=True)

    def keep(df: Any, batch_id: int) -> None:
        rows = df.select(
            F.get_json_object(F.col("data").cast("string"), "$.id").cast("long").alias("id"),
            "shardId",
            "sequenceNumber",
        ).collect()
        final = os.path.join(out, f"batch-{batch_id}.jsonl")
        tmp = final + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps({"id": r[0], "shard": r[1], "seq": r[2], "batch": batch_id}))
                f.write("\n")
        os.replace(tmp, final)
        print(f"batch {batch_id}: {len(rows)} rows", file=sys.stderr, flush=True)

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
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"done {rows}", flush=True)
    spark.stop()


if __name__ == "__main__":
    main()
