"""A complete Kinesis -> Spark -> parquet pipeline, both ways in, on a local emulator.

    uv run python examples/spark_pipeline.py

1. Starts moto's server on 127.0.0.1 and creates a 2-shard stream.
2. Kinesis sink: ``df.write.format("kinesis")`` puts 2,000 JSON records into it.
3. Spark source: ``spark.readStream.format("kinesis")`` drains the stream into parquet with
   Trigger.AvailableNow (progress in DynamoDB), recording its positions in the lease table
   ``orders-pipeline``.
4. 500 more records arrive; kclasync workers take over from the lease table and write them with
   ``SparkProcessor`` + ``ParquetSink`` (nothing from step 3 is read again).
5. Both outputs are read back and counted.
Against AWS, drop the emulator, ``endpointUrl`` and the dummy keys.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
from typing import Any

from moto.server import ThreadedMotoServer
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from kclasync import ClientOptions, Consumer, ConsumerConfig
from kclasync.spark import BatchInfo, ParquetSink, SparkProcessor, register

STREAM = "orders"
TABLE = "orders-pipeline"
AWS = {"region": "us-east-1", "awsAccessKeyId": "testing", "awsSecretKey": "testing"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def client_options(endpoint: str) -> ClientOptions:
    return ClientOptions(
        region_name="us-east-1",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


async def create_stream(endpoint: str) -> None:
    async with client_options(endpoint).create_client("kinesis") as kinesis:
        await kinesis.create_stream(StreamName=STREAM, ShardCount=2)
        while True:
            summary = await kinesis.describe_stream_summary(StreamName=STREAM)
            if summary["StreamDescriptionSummary"]["StreamStatus"] == "ACTIVE":
                return
            await asyncio.sleep(0.1)


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
    register(spark)  # format("kinesis") for reading and writing
    return spark


def put(spark: SparkSession, endpoint: str, first: int, count: int) -> None:
    """The Kinesis sink: one row per record, a partition key and the data."""
    (
        spark.range(first, first + count)
        .select(
            F.concat(F.lit("c"), (F.col("id") % 13).cast("string")).alias("partitionKey"),
            F.to_json(F.struct("id")).alias("data"),
        )
        .coalesce(1)  # moto numbers concurrent puts to one shard wrongly; AWS does not need this
        .write.format("kinesis")
        .option("streamName", STREAM)
        .option("endpointUrl", endpoint)
        .options(**AWS)
        .mode("append")
        .save()
    )


def spark_source(spark: SparkSession, endpoint: str, work: str) -> None:
    query = (
        spark.readStream.format("kinesis")
        .option("streamName", STREAM)
        .option("endpointUrl", endpoint)
        .options(**AWS)
        .option("startingPosition", "TRIM_HORIZON")
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


async def workers(spark: SparkSession, endpoint: str, work: str, expect: int) -> None:
    sink = ParquetSink(os.path.join(work, "from-workers"))
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    written = 0

    def write(df: Any, info: BatchInfo) -> None:
        nonlocal written
        sink(df, info)  # one parquet file per (stream, shard, first, last): replays are no-ops
        written += info.records
        if written >= expect:
            loop.call_soon_threadsafe(done.set)

    consumer = Consumer(
        stream_name=STREAM,
        application_name=TABLE,  # the same lease table: start where the Spark source stopped
        processor=SparkProcessor.factory(spark, write),
        config=ConsumerConfig(initial_position="TRIM_HORIZON", failover_time=5.0),
        client_options=client_options(endpoint),
    )
    async with consumer:
        await asyncio.wait_for(done.wait(), 120)


def main() -> None:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        with tempfile.TemporaryDirectory() as work:
            asyncio.run(create_stream(endpoint))
            spark = spark_session()
            put(spark, endpoint, 0, 2000)
            spark_source(spark, endpoint, work)
            put(spark, endpoint, 2000, 500)
            asyncio.run(workers(spark, endpoint, work, 500))
            a = spark.read.parquet(os.path.join(work, "from-source")).count()
            b = spark.read.parquet(os.path.join(work, "from-workers")).count()
            print(f"Spark source wrote {a} rows; kclasync workers wrote {b} rows; total {a + b}")
            spark.stop()
            assert (a, b) == (2000, 500), "a record was lost or read twice"
    finally:
        server.stop()


if __name__ == "__main__":
    main()
