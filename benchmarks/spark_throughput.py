"""Rows/s of the Spark source and the Spark processor on this machine, and Spark's start-up cost.

    uv run python benchmarks/spark_throughput.py [--records 20000] [--shards 4]

Starts moto's server, writes a backlog, then measures (1) a local[2] Spark session's start,
(2) the ``kinesis`` source draining the backlog with Trigger.AvailableNow into Spark's ``noop``
sink and into parquet, (3) kclasync workers with ``SparkProcessor`` + ``ParquetSink`` writing
the same backlog. moto serves ~20,000 GetRecords records/s on one core, which bounds (2).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time

import orjson
from prometheus_client import CollectorRegistry

from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync.testing.emulators import LocalAws, moto_process


async def backlog(local: LocalAws, stream: str, shards: int, records: int) -> None:
    options = local.client_options()
    async with options.create_client("kinesis") as client:
        kinesis = KinesisStreamClient(client)
        await kinesis.create_stream(stream, shards)
        pending = [(f"k{i % 97}", orjson.dumps({"id": i, "pad": "x" * 64})) for i in range(records)]
        while pending:  # one PutRecords at a time: moto drops records under concurrent puts
            chunk, pending = pending[:500], pending[500:]
            results = await kinesis.put_records(stream, chunk)
            pending = [e for e, r in zip(chunk, results, strict=True) if r is None] + pending


def source_run(spark: object, local: LocalAws, stream: str, tmp: str, fmt: str) -> float:
    options = {
        "streamName": stream,
        "endpointUrl": local.endpoint_url,
        "region": "us-east-1",
        "awsAccessKeyId": "testing",
        "awsSecretKey": "testing",
        "startingPosition": "TRIM_HORIZON",
        "metadataPath": os.path.join(tmp, f"progress-{fmt}"),
    }
    df = spark.readStream.format("kinesis").options(**options).load()  # type: ignore[attr-defined]
    writer = df.writeStream.format(fmt).option("checkpointLocation", os.path.join(tmp, f"ck-{fmt}"))
    if fmt == "parquet":
        writer = writer.option("path", os.path.join(tmp, "out-source"))
    started = time.monotonic()
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination()
    elapsed = time.monotonic() - started
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    return rows / elapsed


async def sink_run(spark: object, local: LocalAws, stream: str, tmp: str, records: int) -> float:
    from kclasync.spark import ParquetSink, SparkProcessor

    sink = ParquetSink(os.path.join(tmp, "out-sink"))
    written = 0

    def write(df: object, info: object) -> None:
        nonlocal written
        sink(df, info)  # type: ignore[arg-type]
        written += info.records  # type: ignore[attr-defined]

    consumer = Consumer(
        stream_name=stream,
        application_name=f"{stream}-sink",
        processor=SparkProcessor.factory(spark, write),
        config=ConsumerConfig(initial_position="TRIM_HORIZON", idle_time_between_reads=0.1),
        client_options=local.client_options(),
        registry=CollectorRegistry(),
    )
    started = time.monotonic()
    async with consumer:
        while written < records:
            await asyncio.sleep(0.05)
    return written / (time.monotonic() - started)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=4)
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with moto_process() as local, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(backlog(local, "bench", args.shards, args.records))
        started = time.monotonic()
        from pyspark.sql import SparkSession

        from kclasync.spark import register

        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "1g")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        register(spark)
        print(f"spark session start: {time.monotonic() - started:.1f} s")
        print(f"source -> noop:    {source_run(spark, local, 'bench', tmp, 'noop'):,.0f} rows/s")
        print(f"source -> parquet: {source_run(spark, local, 'bench', tmp, 'parquet'):,.0f} rows/s")
        rate = asyncio.run(sink_run(spark, local, "bench", tmp, args.records))
        print(f"workers -> SparkProcessor -> parquet: {rate:,.0f} rows/s")
        spark.stop()


if __name__ == "__main__":
    main()
