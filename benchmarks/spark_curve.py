"""Rows/s of the Spark ``kinesis`` source as a curve: over shard counts and ``shardsPerTask``, on
moto's server and on kinesis-local, each point against a plain aiobotocore GetRecords loop run
just before it in the same process.

    flock /tmp/heavy.lock uv run python benchmarks/spark_curve.py [--backends moto,kinesis-local]
        [--shards 4,16,64] [--records 20000 | --per-shard N] [--group 0] [--runs 1] [--phases]
        [--floor]

Per backend: a new stream per shard count holding the same ``--records`` backlog (a fixed
total, spread over unique partition keys, so more shards means fewer records per shard; with
``--per-shard`` the same backlog per shard instead, so the total grows with the shards), and a
new ``local[2]`` Spark session (``spark_throughput.start_session``). The session's first query
is the cold start (Spark starts its executors' Python workers), reported apart. Then per shard
count and per ``shardsPerTask`` (the source's default, 1, and ``--group``; by default
ceil(shards / 2), docs/spark.md's value for ``local[2]``: every shard read at once): a short
warm-up query (400 records on a 4-shard stream, the same ``shardsPerTask``), the plain loop over
the backlog, and the timed query (AvailableNow into Spark's ``noop`` sink, a new checkpoint),
measured as ``spark_throughput.source_run`` does: from ``start()``, from the first batch's start
and over the batches. ``--runs`` > 1 repeats each point and prints medians (each ratio is the
median of the queries' ratios to their own plain loop). kinesis-local accepts puts slowly
(about 1,000-3,000 records/s), which bounds the backlog. Load averages are printed per point.
``--floor`` then times Spark alone with as many tasks and rows (``spark_floor.py``), once, in
the first backend's session.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from statistics import median
from typing import Any, NamedTuple

from kclasync.testing.emulators import LocalAws, find_kinesis_local, kinesis_local, moto_process

# Run as a script: its directory is on the path.
import spark_floor  # isort: skip
import spark_throughput  # isort: skip
from spark_probes import ServerCpu  # isort: skip
from spark_throughput import Rates, backlog, plain_loop, source_run, start_session  # isort: skip

WARMUP_STREAM = "warmup"
WARMUP_RECORDS = 400

#: Task slots of the session (``local[2]``).
SLOTS = 2


class Point(NamedTuple):
    backend: str
    shards: int
    per_task: str
    records: int
    plain: float
    rates: Rates
    ratios: Rates
    load: tuple[float, float]


def load1() -> float:
    return os.getloadavg()[0]


@contextlib.contextmanager
def backend(name: str) -> Iterator[LocalAws]:
    """moto's server alone, or kinesis-local for Kinesis with moto for DynamoDB."""
    with moto_process(timeout=120) as moto:
        if name == "moto":
            yield moto
            return
        script = find_kinesis_local(spark_throughput.ROOT)
        if script is None:
            raise SystemExit("node_modules/kinesis-local not found: run `npm ci` first")
        with kinesis_local(moto, script=script) as local:
            yield local


class Curve:
    """The queries of one backend's session, numbered for their checkpoints."""

    def __init__(self, spark: Any, local: LocalAws, tmp: str, runs: int) -> None:
        self.spark, self.local, self.tmp, self.runs = spark, local, tmp, runs
        self.queries = 0

    def query(self, stream: str, per_task: int | None) -> Rates:
        self.queries += 1
        return source_run(self.spark, self.local, stream, self.tmp, "noop", self.queries, per_task)

    def paired(self, stream: str, per_task: int | None, warm: bool = True) -> tuple[Rates, float]:
        """One timed query after (warm) a warm-up query and a plain loop; its rates and the plain
        loop's."""
        if warm:
            self.query(WARMUP_STREAM, per_task)
        n, s = asyncio.run(plain_loop(self.local, stream))
        return self.query(stream, per_task), n / s

    def point(self, name: str, shards: int, records: int, per_task: int | None) -> Point:
        load = load1()
        got = [self.paired(f"curve-{shards}", per_task) for _ in range(self.runs)]
        rates = Rates(*(median(getattr(r, f) for r, _ in got) for f in Rates._fields))
        ratios = Rates(*(median(getattr(r, f) / p for r, p in got) for f in Rates._fields))
        plain = median(p for _, p in got)
        label = "default" if per_task is None else str(per_task)
        return Point(name, shards, label, records, plain, rates, ratios, (load, load1()))


