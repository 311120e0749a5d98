"""Rows/s of the Spark source on a 50,000-record backlog against a plain aiobotocore GetRecords
loop on the same stream in the same run, and the ratios; also the Kinesis sink and the Spark
processor.

    uv run python benchmarks/spark_throughput.py [--records 50000] [--shards 4] [--phases]
        [--shards-per-task 2] [--runs 3] [--preload] [--skip-extras] [--driver] [--profile]

Starts moto's server, writes a backlog, starts a local[2] Spark session, then measures:
(1) the plain loop: every shard read from TRIM_HORIZON to its end with GetRecords of 10,000,
    shards concurrently, in this process (before and after the Spark runs; the mean counts);
(2) the ``kinesis`` source draining the backlog with Trigger.AvailableNow into Spark's ``noop``
    sink (a new checkpoint per run): cold (the session's first query: Spark starts its Python
    workers) and warm (each timed query follows a short warm-up query in the same session, so
    the executors' Python workers are up and have imported kclasync; the processes each query
    starts are listed, from /proc, to show that), each three ways: from ``start()`` to the end,
    from the first batch's start to the end (a query already running: without the one Python
    process Spark starts on the driver for every query's source), and over the batches;
    with the default ``shardsPerTask``, 1 and ``--shards-per-task``, ``--runs`` times each
    (medians and bests printed; also the median of each query's ratio to a plain loop run just
    before it, since the machine's load drifts between the first and the last plain loop);
(3) the same into parquet; (4) the Kinesis sink copying the backlog into a second stream;
(5) kclasync workers with ``SparkProcessor`` + ``ParquetSink``.
``--phases`` prints each query's batches with Spark's time per phase, and how many seconds of
CPU moto's server spent in the plain loops and in each query (the reads' own work is the same
for both, so a query's time beyond moto's busy time is time nothing was being read).
``--driver`` times only the source's own driver calls (its reader called as Spark calls it).
``--preload`` starts the session with ``spark.python.daemon.module`` set to
``kclasync.integrations.spark_daemon`` (workers forked with the AWS stack imported: the cold
query is the one that changes).
``--profile`` runs cProfile over one executor-side read of a shard (what a task does) and prints
the top entries. Everything shares the machine's cores with moto; bounded by ``--timeout``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from datetime import datetime
from statistics import median
from typing import Any, NamedTuple

import orjson
from prometheus_client import CollectorRegistry

import kclasync
from kclasync import Consumer, ConsumerConfig
from kclasync._adapters.kinesis import KinesisStreamClient
from kclasync.testing.emulators import LocalAws, moto_process

# Run as a script (``uv run python benchmarks/spark_throughput.py``): its directory is on the path.
from spark_probes import (  # isort: skip
    AWS,
    ServerCpu,
    describe,
    driver_calls,
    new_processes,
    profile_task,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(kclasync.__file__)))

#: Print each run's batches and Spark's time per phase (``--phases``).
PHASES = False

#: With ``--phases``: moto's CPU time, to show how busy the server was in each measured window.
MOTO: ServerCpu | None = None

#: ``--preload``: the daemon module that imports the source's AWS stack before forking workers.
DAEMON = "kclasync.integrations.spark_daemon"


async def backlog(local: LocalAws, stream: str, shards: int, records: int, keys: int = 97) -> None:
    """A new stream of ``shards`` with ``records`` records over ``keys`` partition keys."""
    options = local.client_options()
    async with options.create_client("kinesis") as client:
        kinesis = KinesisStreamClient(client)
        await kinesis.create_stream(stream, shards)
        pending = [
            (f"k{i % keys}", orjson.dumps({"id": i, "pad": "x" * 64})) for i in range(records)
        ]
        while pending:  # one PutRecords at a time: moto drops records under concurrent puts
            chunk, pending = pending[:500], pending[500:]
            results = await kinesis.put_records(stream, chunk)
            pending = [e for e, r in zip(chunk, results, strict=True) if r is None] + pending


async def plain_loop(local: LocalAws, stream: str) -> tuple[int, float]:
    """Records and seconds for a bare aiobotocore read of every shard, shards concurrently."""
    async with local.client_options(read_timeout=120.0).create_client("kinesis") as client:
        shards = (await client.list_shards(StreamName=stream))["Shards"]

        async def drain(shard_id: str) -> int:
            it = (
                await client.get_shard_iterator(
                    StreamName=stream, ShardId=shard_id, ShardIteratorType="TRIM_HORIZON"
                )
            )["ShardIterator"]
            n = 0
            while it:
                resp = await client.get_records(ShardIterator=it, Limit=10_000)
                n += len(resp["Records"])
                if not resp["Records"] and not resp.get("MillisBehindLatest"):
                    break
                it = resp.get("NextShardIterator")
            return n

        started = time.monotonic()
        counts = await asyncio.gather(*(drain(s["ShardId"]) for s in shards))
        ended = time.monotonic()
        if PHASES and MOTO is not None:
            await asyncio.sleep(0.05)  # one more sample after the end
            busy = MOTO.used(started, ended)
            print(f"  plain loop: {ended - started:.2f} s, moto busy {busy:.2f} s")
        return sum(counts), ended - started


class Rates(NamedTuple):
    """Rows/s of one query, three ways."""

    #: From ``start()`` to the end of ``awaitTermination()``.
    start_to_end: float
    #: From the first batch's start to the end: what a query that is already running sees
    #: (without the query's one-time start: Spark launching the source's Python process on
    #: the driver, which imports pyspark, botocore and aiohttp).
    running: float
    #: Over the batches only (Spark's ``processedRowsPerSecond``): every batch's planning,
    #: task launches, reads and commits.
    batches: float


def endpoints(local: LocalAws) -> dict[str, str]:
    """The source's endpoint options: Kinesis, and DynamoDB when it is another server."""
    if local.kinesis_endpoint_url is None:
        return {"endpointUrl": local.endpoint_url}
    return {"endpointUrl": local.kinesis_endpoint_url, "dynamodbEndpointUrl": local.endpoint_url}


