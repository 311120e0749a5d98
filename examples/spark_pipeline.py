"""A complete Kinesis -> Spark -> parquet pipeline, both ways in, on a local emulator.

    uv run python examples/spark_pipeline.py

1. Starts moto's server on 127.0.0.1 and writes 2,000 JSON records to a 2-shard stream.
2. Spark source: ``spark.readStream.format("kinesis")`` drains the stream into parquet with
   Trigger.AvailableNow, recording its positions in the lease table ``orders-pipeline``.
3. 500 more records arrive; kclasync workers take over from the lease table and write them with
   ``SparkProcessor`` + ``ParquetSink`` (nothing from step 2 is read again).
4. Both outputs are read back and counted.
Against AWS, drop the emulator, ``endpointUrl`` and the dummy keys.
"""

from __future__ import annotations

import asyncio
import os
import sys
import tempfile
from typing import Any

import orjson
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync.spark import BatchInfo, ParquetSink, SparkProcessor, register
from kclasync.testing.emulators import LocalAws, moto_process

STREAM = "orders"
TABLE = "orders-pipeline"


async def produce(local: LocalAws, first: int, count: int, create: bool = False) -> None:
    async with local.client_options().create_client("kinesis") as client:
        kinesis = KinesisStreamClient(client)
        if create:
            await kinesis.create_stream(STREAM, 2)
        pending = [(f"c{i % 13}", orjson.dumps({"id": i})) for i in range(first, first + count)]
        while pending:
            chunk, pending = pending[:500], pending[500:]
            results = await kinesis.put_records(STREAM, chunk)
            pending = [e for e, r in zip(chunk, results, strict=True) if r is None] + pending


def spark_session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)  # spark.readStream.format("kinesis")
    return spark


def spark_source(spark: SparkSession, local: LocalAws, work: str) -> None:
    query = (
        spark.readStream.format("kinesis")
        .option("streamName", STREAM)
        .option("endpointUrl", local.endpoint_url)
        .option("region", "us-east-1")
        .option("awsAccessKeyId", "testing")
        .option("awsSecretKey", "testing")
        .option("startingPosition", "TRIM_HORIZON")
        .option("metadataPath", os.path.join(work, "progress"))
        .option("maxRecordsPerShard", 500)
        .option("leaseTable", TABLE)  # optional: hand over to kclasync workers later
        .load()
        .withColumn("id", F.get_json_object(F.col("data").cast("string"), "$.id").cast("long"))
        .writeStream.format("parquet")
        .option("path", os.path.join(work, "from-source"))
        .option("checkpointLocation", os.path.join(work, "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


async def workers(spark: SparkSession, local: LocalAws, work: str, expect: int) -> None:
    sink = ParquetSink(os.path.join(work, "from-workers"))
    done = asyncio.Event()
    written = 0

    def write(df: Any, info: BatchInfo) -> None:
        nonlocal written
        sink(df, info)  # one parquet file per (stream, shard, first, last): replays are no-ops
        written += info.records
        if written >= expect:
            done.set()

    consumer = Consumer(
        stream_name=STREAM,
        application_name=TABLE,  # the same lease table: start where the Spark source stopped
        processor=SparkProcessor.factory(spark, write),
        config=ConsumerConfig(initial_position="TRIM_HORIZON", failover_time=5.0),
        client_options=local.client_options(),
    )
    async with consumer:
        await asyncio.wait_for(done.wait(), 120)


def main() -> None:
    with moto_process() as local, tempfile.TemporaryDirectory() as work:
        asyncio.run(produce(local, 0, 2000, create=True))
        spark = spark_session()
        spark_source(spark, local, work)
        asyncio.run(produce(local, 2000, 500))
        asyncio.run(workers(spark, local, work, 500))
        a = spark.read.parquet(os.path.join(work, "from-source")).count()
        b = spark.read.parquet(os.path.join(work, "from-workers")).count()
        print(f"Spark source wrote {a} rows; kclasync workers wrote {b} rows; total {a + b}")
        spark.stop()
        assert (a, b) == (2000, 500), "a record was lost or read twice"


if __name__ == "__main__":
    main()
