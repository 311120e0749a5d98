"""The Spark source's own part of a batch without Spark: its reader driven in this process as
Spark drives it (``initialOffset``, ``latestOffset``, ``partitions``, each task's
``arrow_batches`` on a thread of its own over one ``WorkerIO``, ``commit`` and the planning
that ends an AvailableNow run), against the plain aiobotocore loop on a stream like it, in the
same process, with moto's CPU time in each part.

    uv run python benchmarks/spark_inprocess.py [--shards 64] [--records 20000] [--group 32]
        [--runs 3]

What is left between this ratio and a Spark query's is Spark's (its scheduling, the Python
workers' hand-over of the rows, the write-ahead log and commit) and the machine's other work.
Each run uses a new stream (a new query's checkpoint), after one warm-up run.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from typing import Any

from pyspark.sql.streaming.datasource import ReadAllAvailable

import kclasync.spark.worker_io as worker_module
from kclasync.spark.checks import check_source
from kclasync.spark.options import SourceOptions
from kclasync.spark.shard_task import arrow_batches
from kclasync.spark.source import KinesisStreamReader
from kclasync.spark.worker_io import WorkerIO
from kclasync.testing.emulators import LocalAws, moto_process

# Run as a script: its directory is on the path.
from spark_probes import AWS, ServerCpu  # isort: skip
from spark_throughput import backlog, endpoints, plain_loop  # isort: skip


def options(local: LocalAws, stream: str, group: int) -> SourceOptions:
    return SourceOptions.parse(
        {
            "streamName": stream,
            **endpoints(local),
            **AWS,
            "startingPosition": "TRIM_HORIZON",
            "progressTable": "inprocess-progress",
            "shardsPerTask": str(group),
            "maxRecordsPerShard": "100000",
            "maxFetchTimePerShardSec": "60",
        }
    )


def one_query(local: LocalAws, opts: SourceOptions, cpu: ServerCpu) -> dict[str, Any]:
    """Seconds (and moto's CPU seconds) of the planning, the tasks and the end of one run."""
    reader = KinesisStreamReader(opts)
    try:
        start = reader.initialOffset()
        reader.prepareForTriggerAvailableNow()
        t0 = time.monotonic()
        end = reader.latestOffset(start, ReadAllAvailable())
        tasks = reader.partitions(start, end)
        t1 = time.monotonic()
        rows: list[int] = []
        threads = [
            threading.Thread(
                target=lambda t=t: rows.append(sum(b.num_rows for b in arrow_batches(t)))
            )
            for t in tasks
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        t2 = time.monotonic()
        reader.commit(end)
        assert reader.latestOffset(end, ReadAllAvailable()) == end
        t3 = time.monotonic()
    finally:
        reader.stop()
    return {
        "rows": sum(rows),
        "plan": (t1 - t0, cpu.used(t0, t1)),
        "tasks": (t2 - t1, cpu.used(t1, t2)),
        "end": (t3 - t2, cpu.used(t2, t3)),
        "total": (t3 - t0, cpu.used(t0, t3)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--records", type=int, default=20_000)
    parser.add_argument("--group", type=int, default=32, help="shardsPerTask")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with moto_process(timeout=120) as local, tempfile.TemporaryDirectory():
        for r in range(args.runs + 1):
            asyncio.run(backlog(local, f"s{r}", args.shards, args.records, args.records))
        check_source(options(local, "s0", args.group))  # creates the progress table
        cpu = ServerCpu()
        io = WorkerIO()
        worker_module._current = io
        try:
            for r in range(args.runs + 1):
                t0 = time.monotonic()
                n, took = asyncio.run(plain_loop(local, f"s{r}"))
                plain_busy = cpu.used(t0, time.monotonic())
                got = one_query(local, options(local, f"s{r}", args.group), cpu)
                assert got["rows"] == n == args.records, (got["rows"], n)
                if r == 0:
                    continue  # warm-up
                parts = ", ".join(
                    f"{k} {got[k][0]:.2f} s (moto {got[k][1]:.2f})"
                    for k in ("plan", "tasks", "end")
                )
                total, busy = got["total"]
                print(
                    f"plain loop {took:.2f} s (moto {plain_busy:.2f}); source {total:.2f} s "
                    f"(moto {busy:.2f}): {parts}; ratio {took / total:.2f}x",
                    flush=True,
                )
        finally:
            io.close()
            cpu.stop()


if __name__ == "__main__":
    main()