def start_session(preload: bool = False) -> Any:
    """A ``local[2]`` Spark session with the ``kinesis`` source registered (``preload``: the
    executors' workers are forked from kclasync's daemon)."""
    from pyspark.sql import SparkSession

    from kclasync.spark import register

    builder = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
    )
    if preload:
        builder = builder.config("spark.python.daemon.module", DAEMON)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def source_run(
    spark: Any, local: LocalAws, stream: str, tmp: str, fmt: str, n: int, per_task: int | None = 1
) -> Rates:
    """One AvailableNow query over ``stream``. ``per_task=None``: the source's default
    ``shardsPerTask``."""
    options = {
        "streamName": stream,
        **endpoints(local),
        "startingPosition": "TRIM_HORIZON",
        "maxRecordsPerShard": "100000",
        "maxFetchTimePerShardSec": "60",
        **({"shardsPerTask": str(per_task)} if per_task is not None else {}),
        **AWS,
    }
    df = spark.readStream.format("kinesis").options(**options).load()
    writer = df.writeStream.format(fmt).option(
        "checkpointLocation", os.path.join(tmp, f"ck-{fmt}-{n}")
    )
    if fmt == "parquet":
        writer = writer.option("path", os.path.join(tmp, f"out-source-{n}"))
    with new_processes() as procs:
        wall = time.time()
        started = time.monotonic()
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        elapsed = time.monotonic() - started
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    batches = sum(p["durationMs"]["triggerExecution"] for p in query.recentProgress) / 1000
    first = query.recentProgress[0]["timestamp"]
    to_first = datetime.fromisoformat(first.replace("Z", "+00:00")).timestamp() - wall
    if PHASES:
        print(
            f"  run {n}: {elapsed:.2f} s from start(), {batches:.2f} s in batches, "
            f"first batch {to_first:.2f} s after start(); processes started: {describe(procs)}"
        )
        for p in query.recentProgress:
            print(f"    batch {p['batchId']}: {p['numInputRows']} rows {dict(p['durationMs'])}")
        if MOTO is not None:
            time.sleep(0.05)  # one more sample after the end
            first_batch = started + to_first
            print(
                f"    moto busy {MOTO.used(started, started + elapsed):.2f} s from start(), "
                f"{MOTO.used(first_batch, first_batch + batches):.2f} s of the {batches:.2f} s "
                "in batches"
            )
    return Rates(rows / elapsed, rows / (elapsed - to_first), rows / batches)