def groupings(shards: int, group: int, only_grouped: bool = False) -> list[int | None]:
    """The ``shardsPerTask`` values measured at ``shards``: the default, 1, and a grouping
    (``group``, or with 0 docs/spark.md's ceil(shards / task slots) for ``local[2]``); with
    ``only_grouped`` the grouping alone."""
    grouped = group or -(-shards // SLOTS)
    return [grouped] if only_grouped else [None, 1, grouped]


def header() -> str:
    cells = ["from start()", "from 1st batch", "over batches"]
    return (
        f"{'backend':<14}{'shards':>6} {'perTask':>8}{'records':>8}{'plain':>8}"
        + "".join(f"{c:>18}" for c in cells)
        + f"{'load1':>12}"
    )


def line(p: Point) -> str:
    cells = [f"{r:,.0f} {q:.2f}x" for r, q in zip(p.rates, p.ratios, strict=True)]
    return (
        f"{p.backend:<14}{p.shards:>6} {p.per_task:>8}{p.records:>8,}{p.plain:>8,.0f}"
        + "".join(f"{c:>18}" for c in cells)
        + f"{p.load[0]:>6.1f}-{p.load[1]:<5.1f}"
    )


def total(args: argparse.Namespace, shards: int) -> int:
    """The backlog of the stream of ``shards``: ``--records``, or ``--per-shard`` per shard."""
    return int(args.per_shard * shards if args.per_shard else args.records)


def run_backend(name: str, args: argparse.Namespace, tmp: str) -> tuple[Point, list[Point]]:
    with backend(name) as local:
        if args.phases and name == "moto":
            spark_throughput.MOTO = ServerCpu()  # moto's CPU time in each window, printed
        for shards in args.shards:
            started = time.monotonic()
            records = total(args, shards)
            asyncio.run(backlog(local, f"curve-{shards}", shards, records, records))
            took = time.monotonic() - started
            print(f"{name}: {records:,} records into {shards} shards in {took:.1f} s")
        asyncio.run(backlog(local, WARMUP_STREAM, 4, WARMUP_RECORDS))
        started = time.monotonic()
        spark = start_session()
        print(f"{name}: spark session start {time.monotonic() - started:.1f} s", flush=True)
        curve = Curve(spark, local, os.path.join(tmp, name), args.runs)
        try:
            first = args.shards[0]
            load = load1()
            rates, plain = curve.paired(f"curve-{first}", None, warm=False)
            cold = Point(
                name,
                first,
                "default",
                total(args, first),
                plain,
                rates,
                Rates(*(v / plain for v in rates)),
                (load, load1()),
            )
            print("cold " + line(cold), flush=True)
            points = []
            for shards in args.shards:
                for per_task in groupings(shards, args.group, args.only_grouped):
                    points.append(curve.point(name, shards, total(args, shards), per_task))
                    print("     " + line(points[-1]), flush=True)
            if args.floor:
                done = {(p.shards, int(p.per_task)) for p in points if p.per_task != "default"}
                spark_floor.floor_table(spark, sorted(done), total(args, first), tmp)
                args.floor = False  # Spark's share does not depend on the backend
        finally:
            spark.stop()
            if spark_throughput.MOTO is not None:
                spark_throughput.MOTO.stop()
                spark_throughput.MOTO = None
        return cold, points


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--backends", default="moto,kinesis-local", help="comma-separated: moto, kinesis-local"
    )
    parser.add_argument("--shards", default="4,16,64", help="comma-separated shard counts")
    parser.add_argument(
        "--records", type=int, default=20_000, help="backlog per shard count (a fixed total)"
    )
    parser.add_argument(
        "--per-shard",
        type=int,
        default=0,
        help="backlog per shard instead of a fixed total (the total grows with the shards)",
    )
    parser.add_argument(
        "--group",
        type=int,
        default=0,
        help="the grouping shardsPerTask measured besides the default and 1 (0: ceil(shards / "
        "2), every shard read at once on local[2], as docs/spark.md recommends)",
    )
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also time Spark alone: a Python streaming source that reads nothing, with the "
        "same tasks and rows as each point (spark_floor.py)",
    )
    parser.add_argument(
        "--only-grouped",
        action="store_true",
        help="measure the grouping alone (not the default or 1)",
    )
    parser.add_argument("--runs", type=int, default=1, help="timed queries per point (medians)")
    parser.add_argument(
        "--phases",
        action="store_true",
        help="each query's batches and phases (and on moto, how busy its server was)",
    )
    parser.add_argument("--timeout", type=float, default=1800.0, help="the whole run, seconds")
    args = parser.parse_args()
    args.shards = [int(s) for s in args.shards.split(",")]
    backends = args.backends.split(",")
    unknown = set(backends) - {"moto", "kinesis-local"}
    if unknown:
        parser.error(f"unknown backends: {sorted(unknown)}")
    spark_throughput.PHASES = args.phases
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    signal.alarm(int(args.timeout))
    print(f"load average at the start: {os.getloadavg()}; kclasync from {spark_throughput.ROOT}")
    print(header())
    colds, points = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in backends:
            cold, more = run_backend(name, args, tmp)
            colds.append(cold)
            points.extend(more)
    print(f"\nload average at the end: {os.getloadavg()}")
    print("cold start (each backend's session's first query, no warm-up):")
    print(header())
    for p in colds:
        print(line(p))
    print(f"warm (rows/s and ratio to the plain loop just before; medians of {args.runs}):")
    print(header())
    for p in points:
        print(line(p))
    below = [p for p in points if p.ratios.running < 0.9]
    print(f"points below 0.9x from the 1st batch: {len(below)} of {len(points)}")


if __name__ == "__main__":
    main()
