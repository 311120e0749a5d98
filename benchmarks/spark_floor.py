"""Spark's own cost of a batch of a Python streaming source, for ``spark_curve.py --floor``: a
source (``nullstream``) that reads nothing, whose one batch has ``tasks`` partitions handing Spark
``rows`` rows between them as Arrow record batches (as the ``kinesis`` source does), drained with
Trigger.AvailableNow into the ``noop`` sink. What such a query takes from its first batch is
what any Python source pays on top of its reads, with that many tasks.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime
from typing import Any

NAME = "nullstream"


def _classes() -> Any:
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

    class Part(InputPartition):
        def __init__(self, rows: int) -> None:
            super().__init__(rows)
            self.rows = rows

    class Reader(DataSourceStreamReader):
        def __init__(self, options: dict[str, str]) -> None:
            self.tasks = int(options["tasks"])
            self.rows = int(options["rows"])

        def initialOffset(self) -> dict[str, Any]:
            return {"batch": 0}

        def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:
            return {"batch": 1}

        def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[Any]:
            if start == end:
                return []
            each, extra = divmod(self.rows, self.tasks)
            return [Part(each + (i < extra)) for i in range(self.tasks)]

        def read(self, partition: Any) -> Any:
            data = [b'{"id": 0, "pad": "' + b"x" * 64 + b'"}'] * partition.rows
            yield pa.RecordBatch.from_arrays(
                [pa.array(range(partition.rows), pa.int64()), pa.array(data, pa.binary())],
                names=["id", "data"],
            )

        def commit(self, end: dict[str, Any]) -> None:
            pass

    class Source(DataSource):
        @classmethod
        def name(cls) -> str:
            return NAME

        def schema(self) -> str:
            return "id long, data binary"

        def streamReader(self, schema: Any) -> Any:
            return Reader(dict(self.options))

    return Source


def register(spark: Any) -> None:
    """Register ``nullstream`` in ``spark``'s session; its classes travel by value."""
    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    spark.dataSource.register(_classes())


def floor_run(spark: Any, tasks: int, rows: int, checkpoint: str) -> tuple[float, float]:
    """Seconds from the first batch's start to the end, and over the batches, of one query."""
    query = (
        spark.readStream.format(NAME)
        .options(tasks=str(tasks), rows=str(rows))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    wall = time.time()
    started = time.monotonic()
    running = query.start()
    running.awaitTermination()
    elapsed = time.monotonic() - started
    progress = running.recentProgress
    assert sum(p["numInputRows"] for p in progress) == rows
    first = datetime.fromisoformat(progress[0]["timestamp"].replace("Z", "+00:00")).timestamp()
    batches = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    return elapsed - (first - wall), batches


def floor_table(spark: Any, points: list[tuple[int, int]], rows: int, tmp: str) -> None:
    """Per (shards, shardsPerTask): the null source's query with as many tasks, after a warm-up."""
    register(spark)
    print(f"Spark alone ({NAME}: no reads, {rows:,} rows; warm, a warm-up query before each):")
    print(f"{'shards':>6} {'perTask':>8}{'tasks':>6}{'from 1st batch':>16}{'over batches':>14}")
    for n, (shards, per_task) in enumerate(points):
        tasks = -(-shards // per_task)
        floor_run(spark, tasks, 400, os.path.join(tmp, f"floor-warm-{n}"))
        running, batches = floor_run(spark, tasks, rows, os.path.join(tmp, f"floor-{n}"))
        print(f"{shards:>6} {per_task:>8}{tasks:>6}{running:>14.2f} s{batches:>12.2f} s")