def sink_copy(spark: Any, local: LocalAws, stream: str, tmp: str, records: int) -> float:
    target = f"{stream}-copy"
    asyncio.run(backlog(local, target, 4, 0))
    options = {"endpointUrl": local.endpoint_url, **AWS}
    df = (
        spark.readStream.format("kinesis")
        .options(streamName=stream, startingPosition="TRIM_HORIZON", **options)
        .option("maxRecordsPerShard", "100000")
        .load()
    )
    started = time.monotonic()
    query = (
        df.writeStream.format("kinesis")
        .options(streamName=target, **options)
        .option("checkpointLocation", os.path.join(tmp, "ck-sink"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return records / (time.monotonic() - started)


async def processor_run(spark: Any, local: LocalAws, stream: str, tmp: str, records: int) -> float:
    from kclasync.spark import ParquetSink, SparkProcessor

    sink = ParquetSink(os.path.join(tmp, "out-sink"))
    written = 0

    def write(df: Any, info: Any) -> None:
        nonlocal written
        sink(df, info)
        written += info.records

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
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument(
        "--shards-per-task",
        type=int,
        default=2,
        help="also measure the source with this shardsPerTask (local[2]: 2 reads all 4 at once)",
    )
    parser.add_argument("--phases", action="store_true", help="Spark's time per batch phase")
    parser.add_argument("--runs", type=int, default=3, help="warm timed queries per setting")
    parser.add_argument(
        "--preload", action="store_true", help="spark.python.daemon.module: kclasync's daemon"
    )
    parser.add_argument(
        "--driver", action="store_true", help="only time the source's driver calls, then exit"
    )
    parser.add_argument("--skip-extras", action="store_true", help="only the source vs plain")
    parser.add_argument("--timeout", type=float, default=900.0)
    args = parser.parse_args()
    global PHASES
    PHASES = args.phases
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    import signal

    signal.alarm(int(args.timeout))  # bounded: the whole run dies after --timeout seconds
    with moto_process(timeout=120) as local, tempfile.TemporaryDirectory() as tmp:
        if PHASES:
            global MOTO
            MOTO = ServerCpu()
        asyncio.run(backlog(local, "bench", args.shards, args.records))
        if args.profile:
            profile_task(local, "bench")
        if args.driver:
            print(f"kclasync from {ROOT}")
            driver_calls(local, "bench")
            return
        n, s = asyncio.run(plain_loop(local, "bench"))
        assert n == args.records, f"plain loop read {n} of {args.records}"
        plain = [n / s]
        started = time.monotonic()
        spark = start_session(args.preload)
        print(f"spark session start: {time.monotonic() - started:.1f} s (kclasync from {ROOT})")
        reuse = spark.sparkContext.getConf().get("spark.python.worker.reuse", "true")
        print(f"spark.python.worker.reuse: {reuse}; daemon module: {args.preload and DAEMON}")
        # Cold: the session's first query (Spark starts its Python workers for it).
        cold = source_run(spark, local, "bench", tmp, "noop", 0, None)
        asyncio.run(backlog(local, "warmup", args.shards, 400))
        per_task: list[int | None] = [None, 1, args.shards_per_task]
        runs: dict[int | None, list[Rates]] = {k: [] for k in per_task}
        #: Each timed query's rates over a plain loop run just before it (load drifts).
        paired: dict[int | None, list[Rates]] = {k: [] for k in per_task}
        timed_started: dict[str, int] = {}
        for i in range(1, args.runs + 1):
            for j, k in enumerate(per_task):
                # Warm: a short query first, in the same session (its Python workers stay up
                # and keep kclasync imported), then the timed one on the same backlog.
                if PHASES:
                    print(f"  warm-up before run {100 * i + j}:")
                source_run(spark, local, "warmup", tmp, "noop", 1000 + 100 * i + j, k)
                n, s = asyncio.run(plain_loop(local, "bench"))
                with new_processes() as procs:
                    runs[k].append(source_run(spark, local, "bench", tmp, "noop", 100 * i + j, k))
                paired[k].append(Rates(*(v * s / n for v in runs[k][-1])))
                for what in procs.values():
                    if what.startswith("pyspark."):
                        timed_started[what] = timed_started.get(what, 0) + 1
        n, s = asyncio.run(plain_loop(local, "bench"))
        plain.append(n / s)
        base = sum(plain) / len(plain)
        print(f"plain aiobotocore loop (mean of before and after): {base:,.0f} rec/s  {plain}")
        print("source -> noop, rows/s and ratio to the plain loop:")
        print(f"  {'run':<34} {'start() to end':>20} {'from 1st batch':>20} {'over batches':>20}")

        def row(name: str, r: Rates) -> None:
            cells = [f"{v:,.0f} {v / base:.2f}x" for v in r]
            print(f"  {name:<34} {cells[0]:>20} {cells[1]:>20} {cells[2]:>20}")

        print(
            f"  Python processes started by the {args.runs * len(per_task)} warm timed queries: "
            f"{timed_started}"
        )
        row("cold (session's 1st query), default", cold)
        for k in per_task:
            name = "default" if k is None else str(k)
            for field in ("start_to_end", "running", "batches"):
                each = [round(getattr(r, field)) for r in runs[k]]
                print(f"    shardsPerTask={name} {field}: {each}")
            middle = Rates(*(median(getattr(r, f) for r in runs[k]) for f in Rates._fields))
            row(f"warm, shardsPerTask={name} (median of {args.runs})", middle)
            best = Rates(*(max(getattr(r, f) for r in runs[k]) for f in Rates._fields))
            row(f"warm, shardsPerTask={name} (best of {args.runs})", best)
            ratios = [median(getattr(r, f) for r in paired[k]) for f in Rates._fields]
            cells = " ".join(f"{v:>19.2f}x" for v in ratios)
            print(f"  {'  paired with a plain loop just before':<34} {cells}")
        if not args.skip_extras:
            rate = source_run(spark, local, "bench", tmp, "parquet", 3).start_to_end
            print(f"source -> parquet, warm:                        {rate:,.0f} rows/s")
            rate = sink_copy(spark, local, "bench", tmp, args.records)
            print(f"source -> kinesis sink (copy to a 2nd stream):  {rate:,.0f} rows/s")
            rate = asyncio.run(processor_run(spark, local, "bench", tmp, args.records))
            print(f"workers -> SparkProcessor -> parquet:           {rate:,.0f} rows/s")
        spark.stop()
        if MOTO is not None:
            MOTO.stop()


if __name__ == "__main__":
    main()
